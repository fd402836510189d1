"""collectors/runtime.py: the one way a collector is built and run (agent, handover suite, check).

A hung factory or collect() costs its own timeout and makes that collector disabled or stale;
the caller never waits longer, and what a hung call returns late is discarded.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from podhealth import collectors, config
from podhealth.checks.handover.suite import LocalCollector
from podhealth.collectors.base import Collection, CollectorDisabled, specs
from podhealth.collectors.runtime import MAX_ERRORS, Outcome, Runner, build, outcome_state
from podhealth.snapshot import CollectorState
from podhealth.vocab import MetricSpec, Sample

pytestmark = pytest.mark.timeout(60)

CFG = config.Config()


class Gate:
    """A collector whose collect() blocks until released (a wedged NVML or NFS source)."""

    name = "gate"
    metrics = specs(MetricSpec("gate_value", "gauge", "A test value."))

    def __init__(self, hang: bool = True) -> None:
        self.release = threading.Event()
        if not hang:
            self.release.set()
        self.calls = 0
        self.closed = False

    def collect(self) -> Collection:
        self.calls += 1
        self.release.wait(30)
        return Collection((Sample.of("gate_value", float(self.calls)),), errors=tuple(f"e{i}" for i in range(40)))

    def close(self) -> None:
        self.closed = True


async def test_build_names_why_a_collector_is_disabled() -> None:
    def disabled(cfg: config.Config, **_: Any) -> Gate:
        raise CollectorDisabled("no HCA")

    def broken(cfg: config.Config, **_: Any) -> Gate:
        raise RuntimeError("bad firmware")

    def not_a_collector(cfg: config.Config, **_: Any) -> object:
        return object()

    assert await build("a", disabled, CFG, {}, 5.0) == (None, "no HCA")
    assert await build("b", broken, CFG, {}, 5.0) == (None, "initialisation failed: RuntimeError: bad firmware")
    assert await build("c", not_a_collector, CFG, {}, 5.0) == (None, "factory returned object, not a Collector")
    col, reason = await build("d", lambda cfg, **seams: Gate(**seams), CFG, {"hang": False}, 5.0)
    assert isinstance(col, Gate) and reason == "" and col.release.is_set()  # seams reach the factory


async def test_a_hung_factory_costs_its_timeout_not_the_caller() -> None:
    release = threading.Event()

    def hung(cfg: config.Config, **_: Any) -> Gate:
        release.wait(30)
        return Gate()

    try:
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        assert await build("h", hung, CFG, {}, 0.2) == (None, "initialisation did not finish within 0.2s")
        assert loop.time() - t0 < 5.0
    finally:
        release.set()


async def test_a_hung_collect_times_out_and_its_late_result_is_discarded() -> None:
    gate = Gate()
    runner = Runner("gate", gate, 0.2)
    late = asyncio.Event()
    runner.on_late = lambda seconds: late.set()
    try:
        out = await runner.collect_once()
        assert out == Outcome(None, "timed out after 0.2s", True, 0.2)
        assert runner.busy  # the thread is still in the call: no second one piles onto it
        with pytest.raises(RuntimeError, match="still collecting"):
            runner.collect_once()
        gate.release.set()
        await asyncio.wait_for(late.wait(), 10)
        assert not runner.busy
        out = await runner.collect_once()  # the next call is fresh data, not the late one
        assert out.collection is not None and out.collection.samples[0].value == 2.0 and not out.timed_out
    finally:
        gate.release.set()
        assert await runner.close(5.0) and gate.closed


async def test_a_runner_still_collecting_is_not_closed() -> None:
    gate = Gate()
    runner = Runner("gate", gate, 0.1)
    try:
        assert (await runner.collect_once()).timed_out
        assert not await runner.close(1.0) and not gate.closed
    finally:
        gate.release.set()


async def test_a_shutdown_mid_collection_still_closes_the_collector() -> None:
    """A collect() in flight (not hung: within its timeout) when the agent stops is waited for,
    then the collector is closed (it was left open, and the scheduler test saw it at random)."""
    gate = Gate()
    runner = Runner("gate", gate, 10.0)
    task = runner.collect_once()
    closing = asyncio.create_task(runner.close(5.0))
    await asyncio.sleep(0)  # let close() find the call in flight (either order must close)
    assert not gate.closed
    gate.release.set()
    assert await closing and gate.closed
    assert (await task).collection is not None


async def test_a_failing_or_wrong_collect_is_an_error_outcome() -> None:
    class Raises(Gate):
        def collect(self) -> Collection:
            raise OSError(24, "Too many open files")

    class Wrong(Gate):
        def collect(self) -> Collection:
            return "samples"  # type: ignore[return-value]

    for col, error in ((Raises(), "OSError: [Errno 24] Too many open files"),
                       (Wrong(), "TypeError: collect() returned str, not Collection")):
        runner = Runner("x", col, 5.0)
        out = await runner.collect_once()
        assert (out.collection, out.error, out.timed_out) == (None, error, False)
        await runner.close(5.0)


def test_outcome_state() -> None:
    st = CollectorState("gate", stale=False, samples=(Sample.of("gate_value", 1.0),), last_success=5.0, runs=3)
    ok = outcome_state(st, Outcome(Collection((Sample.of("gate_value", 2.0),), errors=tuple("e" * 600 for _ in range(40))),
                                   duration=0.5), 10.0)
    assert (ok.samples[0].value, ok.last_success, ok.last_attempt, ok.runs, ok.stale) == (2.0, 10.0, 10.0, 4, False)
    assert len(ok.errors) == MAX_ERRORS and all(len(e) == 512 for e in ok.errors)
    failed = outcome_state(st, Outcome(None, "OSError: boom", duration=0.1), 11.0)
    # The samples go; whether the state is stale is the caller's (the scheduler ages it).
    assert (failed.samples, failed.errors, failed.failures, failed.last_success, failed.stale) == \
        ((), ("OSError: boom",), 1, 5.0, False)
    hung = outcome_state(st, Outcome(None, "timed out after 2s", True, 2.0), 12.0)
    assert (hung.samples, hung.stale, hung.last_duration, hung.failures) == ((), True, 2.0, 1)


def test_local_collector_reports_a_hung_source_stale_and_finishes(monkeypatch: pytest.MonkeyPatch) -> None:
    """`podhealth check` with no agent: the same runtime, so a wedged source is UNKNOWN, not a hang."""
    gates: list[Gate] = []

    def make(cfg: config.Config, **_: Any) -> Gate:
        gates.append(Gate())
        return gates[-1]

    monkeypatch.setitem(collectors.REGISTRY, "gate", f"{__name__}:_factory")
    monkeypatch.setattr(f"{__name__}._factory", make, raising=False)
    try:
        snap = LocalCollector(CFG, only=("gate",), timeout_cap=0.3).collect_sync()
        st = snap.collectors["gate"]
        assert (st.enabled, st.stale, st.samples, st.errors, st.failures) == \
            (True, True, (), ("timed out after 0.3s",), 1)
        assert gates and not gates[0].closed  # still in its call: left alone
    finally:
        for g in gates:
            g.release.set()


def _factory(cfg: config.Config, **seams: Any) -> Gate:  # replaced per test (monkeypatch)
    raise CollectorDisabled("not set up")
