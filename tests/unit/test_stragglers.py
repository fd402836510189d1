"""aggregator/stragglers.py on a simulated 16-node job (sim/perfmodel.job_window)."""

from __future__ import annotations

import pytest

from podhealth.aggregator import stragglers
from podhealth.aggregator.stragglers import GpuObs, JobWindow
from podhealth.config_failslow import StragglerConfig
from podhealth.sim import faults, perfmodel
from podhealth.sim.state import NodeState, default_state

T0 = 1_700_000_000.0
WINDOW_S = 30.0


def job(nodes: list[NodeState], at: float, seed: int = 5) -> JobWindow:
    gpus = []
    for st in nodes:
        for w in perfmodel.job_window(st, seed, at):
            gpus.append(GpuObs(w.node, w.gpu, w.sm_active, w.power_w, w.sm_clock_mhz, w.throttle, w.nvlink_gbs,
                               w.ib_gbs))
    return JobWindow("4242", "alice", at, tuple(gpus))


def sixteen(fault: list[str] | None = None, victim: int = 11) -> list[NodeState]:
    nodes = [default_state(f"dgx{i:02d}", "dgx-h100", now=T0) for i in range(16)]
    if fault:
        f = faults.parse(fault, T0 + 10)
        faults.validate(f, nodes[victim])
        nodes[victim] = nodes[victim].with_fault(f)
    return nodes


def windows_until_named(nodes: list[NodeState], start: float, n: int = 6) -> tuple[int, set[str]]:
    cfg = StragglerConfig()
    seen: list[JobWindow] = []
    for i in range(n):
        seen.append(job(nodes, start + i * WINDOW_S))
        named = stragglers.named_nodes(stragglers.judge(seen, cfg))
        if named:
            return i + 1, named
    return 0, set()


@pytest.mark.parametrize("fault", [
    ["fault=thermal-throttle-intermittent"],           # every GPU of the node, half of each 10 minutes
    ["fault=thermal-throttle-intermittent", "gpu=5", "pct=8"],
    ["fault=thermal", "gpu=2"],                        # held hot: SM clock halved
])
def test_throttled_node_named_within_two_windows_and_no_other(fault: list[str]) -> None:
    nodes = sixteen(fault)
    n, named = windows_until_named(nodes, T0 + 20)
    assert (n, named) == (2, {"dgx11"})
    cfg = StragglerConfig()
    (first, *_) = stragglers.judge([job(nodes, T0 + 20), job(nodes, T0 + 50)], cfg)
    assert first.reason == "thermal" and first.owner == "alice"
    assert "job 4242 (alice): dgx11 gpu" in first.text()


def test_healthy_job_names_nobody_over_a_day_of_windows() -> None:
    nodes = sixteen()
    cfg = StragglerConfig()
    seen: list[JobWindow] = []
    for i in range(0, 2880, 7):  # every 7th of a day's 30 s windows, different noise each
        seen.append(job(nodes, T0 + i * WINDOW_S, seed=i))
        assert stragglers.judge(seen, cfg) == []


def test_intermittent_throttle_names_only_while_on() -> None:
    nodes = sixteen(["fault=thermal-throttle-intermittent", "period=600"])
    cfg = StragglerConfig()
    off = [job(nodes, T0 + 10 + 300 + k * WINDOW_S) for k in range(1, 4)]  # the cool half of the period
    assert stragglers.judge(off, cfg) == []


def test_slow_hca_names_the_node_for_ib() -> None:
    nodes = sixteen(["fault=slow-hca", "device=mlx5_0", "pct=90"])
    nodes = [nodes[i] if i != 11 else _all_hcas_slow(nodes[i]) for i in range(16)]
    found = stragglers.judge([job(nodes, T0 + 20), job(nodes, T0 + 50)], StragglerConfig())
    assert [(s.node, s.gpu, s.reason) for s in found] == [("dgx11", None, "ib")]


def _all_hcas_slow(st: NodeState) -> NodeState:
    for dev in sorted({h.device for h in st.hcas if h.role == "compute"} - {"mlx5_0"}):
        st = st.with_fault(faults.parse(["fault=slow-hca", f"device={dev}", "pct=90"], T0))
    return st


def test_a_node_whose_ib_is_not_known_is_not_compared() -> None:
    nodes = sixteen()
    w = job(nodes, T0 + 20)
    unknown = JobWindow(w.job, w.owner, w.at, tuple(
        GpuObs(g.node, g.gpu, g.sm_active, g.power_w, g.sm_clock_mhz, g.throttle, g.nvlink_gbs,
               None if g.node == "dgx05" else g.ib_gbs) for g in w.gpus))
    assert stragglers.flag(unknown, StragglerConfig()) == []
    zero = JobWindow(w.job, w.owner, w.at, tuple(
        GpuObs(g.node, g.gpu, g.sm_active, g.power_w, g.sm_clock_mhz, g.throttle, g.nvlink_gbs,
               0.0 if g.node == "dgx05" else g.ib_gbs) for g in w.gpus))
    assert [(s.node, s.reason) for s in stragglers.flag(zero, StragglerConfig())] == [("dgx05", "ib")]


def test_one_odd_window_names_nobody() -> None:
    nodes = sixteen()
    hot = sixteen(["fault=thermal", "gpu=2"])
    cfg = StragglerConfig()
    seq = [job(nodes, T0), job(hot, T0 + 30), job(nodes, T0 + 60)]
    assert stragglers.judge(seq, cfg) == []


def test_too_few_peers_are_not_compared() -> None:
    w = JobWindow("1", "bob", T0, tuple(GpuObs("n1", i, 0.9, 600, 1980 if i else 900, ("thermal",) if not i else (),
                                               100, 10) for i in range(3)))
    assert stragglers.flag(w, StragglerConfig()) == []
    assert stragglers.flag(w, StragglerConfig(min_peers=3)) != []
