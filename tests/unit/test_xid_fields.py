"""The kernel line is parsed once: the collector's Event carries what the parser read
(Event.kernel), checks/passive/xid.py judges from those fields, and an event that carries none
(an older agent's, one built from text) is completed by the same parser, in one place."""

from __future__ import annotations

import ast
import json
from dataclasses import replace
from pathlib import Path

import pytest

from podhealth.checks.passive import xid as xid_rules
from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.collectors.kmsg import create
from podhealth.collectors.xid_parse import LineAssembler, ParsedLine, event_of, parse_line, with_kernel_fields
from podhealth.config import loads
from podhealth.sim import kmsg_lines
from podhealth.sim.state import Fault, default_state
from podhealth.vocab import Action, Event, KernelFields, Nvlink5Payload, RecoveryChange, Status

REPO = Path(__file__).resolve().parents[2]
NOW = 1_000_000.0
CAT = load_catalog()
GPUS = {"0000:18:00.0": (0, "GPU-0")}

L154 = "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
L145 = ("NVRM: Xid (PCI:0000:18:00): 145, RLW_SRC_TRACK Nonfatal XC1 i0 Link 05 "
        "(0x0408a8e2 0x00000008 0x00000000 0x00000000 0x00000000 0x00000000)")
L43 = "NVRM: Xid (PCI:0000:18:00): 43, pid=4242, name=python3, Ch 00000008"
SXID_FATAL = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 20034, Fatal, Link 33 LTSSM Fault Up"
SXID_NONFATAL = "nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error"


def collected(tmp_path: Path, *lines: str) -> tuple[Event, ...]:
    log = tmp_path / "kern.log"
    log.write_text("".join(f"[ 10.0] {line}\n" for line in lines))
    c = create(loads(f"paths: {{kmsg: {log}}}\ncollectors: {{kmsg: {{from_start: true}}}}\n"),
               nvml=None, gpu_index_of=lambda pci: {"0000:18:00.0": 0}.get(pci), boot_time=lambda: NOW - 20)
    try:
        return c.collect().events
    finally:
        c.close()


def verdicts(events: list[Event], gpu_ids: xid_rules.GpuIds | None = None) -> dict[str, tuple[Status, Action, str]]:
    """What the rules decided, per entity (the evidence's `last` quotes the text, so it is left out)."""
    res = evaluate_xids(events, CAT, NOW, 3600.0, GPUS if gpu_ids is None else gpu_ids)
    return {r.entity: (r.status, r.action, dict(r.evidence).get("reason", "")) for r in res}


def test_the_collectors_event_carries_what_the_line_said(tmp_path: Path) -> None:
    ev154, ev145, ev43, sx, sxn = collected(tmp_path, L154, L145, L43, SXID_FATAL, SXID_NONFATAL)
    assert (ev154.kind, ev154.code, ev154.pci_bus_id, ev154.gpu) == ("xid", 154, "0000:18:00.0", 0)
    assert ev154.kernel == KernelFields(recovery=RecoveryChange(0, "None", 2, "Node Reboot Required"))
    assert ev154.subcode == 2
    assert ev145.kernel is not None and ev145.kernel.nvlink5 == Nvlink5Payload(
        unit="RLW_SRC_TRACK", fatal=False, cross_contain=1, injected=0, link=5,
        registers=(0x0408a8e2, 0x8, 0, 0, 0, 0))
    assert (ev145.kernel.fatal, ev145.kernel.link, ev145.subcode) == (False, 5, 0x0408a8e2)
    assert (ev43.pid, ev43.process, ev43.kernel) == (4242, "python3", KernelFields())
    assert (sx.kind, sx.device, sx.pci_bus_id, sx.gpu) == ("sxid", "nvswitch2", "", None)
    assert sx.kernel == KernelFields(fatal=True, link=33)
    assert sxn.kernel == KernelFields(fatal=False, link=32)


def test_the_collectors_nvml_event_carries_empty_fields_not_missing_ones(tmp_path: Path) -> None:
    """An NVML XID has no line: its fields are known to be empty, so nothing tries to parse its text."""
    from podhealth.collectors.nvml_events import NvmlXid

    class Source:
        def __init__(self) -> None:
            self.queue = [NvmlXid("0000:18:00.0", 0, 154, NOW)]

        def poll(self, max_events: int) -> list[NvmlXid]:
            out, self.queue = self.queue, []
            return out

        def gpu_index_by_pci(self) -> dict[str, int]:
            return {"0000:18:00.0": 0}

        def close(self) -> None:
            pass

    log = tmp_path / "kern.log"
    log.write_text("")
    clock = [NOW]
    c = create(loads(f"paths: {{kmsg: {log}}}\n"), nvml=Source, clock=lambda: clock[0])
    assert c.collect().events == ()  # held for its kernel line
    clock[0] += 3
    (ev,) = c.collect().events
    c.close()
    assert (ev.source, ev.code, ev.kernel) == ("nvml", 154, KernelFields())
    assert verdicts([ev])["gpu0"][:2] == (Status.WARN, Action.DRAIN)  # recovery unstated: conservative


