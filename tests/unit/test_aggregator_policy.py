"""decide() is pure: every safety rule is checked here without a cluster or a clock."""

from __future__ import annotations

import copy

import pytest

from podhealth.config_aggregator import RuleConfig, _default_rules
from podhealth.aggregator.model import BreakerState, Condition, FenceMode, FleetState, NodeView
from podhealth.aggregator.policy import Policy, decide, partition_limit, rule_for
from podhealth.vocab import Action, Status

NOW = 10_000.0


def cond(node: str = "dgx01", check: str = "xid", entity: str = "GPU0", status: Status = Status.FAIL,
         action: Action = Action.RESET_GPU, since: float = NOW - 100, observed: float = NOW - 1,
         severity: str | None = None, ref: str = "", notified: bool = False) -> Condition:
    sev = severity or {Status.FAIL: "critical", Status.WARN: "warning"}.get(status, "info")
    return Condition(node=node, check=check, entity=entity, status=status, action=action, severity=sev,
                     since=since, observed=observed, ref=ref, notified=notified)


def fleet(*views: NodeView, n: int = 100, partition: str = "", breaker: BreakerState = BreakerState(),
          recent: tuple[float, ...] = ()) -> FleetState:
    nodes = {f"dgx{i:02d}": NodeView(f"dgx{i:02d}", partition=partition) for i in range(1, n + 1)}
    for v in views:
        nodes[v.name] = v
    return FleetState(nodes=nodes, breaker=breaker, recent_fences=recent)


def policy(**kw: object) -> Policy:
    base: dict[str, object] = dict(rules=_default_rules(), max_fenced=100, max_percent_per_partition=100.0,
                                   fences_per_minute=100, breaker_share_percent=50.0, breaker_window=300.0,
                                   breaker_min_nodes=3, healthy_for=600.0)
    base.update(kw)
    return Policy(**base)  # type: ignore[arg-type]


def fenced_nodes(d: object) -> list[str]:
    return [a.node for a in d.of_kind("fence")]  # type: ignore[attr-defined]


# ---- rules ----------------------------------------------------------------------------------


def test_fail_with_a_fence_action_fences_with_a_reason() -> None:
    d = decide([cond(ref="0123456789abcdef0123")], fleet(), NOW, policy())
    [a] = d.of_kind("fence")
    assert a.node == "dgx01" and a.rule == "fence" and not a.dry_run
    assert a.reason is not None
    assert (a.reason.check, a.reason.entity, a.reason.action, a.reason.id) == ("xid", "GPU0", "RESET_GPU",
                                                                               "0123456789abcdef")
    assert a.condition == ("dgx01", "xid", "GPU0")


def test_reason_id_without_a_ref_is_a_stable_short_hash() -> None:
    a = decide([cond()], fleet(), NOW, policy()).of_kind("fence")[0]
    b = decide([cond()], fleet(), NOW + 5, policy()).of_kind("fence")[0]
    assert a.reason and b.reason and a.reason.id == b.reason.id and len(a.reason.id) == 12
    weird = decide([cond(ref="a b;c$(rm)")], fleet(), NOW, policy()).of_kind("fence")[0]
    assert weird.reason and weird.reason.id == "abcrm"


@pytest.mark.parametrize("status", [Status.UNKNOWN, Status.OK])
def test_unknown_never_fences_even_under_a_rule_that_matches_anything(status: Status) -> None:
    anything = (RuleConfig(check="*", actions=(), min_severity="info", do="fence"),)
    c = cond(status=status, severity="critical")
    assert rule_for(c, anything) is None
    d = decide([c], fleet(), NOW, policy(rules=anything))
    assert d.actions == ()


def test_warn_only_notifies_and_only_once() -> None:
    d = decide([cond(status=Status.WARN)], fleet(), NOW, policy())
    assert [a.kind for a in d.actions] == ["notify"]
    assert decide([cond(status=Status.WARN, notified=True)], fleet(), NOW, policy()).actions == ()


