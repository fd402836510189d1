"""Counters that can no longer count: widths from checks/data/ib_counters.yaml, the saturated-
counter WARN in ib_errors, and what still moves on such a port."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from podhealth.checks.passive import ib, ib_counters
from podhealth.checks import profiles
from podhealth.checks.passive.context import Context, observe_counters
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Status
from tests.harness.ibtree import dgx_h100, write_tree

H100 = profiles.load("dgx-h100")
T0 = 1_700_000_000.0
_NAMES = frozenset({"infiniband_port_stat", "infiniband_port_hw_stat"})


def test_widths_match_the_pma_table(shared_fixtures: Path) -> None:
    """Every sysfs counter's width in the data file is the one libibmad/the kernel give it."""
    rows = list(csv.DictReader((shared_fixtures / "infiniband" / "ib_pma_portcounters_bit_widths.csv").open()))
    table = {r["linux_sysfs_counter"]: int(r["linux_sysfs_width_bits"]) for r in rows
             if r["pma_attribute"] == "PortCounters" and r["linux_sysfs_counter"]}
    m = ib_counters.load()
    for name, width in m.widths.items():
        assert table[name] == width, name
    # every PortCounters error counter of the table is known (the data counters are 64-bit in sysfs)
    assert set(table) - set(m.widths) == {"port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets"}


def test_shipped_widths() -> None:
    m = ib_counters.load()
    assert (m.max_value("symbol_error"), m.max_value("link_downed"), m.max_value("local_link_integrity_errors")) == (65535, 255, 15)
    assert "port_xmit_wait" not in m.errors and "symbol_error" in m.errors


@pytest.mark.parametrize("doc, key", [
    ({"error_counters": {"symbol_error": 0}, "other_counters": {}, "rising": {}, "substitutes": {}, "clear": {}}, "error_counters.symbol_error"),
    ({"error_counters": {}, "other_counters": {}, "rising": {"x": 3}, "substitutes": {}, "clear": {}}, "rising.x"),
    ({"error_counters": {}, "other_counters": {}, "rising": {}, "substitutes": {"y": -1}, "clear": {}}, "substitutes.y"),
    ({"error_counters": {}, "other_counters": {}, "rising": {}, "substitutes": {}, "clear": {}, "z": 1}, "z"),
])
def test_bad_counter_data_names_the_key(doc: dict[str, object], key: str) -> None:
    with pytest.raises(ib_counters.CountersError, match=f"ib_counters.yaml: {key}"):
        ib_counters.parse(doc)


def _errors(tmp: Path, steps: list[tuple[float, dict[str, int], dict[str, int]]]) -> dict[str, CheckResult]:
    """ib_errors after each step's counters (port mlx5_1/1) were read at its time."""
    rates = RateTracker(3600)
    out: list[CheckResult] = []
    for i, (t, counters, hw) in enumerate(steps):
        hcas = dgx_h100("bond")
        hcas[1].ports[1].counters.update(counters)
        hcas[1].ports[1].hw_counters.update(hw)
        samples = InfinibandCollector(write_tree(tmp / str(i) / "sys", hcas)).collect().samples
        observe_counters(rates, samples, t, _NAMES)
        st = CollectorState("infiniband", samples=samples, stale=False, last_success=t, last_attempt=t)
        ctx = Context(snapshot=Snapshot(t, {"infiniband": st}), profile=H100, now=t, rates=rates)
        out = ib.ib_errors(ctx)
    return {r.entity: r for r in out}


@pytest.mark.parametrize("counter, value, width", [
    ("symbol_error", 65535, "16"), ("local_link_integrity_errors", 15, "4"), ("link_downed", 255, "8"),
    ("excessive_buffer_overrun_errors", 15, "4"), ("port_rcv_errors", 65535, "16"),
])
def test_saturated_error_counter_warns_with_width_and_how_to_clear(tmp_path: Path, counter: str, value: int, width: str) -> None:
    r = _errors(tmp_path, [(T0, {counter: value}, {})])["mlx5_1/1"]
    assert r.status is Status.WARN and f"{counter} saturated" in r.summary
    ev = dict(r.evidence)
    assert ev["saturated"] == f"{counter}={value} ({width}-bit)"
    assert ev["clear_with"].startswith("perfquery -C mlx5_1 -P 1 -R")
    assert ev["still_moving"] == "no hw_counters retry rising"


def test_one_below_the_maximum_is_ok(tmp_path: Path) -> None:
    assert _errors(tmp_path, [(T0, {"symbol_error": 65534}, {})])["mlx5_1/1"].status is Status.OK


def test_saturated_port_is_judged_from_what_still_moves(tmp_path: Path) -> None:
    res = _errors(tmp_path, [(T0, {"symbol_error": 65535}, {"local_ack_timeout_err": 10}),
                             (T0 + 600, {"symbol_error": 65535, "link_error_recovery": 3},
                              {"local_ack_timeout_err": 510})])
    ev = dict(res["mlx5_1/1"].evidence)
    assert ev["still_moving"] == "local_ack_timeout_err=3000/h"
    assert ev["counters"] == "link_error_recovery+3"  # counters that still count are still judged
    assert "error counters rising" in res["mlx5_1/1"].summary


def test_saturated_congestion_counter_is_evidence_not_a_warning(tmp_path: Path) -> None:
    r = _errors(tmp_path, [(T0, {"port_xmit_wait": 4294967295}, {})])["mlx5_1/1"]
    assert r.status is Status.OK
    assert dict(r.evidence)["saturated_not_errors"] == "port_xmit_wait=4294967295 (32-bit)"


def test_ethernet_port_is_told_how_its_counters_clear(tmp_path: Path) -> None:
    rates = RateTracker(3600)
    hcas = dgx_h100("bond")
    hcas[-1].ports[1].counters["symbol_error"] = 65535
    samples = InfinibandCollector(write_tree(tmp_path / "sys", hcas)).collect().samples
    st = CollectorState("infiniband", samples=samples, stale=False, last_success=T0, last_attempt=T0)
    ctx = Context(snapshot=Snapshot(T0, {"infiniband": st}), profile=H100, now=T0, rates=rates)
    r = {x.entity: x for x in ib.ib_errors(ctx)}["mlx5_bond_0/1"]
    assert r.status is Status.WARN and "mlx5_core" in dict(r.evidence)["clear_with"]


def test_simulated_saturated_counter_fault_warns(tmp_path: Path) -> None:
    """The simulator's `fault=ib-counter-saturated` through the real collector: a WARN that names
    the counter and its width on that port, nothing else."""
    from podhealth.sim import tree_ib
    from podhealth.sim.state import Fault, default_state

    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(
        Fault("ib-counter-saturated", T0 + 10, device="mlx5_4", counter="local_link_integrity_errors"))
    tree_ib.write(st, tmp_path / "sys", T0 + 60)
    samples = InfinibandCollector(tmp_path / "sys").collect().samples
    cs = CollectorState("infiniband", samples=samples, stale=False, last_success=T0 + 60, last_attempt=T0 + 60)
    ctx = Context(snapshot=Snapshot(T0 + 60, {"infiniband": cs}), profile=H100, now=T0 + 60, rates=RateTracker(300))
    res = {r.entity: r for r in ib.ib_errors(ctx)}
    assert [e for e, r in res.items() if r.status is not Status.OK] == ["mlx5_4/1"]
    assert dict(res["mlx5_4/1"].evidence)["saturated"] == "local_link_integrity_errors=15 (4-bit)"
