"""decide()'s remediation ladder, pure: which rung, when REPAIR, and that every safety rule holds a rung."""

from __future__ import annotations

import dataclasses

import pytest

from podhealth.config_aggregator import _default_rules
from podhealth.aggregator.model import BreakerState, Condition, FenceMode, FleetState, NodeView
from podhealth.aggregator.policy import Policy, decide, gpu_index
from podhealth.vocab import Action, Status

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


# ---- job-aware actions: when the jobs on a fenced node are moved off --------------------------

def jobs_policy(**kw: object) -> Policy:
    base: dict[str, object] = dict(jobs=True, job_modes={"DRAIN": "wait", "RESET_GPU": "wait_then_force"},
                                   job_default="wait", job_fatal=("gpu_lost", "xid:79", "xid:95"),
                                   job_force_after=3600.0, job_evict_after=1800.0)
    base.update(kw)
    return policy(ladder=False, **base)


def evac(*views: NodeView, conds: tuple[Condition, ...] = (), pol: Policy | None = None,
         breaker: BreakerState = BreakerState()) -> list[tuple[str, bool]]:
    f = FleetState(nodes={v.name: v for v in views}, breaker=breaker)
    d = decide(conds, f, NOW, pol or jobs_policy())
    return [(a.node, a.force) for a in d.actions if a.kind == "evacuate"]


def fenced(name: str = "dgx01", action: str = "DRAIN", age: float = 60.0, **kw: object) -> NodeView:
    return view(name, fence_action=action, fenced_at=NOW - age, remedy="", **kw)


def fail(check: str, summary: str = "", node: str = "dgx01") -> Condition:
    return Condition(node=node, check=check, entity="gpu3", status=Status.FAIL, action=Action.REBOOT,
                     since=NOW - 60, observed=NOW, summary=summary)


@pytest.mark.parametrize("v, conds, expected", [
    # wait: nothing until evict_after, then the polite way once
    (fenced(age=60), (), []),
    (fenced(age=1801), (), [("dgx01", False)]),
    (fenced(age=1801, evacuated="polite"), (), []),
    # wait_then_force: polite after evict_after, requeue after force_after
    (fenced(action="RESET_GPU", age=1801), (), [("dgx01", False)]),
    (fenced(action="RESET_GPU", age=3601, evacuated="polite"), (), [("dgx01", True)]),
    (fenced(action="RESET_GPU", age=3601, evacuated="forced"), (), []),
    # the fatal set: now, whatever the action
    (fenced(age=5), (fail("gpu_lost"),), [("dgx01", True)]),
    (fenced(age=5), (fail("xid", "XID 79: GPU has fallen off the bus"),), [("dgx01", True)]),
    (fenced(age=5), (fail("xid", "XID 95: Uncontained memory error"),), [("dgx01", True)]),
    (fenced(age=5), (fail("xid", "XID 13: Graphics engine exception"),), []),
    (fenced(age=5), (fail("xid", "XID 950: made up"),), []),
    # ... but only a FAIL of this node, and only once forced; a failed one is not retried
    (fenced(age=5), (fail("gpu_lost", node="dgx02"),), []),
    (fenced(age=5, evacuated="failed"), (fail("gpu_lost"),), []),
    # not ours / not yet fenced: never
    (fenced(age=5, fence=FenceMode.EXTERNAL), (fail("gpu_lost"),), []),
    (fenced(age=5, fence=FenceMode.FENCING), (fail("gpu_lost"),), []),
])
def test_when_jobs_are_moved_off(v: NodeView, conds: tuple[Condition, ...], expected: list[tuple[str, bool]]) -> None:
    assert evac(v, conds=conds) == expected


def test_jobs_off_by_default_and_held_by_breaker_and_opt_out() -> None:
    v, c = fenced(age=5), (fail("gpu_lost"),)
    assert evac(v, conds=c, pol=jobs_policy(jobs=False)) == []
    tripped = BreakerState(tripped=True, tripped_at=NOW - 1, reason="outage")
    assert evac(v, conds=c, breaker=tripped) == []
    assert evac(fenced(age=5, opted_out=True), conds=c) == []
    assert evac(v, conds=c, pol=jobs_policy(opt_out=frozenset({"dgx01"}))) == []
    d = decide(c, FleetState(nodes={"dgx01": v}, breaker=tripped), NOW, jobs_policy())
    assert "breaker tripped" in d.notes_of("jobs_held")[0].detail
