"""The agent's fast path for fatal kernel events (agent/health.py): new kmsg events are judged by
the immediate checks at once, before any snapshot hook runs; the full evaluation afterwards, or
one of an OLDER snapshot finishing late, publishes no second transition and never takes the
fast verdict back; snapshots that bring no new reading are not judged again."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from typing import Any, Callable

import pytest

from podhealth.agent import health
from podhealth.agent.agent import Agent
from podhealth.checks.passive.engine import Evaluator
from podhealth.config import Config
from podhealth.snapshot import CollectorState
from podhealth.vocab import CheckResult, Event, Sample, Status

pytestmark = pytest.mark.timeout(60)

X79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."


async def until(pred: Callable[[], Any], timeout: float = 10.0) -> Any:
    async def poll() -> Any:
        while not (v := pred()):
            await asyncio.sleep(0.005)
        return v
    return await asyncio.wait_for(poll(), timeout)


def kmsg_state(now: float, lines: float = 0.0) -> CollectorState:
    return CollectorState("kmsg", samples=(Sample.of("kmsg_lines", lines),), last_success=now,
                          last_attempt=now, stale=False)


def xid79(now: float) -> Event:
    return Event(kind="xid", code=79, time=now, text=X79, pci_bus_id="0000:18:00.0", source="kmsg")


class Setup:
    def __init__(self) -> None:
        self.agent = Agent(Config(), node="dgx01", factories={})
        self.health = health.Health(self.agent.view())
        self.agent.store.on_events.append(self.health.on_events)
        self.transitions: list[tuple[CheckResult | None, CheckResult]] = []
        self.health.on_transition.append(lambda old, new, at: self.transitions.append((old, new)))
        self.judged = 0
        real = Evaluator.evaluate

        def counted(ev: Evaluator, *a: Any, **kw: Any) -> Any:
            self.judged += 1
            return real(ev, *a, **kw)
        self._patch = pytest.MonkeyPatch()
        self._patch.setattr(Evaluator, "evaluate", counted)

    def xid_fails(self) -> list[CheckResult]:
        return [n for _, n in self.transitions if n.check == "xid" and n.status is Status.FAIL]

    def close(self) -> None:
        self._patch.undo()


def test_fatal_event_judged_before_any_snapshot_hook_and_published_once() -> None:
    async def main() -> None:
        s = Setup()
        try:
            store, h = s.agent.store, s.health
            now = time.time()
            store.put(kmsg_state(now))
            h.on_snapshot(store.snapshot)
            await until(lambda: h.evaluated_at > 0)
            older, older_version = store.snapshot, store.version
            full_runs = s.judged

            store.put(kmsg_state(now + 1, lines=1), events=(xid79(now + 0.5),))  # on_events -> fast path
            fails = await until(s.xid_fails)
            assert s.judged == full_runs, "judged by the fast path alone, no full evaluation"
            assert fails[0].action.value in ("RESET_GPU", "REBOOT", "DRAIN", "REPLACE")
            assert any(r.check == "xid" and r.status is Status.FAIL for r in h.results)
            # A full evaluation of a snapshot from before the event, finishing late (it was already
            # in the worker when the line came), must not turn the verdict back to OK.
            h._latest, h._latest_version, h._judged = older, older_version, None
            await h._judge_loop()
            assert s.judged == full_runs + 1
            assert [n.status for _, n in s.transitions if n.check == "xid"] == [Status.FAIL]
            assert any(r.check == "xid" and r.status is Status.FAIL for r in h.results)
            # The full evaluation of the snapshot with the event agrees: nothing published twice.
            h.on_snapshot(store.snapshot)
            await until(lambda: s.judged == full_runs + 2 and h._judging is not None and h._judging.done())
            assert len(s.xid_fails()) == 1
            assert not h._fast_hold, "a full evaluation of the same facts released the fast verdicts"
        finally:
            s.close()

    asyncio.run(main())


def test_a_snapshot_with_no_new_reading_is_not_judged_again() -> None:
    async def main() -> None:
        s = Setup()
        try:
            store, h = s.agent.store, s.health
            now = time.time()
            store.put(kmsg_state(now))
            h.on_snapshot(store.snapshot)
            await until(lambda: h.evaluated_at > 0 and h._judging is not None and h._judging.done())
            runs = s.judged
            # The kernel-log collector ran again and read nothing: only its stamps moved.
            store.put(dataclasses.replace(kmsg_state(now + 1)))
            h.on_snapshot(store.snapshot)
            assert h._latest is not store.snapshot and s.judged == runs
            # A new reading is judged...
            store.put(kmsg_state(now + 2, lines=3))
            h.on_snapshot(store.snapshot)
            await until(lambda: s.judged == runs + 1)
            # ...and so is an unchanged one once the last judgement is REJUDGE_S old.
            await until(lambda: h._judging is not None and h._judging.done())
            h.evaluated_at -= health.REJUDGE_S
            store.put(kmsg_state(now + 3, lines=3))
            h.on_snapshot(store.snapshot)
            await until(lambda: s.judged == runs + 2)
        finally:
            s.close()

    asyncio.run(main())


def test_fatal_event_judged_between_two_checks_of_an_evaluation_in_flight() -> None:
    """The fast judgement does not wait for a full evaluation already running: it runs between two
    of its checks (same thread), and the evaluations after it agree with it (the same `since`),
    published once."""
    from podhealth.checks.passive import engine

    async def main() -> None:
        s = Setup()
        entered, go = threading.Event(), threading.Event()
        in_eval = threading.Event()
        during: list[bool] = []
        evaluated: list[dict[tuple[str, str], Status]] = []
        real_aer, real_judge, real_eval = engine.CHECKS["kernel_aer"].fn, Evaluator.judge_immediate, Evaluator.evaluate

        def gated_aer(ctx: Any) -> Any:  # holds the first evaluation inside it, once
            if not go.is_set():
                entered.set()
                assert go.wait(10)
            return real_aer(ctx)

        def judge(ev: Evaluator, *a: Any, **kw: Any) -> Any:
            during.append(in_eval.is_set())
            return real_judge(ev, *a, **kw)

        def evaluate(ev: Evaluator, *a: Any, **kw: Any) -> Any:
            in_eval.set()
            try:
                out = real_eval(ev, *a, **kw)
                evaluated.append({(r.check, r.entity): r.status for r in out})
                return out
            finally:
                in_eval.clear()
        s._patch.setitem(engine.CHECKS, "kernel_aer", dataclasses.replace(engine.CHECKS["kernel_aer"], fn=gated_aer))
        s._patch.setattr(Evaluator, "judge_immediate", judge)
        s._patch.setattr(Evaluator, "evaluate", evaluate)
        try:
            store, h = s.agent.store, s.health
            now = time.time()
            store.put(kmsg_state(now))
            h.on_snapshot(store.snapshot)  # the first evaluation: held inside kernel_aer
            await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
            ue = Event(kind="edac", code=1, time=now + 0.5, text="EDAC MC0: 1 UE memory read error on DIMM_A1 (x)",
                       device="mc0", subcode=1, source="kmsg")
            store.put(kmsg_state(now + 1, lines=2), events=(xid79(now + 0.5), ue))  # on_events -> fast path
            await until(lambda: h._worker._first)  # the fast judgement is queued while the evaluation runs
            go.set()
            fails = await until(s.xid_fails)
            await until(lambda: h._judging is not None and h._judging.done())
            assert during == [True], "the fast judgement ran inside the evaluation in flight, once"
            # kernel_ras comes after the fast judgement in that evaluation: it judged the new line too
            assert evaluated[0][("kernel_ras", "node")] is Status.FAIL
            assert any(r.check == "xid" and r.status is Status.FAIL for r in h.results)
            # The evaluation of the snapshot with the event agrees, with the fast verdict's `since`.
            h.on_snapshot(store.snapshot)
            await until(lambda: s.judged == 2 and h._judging is not None and h._judging.done())
            assert len(s.xid_fails()) == 1
            xid = [r for r in h.results if r.check == "xid" and r.status is Status.FAIL]
            assert [r.since for r in xid] == [fails[0].since]
        finally:
            s.close()

    asyncio.run(main())