def test_rules_judge_by_fields_not_by_the_text(tmp_path: Path) -> None:
    """Events whose text is garbage but whose fields are right are judged by the fields."""
    good = collected(tmp_path, L154, L145, SXID_FATAL, SXID_NONFATAL)
    garbage = [replace(e, text="garbage: not a kernel line") for e in good]
    want = verdicts(list(good))
    assert want["gpu0"][:2] == (Status.FAIL, Action.REBOOT)  # 154 says reboot; 145 defers to it
    assert want["nvswitch2"][0] is Status.FAIL
    assert verdicts(garbage) == want
    # And the other way round: the fields decide even where the text says otherwise.
    lying = replace(good[0], kernel=KernelFields(recovery=RecoveryChange(0, "None", 1, "GPU Reset Required")))
    assert verdicts([lying])["gpu0"][:2] == (Status.FAIL, Action.RESET_GPU)
    nonfatal = replace(good[2], kernel=KernelFields(fatal=False, link=33))
    assert verdicts([nonfatal]) != verdicts([good[2]])


def test_an_event_without_fields_is_judged_through_the_one_parser(tmp_path: Path) -> None:
    """An older agent's events (text only) get the same verdicts as the collector's."""
    good = collected(tmp_path, L154, L145, L43, SXID_FATAL, SXID_NONFATAL)
    legacy = [replace(e, kernel=None) for e in good]
    assert verdicts(legacy) == verdicts(list(good))
    assert with_kernel_fields(legacy[0]) == good[0]  # the same parser fills in the same fields
    blank = Event(kind="xid", code=154, time=NOW - 1, gpu=0)  # built by hand, no text at all
    assert with_kernel_fields(blank).kernel == KernelFields()
    ras = Event(kind="edac", code=1, time=NOW, text=L154)  # not a kind the XID parser reads
    assert with_kernel_fields(ras) is ras


def test_event_json_round_trip_and_an_older_agents_body(tmp_path: Path) -> None:
    for ev in collected(tmp_path, L154, L145, L43, SXID_FATAL):
        body = json.loads(json.dumps(ev.to_json()))
        assert Event.from_json(body) == ev
        old = {k: v for k, v in body.items() if k != "kernel"}  # what an agent before Event.kernel sent
        assert Event.from_json(old) == replace(ev, kernel=None)
        assert verdicts([Event.from_json(old)]) == verdicts([ev])


@pytest.mark.parametrize("body, problem", [
    ({"kind": "xid", "code": "79", "time": 1.0}, "code"),
    ({"kind": "nope", "code": 79, "time": 1.0}, "kind"),
    ({"kind": "xid", "code": 79, "time": 1.0, "kernel": []}, "kernel"),
    ({"kind": "xid", "code": 79, "time": 1.0, "kernel": {"fatal": "yes"}}, "kernel.fatal"),
    ({"kind": "xid", "code": 79, "time": 1.0, "kernel": {"recovery": {"from_value": 0, "to_value": "2"}}},
     "kernel.recovery.to_value"),
    ({"kind": "xid", "code": 145, "time": 1.0, "kernel": {"nvlink5": {"unit": "X", "fatal": True,
      "cross_contain": 1, "injected": 0, "link": 1, "registers": ["0x1"]}}}, "kernel.nvlink5.registers"),
])
def test_event_from_json_refuses_bad_bodies(body: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Event.from_json(body)


def test_the_rules_do_not_read_kernel_text() -> None:
    """checks/passive/xid.py takes only the fallback from the parser and has no pattern of its own."""
    tree = ast.parse((REPO / "checks" / "passive" / "xid.py").read_text(encoding="utf-8"))
    imported = {(n.module, a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    plain = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {name for mod, name in imported if mod == "podhealth.collectors.xid_parse"} == {"with_kernel_fields"}
    assert "re" not in plain


def test_simulated_kernel_lines_carry_their_fields() -> None:
    """The simulator's driver lines, as the collector parses them."""
    state = default_state("dgx-h100")
    for code in sorted(kmsg_lines.XID_TEXT):
        lines = kmsg_lines.lines_for(state, Fault(kind="xid", injected_at=100.0, gpu=2, code=code), 0.0, 1)
        parsed = [p for p in (parse_line(x) for x in lines) if p is not None and p.kind == "xid"]
        assert [p.code for p in parsed] == [code]
        ev = event_of(parsed[0], at=NOW - 1, gpu=2)
        assert ev.kernel == parsed[0].kernel and ev.pci_bus_id == state.gpu(2).pci_bus_id_short.lower()
        if code == 154:
            assert ev.kernel is not None and ev.kernel.recovery == RecoveryChange(0, "None", 1, "GPU Reset Required")
        if code in (31, 43, 45, 109):
            assert (ev.pid, ev.process) == (4242, "python3")


def test_real_captures_judged_the_same_from_fields_as_from_text(shared_fixtures: Path) -> None:
    """Every capture in the corpus: the collector's events, their text blanked, get the verdicts
    their text alone gets through the fallback (so the fields carry everything the rules read)."""
    checked = 0
    for log in sorted((shared_fixtures / "xid_kernel_logs").glob("*.log")):
        asm = LineAssembler()
        parsed = [p for p in (asm.feed(x, year=2024) for x in log.read_text(errors="replace").splitlines())
                  if isinstance(p, ParsedLine)]
        if not parsed:
            continue
        carried = [event_of(p, at=NOW - 10) for p in parsed]
        blind = [replace(e, text="") for e in carried]
        legacy = [replace(e, kernel=None) for e in carried]
        assert verdicts(blind, {}) == verdicts(legacy, {}), log.name
        assert all(e.kernel is not None for e in carried)
        checked += len(carried)
    assert checked > 100