@pytest.mark.parametrize("action, kind", [
    (Action.RESET_GPU, "fence"), (Action.DRAIN, "fence"), (Action.REBOOT, "fence"), (Action.REPLACE, "fence"),
    (Action.RESTART_APP, "notify"), (Action.NONE, "notify"),
])
def test_default_rules_by_action(action: Action, kind: str) -> None:
    d = decide([cond(action=action)], fleet(), NOW, policy())
    assert [a.kind for a in d.actions] == [kind]


def test_first_matching_rule_wins_and_globs_match() -> None:
    rules = (RuleConfig(check="nfs*", do="notify", min_severity="warning"),) + _default_rules()
    d = decide([cond(check="nfs_mount", action=Action.DRAIN), cond(node="dgx02", check="xid", action=Action.DRAIN)],
               fleet(), NOW, policy(rules=rules))
    assert sorted((a.kind, a.node) for a in d.actions) == [("fence", "dgx02"), ("notify", "dgx01")]


def test_min_severity() -> None:
    rules = (RuleConfig(check="*", min_severity="critical", do="fence"),)
    assert decide([cond(status=Status.WARN)], fleet(), NOW, policy(rules=rules)).actions == ()
    rules = (RuleConfig(check="*", min_severity="warning", do="fence"),)
    assert fenced_nodes(decide([cond(status=Status.WARN)], fleet(), NOW, policy(rules=rules))) == ["dgx01"]


def test_alertmanager_style_severity_on_a_fail() -> None:
    """A firing alert labelled severity=warning is a FAIL of warning severity: not enough to fence by default."""
    d = decide([cond(check="GpuXid", action=Action.DRAIN, severity="warning")], fleet(), NOW, policy())
    assert [a.kind for a in d.actions] == ["notify"]


def test_minimum_duration() -> None:
    rules = (RuleConfig(check="*", actions=("RESET_GPU",), do="fence", min_duration=60.0),)
    young = cond(since=NOW - 59)
    d = decide([young], fleet(), NOW, policy(rules=rules))
    assert d.actions == () and [n.kind for n in d.notes] == ["waiting_min_duration"]
    assert fenced_nodes(decide([cond(since=NOW - 60)], fleet(), NOW, policy(rules=rules))) == ["dgx01"]


def test_fence_and_reboot_rule_fences_and_says_so() -> None:
    rules = (RuleConfig(check="*", do="fence_and_reboot"),)
    [a] = decide([cond()], fleet(), NOW, policy(rules=rules)).actions
    assert a.kind == "fence" and a.rule == "fence_and_reboot"


# ---- dry run ----------------------------------------------------------------------------------


def test_dry_run_decides_the_same_but_flags_it() -> None:
    d = decide([cond()], fleet(), NOW, policy(dry_run=True))
    [a] = d.of_kind("fence")
    assert a.dry_run
    assert d.notes_of("dry_run")
    wet = decide([cond()], fleet(), NOW, policy())
    assert [x.node for x in wet.actions] == [x.node for x in d.actions]


# ---- caps -------------------------------------------------------------------------------------


def test_absolute_cap_counts_our_fences_and_pending_ones() -> None:
    views = [NodeView("dgx90", fence=FenceMode.FENCED), NodeView("dgx91", fence=FenceMode.FENCING),
             NodeView("dgx92", fence=FenceMode.RELEASING)]
    d = decide([cond()], fleet(*views), NOW, policy(max_fenced=3))
    assert d.actions == () and d.notes_of("cap_reached")
    d = decide([cond()], fleet(*views), NOW, policy(max_fenced=4))
    assert fenced_nodes(d) == ["dgx01"]


def test_absolute_cap_ignores_someone_elses_fences() -> None:
    views = [NodeView(f"dgx9{i}", fence=FenceMode.EXTERNAL) for i in range(5)]
    assert fenced_nodes(decide([cond()], fleet(*views), NOW, policy(max_fenced=1))) == ["dgx01"]


