"""The short collectors' shared lane (core/worker.py `Lane`, issue 32 §5): one thread for them, one
wake-up of the loop per tick for their results, and a hung one still stales only itself.

Behaviour only: threads are counted by name, wake-ups by the lane's own counter, never timed.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any, Callable

import pytest

from podhealth import config
from podhealth.agent.agent import Agent
from podhealth.collectors.base import Collection, specs
from podhealth.collectors.runtime import Runner
from podhealth.vocab import MetricSpec, Sample
from podhealth.worker import Lane

pytestmark = pytest.mark.timeout(60)

NAMES = ("nvml", "nvlink", "infiniband", "host", "pcie_aer", "edac")


class Fake:
    name = "fake"
    metrics = specs(MetricSpec("fake_value", "gauge", "A test value."))

    def __init__(self, ident: str) -> None:
        self.ident = ident
        self.calls = 0
        self.hang = False
        self.release = threading.Event()
        self.closed = False

    def collect(self) -> Collection:
        self.calls += 1
        if self.hang:
            self.release.wait(30)
        return Collection((Sample.of("fake_value", 1.0, id=self.ident),))

    def close(self) -> None:
        self.closed = True


class OwnFake(Fake):
    own_worker = True


def cfg_for(interval: float, timeout: float, names: tuple[str, ...] = NAMES) -> config.Config:
    lines = ["listen: {address: 127.0.0.1, port: 0}", "collectors:"]
    lines += [f"  {n}: {{interval: {interval}, timeout: {timeout}}}" for n in names]
    for n in config.CollectorsConfig.__dataclass_fields__:
        if n not in names:
            lines.append(f"  {n}: {{enabled: false}}")
    return config.loads("\n".join(lines) + "\n")


async def until(pred: Callable[[], Any], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def collector_threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("podhealth-") and t.is_alive())


async def test_short_collectors_share_one_thread_and_one_wakeup_per_tick() -> None:
    fakes = {n: Fake(n) for n in NAMES}
    before = set(collector_threads())
    agent = Agent(cfg_for(0.1, 1.0), node="n1", factories={n: (lambda c, f=f, **_: f) for n, f in fakes.items()})
    await agent.start()
    try:
        await until(lambda: all(f.calls >= 5 for f in fakes.values()), "5 collections each")
        lane = agent.scheduler.shared_lane
        assert lane is not None
        runs = max(s.runs for s in agent.snapshot.collectors.values() if s.name in NAMES)
        wakeups = lane.wakeups
        ours = [t for t in collector_threads() if t not in before]
        assert lane.threads_started == 1
        assert [t for t in ours if t.startswith("podhealth-collectors")] == ["podhealth-collectors"]
        assert not any(t.startswith(tuple(f"podhealth-{n}" for n in NAMES)) for t in ours), ours
    finally:
        await agent.stop()
    # Six collectors, same interval: their results come back together, at most once per tick
    # (a slow tick can merge into the next, never split). One thread each woke the loop six times.
    assert 1 <= wakeups <= runs, (wakeups, runs)
    assert all(f.closed for f in fakes.values())


async def test_a_hung_collector_on_the_lane_stales_only_itself() -> None:
    fakes = {n: Fake(n) for n in NAMES}
    agent = Agent(cfg_for(0.1, 0.3), node="n1", factories={n: (lambda c, f=f, **_: f) for n, f in fakes.items()})
    await agent.start()
    try:
        await until(lambda: all(f.calls >= 2 for f in fakes.values()), "2 collections each")
        fakes["nvml"].hang = True
        await until(lambda: agent.snapshot.collectors["nvml"].stale, "nvml stale")
        counts = {n: f.calls for n, f in fakes.items()}
        # The others go on (on the lane's new thread) and stay fresh while nvml hangs.
        await until(lambda: all(fakes[n].calls >= counts[n] + 5 for n in NAMES if n != "nvml"),
                    "5 more collections of the others")
        snap = agent.snapshot.collectors
        assert all(not snap[n].stale and snap[n].samples for n in NAMES if n != "nvml")
        assert snap["nvml"].stale and not snap["nvml"].samples
        assert fakes["nvml"].calls == counts["nvml"]  # never started again while it hangs
        lane = agent.scheduler.shared_lane
        assert lane is not None and lane.threads_started == 2
        fakes["nvml"].hang = False
        fakes["nvml"].release.set()
        await until(lambda: not agent.snapshot.collectors["nvml"].stale, "nvml fresh again")
    finally:
        await agent.stop()


async def test_collectors_that_wait_by_design_keep_their_own_thread() -> None:
    shared, own = Fake("s"), OwnFake("o")
    agent = Agent(cfg_for(0.1, 1.0, ("nvml", "host")), node="n1",
                  factories={"nvml": lambda c, **_: shared, "host": lambda c, **_: own})
    await agent.start()
    try:
        await until(lambda: shared.calls >= 2 and own.calls >= 2, "2 collections each")
        names = collector_threads()
        assert "podhealth-host" in names and "podhealth-collectors" in names
        assert "podhealth-nvml" not in names
    finally:
        await agent.stop()


async def test_a_call_queued_behind_another_is_not_charged_for_the_wait() -> None:
    lane = Lane("test-queue")
    slow, quick = Fake("slow"), Fake("quick")
    slow.hang = True
    a = Runner("slow", slow, 30.0, lane=lane)
    b = Runner("quick", quick, 0.05, lane=lane)
    ta, tb = a.collect_once(), b.collect_once()
    # Several of quick's timeouts pass while it waits behind slow: it has not started, so it has
    # not timed out.
    done, _ = await asyncio.wait((tb,), timeout=0.5)
    assert not done and quick.calls == 0
    slow.release.set()
    out_a, out_b = await ta, await tb
    assert out_a.collection is not None and not out_a.timed_out
    assert out_b.collection is not None and not out_b.timed_out
    assert lane.wakeups == 1  # both results in one hand-over
    lane.close()


class NvmlFake(Fake):
    lane = "nvml"


async def test_a_vendor_library_has_a_lane_of_its_own() -> None:
    """NVML's collectors queue behind each other, never in front of the file readers: a wedged GPU
    that hangs NVML then holds up no other source, not even until its timeout."""
    gpu, links, ib = NvmlFake("g"), NvmlFake("l"), Fake("ib")
    gpu.hang = True
    agent = Agent(cfg_for(0.1, 0.3, ("nvml", "nvlink", "infiniband")), node="n1",
                  factories={"nvml": lambda c, **_: gpu, "nvlink": lambda c, **_: links,
                             "infiniband": lambda c, **_: ib})
    await agent.start()
    try:
        await until(lambda: ib.calls >= 10 and links.calls >= 2, "the others collecting past the hang")
        nvml_lane, shared = agent.scheduler.lane("nvml"), agent.scheduler.shared_lane
        assert nvml_lane is not None and shared is not None and nvml_lane is not shared
        assert shared.threads_started == 1  # never stuck behind the hung NVML call
        assert nvml_lane.threads_started >= 2  # the hung call kept one, links went on on another
        assert agent.snapshot.collectors["nvml"].stale and not agent.snapshot.collectors["infiniband"].stale
    finally:
        gpu.release.set()
        await agent.stop()
