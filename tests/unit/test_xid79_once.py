"""One GPU falling off the bus is one XID 79: the driver prints the Xid 79 record and then its own
"NVRM: GPU <addr>: GPU has fallen off the bus." line (real captures: the next line, microseconds
later); the second line is folded into the first, and on its own it still fails the GPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.collectors.kmsg import KmsgCollector
from podhealth.collectors.xid_parse import LineAssembler, ParsedLine
from podhealth.sim import faults
from podhealth.sim.node import SimNode
from podhealth.vocab import Action, CheckResult, Event, Sample, Status
from tests.unit.test_kmsg_collector import collector, value

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "kmsg"
CAT = load_catalog()
GPUS = {"0000:1b:00.0": 0, "0000:43:00.0": 4}
X79 = "NVRM: Xid (PCI:0000:1b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
BUS = "NVRM: GPU 0000:1b:00.0: GPU has fallen off the bus."


def collect(tmp_path: Path, text: str) -> tuple[KmsgCollector, tuple[Event, ...], tuple[Sample, ...]]:
    log = tmp_path / "kern.log"
    log.write_text(text)
    c = collector(log, gpu_index_of=GPUS.get)
    got = c.collect()
    return c, got.events, got.samples


def verdicts(events: tuple[Event, ...]) -> dict[str, CheckResult]:
    now = max(e.time for e in events) + 1
    return {r.entity: r for r in evaluate_xids(list(events), CAT, now, 3600.0) if r.check == "xid"}


def evidence(r: CheckResult) -> dict[str, str]:
    return dict(r.evidence)


def fed(lines: list[str]) -> list[tuple[str, int, str]]:
    a = LineAssembler()
    return [(p.kind, p.code, p.pci_bus_id) for p in (a.feed(x) for x in lines) if isinstance(p, ParsedLine)]


# ---- the collector and the check, on the project's fixtures ------------------------------------


def test_xid79_and_its_bus_line_are_one_event_counted_once_and_one_fail(tmp_path: Path) -> None:
    _, events, samples = collect(tmp_path, (OWN / "xid79_fallen_off_bus.log").read_text())
    assert [(e.kind, e.code, e.gpu) for e in events] == [("xid", 79, 0)]
    assert events[0].text == X79  # the Xid record is the event
    assert value(samples, "xid_events", gpu="0", code="79") == 1
    assert value(samples, "kmsg_lines") == 5  # the folded line was read, not lost
    r = verdicts(events)
    assert list(r) == ["gpu0"]
    assert (r["gpu0"].status, r["gpu0"].action) == (Status.FAIL, Action.REBOOT)
    ev = evidence(r["gpu0"])
    assert (ev["codes"], ev["events"], ev["pci_bus_id"]) == ("79x1", "1", "0000:1b:00.0")


def test_bus_line_alone_still_fails_the_gpu(tmp_path: Path) -> None:
    _, events, samples = collect(tmp_path, (OWN / "fallen_off_bus_alone.log").read_text())
    assert [(e.kind, e.code, e.gpu, e.pci_bus_id) for e in events] == [("kernel", 79, 0, "0000:1b:00.0")]
    r = verdicts(events)
    assert (r["gpu0"].status, r["gpu0"].action) == (Status.FAIL, Action.REBOOT)
    assert evidence(r["gpu0"])["codes"] == "79x1"


def test_two_gpus_falling_off_are_two_events_and_two_fails(tmp_path: Path) -> None:
    _, events, samples = collect(tmp_path, (OWN / "xid79_fallen_off_bus_two_gpus.log").read_text())
    assert [(e.kind, e.code, e.gpu) for e in events] == [("xid", 79, 0), ("xid", 79, 4)]
    assert value(samples, "xid_events", gpu="0", code="79") == 1
    assert value(samples, "xid_events", gpu="4", code="79") == 1
    r = verdicts(events)
    assert {k: (v.status, v.action, evidence(v)["events"]) for k, v in r.items()} == {
        "gpu0": (Status.FAIL, Action.REBOOT, "1"), "gpu4": (Status.FAIL, Action.REBOOT, "1")}


def test_bus_line_read_in_the_next_collection_is_still_folded(tmp_path: Path) -> None:
    c, events, _ = collect(tmp_path, f"[ 10.000001] {X79}\n")
    assert [e.kind for e in events] == ["xid"]
    with open(tmp_path / "kern.log", "a") as f:
        f.write(f"[ 10.000005] {BUS}\n")
    got = c.collect()
    assert got.events == ()
    assert value(got.samples, "xid_events", gpu="0", code="79") == 1


# ---- the pairing rule (the assembler, pure) -----------------------------------------------------


def test_bus_line_of_another_gpu_stands() -> None:
    other = "NVRM: GPU 0000:43:00.0: GPU has fallen off the bus."
    assert fed([f"[ 10.000001] {X79}", f"[ 10.000005] {other}"]) == [
        ("xid", 79, "0000:1b:00.0"), ("fallen_off_bus", 79, "0000:43:00.0")]


def test_bus_line_stamped_apart_from_the_xid_is_a_second_fault() -> None:
    # Same GPU, 30 s later: not the summary of that Xid; never hidden.
    assert fed([f"[ 10.000001] {X79}", f"[ 40.000001] {BUS}"]) == [
        ("xid", 79, "0000:1b:00.0"), ("fallen_off_bus", 79, "0000:1b:00.0")]
    # dmesg -T stamps (whole seconds) of the same second pair up.
    assert fed([f"[Fri Apr  5 21:29:39 2024] {X79}", f"[Fri Apr  5 21:29:39 2024] {BUS}"]) == [
        ("xid", 79, "0000:1b:00.0")]


def test_bus_line_far_below_the_xid_stands() -> None:
    filler = [f"[ 10.0000{i:02d}] usb 1-1: new high-speed USB device number {i}" for i in range(20)]
    assert fed([f"[ 10.000001] {X79}", *filler, f"[ 10.000099] {BUS}"]) == [
        ("xid", 79, "0000:1b:00.0"), ("fallen_off_bus", 79, "0000:1b:00.0")]


def test_an_xid79_is_never_folded_into_a_bus_line_before_it() -> None:
    # Not the driver's order; the Xid record (catalogued, counted, matched with NVML) still stands.
    assert fed([f"[ 10.000001] {BUS}", f"[ 10.000005] {X79}"]) == [
        ("fallen_off_bus", 79, "0000:1b:00.0"), ("xid", 79, "0000:1b:00.0")]


def test_bus_line_naming_no_gpu_stands() -> None:
    assert fed([f"[ 10.000001] {X79}", "[ 10.000005] NVRM: GPU has fallen off the bus."]) == [
        ("xid", 79, "0000:1b:00.0"), ("fallen_off_bus", 79, "")]


# ---- the simulator writes what the driver writes, and it is one event ----------------------------


def test_simulated_fallen_off_bus_is_one_event_and_one_fail(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    node.inject(faults.parse("fault=fallen-off-bus gpu=3".split(), time.time()))
    node.inject(faults.parse("xid=79 gpu=5".split(), time.time()))
    text = node.kmsg_path.read_text()
    assert text.count("GPU has fallen off the bus.") == 4  # Xid + bus line for each of the two faults
    pci = {node.state.gpu(i).pci_bus_id_short: i for i in (3, 5)}
    c = collector(node.kmsg_path, gpu_index_of=pci.get)
    got = c.collect()
    assert [(e.kind, e.code, e.gpu) for e in got.events] == [("xid", 79, 3), ("xid", 79, 5)]
    r = verdicts(got.events)
    assert {k: (v.status, v.action, evidence(v)["events"]) for k, v in r.items()} == {
        "gpu3": (Status.FAIL, Action.REBOOT, "1"), "gpu5": (Status.FAIL, Action.REBOOT, "1")}


# ---- real captures (../shared/fixtures) ---------------------------------------------------------


@pytest.mark.parametrize("log,want", [
    # Xid 79, then the bus line 4 us later for the same address: one fault.
    ("kmsg_xid79_fallen_off_bus_plus_sxid20034_h100.log", [("xid", 79, "0000:91:00.0")]),
    ("dmesg_T_xid79_fallen_off_bus_crash_dump_multiline.log", [("xid", 79, "0000:a1:00.0")]),
    # The 570 open module: the multi-line message without any Xid line stands for the fault.
    ("dmesg_fallen_off_bus_no_xid_multiline_570.log", [("fallen_off_bus", 79, "0000:b3:00.0")]),
])
def test_real_captures_one_fault_one_event(shared_fixtures: Path, log: str, want: list[tuple[str, int, str]]) -> None:
    lines = (shared_fixtures / "xid_kernel_logs" / log).read_text(encoding="utf-8", errors="replace").splitlines()
    assert sum("fallen off the bus" in x for x in lines) == (1 if "no_xid" in log else 2)
    assert [x for x in fed(lines) if x[1] == 79] == want