def test_cap_applies_within_one_decision_earliest_failure_first() -> None:
    conds = [cond(node=f"dgx0{i}", since=NOW - 10 * i) for i in range(1, 6)]
    d = decide(conds, fleet(), NOW, policy(max_fenced=2))
    assert fenced_nodes(d) == ["dgx05", "dgx04"]
    assert sorted(n.node for n in d.notes_of("cap_reached")) == ["dgx01", "dgx02", "dgx03"]


def test_zero_cap_fences_nothing() -> None:
    assert decide([cond()], fleet(), NOW, policy(max_fenced=0)).of_kind("fence") == []


@pytest.mark.parametrize("size, pct, limit", [(10, 20, 2), (10, 10, 1), (4, 10, 1), (100, 10, 10), (3, 100, 3),
                                              (10, 0, 1), (7, 50, 3)])
def test_partition_limit(size: int, pct: float, limit: int) -> None:
    assert partition_limit(size, pct) == limit


def test_partition_cap_counts_everyones_fences_per_partition() -> None:
    views = [NodeView(f"a{i:02d}", partition="a") for i in range(10)] + \
            [NodeView(f"b{i:02d}", partition="b") for i in range(10)]
    views[0] = NodeView("a00", partition="a", fence=FenceMode.EXTERNAL)  # a human drained one in a
    conds = [cond(node="a01", since=NOW - 50), cond(node="a02", since=NOW - 40), cond(node="b01", since=NOW - 30),
             cond(node="b02", since=NOW - 20), cond(node="b03", since=NOW - 10)]
    d = decide(conds, fleet(*views, n=0), NOW, policy(max_percent_per_partition=20.0))
    assert fenced_nodes(d) == ["a01", "b01", "b02"]
    held = sorted(n.node for n in d.notes_of("partition_cap_reached"))
    assert held == ["a02", "b03"]


# ---- rate limit -------------------------------------------------------------------------------


def test_rate_limit_counts_the_last_minute_only() -> None:
    recent = tuple(NOW - s for s in (1, 2, 30, 59))
    old = tuple(NOW - s for s in (60, 61, 600))
    d = decide([cond()], fleet(recent=recent + old), NOW, policy(fences_per_minute=4))
    assert d.actions == () and d.notes_of("rate_limited")
    d = decide([cond()], fleet(recent=recent + old), NOW, policy(fences_per_minute=5))
    assert fenced_nodes(d) == ["dgx01"]


def test_rate_limit_within_one_decision() -> None:
    conds = [cond(node=f"dgx0{i}", since=NOW - i) for i in range(1, 6)]
    d = decide(conds, fleet(recent=(NOW - 5,)), NOW, policy(fences_per_minute=3))
    assert len(fenced_nodes(d)) == 2 and len(d.notes_of("rate_limited")) == 3


# ---- circuit breaker --------------------------------------------------------------------------


def _storm(k: int, since: float = NOW - 10) -> list[Condition]:
    return [cond(node=f"dgx{i:02d}", since=since) for i in range(1, k + 1)]


def test_breaker_trips_when_more_than_the_share_turns_bad_in_the_window() -> None:
    d = decide(_storm(11), fleet(n=100), NOW, policy(breaker_share_percent=10.0))
    assert d.breaker.tripped and d.breaker.tripped_at == NOW and "11 of 100" in d.breaker.reason
    assert d.of_kind("fence") == []
    assert len(d.notes_of("breaker_holding")) == 11 and d.notes_of("breaker_tripped")


