"""decide()'s remediation ladder, pure: which rung, when REPAIR, and that every safety rule holds a rung."""

from __future__ import annotations

import dataclasses

import pytest

from podhealth.aggregator.config import _default_rules
from podhealth.aggregator.model import BreakerState, FenceMode, FleetState, NodeView
from podhealth.aggregator.policy import Policy, decide, gpu_index

NOW = 100_000.0
DAY = 86400.0


def view(name: str = "dgx01", **kw: object) -> NodeView:
    base: dict[str, object] = dict(fence=FenceMode.FENCED, remedy="RESET_GPU", remedy_entity="gpu3", can_handover=True)
    base.update(kw)
    return NodeView(name, **base)  # type: ignore[arg-type]


def policy(**kw: object) -> Policy:
    base: dict[str, object] = dict(rules=_default_rules(), ladder=True, ladder_max_attempts=2, ladder_window=DAY,
                                   ladder_verify_within=600.0, ladder_max_remediating=5, ladder_per_minute=2)
    base.update(kw)
    return Policy(**base)  # type: ignore[arg-type]


def plan(*views: NodeView, pol: Policy | None = None, breaker: BreakerState = BreakerState(),
         recent: tuple[float, ...] = ()) -> list[tuple[str, str, str, bool]]:
    f = FleetState(nodes={v.name: v for v in views}, breaker=breaker, recent_remediations=recent)
    d = decide([], f, NOW, pol or policy())
    return [(a.kind, a.node, a.entity, a.failed_verify) for a in d.actions]


@pytest.mark.parametrize("v, expected", [
    # the first rung is what the failure asks for
    (view(), [("reset_gpu", "dgx01", "gpu3", False)]),
    (view(remedy="REBOOT", remedy_entity="node"), [("reboot", "dgx01", "", False)]),
    # a reset that already failed escalates to a reboot
    (view(ladder_failures=(NOW - 60,)), [("reboot", "dgx01", "", False)]),
    # RESET_GPU on something that is not one GPU: nothing to reset, reboot instead
    (view(remedy_entity="node"), [("reboot", "dgx01", "", False)]),
    # max_attempts failed attempts within the window: REPAIR
    (view(ladder_failures=(NOW - 7200, NOW - 60)), [("repair", "dgx01", "gpu3", False)]),
    # ... but not when the older one is outside the window, or before the operator's release
    (view(ladder_failures=(NOW - DAY - 1, NOW - 60)), [("reboot", "dgx01", "", False)]),
    (view(ladder_failures=(NOW - 7200, NOW - 60), released_at=NOW - 3600), [("reboot", "dgx01", "", False)]),
    # verifying: wait for the handover suite; past verify_within it is a failed attempt
    (view(ladder="verifying", ladder_at=NOW - 60), []),
    (view(ladder="verifying", ladder_at=NOW - 601), [("reboot", "dgx01", "", True)]),
    (view(ladder="verifying", ladder_at=NOW - 601, ladder_failures=(NOW - 900,)), [("repair", "dgx01", "gpu3", True)]),
    # healthy again while verifying: the handover suite decides, not the clock
    (view(ladder="verifying", ladder_at=NOW - 601, ok_since=NOW - 10), []),
    # a step in flight, a node in repair, a node held by an operator, no remedy: nothing
    (view(ladder="acting"), []),
    (view(ladder="repair", hold=True), []),
    (view(hold=True, hold_reason="fenced by an operator"), []),
    (view(remedy=""), []),
    # not ours, or not yet confirmed fenced
    (view(fence=FenceMode.EXTERNAL), []),
    (view(fence=FenceMode.FENCING), []),
    # OK now (the handover path returns it) unless its handover suite failed
    (view(ok_since=NOW - 10), []),
    (view(ok_since=NOW - 10, handover="failed"), [("reset_gpu", "dgx01", "gpu3", False)]),
])
def test_the_next_rung(v: NodeView, expected: list[tuple[str, str, str, bool]]) -> None:
    assert plan(v) == expected


def test_off_by_default_nothing_climbs() -> None:
    assert plan(view(), pol=policy(ladder=False)) == []
    assert Policy(rules=_default_rules()).ladder is False


def test_the_breaker_opt_out_cap_and_rate_limit_hold_every_rung_but_not_repair() -> None:
    tripped = BreakerState(tripped=True, tripped_at=NOW - 5, reason="outage")
    assert plan(view(), breaker=tripped) == []
    assert plan(view(ladder_failures=(NOW - 10, NOW - 5)), breaker=tripped) == [("repair", "dgx01", "gpu3", False)]
    assert plan(view(opted_out=True)) == []
    assert plan(view(), pol=policy(opt_out=frozenset({"dgx01"}))) == []
    busy = [view(f"dgx{i:02d}", ladder="verifying", ladder_at=NOW - 10) for i in range(2, 4)]
    assert plan(view(), *busy, pol=policy(ladder_max_remediating=2)) == []
    assert plan(view(), *busy, pol=policy(ladder_max_remediating=3)) == [("reset_gpu", "dgx01", "gpu3", False)]
    assert plan(view(), recent=(NOW - 10, NOW - 20)) == []
    assert plan(view(), recent=(NOW - 70, NOW - 80)) == [("reset_gpu", "dgx01", "gpu3", False)]


def test_the_cap_and_rate_count_the_rungs_of_one_decision() -> None:
    nodes = [view(f"dgx{i:02d}") for i in range(1, 6)]
    assert [p[1] for p in plan(*nodes)] == ["dgx01", "dgx02"]  # per_minute 2
    assert [p[1] for p in plan(*nodes, pol=policy(ladder_per_minute=10, ladder_max_remediating=3))] == \
        ["dgx01", "dgx02", "dgx03"]


def test_a_verifying_node_that_runs_out_of_time_is_not_counted_against_its_own_next_rung() -> None:
    v = view(ladder="verifying", ladder_at=NOW - 601)
    assert plan(v, pol=policy(ladder_max_remediating=1)) == [("reboot", "dgx01", "", True)]


def test_decide_is_pure_and_repeatable() -> None:
    v = view(ladder_failures=(NOW - 60,))
    f = FleetState(nodes={"dgx01": v})
    first = decide([], f, NOW, policy())
    assert decide([], f, NOW, policy()) == first
    assert dataclasses.asdict(v) == dataclasses.asdict(view(ladder_failures=(NOW - 60,)))


@pytest.mark.parametrize("entity, index", [("gpu3", 3), ("GPU0", 0), ("gpu12", 12), ("node", None), ("gpu", None),
                                           ("gpu3/nvlink5", None), ("mlx5_0", None), ("gpu-1", None)])
def test_gpu_index(entity: str, index: int | None) -> None:
    assert gpu_index(entity) == index
