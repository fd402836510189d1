"""evaluate_xids: catalog actions, NVIDIA's workflows, ageing out, and real captures."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.collectors.xid_parse import LineAssembler, ParsedLine, parse_line
from podhealth.vocab import MAX_EVIDENCE_CHARS, MAX_EVIDENCE_ITEMS, Action, CheckResult, Event, Status

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"
NOW = 1_000_000.0
WINDOW = 3600.0
GPUS = {f"0000:{0x18 + i:02x}:00.0": (i, f"GPU-{i:08d}") for i in range(8)}
CAT = load_catalog()


def pci(i: int) -> str:
    return f"0000:{0x18 + i:02x}:00.0"


def xid(code: int, t: float, gpu: int = 0, text: str = "", source: str = "kmsg") -> Event:
    p = pci(gpu)
    line = text or f"NVRM: Xid (PCI:{p[:-2]}): {code}, pid='<unknown>', name=<unknown>, test"
    return Event(kind="xid", code=code, time=t, text=line, pci_bus_id=p, source=source)


def sxid(code: int, t: float, device: str, detail: str) -> Event:
    return Event(kind="sxid", code=code, time=t, device=device,
                 text=f"nvidia-{device}: SXid (PCI:0000:05:00.0): {code}, {detail}")


def run(*events: Event, window: float = WINDOW, switches: tuple[str, ...] = ()) -> dict[str, CheckResult]:
    return {r.entity: r for r in evaluate_xids(list(events), CAT, NOW, window, GPUS, switches=switches)}


def test_no_events_every_gpu_ok_with_uuid() -> None:
    res = run()
    assert sorted(res) == [f"gpu{i}" for i in range(8)]
    assert all(r.status is Status.OK and r.check == "xid" and r.action is Action.NONE for r in res.values())
    assert dict(res["gpu3"].evidence)["uuid"] == "GPU-00000003"


def test_xid13_three_incidents_on_one_gpu_is_hardware_suspicion_shown_not_fenced() -> None:
    # NVIDIA's immediate bucket for 13 is RESTART_APP; the repeat rule is the investigatory
    # workflow: the suspicion is shown (WARN, with the action to take), never a FAIL.
    r = run(*(xid(13, NOW - 600 + 60 * i, gpu=2) for i in range(3)))["gpu2"]
    assert (r.status, r.action) == (Status.WARN, Action.RESET_GPU)
    assert "hardware" in dict(r.evidence)["reason"]
    assert r.since == NOW - 600


def test_xid13_persisting_on_one_gpu_asks_for_a_drain_without_fencing() -> None:
    r = run(*(xid(13, NOW - 900 + 60 * i, gpu=2) for i in range(6)))["gpu2"]
    assert (r.status, r.action) == (Status.WARN, Action.DRAIN)


def test_xid13_on_three_gpus_is_the_application() -> None:
    res = run(*(xid(13, NOW - 100 + i, gpu=g) for g in (1, 4, 6) for i in range(0, 300, 60)))
    for g in (1, 4, 6):
        assert (res[f"gpu{g}"].status, res[f"gpu{g}"].action) == (Status.WARN, Action.RESTART_APP)
        assert "3 GPUs" in dict(res[f"gpu{g}"].evidence)["reason"]
    assert res["gpu0"].status is Status.OK


def test_one_burst_of_xid13_lines_is_one_incident() -> None:
    # One fault prints warp / global / ESR lines per SM within milliseconds.
    r = run(*(xid(13, NOW - 10 + i * 0.0001, gpu=0) for i in range(15)))["gpu0"]
    assert (r.status, r.action) == (Status.WARN, Action.RESTART_APP)
    assert dict(r.evidence)["codes"] == "13x15"


def test_xid31_follows_the_same_workflow() -> None:
    assert run(*(xid(31, NOW - 400 + 100 * i, gpu=5) for i in range(3)))["gpu5"].action is Action.RESET_GPU
    assert run(xid(31, NOW - 1, gpu=5), xid(31, NOW - 1, gpu=6))["gpu5"].action is Action.RESTART_APP


def test_xid48_alone_resets_and_with_63_or_64_drains() -> None:
    assert (run(xid(48, NOW - 5))["gpu0"].action, run(xid(48, NOW - 5))["gpu0"].status) == (Action.RESET_GPU, Status.FAIL)
    for companion in (63, 64):
        r = run(xid(48, NOW - 5), xid(companion, NOW - 4))["gpu0"]
        assert (r.status, r.action) == (Status.FAIL, Action.DRAIN), companion
        assert "drain and reset" in dict(r.evidence)["reason"]
    # A 63 on another GPU does not make gpu0's 48 a drain.
    assert run(xid(48, NOW - 5, gpu=0), xid(63, NOW - 4, gpu=1))["gpu0"].action is Action.RESET_GPU


@pytest.mark.parametrize("value, name, status, action", [
    (0, "None", Status.OK, Action.NONE),
    (1, "GPU Reset Required", Status.FAIL, Action.RESET_GPU),
    (2, "Node Reboot Required", Status.FAIL, Action.REBOOT),
    (3, "Drain P2P", Status.FAIL, Action.DRAIN),
    (4, "Drain and Reset", Status.FAIL, Action.DRAIN),
])
def test_xid154_stated_recovery_action(value: int, name: str, status: Status, action: Action) -> None:
    text = f"NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x{value:x} ({name})"
    r = run(xid(154, NOW - 1, text=text))["gpu0"]
    assert (r.status, r.action) == (status, action)


def test_xid154_latest_state_wins_and_unstated_is_conservative() -> None:
    first = "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x4 (Drain and Reset)"
    then = "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x4 (Drain and Reset) to 0x1 (GPU Reset Required)"
    assert run(xid(154, NOW - 2, text=first), xid(154, NOW - 1, text=then))["gpu0"].action is Action.RESET_GPU
    r = run(xid(154, NOW - 1, text="NVRM: Xid (PCI:0000:18:00): 154 ("))["gpu0"]
    assert (r.status, r.action) == (Status.WARN, Action.DRAIN)


@pytest.mark.parametrize("row", list(csv.DictReader(open(OWN / "nvlink5_expected.tsv", encoding="utf-8"),
                                                    delimiter="\t", quoting=csv.QUOTE_NONE)),
                         ids=lambda r: r["line"][30:80])
def test_nvlink5_subcode_decode(row: dict[str, str]) -> None:
    p = parse_line(row["line"])
    assert p is not None
    d = CAT.decode_nvlink5(p.code, p.nvlink5)
    assert (d.bucket, d.rule.action.value, d.rule.severity) == (row["bucket"], row["action"], row["severity"])
    assert d.text  # a human-readable cause for the evidence


def test_nvlink5_xid154_eval_defers_to_a_154_on_the_same_gpu() -> None:
    line = ("NVRM: Xid (PCI:0000:18:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 05 "
            "(0x0408a8e2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)")
    alone = run(xid(145, NOW - 1, text=line))["gpu0"]
    assert (alone.status, alone.action) == (Status.WARN, Action.RESTART_APP)
    assert "XID_154_EVAL" in dict(alone.evidence)["reason"]
    reboot = "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    both = run(xid(145, NOW - 1, text=line), xid(154, NOW - 0.5, text=reboot))["gpu0"]
    assert (both.status, both.action) == (Status.FAIL, Action.REBOOT)


def test_unknown_code_is_flagged_and_does_not_fence() -> None:
    r = run(xid(4242, NOW - 1))["gpu0"]
    assert (r.status, r.action) == (Status.WARN, Action.DRAIN)
    assert dict(r.evidence)["unknown"] == "true" and dict(r.evidence)["unknown_codes"] == "4242"


def test_events_age_out_of_the_window() -> None:
    old = xid(79, NOW - WINDOW - 1)
    assert run(old)["gpu0"].status is Status.OK
    assert run(xid(79, NOW - WINDOW + 1))["gpu0"].status is Status.FAIL


def test_xid79_reboots_and_recurring_asks_for_replacement() -> None:
    r = run(xid(79, NOW - 5))["gpu0"]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)
    r2 = run(xid(79, NOW - 1000), xid(79, NOW - 5))["gpu0"]
    assert r2.action is Action.REPLACE


def test_fallen_off_bus_without_xid_counts_as_79_once() -> None:
    kern = Event(kind="kernel", code=79, time=NOW - 5, pci_bus_id=pci(3),
                 text="NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus.")
    r = run(kern)["gpu3"]
    assert (r.status, r.action) == (Status.FAIL, Action.REBOOT)
    # With the Xid line too, it is one fault, not a recurrence (which would ask for REPLACE).
    assert run(kern, xid(79, NOW - 5, gpu=3))["gpu3"].action is Action.REBOOT


def test_gpu_not_known_by_pci_is_named_by_its_address() -> None:
    e = Event(kind="xid", code=79, time=NOW - 1, pci_bus_id="0000:ee:00.0", text="NVRM: Xid (PCI:0000:ee:00): 79")
    res = run(e)
    assert res["pci:0000:ee:00.0"].status is Status.FAIL and len(res) == 9


def test_info_codes_stay_ok_but_are_shown() -> None:
    r = run(xid(43, NOW - 1))["gpu0"]
    assert (r.status, r.action) == (Status.OK, Action.NONE)
    assert dict(r.evidence)["codes"] == "43x1"


def test_evidence_is_bounded() -> None:
    long = "NVRM: Xid (PCI:0000:18:00): 4243, " + "x" * 2000
    r = run(*(xid(c, NOW - 1, text=long) for c in range(4243, 4300)))["gpu0"]
    assert len(r.evidence) <= MAX_EVIDENCE_ITEMS
    assert all(len(v) <= MAX_EVIDENCE_CHARS for _, v in r.evidence)


def test_sxid_per_switch() -> None:
    res = run(
        sxid(20034, NOW - 3, "nvswitch0", "Fatal, Link 30 LTSSM Fault Up"),
        sxid(20009, NOW - 3, "nvswitch1", "Non-fatal, Link 04 RX Short Error Rate"),
        sxid(24007, NOW - 3, "nvswitch2", "Non-fatal, Link 28 sourcetrack timeout error"),
        sxid(23001, NOW - 3, "nvswitch3", "Non-fatal, Link 1 ingress SRC-VC buffer overflow"),
        sxid(31337, NOW - 3, "nvswitch4", "Fatal, Link 1 mystery"),
        switches=("nvswitch5",),
    )
    got = {k: (v.check, v.status, v.action) for k, v in res.items() if k.startswith("nvswitch")}
    assert got == {
        "nvswitch0": ("sxid", Status.FAIL, Action.REBOOT),
        "nvswitch1": ("sxid", Status.OK, Action.NONE),  # non-fatal, recovery "not applicable"
        "nvswitch2": ("sxid", Status.WARN, Action.NONE),  # potentially fatal, reported non-fatal
        "nvswitch3": ("sxid", Status.FAIL, Action.REBOOT),  # always fatal, whatever the line says
        "nvswitch4": ("sxid", Status.FAIL, Action.DRAIN),  # unknown, reported fatal
        "nvswitch5": ("sxid", Status.OK, Action.NONE),
    }
    assert dict(res["nvswitch4"].evidence)["unknown"] == "true"


# ---- real captures ---------------------------------------------------------------------------

# NVIDIA's immediate bucket -> what podhealth must answer for one event alone (the reading
# documented at the top of checks/data/xid_catalog.yaml, written out again here).
EXPECTED_ALONE = {
    "IGNORE": (Status.OK, Action.NONE),
    "RESTART_APP": (Status.WARN, Action.RESTART_APP),
    "RESET_GPU": (Status.FAIL, Action.RESET_GPU),
    "RESTART_BM": (Status.FAIL, Action.REBOOT),
    "CONTACT_SUPPORT": (Status.FAIL, Action.DRAIN),
    "WORKFLOW_XID_48": (Status.FAIL, Action.RESET_GPU),
    "WORKFLOW_XID_45": (Status.OK, Action.NONE),
}
RECOVERY = {"None": Action.NONE, "GPU Reset Required": Action.RESET_GPU, "Node Reboot Required": Action.REBOOT,
            "Drain P2P": Action.DRAIN, "Drain and Reset": Action.DRAIN}


def _buckets(shared: Path) -> dict[int, str]:
    with open(shared / "xid_catalog" / "xid_catalog_with_investigatory.csv", encoding="utf-8", newline="") as f:
        return {int(r["xid"]): r["immediate_action"].strip() for r in csv.DictReader(f)}


def _real_lines(shared: Path) -> list[tuple[str, ParsedLine]]:
    out = []
    for log in sorted((shared / "xid_kernel_logs").glob("*.log")):
        a = LineAssembler()
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            p = a.feed(line, year=2024)
            if isinstance(p, ParsedLine) and p.kind == "xid":
                out.append((log.name, p))
    return out


def test_real_xid_lines_map_to_the_catalog_action(shared_fixtures: Path) -> None:
    buckets = _buckets(shared_fixtures)
    checked = 0
    for name, p in _real_lines(shared_fixtures):
        ev = Event(kind="xid", code=p.code, time=NOW - 1, text=p.message, pci_bus_id=p.pci_bus_id)
        r = evaluate_xids([ev], CAT, NOW, WINDOW, {p.pci_bus_id: (0, "")})[0]
        bucket = buckets[p.code]
        if p.code in (13, 31):  # one line alone: the application
            want = (Status.WARN, Action.RESTART_APP)
        elif bucket == "XID_154":
            assert p.recovery is not None
            want = (Status.FAIL, RECOVERY[p.recovery.to_name])
        elif bucket == "WORKFLOW_NVLINK5_ERR":
            d = CAT.decode_nvlink5(p.code, p.nvlink5)
            assert d.bucket, f"{name}: real NVLink5 line not in NVIDIA's decode table: {p.message}"
            continue  # decode expectations: nvlink5_expected.tsv
        else:
            want = EXPECTED_ALONE[bucket]
        assert (r.status, r.action) == want, (name, p.message)
        checked += 1
    assert checked > 600


def test_real_captures_end_to_end_verdicts(shared_fixtures: Path) -> None:
    """Whole captures, every event in one window: the workflows over real sequences."""
    def verdict(log: str) -> dict[str, CheckResult]:
        asm = LineAssembler()
        evs = [Event(kind={"xid": "xid", "sxid": "sxid", "fallen_off_bus": "kernel"}[p.kind],  # type: ignore[arg-type]
                     code=p.code, time=NOW - 10, text=p.message, pci_bus_id=p.pci_bus_id if p.kind != "sxid" else "",
                     device=p.device)
               for p in (asm.feed(x, year=2024)
                         for x in (shared_fixtures / "xid_kernel_logs" / log).read_text().splitlines())
               if isinstance(p, ParsedLine)]
        return {r.entity: r for r in evaluate_xids(evs, CAT, NOW, WINDOW, {})}

    dbe = verdict("dmesg_iso_xid48_63_94_dbe_rowremap_contained_peermem.log")["pci:0000:19:00.0"]
    assert (dbe.status, dbe.action) == (Status.FAIL, Action.DRAIN)  # 48 with 63: drain and reset
    off = verdict("kmsg_xid79_fallen_off_bus_plus_sxid20034_h100.log")
    assert (off["pci:0000:91:00.0"].status, off["pci:0000:91:00.0"].action) == (Status.FAIL, Action.REBOOT)
    assert all(off[s].action is Action.REBOOT for s in ("nvswitch0", "nvswitch1", "nvswitch2"))
    gb = verdict("kmsg_gb200_xid149_154_nvlink5_recovery_action.log")
    assert gb["pci:0008:01:00.0"].action is Action.RESET_GPU  # 154 -> GPU Reset Required, 149 link fatal
    assert gb["pci:0009:01:00.0"].action is Action.DRAIN  # its 154 says Drain and Reset
    lost = verdict("dmesg_fallen_off_bus_no_xid_multiline_570.log")["pci:0000:b3:00.0"]
    assert (lost.status, lost.action) == (Status.FAIL, Action.REBOOT)