def test_breaker_threshold_is_strict_and_needs_min_nodes() -> None:
    d = decide(_storm(10), fleet(n=100), NOW, policy(breaker_share_percent=10.0))
    assert not d.breaker.tripped and len(fenced_nodes(d)) == 10
    # 2 of 4 nodes is 50%, but fewer than min_nodes=3: bad nodes, not an outage
    d = decide(_storm(2), fleet(n=4), NOW, policy(breaker_share_percent=10.0, breaker_min_nodes=3))
    assert not d.breaker.tripped and len(fenced_nodes(d)) == 2


def test_breaker_ignores_nodes_that_turned_bad_before_the_window() -> None:
    conds = _storm(20, since=NOW - 1000)
    d = decide(conds, fleet(n=100), NOW, policy(breaker_share_percent=10.0, breaker_window=300.0))
    assert not d.breaker.tripped


def test_breaker_counts_nodes_not_conditions_and_not_notify_only_ones() -> None:
    conds = [cond(node="dgx01", entity=f"GPU{g}") for g in range(8)]
    conds += [cond(node=f"dgx{i:02d}", status=Status.WARN) for i in range(2, 50)]
    d = decide(conds, fleet(n=100), NOW, policy(breaker_share_percent=5.0, breaker_min_nodes=1))
    assert not d.breaker.tripped and fenced_nodes(d) == ["dgx01"]


def test_tripped_breaker_stays_tripped_and_holds_every_fence_but_not_returns() -> None:
    b = BreakerState(tripped=True, tripped_at=NOW - 50, reason="storm")
    back = NodeView("dgx50", fence=FenceMode.FENCED, ok_since=NOW - 700, can_handover=True)
    d = decide([cond()], fleet(back, breaker=b), NOW, policy())
    assert d.breaker == b and d.of_kind("fence") == [] and d.notes_of("breaker_holding")
    assert [a.node for a in d.of_kind("handover")] == ["dgx50"]


def test_breaker_reset_does_not_replay_what_was_held_back() -> None:
    reset = BreakerState(tripped=False, reset_at=NOW - 5)
    stale = [_with(c, observed=NOW - 6) for c in _storm(20, since=NOW - 100)]  # last seen before the reset
    d = decide(stale, fleet(n=100, breaker=reset), NOW, policy(breaker_share_percent=10.0))
    assert d.actions == () and not d.breaker.tripped
    assert len(d.notes_of("held_since_reset")) == 20


def test_after_reset_a_fresh_observation_counts_from_the_reset() -> None:
    rules = (RuleConfig(check="*", actions=("RESET_GPU",), do="fence", min_duration=30.0),)
    reset = BreakerState(tripped=False, reset_at=NOW - 10)
    seen_again = cond(since=NOW - 1000, observed=NOW - 1)  # began long ago, seen again after the reset
    d = decide([seen_again], fleet(breaker=reset), NOW, policy(rules=rules))
    assert d.actions == () and d.notes_of("waiting_min_duration")  # 10 s since the reset, not 1000
    d = decide([seen_again], fleet(breaker=reset), NOW + 20, policy(rules=rules))
    assert fenced_nodes(d) == ["dgx01"]


def test_after_reset_a_persisting_outage_trips_again() -> None:
    reset = BreakerState(tripped=False, reset_at=NOW - 10)
    d = decide(_storm(20, since=NOW - 100), fleet(n=100, breaker=reset), NOW, policy(breaker_share_percent=10.0))
    assert d.breaker.tripped and d.breaker.reset_at == NOW - 10 and d.of_kind("fence") == []


# ---- whose node is it -------------------------------------------------------------------------


def test_config_opt_out() -> None:
    d = decide([cond()], fleet(), NOW, policy(opt_out=frozenset({"dgx01"})))
    assert d.actions == () and "config opt_out" in d.notes_of("opted_out")[0].detail


def test_backend_opt_out_label() -> None:
    d = decide([cond()], fleet(NodeView("dgx01", opted_out=True)), NOW, policy())
    assert d.actions == () and "backend opt-out" in d.notes_of("opted_out")[0].detail


