"""Issue 32 §1: the periodic work that walked every node held the event loop for 100s of ms at
100,000 nodes. The counts by state are taken once per housekeeping pass at most (none when memory
did not change), and the periodic reconcile looks only at the nodes a move can concern."""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from typing import Any, Sequence

import pytest

from podhealth.config_aggregator import RuleConfig, _default_rules
from podhealth.aggregator import policy as policy_mod
from podhealth.aggregator import reconcile as reconcile_mod
from podhealth.aggregator.lifecycle import Move, Seen
from podhealth.aggregator.model import Condition, FenceMode, FleetState, NodeView
from podhealth.aggregator.policy import Policy
from podhealth.aggregator.service import Aggregator
from podhealth.aggregator.state import OURS_STATES, STATES
from podhealth.fencing.fence import REASON_PREFIX
from podhealth.vocab import Action, Status
from tests.harness.agg import MemFencer, config


async def test_counts_match_every_nodes_state(tmp_path: Path) -> None:
    """The walk reads an unfenced node's status directly: the same tally as NodeRecord.state."""
    combos = list(itertools.product(FenceMode, ("", "repair", "acting"), ("", "running"), Status))
    agg = await Aggregator.open(config(tmp_path, nodes=len(combos), gc_freeze=False), fencers=[MemFencer()])
    try:
        for rec, (fence, ladder, handover, status) in zip(agg.mem.nodes.values(), combos):
            agg.mem.set_node(rec.name, fence=fence, ladder=ladder, handover=handover)
            rec.status = status
        expected = dict.fromkeys(STATES, 0)
        for rec in agg.mem.nodes.values():
            expected[rec.state] = expected.get(rec.state, 0) + 1
        assert agg.mem.counts() == expected
        assert {"drained", "repair", "returning", "fenced", "OK", "FAIL"} <= {s for s, n in expected.items() if n}
        # podhealth's fences (the fence cap's use on /metrics) are read off the same counts
        assert sum(expected[s] for s in OURS_STATES) == sum(1 for r in agg.mem.nodes.values() if r.fence.ours)
        used = agg.metrics.registry.get_sample_value("podhealth_aggregator_fence_cap_used")
        assert used == sum(1 for r in agg.mem.nodes.values() if r.fence.ours)
    finally:
        await agg.stop()


async def _passes(agg: Aggregator, n: int, timeout: float = 30.0) -> None:
    target = agg.housekeeping_passes + n
    deadline = time.monotonic() + timeout
    while agg.housekeeping_passes < target:
        assert time.monotonic() < deadline, "no housekeeping pass"
        await asyncio.sleep(0.01)


