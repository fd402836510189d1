"""Issue 32: a housekeeping pass looks at what changed, not at the fleet (the counter of nodes
visited per pass); the garbage collector's pauses are observed and long-lived objects frozen
after a large load; the loop-lag probe sees a stall."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from podhealth import looplag
from podhealth.config_aggregator import NodeEntry
from podhealth.aggregator.gcwatch import MIN_GROWTH, Freezer
from podhealth.aggregator.service import Aggregator
from podhealth.aggregator.state import digest_of
from tests.harness.agg import MemFencer, config

FLEET = 10_000


async def _passes(agg: Aggregator, n: int = 2, timeout: float = 30.0) -> None:
    """Until `n` more housekeeping passes have finished (the first may have begun before the change)."""
    target = agg.housekeeping_passes + n
    deadline = time.monotonic() + timeout
    while agg.housekeeping_passes < target:
        assert time.monotonic() < deadline, "no housekeeping pass"
        await asyncio.sleep(0.01)


def _visits(agg: Aggregator) -> float:
    return agg.metrics.registry.get_sample_value("podhealth_aggregator_housekeeping_visits_total") or 0.0


async def test_a_pass_visits_the_nodes_that_changed_not_the_fleet(tmp_path: Path) -> None:
    clock = [1000.0]
    cfg = config(tmp_path, nodes=0, heartbeat_interval=30.0, unreachable_after=60.0, gc_freeze=False)
    agg = await Aggregator.open(cfg, fencers=[MemFencer()], clock=lambda: clock[0])
    agg.housekeeping_interval = 0.01
    names = [f"dgx{i:05d}" for i in range(FLEET)]
    ops: list[Any] = []
    for n in names:
        ops += agg.mem.apply_report(n, (), 1000.0, "{}", 1000.0, fp=7, order=("b", 1))[1]
    await agg.commit(ops)
    digest = digest_of(7)
    await agg.start()
    try:
        await _passes(agg)
        settled = _visits(agg)
        await _passes(agg)
        assert _visits(agg) == settled, "nothing changed: nothing visited"

        # One node of 10,000 renews its lease: the pass looks at that one (its last-seen flush).
        clock[0] = 1010.0
        assert agg.mem.lease_quiet(names[5], digest, 1010.0, 1010.0, ("b", 2)) == "unchanged"
        await _passes(agg)
        assert _visits(agg) - settled == 1
        assert agg.metrics.registry.get_sample_value("podhealth_aggregator_housekeeping_last_visits") == 0

        # Every node but one is heard (a flush of each), then time passes: the one that stayed
        # silent is the one the pass finds, without walking the others.
        clock[0] = 1040.0
        for seq, n in enumerate(names[1:], start=3):
            agg.mem.lease_quiet(n, digest, 1040.0, 1040.0, ("b", seq))
        await _passes(agg)
        heard = _visits(agg)
        assert heard - settled == 1 + (FLEET - 1)
        clock[0] = 1061.0  # 61 s after names[0] was last heard, 21 s after the others
        await _passes(agg)
        assert _visits(agg) - heard == 1
        assert agg.mem.nodes[names[0]].unreachable_since == 1000.0
        assert ("dgx00000", "node_unreachable", "node") in agg.mem.conditions  # (never fences by itself)
        assert all(agg.mem.nodes[n].state == "OK" for n in names[1:])
        await _passes(agg)
        assert _visits(agg) - heard == 1, "a node already marked is not visited again"

        # Heard again: reachable, fresh, and the next silence finds it again.
        clock[0] = 1062.0
        agg.mem.apply_report(names[0], (), 1062.0, "{}", 1062.0, fp=7, order=("b", 50))
        assert agg.mem.nodes[names[0]].unreachable_since is None
        assert names[0] in agg.mem.heard.fresh and names[0] not in agg.mem.heard.lapsed
    finally:
        await agg.stop()


async def test_a_pulled_node_is_watched_only_until_node_unreachable_opens(tmp_path: Path) -> None:
    clock = [1000.0]
    cfg = dataclasses.replace(config(tmp_path, nodes=0, unreachable_after=60.0, gc_freeze=False),
                              nodes=(NodeEntry(name="dgx01", agent_url="http://127.0.0.1:9"),))
    agg = await Aggregator.open(cfg, fencers=[MemFencer()], clock=lambda: clock[0])  # not started: no pulls
    try:
        agg.mem.mark_unreachable("dgx01", 1000.0, 60.0, "GET /health: refused")
        assert agg.mem.heard.watch == {"dgx01"}
        clock[0] = 1030.0
        before = agg.mem.heard.visited
        agg.silence_ops(1030.0)
        assert agg.mem.heard.visited - before == 1  # still on its way
        assert ("dgx01", "node_unreachable", "node") not in agg.mem.conditions
        agg.silence_ops(1061.0)
        assert ("dgx01", "node_unreachable", "node") in agg.mem.conditions
        assert agg.mem.heard.watch == set()
        before = agg.mem.heard.visited
        agg.silence_ops(1100.0)
        assert agg.mem.heard.visited == before
    finally:
        await agg.stop()


@pytest.fixture
def unfrozen() -> Iterator[None]:
    yield
    gc.unfreeze()


def test_the_freezer_freezes_after_a_large_load_and_observes_every_pause(unfrozen: None) -> None:
    pauses: list[tuple[int, float]] = []
    f = Freezer(True, lambda g, s: pauses.append((g, s)))
    f.install()
    try:
        gc.unfreeze()
        assert not f.after_load(MIN_GROWTH - 1) and gc.get_freeze_count() == 0, "a small load is not frozen"
        assert f.after_load(MIN_GROWTH) and gc.get_freeze_count() > 0
        assert not f.after_load(MIN_GROWTH + 50), "grown by less than the threshold since"
        gc.collect()
        assert pauses == [], "noted, handed over by drain()"
        f.drain()
        assert any(g == 2 and s >= 0 for g, s in pauses), pauses
    finally:
        f.uninstall()
    n = len(pauses)
    gc.collect()
    f.drain()
    assert len(pauses) == n, "uninstalled: no more callbacks"
    off = Freezer(False, lambda g, s: None)
    gc.unfreeze()
    assert not off.after_load(10 * MIN_GROWTH) and gc.get_freeze_count() == 0


async def test_the_lag_probe_sees_a_stall_of_the_loop() -> None:
    seen: list[tuple[float, float]] = []
    task = asyncio.create_task(looplag.probe(lambda late, busy: seen.append((late, busy)), period=0.01))
    try:
        while not seen:
            await asyncio.sleep(0.005)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.2:  # a stall of the loop's own work: 0.2 s of CPU
            pass
        n = len(seen)
        while len(seen) == n:
            await asyncio.sleep(0.005)
        late, busy = max(seen)
        # Lower bounds: a slower or loaded machine only adds to the lag, and the busy part is at
        # least the CPU the loop spent.
        assert late >= 0.15 and busy >= 0.15
        assert all(b <= lt for lt, b in seen)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