def test_node_drained_by_a_human_is_never_fenced_nor_returned() -> None:
    human = NodeView("dgx01", fence=FenceMode.EXTERNAL, ok_since=NOW - 10_000, can_handover=True)
    d = decide([cond()], fleet(human), NOW, policy())
    assert d.actions == () and d.notes_of("fenced_by_other")
    assert decide([], fleet(human), NOW, policy()).actions == ()


@pytest.mark.parametrize("mode", [FenceMode.FENCED, FenceMode.FENCING, FenceMode.RELEASING])
def test_already_ours_is_not_fenced_again(mode: FenceMode) -> None:
    d = decide([cond()], fleet(NodeView("dgx01", fence=mode)), NOW, policy())
    assert d.of_kind("fence") == []


def test_operator_release_is_respected_until_a_new_failure() -> None:
    v = NodeView("dgx01", released_at=NOW - 50)
    d = decide([cond(since=NOW - 100)], fleet(v), NOW, policy())
    assert d.actions == () and d.notes_of("operator_released")
    assert fenced_nodes(decide([cond(since=NOW - 10)], fleet(v), NOW, policy())) == ["dgx01"]


# ---- return to service ------------------------------------------------------------------------


def _fenced(**kw: object) -> NodeView:
    base: dict[str, object] = dict(name="dgx01", fence=FenceMode.FENCED, ok_since=NOW - 600, can_handover=True)
    base.update(kw)
    return NodeView(**base)  # type: ignore[arg-type]


def test_healthy_long_enough_asks_for_the_handover_suite() -> None:
    d = decide([], fleet(_fenced()), NOW, policy(healthy_for=600))
    assert [(a.kind, a.node) for a in d.actions] == [("handover", "dgx01")]


@pytest.mark.parametrize("view, note", [
    (_fenced(ok_since=NOW - 599), None),
    (_fenced(ok_since=None), None),
    (_fenced(handover="running"), None),
    (_fenced(handover="failed", handover_at=NOW - 100), None),
    (_fenced(hold=True), "operator_hold"),
    (_fenced(can_handover=False), "no_agent_url"),
    (_fenced(fence=FenceMode.FENCING), None),
    (_fenced(fence=FenceMode.EXTERNAL), None),
])
def test_no_handover(view: NodeView, note: str | None) -> None:
    d = decide([], fleet(view), NOW, policy(healthy_for=600))
    assert d.actions == ()
    if note:
        assert d.notes_of(note)  # type: ignore[arg-type]


def test_failed_handover_is_retried_after_another_healthy_period() -> None:
    d = decide([], fleet(_fenced(handover="failed", handover_at=NOW - 600)), NOW, policy(healthy_for=600))
    assert [a.kind for a in d.actions] == ["handover"]


def test_manual_release_waits_for_the_operator() -> None:
    d = decide([], fleet(_fenced()), NOW, policy(manual_release=True))
    assert d.actions == () and d.notes_of("awaiting_manual_release")


def test_opted_out_node_is_not_released_either() -> None:
    d = decide([], fleet(_fenced()), NOW, policy(opt_out=frozenset({"dgx01"})))
    assert d.actions == () and d.notes_of("opted_out")


# ---- purity -----------------------------------------------------------------------------------


def test_decide_is_deterministic_and_does_not_touch_its_inputs() -> None:
    conds = _storm(5) + [cond(node="dgx77", status=Status.WARN)]
    f = fleet(_fenced(name="dgx60"), recent=(NOW - 3,))
    before = (copy.deepcopy(conds), dict(f.nodes), f.breaker, f.recent_fences)
    p = policy(max_fenced=3)
    d1 = decide(conds, f, NOW, p)
    d2 = decide(list(conds), f, NOW, p)
    assert d1 == d2
    assert (conds, dict(f.nodes), f.breaker, f.recent_fences) == before


def _with(c: Condition, **kw: object) -> Condition:
    from dataclasses import replace
    return replace(c, **kw)  # type: ignore[arg-type]
