"""Host errors under the GPUs: PCIe AER, EDAC/MCE, NVMe -- parsers, collectors, rules, simulator faults.

Own fixtures (tests/fixtures/host_errors) carry non-zero counts in the kernel's formats; the
corpus tests read the real captures in ../shared/fixtures/host_errors when they exist.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import CHECKS, Evaluator
from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.aer_parse import LONG_TO_SHORT, device_kind, parse_aer_file, parse_rootport_total
from podhealth.collectors.edac import EdacCollector
from podhealth.collectors.kmsg import KmsgCollector
from podhealth.collectors.kmsg_reader import FileFollower
from podhealth.collectors.nvme import NvmeCollector, dir_source
from podhealth.collectors.nvme_parse import parse_smart_log
from podhealth.collectors.pcie_aer import PcieAerCollector
from podhealth.collectors.ras_parse import parse as parse_ras
from podhealth.config import ChecksConfig, Config
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Event, Sample, Status

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "host_errors"
REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "fixtures" / "host_errors"
H100 = profiles.load("dgx-h100")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=f"real captures not found at {SHARED} "
                                  "(CI has ../shared beside the clone)")


# ---- parsers -------------------------------------------------------------------------------------


def test_aer_long_and_short_names_give_the_same_series() -> None:
    long = parse_aer_file("Receiver Error 2\nBad TLP 0\nRELAY_NUM Rollover 0\nTOTAL_ERR_COR 2\n")
    short = parse_aer_file("RxErr 2\nBadTLP 0\nRollover 0\nTOTAL_ERR_COR 2\n")
    assert long == short
    assert dict(long.errors)["RxErr"] == 2 and long.total == 2


def test_aer_unknown_bit_is_kept_and_missing_total_falls_back() -> None:
    c = parse_aer_file("RxErr 0\nSomeFutureBit 7\n")
    assert ("SomeFutureBit", 7) in c.errors and c.total is None and c.effective_total == 7


@pytest.mark.parametrize("text", ["", "RxErr\n", "RxErr -1\n", "RxErr 1 2\n", "RxErr 0x10\n", "RxErr " + "9" * 30])
def test_aer_malformed_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_aer_file(text)


def test_rootport_total() -> None:
    assert parse_rootport_total("14\n") == 14
    with pytest.raises(ValueError):
        parse_rootport_total("n/a")


@pytest.mark.parametrize("vendor,klass,ib,kind", [
    (0x10DE, 0x030200, False, "gpu"), (0x10DE, 0x068000, False, "nvswitch"), (0x15B3, 0x020700, True, "hca"),
    (0x144D, 0x010802, False, "nvme"), (0x8086, 0x060400, False, "port"), (0x8086, 0x020000, False, "other"),
    (0x1A03, 0x030000, False, "other"),  # an ASPEED BMC VGA is no GPU of ours
])
def test_device_kind(vendor: int, klass: int, ib: bool, kind: str) -> None:
    assert device_kind(vendor, klass, ib) == kind


def test_smart_log_v1_16_and_v2_11_shapes() -> None:
    old = parse_smart_log((OWN / "smart_v1.16_nvme0.json").read_text())
    assert old.critical_warning == 0 and old.temperature_c == 37 and old.media_errors == 0
    assert old.error_log_entries == 4 and old.percentage_used == 3
    new = parse_smart_log((OWN / "smart_v2.11_critical.json").read_text())
    assert new.critical_warning == 12 and new.media_errors == 57 and new.available_spare_pct == 8
    assert new.percentage_used == 104 and new.temperature_c == 45


@pytest.mark.parametrize("text", ["", "[]", "{", "not json", "[" * 100_000, '{"media_errors": ' + "9" * 5000 + "}"])
def test_smart_log_garbage_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError):
        parse_smart_log(text)


def test_smart_log_odd_values_are_none_not_zero() -> None:
    log = parse_smart_log(json.dumps({"critical_warning": "x", "media_errors": None, "avail_spare": True,
                                      "percent_used": -1.0, "num_err_log_entries": 10 ** 400, "temperature": -5}))
    assert log.critical_warning is None and log.media_errors is None and log.available_spare_pct is None
    assert log.percentage_used is None and log.error_log_entries is None and log.temperature_c is None


def test_ras_lines() -> None:
    lines = (OWN / "kern_ras.log").read_text().splitlines()
    got = [parse_ras(line) for line in lines]
    kinds = [(r.kind, r.uncorrected, r.count, r.source) if r else None for r in got]
    assert kinds == [("mce", None, 1, ""), None, None,
                     ("edac", False, 1, "mc2"), ("edac", True, 1, "mc0"), ("mce", True, 1, "bank13"),
                     ("aer", True, 1, "0000:18:00.0")]  # the fatal AER line: the fast path of pcie_aer_fatal
    assert got[4] is not None and got[4].label == "CPU_SrcID#0_MC#0_Chan#1_DIMM#0"


# ---- collectors ----------------------------------------------------------------------------------


def test_registered_with_config_and_documented_metrics() -> None:
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    for name, cls in (("pcie_aer", PcieAerCollector), ("edac", EdacCollector), ("nvme", NvmeCollector)):
        assert REGISTRY[name] == f"podhealth.collectors.{name}:create"
        assert factory(name).__module__ == f"podhealth.collectors.{name}"
        assert getattr(Config().collectors, name).enabled
        section = doc.split(f"## {name} ", 1)[1].split("\n## ", 1)[0]
        assert set(cls.metrics) == set(re.findall(r"^\| (\w+) \|", section, re.M))


def _samples(c: object) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    col = c.collect()  # type: ignore[attr-defined]
    return {(s.name, s.labels): s.value for s in col.samples}


def _one(col: list[Sample], name: str, **labels: str) -> Sample:
    found = [s for s in col if s.name == name and all(s.label(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def test_pcie_aer_reads_the_tree_and_ties_ports_to_devices() -> None:
    col = PcieAerCollector(OWN / "aer_tree" / "sys").collect()
    s = list(col.samples)
    assert col.errors == ()
    assert _one(s, "pcie_aer_devices").value == 4
    gpu = _one(s, "pcie_aer_errors", pci="0000:18:00.0", severity="fatal")
    assert gpu.value == 1 and gpu.label("kind") == "gpu"
    assert _one(s, "pcie_aer_errors", pci="0000:18:00.0", severity="correctable").value == 14
    assert _one(s, "pcie_aer_error_bits", pci="0000:18:00.0", error="SDES").value == 1  # long name mapped
    assert _one(s, "pcie_aer_errors", pci="0000:17:00.0", severity="fatal").label("device") == "mlx5_0"
    port = _one(s, "pcie_aer_errors", pci="0000:10:01.0", severity="fatal")
    assert port.label("kind") == "port" and port.label("serves") == "gpu:0000:18:00.0,mlx5_0"
    assert _one(s, "pcie_aer_rootport_errors", pci="0000:10:01.0", severity="fatal").value == 1
    assert _one(s, "pcie_aer_errors", pci="0000:45:00.0", severity="fatal").label("kind") == "other"
    assert not [x for x in s if x.name == "pcie_aer_error_bits" and x.value == 0]


def test_pcie_aer_without_pci_in_sysfs_fails_the_collection(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        PcieAerCollector(tmp_path).collect()


def test_pcie_aer_one_garbled_file_skips_that_counter_only(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(OWN / "aer_tree" / "sys", root, symlinks=True)
    (root / "devices/pci0000:10/0000:10:01.0/0000:18:00.0/aer_dev_correctable").write_text("garbage here\n")
    col = PcieAerCollector(root).collect()
    assert any("0000:18:00.0/aer_dev_correctable" in e for e in col.errors)
    s = list(col.samples)
    assert _one(s, "pcie_aer_errors", pci="0000:18:00.0", severity="fatal").value == 1
    assert not [x for x in s if x.label("pci") == "0000:18:00.0" and x.label("severity") == "correctable"]


def test_pcie_aer_again_keeps_what_held_and_sees_what_changed(tmp_path: Path) -> None:
    """The collector keeps each file's parse and last cycle's Samples: an unchanged counter is the
    same object, a changed file is read afresh, and a garbled one is reported every cycle."""
    root = tmp_path / "sys"
    shutil.copytree(OWN / "aer_tree" / "sys", root, symlinks=True)
    gpu = root / "devices/pci0000:10/0000:10:01.0/0000:18:00.0"
    (gpu / "aer_dev_correctable").write_text("garbage here\n")
    c = PcieAerCollector(root)
    first = c.collect()
    fatal = gpu / "aer_dev_fatal"
    fatal.write_text(fatal.read_text().replace("TOTAL_ERR_FATAL 1", "TOTAL_ERR_FATAL 3"))
    second = c.collect()
    assert [e for e in second.errors if "aer_dev_correctable" in e] == [e for e in first.errors if "aer_dev_correctable" in e] != []
    assert _one(list(second.samples), "pcie_aer_errors", pci="0000:18:00.0", severity="fatal").value == 3
    port = dict(pci="0000:10:01.0", severity="fatal")
    assert _one(list(second.samples), "pcie_aer_errors", **port) is _one(list(first.samples), "pcie_aer_errors", **port)
    assert {(x.name, x.labels, x.value) for x in second.samples} - {(x.name, x.labels, x.value) for x in first.samples} \
        == {(x.name, x.labels, x.value) for x in second.samples if x.label("pci") == "0000:18:00.0"
            and x.label("severity") == "fatal" and x.name == "pcie_aer_errors"}


def test_edac_dimm_layout_wins_over_csrow_emulation() -> None:
    s = list(EdacCollector(OWN / "edac_tree" / "sys").collect().samples)
    assert _one(s, "edac_memory_controllers").value == 2
    assert _one(s, "edac_mc_errors", mc="mc0", type="ue").value == 1
    d = _one(s, "edac_dimm_errors", mc="mc0", dimm="dimm1", type="ue")
    assert d.value == 1 and d.label("label") == "CPU_SrcID#0_MC#0_Chan#1_DIMM#0"
    assert not [x for x in s if x.label("label") == "emulated"]


def test_edac_absent_driver_is_said(tmp_path: Path) -> None:
    col = EdacCollector(tmp_path).collect()
    assert [x.value for x in col.samples if x.name == "edac_memory_controllers"] == [0]
    assert "EDAC driver not loaded" in col.errors[0]


def test_nvme_sysfs_and_smart_through_the_seam(tmp_path: Path) -> None:
    smart = tmp_path / "smart"
    smart.mkdir()
    shutil.copy(OWN / "smart_v2.11_critical.json", smart / "nvme0.json")  # nvme1 has none: unread
    col = NvmeCollector(OWN / "nvme_tree" / "sys", dir_source(smart)).collect()
    s = list(col.samples)
    info = _one(s, "nvme_info", controller="nvme0")
    assert info.label("model") == "SAMSUNG MZQL23T8HCLS-00A07" and info.label("pci") == "0000:c1:00.0"
    assert _one(s, "nvme_controller_live", controller="nvme1").value == 0
    assert _one(s, "nvme_critical_warning", controller="nvme0").value == 12
    assert _one(s, "nvme_smart_up", controller="nvme1").value == 0
    assert any("nvme1" in e for e in col.errors)


def test_nvme_without_nvme_cli_has_no_smart_series() -> None:
    s = list(NvmeCollector(OWN / "nvme_tree" / "sys", None).collect().samples)
    assert {x.name for x in s} == {"nvme_info", "nvme_controller_live"}


def test_nvme_cli_is_run_without_a_shell_and_with_a_timeout(tmp_path: Path) -> None:
    from podhealth.collectors.nvme import cli_source

    fake = tmp_path / "nvme"
    fake.write_text("#!/bin/sh\n[ \"$1 $2 $3 $4\" = \"smart-log -o json /dev/nvme0\" ] || exit 3\n"
                    f"cat {OWN / 'smart_v1.16_nvme0.json'}\n")
    fake.chmod(0o755)
    assert parse_smart_log(cli_source(str(fake), 5.0)("nvme0")).power_on_hours == 9120
    with pytest.raises(RuntimeError, match="exited 3"):
        cli_source(str(fake), 5.0)("nvme1; rm -rf /")
    slow = tmp_path / "slow"
    slow.write_text("#!/bin/sh\nexec sleep 30\n")
    slow.chmod(0o755)
    import subprocess
    with pytest.raises(subprocess.TimeoutExpired):
        cli_source(str(slow), 0.3)("nvme0")


def test_kmsg_turns_edac_and_mce_lines_into_events(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    shutil.copy(OWN / "kern_ras.log", log)
    cfg = Config()
    c = KmsgCollector(cfg, reader=FileFollower(log, from_start=True), nvml=None, boot_time=lambda: 1_000_000.0,
                      clock=lambda: 1_010_000.0)
    col = c.collect()
    evs = [(e.kind, e.subcode, e.code, e.device) for e in col.events]
    assert evs == [("mce", None, 1, ""), ("edac", 0, 1, "mc2"), ("edac", 1, 1, "mc0"), ("mce", 1, 1, "bank13"),
                   ("aer", 1, 1, "0000:18:00.0")]
    assert col.events[2].time == pytest.approx(1_000_000.0 + 9400.118001)
    s = list(col.samples)
    assert _one(s, "ras_kernel_errors", kind="edac", source="mc0", severity="uncorrected").value == 1
    assert _one(s, "ras_kernel_errors", kind="mce", source="", severity="unknown").value == 1


# ---- rules ---------------------------------------------------------------------------------------

SOURCES = ("nvml", "kmsg", "pcie_aer", "edac", "nvme")


def _snap(samples: list[Sample], now: float, events: tuple[Event, ...] = ()) -> Snapshot:
    by: dict[str, list[Sample]] = {c: [] for c in SOURCES}
    for s in samples:
        src = next((c for c in ("pcie_aer", "edac", "nvme") if s.name.startswith(c)), "nvml")
        by[src].append(s)
    return Snapshot(now, {c: CollectorState(c, samples=tuple(v), last_success=now, last_attempt=now, stale=False)
                          for c, v in by.items()}, events=events)


def _gpus() -> list[Sample]:
    return [Sample.of("gpu_up", 1, gpu=3, uuid="GPU-3", pci_bus_id="00000000:18:00.0", model="H100")]


def _collected(*cols: object) -> list[Sample]:
    out: list[Sample] = []
    for c in cols:
        out.extend(c.collect().samples)  # type: ignore[attr-defined]
    return out


def _judge(samples: list[Sample], now: float = 1000.0, ev: Evaluator | None = None,
           events: tuple[Event, ...] = (), profile: profiles.Profile = H100) -> dict[tuple[str, str], CheckResult]:
    ev = ev or Evaluator(profile, ChecksConfig(), enabled=SOURCES)
    only = ("pcie_aer_fatal", "pcie_aer", "kernel_aer", "edac_ue", "edac_ce", "kernel_ras", "nvme")
    return {(r.check, r.entity): r for r in ev.evaluate(_snap(samples, now, events), now, damped=False, only=only)}


def test_fatal_aer_on_a_gpu_and_on_the_port_above_drain() -> None:
    res = _judge(_gpus() + _collected(PcieAerCollector(OWN / "aer_tree" / "sys")))
    g = res[("pcie_aer_fatal", "gpu3")]
    assert g.status is Status.FAIL and g.action is Action.DRAIN
    assert dict(g.evidence)["errors"] == "CmpltTO=1 SDES=1" and dict(g.evidence)["pci"] == "0000:18:00.0"
    # the root port counted the same message (aer_rootport_total_err_fatal 1): one finding, not two
    assert ("pcie_aer_fatal", "pci:0000:10:01.0") not in res


def test_fatal_counted_only_at_the_root_port_drains_what_it_serves() -> None:
    samples = _gpus() + [Sample.of("pcie_aer_devices", 2), _aer("0000:18:00.0", "gpu", "fatal", 0),
                         _aer("0000:10:01.0", "port", "fatal", 0, serves="gpu:0000:18:00.0,mlx5_0"),
                         Sample.of("pcie_aer_rootport_errors", 2, pci="0000:10:01.0", severity="fatal")]
    p = _judge(samples)[("pcie_aer_fatal", "pci:0000:10:01.0")]
    assert p.status is Status.FAIL and p.action is Action.DRAIN and dict(p.evidence)["serves"] == "gpu3,mlx5_0"
    samples[-2] = _aer("0000:10:01.0", "port", "fatal", 1, serves="gpu:0000:18:00.0,mlx5_0")
    p = _judge(samples)[("pcie_aer_fatal", "pci:0000:10:01.0")]  # the port's own counter: the same one finding
    assert p.status is Status.FAIL and "port above gpu3,mlx5_0" in p.summary


def _aer(pci: str, kind: str, sev: str, n: float, serves: str = "") -> Sample:
    return Sample.of("pcie_aer_errors", n, pci=pci, severity=sev, kind=kind, device="", serves=serves)


def test_fatal_aer_elsewhere_only_warns_and_clean_is_ok() -> None:
    res = _judge([Sample.of("pcie_aer_devices", 1), _aer("0000:45:00.0", "other", "fatal", 1)])
    assert res[("pcie_aer_fatal", "pci:0000:45:00.0")].status is Status.WARN
    res = _judge([Sample.of("pcie_aer_devices", 1), _aer("0000:45:00.0", "other", "fatal", 0)])
    assert res[("pcie_aer_fatal", "node")].status is Status.OK


def test_no_aer_statistics_is_unknown_never_fail() -> None:
    res = _judge([Sample.of("pcie_aer_devices", 0)])
    assert res[("pcie_aer_fatal", "node")].status is Status.UNKNOWN
    assert res[("pcie_aer", "node")].status is Status.UNKNOWN


def test_correctable_aer_rate_warns_after_consecutive_readings() -> None:
    from podhealth.checks.passive.rules import load

    assert load().damp("pcie_aer").consecutive == 3 and load().damp("pcie_aer_fatal").immediate
    ev = Evaluator(H100, ChecksConfig(), enabled=SOURCES)
    seen = []
    for i in range(6):
        now = 1000.0 + 30 * i
        samples = _gpus() + [Sample.of("pcie_aer_devices", 1),
                             _aer("0000:18:00.0", "gpu", "correctable", 10 * i)]  # 1200/h
        res = {(r.check, r.entity): r for r in ev.evaluate(_snap(samples, now), now)}
        seen.append(res[("pcie_aer", "gpu3")].status if ("pcie_aer", "gpu3") in res else Status.OK)
    assert Status.WARN in seen and seen[:2] == [Status.OK, Status.OK]
    last = res[("pcie_aer", "gpu3")]
    assert dict(last.evidence)["per_hour"] == "1200.0"


def test_nonfatal_and_correctable_on_one_function_are_one_warning() -> None:
    ev = Evaluator(H100, ChecksConfig(), enabled=SOURCES)
    for i, now in enumerate((1000.0, 1060.0)):
        res = _judge(_gpus() + [Sample.of("pcie_aer_devices", 1), _aer("0000:18:00.0", "gpu", "correctable", 100 * i),
                                _aer("0000:18:00.0", "gpu", "nonfatal", 2 * i)], now, ev)
    warns = [r for r in res.values() if r.check == "pcie_aer"]
    assert len(warns) == 1 and warns[0].entity == "gpu3" and warns[0].status is Status.WARN
    assert "6000/h" in warns[0].summary and "2 new uncorrectable (non-fatal)" in warns[0].summary


def test_edac_ue_drains_naming_the_dimm_and_ce_rate_warns() -> None:
    edac = EdacCollector(OWN / "edac_tree" / "sys")
    res = _judge(_collected(edac))
    ue = res[("edac_ue", "mc0")]
    assert ue.status is Status.FAIL and ue.action is Action.DRAIN
    assert "CPU_SrcID#0_MC#0_Chan#1_DIMM#0=1" in dict(ue.evidence)["dimms"]
    assert res[("edac_ue", "mc1")].status is Status.OK
    ev = Evaluator(H100, ChecksConfig(), enabled=SOURCES)
    base = [Sample.of("edac_memory_controllers", 1), Sample.of("edac_mc_errors", 0, mc="mc0", type="ue")]
    _judge(base + [Sample.of("edac_mc_errors", 0, mc="mc0", type="ce"),
                   Sample.of("edac_dimm_errors", 0, mc="mc0", dimm="dimm1", label="DIMM_B1", type="ce")], 1000.0, ev)
    res = _judge(base + [Sample.of("edac_mc_errors", 50, mc="mc0", type="ce"),
                         Sample.of("edac_dimm_errors", 50, mc="mc0", dimm="dimm1", label="DIMM_B1", type="ce")], 1300.0, ev)
    ce = res[("edac_ce", "mc0")]
    assert ce.status is Status.WARN and dict(ce.evidence)["dimms"] == "DIMM_B1=50"


def test_no_edac_driver_is_unknown() -> None:
    res = _judge([Sample.of("edac_memory_controllers", 0)])
    assert res[("edac_ue", "node")].status is Status.UNKNOWN


def test_kernel_ras_uncorrected_line_drains() -> None:
    now = 5000.0
    ue = Event(kind="edac", code=1, time=now - 10, text="EDAC MC0: 1 UE memory read error on DIMM_A1 (x)",
               device="mc0", subcode=1)
    ce = Event(kind="edac", code=16384, time=now - 10, text="EDAC MC0: 16384 CE ...", device="mc0", subcode=0)
    assert _judge([], now, events=(ce,))[("kernel_ras", "node")].status is Status.OK
    r = _judge([], now, events=(ce, ue))[("kernel_ras", "node")]
    assert r.status is Status.FAIL and r.action is Action.DRAIN and "DIMM_A1" in dict(r.evidence)["last"]


def _nvme(state: str = "live", **smart: float) -> list[Sample]:
    out = [Sample.of("nvme_info", 1, controller="nvme0", model="m", serial="s", firmware="f", state=state, pci="")]
    if smart:
        out.append(Sample.of("nvme_smart_up", 1, controller="nvme0"))
    out += [Sample.of(f"nvme_{k}", v, controller="nvme0") for k, v in smart.items()]
    return out


def test_nvme_rules() -> None:
    assert _judge(_nvme(critical_warning=0, percentage_used=3))[("nvme", "nvme0")].status is Status.OK
    r = _judge(_nvme(critical_warning=4))[("nvme", "nvme0")]
    assert r.status is Status.FAIL and r.action is Action.DRAIN and "reliability degraded" in r.summary
    soft = profiles.load("dgx-h100", {"thresholds.nvme_critical_fail": 0})
    assert _judge(_nvme(critical_warning=4), profile=soft)[("nvme", "nvme0")].status is Status.WARN
    assert _judge(_nvme(percentage_used=95))[("nvme", "nvme0")].status is Status.WARN
    assert _judge(_nvme(available_spare_percent=5))[("nvme", "nvme0")].status is Status.WARN
    assert _judge(_nvme(state="dead"))[("nvme", "nvme0")].status is Status.FAIL
    unread = [*_nvme(state="live"), Sample.of("nvme_smart_up", 0, controller="nvme0")]
    assert _judge(unread)[("nvme", "nvme0")].status is Status.UNKNOWN
    ev = Evaluator(H100, ChecksConfig(), enabled=SOURCES)
    _judge(_nvme(critical_warning=0, media_errors=0), 1000.0, ev)
    r = _judge(_nvme(critical_warning=0, media_errors=2), 1060.0, ev)[("nvme", "nvme0")]
    assert r.status is Status.WARN and "2 new NVMe media errors" in r.summary


def test_checks_and_rules_registered() -> None:
    from podhealth.checks.passive.rules import load

    for name in ("pcie_aer_fatal", "pcie_aer", "edac_ue", "edac_ce", "kernel_ras", "nvme"):
        assert name in CHECKS and name in load().damping


# ---- simulator ----------------------------------------------------------------------------------


def test_sim_faults_show_as_fails(tmp_path: Path) -> None:
    from podhealth.sim import faults
    from podhealth.sim.node import SimNode

    node = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    gpus = [Sample.of("gpu_up", 1, gpu=g.index, uuid=g.uuid, pci_bus_id=g.pci_bus_id, model=g.name)
            for g in node.state.gpus]

    def judge() -> dict[tuple[str, str], CheckResult]:
        cols = (PcieAerCollector(node.sys_root), EdacCollector(node.sys_root),
                NvmeCollector(node.sys_root, dir_source(node.dir / "nvme-smart")))
        return _judge(gpus + _collected(*cols))

    healthy = judge()
    assert all(r.status is Status.OK for r in healthy.values()), [r for r in healthy.values() if r.status is not Status.OK]
    now = node.state.t0 + 10
    for tokens in (["fault=pcie-aer-fatal", "gpu=2"], ["fault=edac-ue"], ["fault=nvme-critical"]):
        node.inject(faults.parse(tokens, now))
    res = judge()
    bad = {k: r for k, r in res.items() if r.status is not Status.OK}
    assert bad[("pcie_aer_fatal", "gpu2")].action is Action.DRAIN
    assert "CPU_SrcID#0_MC#0_Chan#1_DIMM#0" in dict(bad[("edac_ue", "mc0")].evidence)["dimms"]
    assert bad[("nvme", "nvme0")].status is Status.FAIL
    assert set(bad) == {("pcie_aer_fatal", "gpu2"), ("edac_ue", "mc0"), ("nvme", "nvme0")}
    assert "EDAC MC0: 1 UE memory read error" in node.kmsg_path.read_text()
    with pytest.raises(ValueError, match="gpu"):
        faults.parse(["fault=pcie-aer-fatal"], now)


# ---- corpus (real captures, read-only) -----------------------------------------------------------


@needs_shared
def test_corpus_abi_doc_samples_parse_with_long_names() -> None:
    text = (SHARED / "linux_ABI_sysfs-bus-pci-devices-aer_stats.txt").read_text()
    blocks = re.findall(r"# cat (aer_dev_\w+)\n((?:[ \t]+\S.*\n)+)", text)
    assert {b[0] for b in blocks} == {"aer_dev_correctable", "aer_dev_fatal", "aer_dev_nonfatal"}
    for name, body in blocks:
        c = parse_aer_file("\n".join(line.strip() for line in body.splitlines()))
        unmapped = [e for e, _ in c.errors if e not in LONG_TO_SHORT.values() and e != "Undefined" and e != "ECRC"]
        assert unmapped == [], (name, unmapped)
        if name == "aer_dev_correctable":
            assert dict(c.errors)["RxErr"] == 2 and c.total == 2


@needs_shared
def test_corpus_node_exporter_aer_tree(tmp_path: Path) -> None:
    # The capture holds the devices/ records only; sysfs's bus/pci/devices links are made here.
    root = tmp_path / "sys"
    shutil.copytree(SHARED / "node_exporter_pci_aer_tree" / "sys", root)
    bus = root / "bus" / "pci" / "devices"
    bus.mkdir(parents=True)
    for d in root.glob("devices/pci*/*/*"):
        os.symlink(os.path.relpath(d, bus), bus / d.name)
    col = PcieAerCollector(root).collect()
    s = list(col.samples)
    assert col.errors == ()
    assert _one(s, "pcie_aer_errors", pci="0000:01:00.0", severity="fatal").label("kind") == "nvme"
    assert _one(s, "pcie_aer_errors", pci="0000:45:00.0", severity="correctable").label("kind") == "other"
    assert all(x.value == 0 for x in s if x.name == "pcie_aer_errors")
    res = _judge(s)
    assert res[("pcie_aer_fatal", "node")].status is Status.OK


@needs_shared
def test_corpus_node_exporter_edac_tree_legacy_csrows() -> None:
    s = list(EdacCollector(SHARED / "node_exporter_edac_tree" / "sys").collect().samples)
    assert _one(s, "edac_mc_errors", mc="mc0", type="ue").value == 5
    assert _one(s, "edac_mc_noinfo_errors", mc="mc0", type="ue").value == 6
    assert _one(s, "edac_dimm_errors", dimm="csrow0_ch1", type="ue").label("label") == "mc0csrow0channel1"
    r = _judge(s)[("edac_ue", "mc0")]
    assert r.status is Status.FAIL and "mc0csrow" in dict(r.evidence)["dimms"]


@needs_shared
@pytest.mark.parametrize("name,expect", [
    ("dmesg_T_edac_skx_ce_read_and_scrub_overflow_retry_rd_err_log.log", [("edac", False, 16384), ("edac", False, 78)]),
    ("journal_kernel_edac_sbridge_mce_ce_scrubbing_radiasoft134.log", [("mce", None, 1), ("edac", False, 1)]),
    ("dmesg_T_edac_sbridge_262_ce_overflow_illinois66.log", [("edac", False, 262)]),
    ("dmesg_H_aer_uncorrected_fatal_sdes_cmpltto_nvidia_gpu_returnn1500.log", []),
])
def test_corpus_kernel_ras_lines(name: str, expect: list[tuple[str, bool | None, int]]) -> None:
    got = [parse_ras(line) for line in (SHARED / name).read_text(errors="replace").splitlines()]
    assert [(r.kind, r.uncorrected, r.count) for r in got if r] == expect


@needs_shared
def test_corpus_nvme_cli_key_table_versions() -> None:
    """Every documented key shape of every nvme-cli version parses to the same values."""
    rows = [line.split(",") for line in (SHARED / "nvme-cli_smart-log_json_keys_by_version.csv").read_text().splitlines()[1:]]
    for col in range(2, 6):
        doc: dict[str, object] = {}
        for row in rows:
            key, nested, shape = row[0], row[1], row[col] if col < len(row) else ""
            if not shape or nested or "%d" in key:
                continue
            kind = shape.split("@")[0].split("|")[0]
            value: object = {"int": 7, "uint": 7, "uint64": 7, "float": 7.0, "uint128": "7",
                             "object": {"value": 7}, "obj": {"value": 7}}[kind]
            doc[key] = value
        log = parse_smart_log(json.dumps(doc))
        assert (log.critical_warning, log.media_errors, log.percentage_used, log.available_spare_pct) == (7, 7.0, 7.0, 7.0), col


@needs_shared
def test_corpus_truncated_netdata_smart_log_is_refused() -> None:
    text = (SHARED / "nvme_list_and_smart-log_json_samsung_pm983_netdata8594_excerpt_truncated.txt").read_text()
    with pytest.raises(ValueError):
        parse_smart_log(text)
    # its smart_log object, closed here, reads as what the drive said: 322 K = 49 C
    body = text.split('"smart_log": ', 1)[1].rsplit(",", 1)[0] + "}"
    log = parse_smart_log(body)
    assert log.temperature_c == 49 and log.available_spare_pct == 100 and log.media_errors == 0


def test_a_file_that_cannot_be_read_is_reported_not_judged(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    shutil.copytree(OWN / "aer_tree" / "sys", root, symlinks=True)
    # a directory where a file is expected answers EISDIR: a per-file problem, reported
    target = root / "devices/pci0000:10/0000:10:01.0/0000:18:00.0/aer_dev_fatal"
    target.unlink()
    target.mkdir()
    col = PcieAerCollector(root).collect()
    assert any("aer_dev_fatal" in e for e in col.errors)
    assert not [x for x in col.samples if x.label("pci") == "0000:18:00.0" and x.label("severity") == "fatal"]


# ---- fuzz: the pure parsers raise only ValueError, and never invent negative counts ----------

from hypothesis import given, settings  # noqa: E402 - kept beside the tests that use it
from hypothesis import strategies as st  # noqa: E402

_AER_SEEDS = [(OWN / "aer_tree/sys/devices/pci0000:10/0000:10:01.0/0000:18:00.0" / n).read_text()
              for n in ("aer_dev_correctable", "aer_dev_fatal")]
_SMART_SEEDS = [(OWN / n).read_text() for n in ("smart_v1.16_nvme0.json", "smart_v2.11_critical.json")]
_RAS_SEEDS = (OWN / "kern_ras.log").read_text().splitlines()


def _mutated(seeds: list[str]) -> st.SearchStrategy[str]:
    cut = st.tuples(st.sampled_from(seeds), st.integers(0, 4000), st.text(max_size=40))
    return st.one_of(st.text(max_size=200), cut.map(lambda t: t[0][:t[1]] + t[2] + t[0][t[1]:]))


@settings(max_examples=300, deadline=None)
@given(_mutated(_AER_SEEDS))
def test_aer_parser_raises_only_value_error(text: str) -> None:
    try:
        c = parse_aer_file(text)
    except ValueError:
        return
    assert all(n >= 0 for _, n in c.errors) and c.effective_total >= 0


@settings(max_examples=300, deadline=None)
@given(_mutated(_SMART_SEEDS))
def test_smart_parser_raises_only_value_error(text: str) -> None:
    try:
        log = parse_smart_log(text)
    except ValueError:
        return
    for v in (log.media_errors, log.error_log_entries, log.percentage_used, log.available_spare_pct):
        assert v is None or v >= 0
    assert log.critical_warning is None or 0 <= log.critical_warning <= 0xFF


@settings(max_examples=300, deadline=None)
@given(_mutated(_RAS_SEEDS))
def test_ras_parser_never_raises(line: str) -> None:
    r = parse_ras(line)
    assert r is None or (r.count >= 0 and len(r.message) <= 512)


@pytest.mark.parametrize("line, pci", [
    # the root port names the device (older kernels, and 6.x's wording), and the device's own line
    ("[ 812.5] pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error received: 0000:18:00.0", "0000:18:00.0"),
    ("6,881,812500000,-;pcieport 0000:17:01.0: AER: Uncorrected (Fatal) error message received from 0000:18:00.0",
     "0000:18:00.0"),
    ("6,882,812500010,-;nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal), type=Inaccessible, "
     "(Unregistered Agent ID)", "0000:18:00.0"),
])
def test_fatal_aer_kernel_lines_parse(line: str, pci: str) -> None:
    from podhealth.collectors import ras_parse

    r = ras_parse.parse(line)
    assert r is not None and r.kind == "aer" and r.uncorrected and r.source == pci


@pytest.mark.parametrize("line", [
    "pcieport 0000:17:01.0: AER: Corrected error received: 0000:18:00.0",
    "nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Uncorrected (Non-Fatal), type=Transaction Layer, (Requester ID)",
    "nvidia 0000:18:00.0: AER: PCIe Bus Error: severity=Corrected, type=Physical Layer, (Receiver ID)",
])
def test_other_aer_lines_are_no_events(line: str) -> None:
    from podhealth.collectors import ras_parse

    assert ras_parse.parse(line) is None


def test_kernel_aer_drains_a_gpu_at_once_and_warns_for_a_device_it_cannot_name() -> None:
    now = 5000.0
    gpu = Event(kind="aer", code=1, time=now - 1, text="AER: PCIe Bus Error: severity=Uncorrected (Fatal)",
                device="0000:18:00.0", subcode=1, source="kmsg")
    other = Event(kind="aer", code=1, time=now - 1, text="AER: ...", device="0000:99:00.0", subcode=1, source="kmsg")
    assert _judge(_gpus(), now)[("kernel_aer", "node")].status is Status.OK
    res = _judge(_gpus(), now, events=(gpu, other))
    g = res[("kernel_aer", "gpu3")]
    assert g.status is Status.FAIL and g.action is Action.DRAIN and dict(g.evidence)["pci"] == "0000:18:00.0"
    assert res[("kernel_aer", "pci:0000:99:00.0")].status is Status.WARN
    assert ("kernel_aer", "node") not in res