async def test_a_pass_counts_the_fleet_once_at_most(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    agg = await Aggregator.open(config(tmp_path, nodes=20, gc_freeze=False), fencers=[MemFencer()],
                                clock=lambda: clock[0])
    agg.housekeeping_interval = 0.01
    walks = [0]
    counts = agg.mem.counts

    def counting() -> dict[str, int]:
        walks[0] += 1
        return counts()
    monkeypatch.setattr(agg.mem, "counts", counting)
    await agg.start()
    try:
        await _passes(agg, 2)
        walks[0], passes = 0, agg.housekeeping_passes
        await _passes(agg, 3)
        assert walks[0] == 0, "memory did not change: no walk"
        # Memory changes before every pass (a new node each, so the counts change and a sample is written).
        for i in range(5):
            walks[0], passes = 0, agg.housekeeping_passes
            agg.mem.apply_report(f"new{i:02d}", (), 1000.0, "{}", 1000.0, fp=7, order=("b", 1))
            await _passes(agg, 1)
            assert 1 <= walks[0] <= agg.housekeeping_passes - passes + 1, walks[0]
    finally:
        await agg.stop()


async def test_reconcile_looks_only_at_listed_and_stored_fences(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fencer = MemFencer()
    agg = await Aggregator.open(config(tmp_path, nodes=40, gc_freeze=False), fencers=[fencer])
    seen: dict[str, Move] = {}
    move_of = reconcile_mod.reconcile_move
    try:
        agg.mem.set_node("dgx01", fence=FenceMode.FENCED)  # the store says ours: no backend shows it
        agg.mem.set_node("dgx02", fence=FenceMode.EXTERNAL)  # drained by someone, free now
        agg.mem.set_node("dgx03", fence=FenceMode.FENCING)  # unlisted and pending: nothing to do
        fencer.fenced["dgx04"] = f"{REASON_PREFIX}xid 79"  # our mark the store does not hold

        def noting(s: Seen, names: list[str] = sorted(["dgx01", "dgx02", "dgx04"])) -> Move:
            move = move_of(s)
            seen[names[len(seen)]] = move
            return move
        monkeypatch.setattr(reconcile_mod, "reconcile_move", noting)
        monkeypatch.setattr(reconcile_mod, "CHUNK", 10)
        await agg.reconcile()
        assert seen == {"dgx01": Move.RECORD_REMOVED, "dgx02": Move.RECORD_FREE, "dgx04": Move.ADOPT}
        # The backend's names of the 40 nodes were mapped in 4 slices, the loop given a turn between them.
        assert agg.reconciler.sliced == 3
        assert await agg.reconciler.targets(fencer) == {n: n for n in agg.mem.nodes}
        assert agg.mem.nodes["dgx04"].fence is FenceMode.FENCED and agg.mem.nodes["dgx02"].fence is FenceMode.NONE
        # Every node the walk left out would have been NOTHING.
        others = [n for n in agg.mem.nodes if n not in seen]
        assert len(others) == 37
        for n in others:
            rec: Any = agg.mem.nodes[n]
            assert move_of(Seen(rec.fence, False, False)) is Move.NOTHING
            assert move_of(Seen(rec.fence, False, False, initial=True)) is Move.NOTHING
    finally:
        await agg.stop()


def test_decide_matches_the_rules_once_per_kind_of_condition(monkeypatch: pytest.MonkeyPatch) -> None:
    """decide() runs every second over every open condition: a warning on each of 100,000 nodes
    made that many glob matches a run. Conditions of one kind (status, check, action, severity)
    share their rule, matched once; each still gets what its rule says."""
    conds = [Condition(node=f"dgx{i:03d}", check=check, entity="GPU0", status=status, action=action,
                       severity="critical" if status is Status.FAIL else "warning", since=900.0, observed=999.0,
                       notified=i % 2 == 0)
             for i in range(60)
             for check, status, action in [(("xid", "thermal")[i % 2], (Status.FAIL, Status.WARN)[i % 3 == 0],
                                            (Action.RESET_GPU, Action.NONE)[i % 5 == 0])]]
    kinds = {(c.status, c.check, c.action, c.severity) for c in conds}
    calls = [0]
    matched = policy_mod.rule_for

    def counting(c: Condition, rules: Sequence[RuleConfig]) -> RuleConfig | None:
        calls[0] += 1
        return matched(c, rules)
    monkeypatch.setattr(policy_mod, "rule_for", counting)
    rules = _default_rules()
    fleet = FleetState(nodes={c.node: NodeView(c.node) for c in conds})
    d = policy_mod.decide(conds, fleet, 1000.0, Policy(rules=rules, max_fenced=100, max_percent_per_partition=100.0,
                                                      fences_per_minute=100, breaker_share_percent=100.0,
                                                      breaker_min_nodes=1000))
    assert calls[0] == len(kinds) < len(conds)
    notify = sorted(c.node for c in conds if not c.notified and (r := matched(c, rules)) and r.do == "notify")
    assert sorted(a.node for a in d.actions if a.kind == "notify") == notify and notify
    fence = {c.node for c in conds if (r := matched(c, rules)) and r.do == "fence"}
    assert {a.node for a in d.actions if a.kind == "fence"} == fence and fence
