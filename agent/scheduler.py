"""Runs each collector on its own interval, off the event loop, with a timeout.

Per collector: a tick every `interval` seconds starts a collection through the collector runtime
(collectors/runtime.py), unless the previous
call is still in flight (then the tick is an overrun, counted, and
nothing starts: a thread cannot be cancelled, and piling calls onto a hung NVML or NFS source
would only leak threads). A call still running `timeout` seconds after it started marks the
collector stale and drops its samples, so hung data never looks fresh; whatever it returns late
is discarded. Data also goes stale when the last success is older than `stale_after` intervals.
Only changes are logged (went stale, failing, recovered), never every failure.

Threads: the short collectors share one lane (core/worker.py `Lane`, thread "collectors"), the
NVML ones another ("nvml"; collectors/runtime.py `lane_of`): every tick starts on one origin, so
the collections due together reach a lane's thread together and their results come back in one
wake-up of the loop; a hung one is given up at its timeout and the lane goes on with a new
thread. A collector with `own_worker` (kmsg, nfs, dcgm, site checks) has its own.

A collector with `readable_fd()` (kmsg: /dev/kmsg, or the simulated node's FIFO) is also
collected as soon as its descriptor turns readable (loop.add_reader), so a kernel record is read
when the kernel offers it, not up to an interval later. The descriptor is watched only between
collections (a collection may close and reopen it) and kicks are spaced by KICK_MIN_GAP after a
burst of KICK_BURST, so a chattering kernel log costs at most a bounded number of extra
collections per second. While it
is watched, its interval ticks are only a fallback and run every `watched_interval` (when longer).
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, replace
from typing import Callable

from podhealth import log
from podhealth.agent.store import SnapshotStore
from podhealth.collectors.base import Collector
from podhealth.collectors.runtime import SHARED_LANE, Outcome, Runner, lane_of, outcome_state
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.worker import Lane

_log = log.get("podhealth.agent.scheduler")

KICK_MIN_GAP = 0.05  # seconds between collections started by readiness (a log storm stays bounded)
# Collections readiness may start back to back before the gap applies. The kernel prints a fault
# as a burst of records (XID 79: five NVRM lines); a collection that woke on the first may find
# the burst half written, and the record that matters must not then wait out the gap (~60 ms).
KICK_BURST = 3


def succeeded(st: CollectorState) -> bool:
    """Whether the collector's last finished run succeeded (both stamps come from the same clock read)."""
    return st.last_success is not None and st.last_success == st.last_attempt


@dataclass
class _Slot:
    name: str
    runner: Runner
    interval: float
    watched_interval: float | None = None  # the interval while the descriptor is watched
    watchable: bool = False  # the last collection left a descriptor that is being watched
    run: "asyncio.Task[Outcome] | None" = None  # the collection not yet recorded (ends at its timeout)
    task: "asyncio.Task[None] | None" = None
    failing: bool = False  # last outcome was a failure or timeout (for logging the recovery)
    watched_fd: int | None = None  # registered with loop.add_reader while no collection runs
    kicked: float = float("-inf")  # monotonic start of the last collection started by readiness
    kick_credit: float = KICK_BURST  # collections readiness may start now (refilled one per KICK_MIN_GAP)
    kick_timer: asyncio.TimerHandle | None = None
    unwatchable: bool = False  # its descriptor cannot be polled: the interval alone, said once


class Scheduler:
    def __init__(self, store: SnapshotStore, *, stale_after: float = 3.0,
                 clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.stale_after = stale_after
        self._clock = clock
        self._mono = monotonic
        self._slots: dict[str, _Slot] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lanes: dict[str, Lane] = {}  # shared threads by lane name, each made with its first collector

    @property
    def shared_lane(self) -> Lane | None:
        return self._lanes.get(SHARED_LANE)

    def lane(self, name: str) -> Lane | None:
        return self._lanes.get(name)

    def add(self, name: str, collector: Collector, interval: float, timeout: float,
            watched_interval: float | None = None) -> None:
        if name in self._slots:
            raise ValueError(f"collector {name!r} added twice")
        lane = None
        lane_name = lane_of(collector)
        if lane_name is not None:
            lane = self._lanes.get(lane_name)
            if lane is None:
                lane = self._lanes[lane_name] = Lane(lane_name, self._mono)
        runner = Runner(name, collector, timeout, self._mono, lane)
        slot = _Slot(name, runner, interval, watched_interval)
        runner.on_late = lambda seconds, s=slot: self._late(s, seconds)
        self._slots[name] = slot
        if self.store.get(name) is None:
            self.store.put(CollectorState(name=name))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._slots)

    def in_flight(self, name: str) -> bool:
        return _busy(self._slots[name])

    def idle(self) -> bool:
        """No collection running that has not timed out (a hung one does not hold up rendering)."""
        return all(s.run is None for s in self._slots.values())

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        # One origin, on the loop's own clock, for every collector: those on the same interval
        # get identical deadlines and so start in the same loop iteration. With an origin (or a
        # sleep) each, a loaded machine lets one start and finish before the other has started,
        # which ends the burst early and runs the checks on a half-updated cycle.
        origin = self._loop.time()
        for slot in self._slots.values():
            slot.task = self._loop.create_task(self._every(slot, origin), name=f"collect-{slot.name}")

    async def stop(self, close_timeout: float = 2.0) -> None:
        """Stop ticking and close every collector whose worker is free (a hung one is left alone)."""
        for slot in self._slots.values():
            for task in (slot.task, slot.run):
                if task is not None:
                    task.cancel()
            self._unwatch(slot)
        tasks = [t for s in self._slots.values() for t in (s.task, s.run) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        for slot in self._slots.values():
            slot.runner.on_late = None
            self._unwatch(slot)  # a collection that finished meanwhile may have watched again
        slots = list(self._slots.values())
        closed = await asyncio.gather(*(s.runner.close(close_timeout) for s in slots))
        for slot, ok in zip(slots, closed):
            if not ok:  # its thread exits when the hung call returns
                _log.warning("collector still busy at shutdown; not closed", collector=slot.name)
        for lane in self._lanes.values():
            lane.close()

    async def _every(self, slot: _Slot, origin: float) -> None:
        # Fixed-rate ticks at absolute times on the loop's clock; a late wake-up skips ticks
        # rather than bunching them (whole intervals, so slots that share an interval stay in step).
        loop = asyncio.get_running_loop()
        due = origin
        while True:
            interval = self._interval(slot)  # before the tick, which unwatches until the collection ends
            self._tick(slot)
            due += interval
            now = loop.time()
            if due <= now:
                due += (math.floor((now - due) / interval) + 1) * interval
            wake = loop.create_future()
            timer = loop.call_at(due, _wake, wake)
            try:
                await wake
            finally:
                timer.cancel()

    @staticmethod
    def _interval(slot: _Slot) -> float:
        if slot.watchable and slot.watched_interval is not None:
            return max(slot.interval, slot.watched_interval)
        return slot.interval

    async def collect_now(self) -> Snapshot:
        """Run every collector once now and return the snapshot (the handover suite wants fresh data).

        A collector already running is not started twice: its current run is awaited instead.
        Each run is bounded by its own timeout (a hung one comes back marked stale).
        """
        if self._loop is None:
            raise RuntimeError("collect_now() before start()")
        waits = []
        for slot in self._slots.values():
            if not _busy(slot):
                self._start(slot)
            if slot.run is not None:
                waits.append(slot.run)
        if waits:
            limit = max(s.runner.timeout for s in self._slots.values()) + 0.1
            # Each run records its outcome (or its timeout) itself; shield it from our own cancellation.
            await asyncio.wait([asyncio.shield(t) for t in waits], timeout=limit)
        return self.store.snapshot

    # ---- one tick ---------------------------------------------------------------------------

    def _tick(self, slot: _Slot) -> None:
        st = self.store.get(slot.name) or CollectorState(name=slot.name)
        aged = self._aged(slot, st)
        if _busy(slot):
            self.store.put(replace(aged, overruns=aged.overruns + 1))
            _log.debug("collector overrun", collector=slot.name, overruns=aged.overruns + 1)
            return
        if aged is not st:
            self.store.put(aged)
        self._start(slot)

    # ---- readiness ----------------------------------------------------------------------------

    def _watch(self, slot: _Slot) -> None:
        """Watch the collector's descriptor until the next collection starts (none: nothing)."""
        fd_of = getattr(slot.runner.collector, "readable_fd", None)
        if fd_of is None or slot.unwatchable or self._loop is None or slot.task is None or slot.task.done():
            return
        try:
            fd = fd_of()
            slot.watchable = fd is not None
            if fd is None:
                return  # not open (the source is unreadable now): the interval, as for a file
            self._loop.add_reader(fd, self._readable, slot)
        except Exception as e:  # noqa: BLE001 - a descriptor epoll refuses (EPERM), a broken hook
            slot.unwatchable = True
            slot.watchable = False
            _log.warning("cannot watch the collector's descriptor; collecting on its interval only",
                         collector=slot.name, error=repr(e))
            return
        slot.watched_fd = fd

    def _unwatch(self, slot: _Slot) -> None:
        if slot.kick_timer is not None:
            slot.kick_timer.cancel()
            slot.kick_timer = None
        if slot.watched_fd is not None and self._loop is not None:
            self._loop.remove_reader(slot.watched_fd)
        slot.watched_fd = None

    def _readable(self, slot: _Slot) -> None:
        """Records wait on the collector's descriptor: collect now (or after KICK_MIN_GAP)."""
        assert self._loop is not None
        self._unwatch(slot)  # level-triggered: unwatched until the records are read
        if _busy(slot):
            return  # _record (or _late) watches again; whatever is still unread makes it readable at once
        credit = _credit(slot, self._mono())
        if credit < 1:
            slot.kick_timer = self._loop.call_later((1 - credit) * KICK_MIN_GAP, self._kick, slot)
            return
        self._kick(slot)

    def _kick(self, slot: _Slot) -> None:
        slot.kick_timer = None
        if not _busy(slot):
            now = self._mono()
            slot.kick_credit, slot.kicked = _credit(slot, now) - 1, now
            self._start(slot)

    def _start(self, slot: _Slot) -> None:
        assert self._loop is not None
        self._unwatch(slot)
        run = slot.runner.collect_once()  # the call starts now: the slot is busy from here
        slot.run = run
        # Added before anyone else waits on `run` (collect_now), so the outcome is in the store first.
        run.add_done_callback(lambda t, s=slot: self._collected(s, t))

    def _collected(self, slot: _Slot, run: "asyncio.Task[Outcome]") -> None:
        if slot.run is run:
            slot.run = None  # before the store hears of it: the agent's idle check must see it done
        if run.cancelled():
            return  # stopping
        try:
            self._record(slot, run.result())
        finally:
            if not slot.runner.busy:
                self._watch(slot)  # a hung call watches again when it returns (_late)

    def _aged(self, slot: _Slot, st: CollectorState) -> CollectorState:
        """The state with staleness by age applied (last success older than stale_after intervals)."""
        if st.stale and not st.samples:
            return st
        if st.last_success is not None and self._clock() - st.last_success <= self.stale_after * self._interval(slot):
            return st
        if not st.stale:
            _log.warning("collector data is stale", collector=slot.name,
                         last_success=st.last_success, max_age=self.stale_after * slot.interval)
        return replace(st, stale=True, samples=(), reports=())

    def _record(self, slot: _Slot, out: Outcome) -> None:
        now = self._clock()
        st = self.store.get(slot.name) or CollectorState(name=slot.name)
        if out.timed_out:
            self.store.put(outcome_state(st, out, now))
            if not slot.failing:
                _log.warning("collector timed out; marked stale until it returns",
                             collector=slot.name, timeout=slot.runner.timeout)
            slot.failing = True
            return
        if out.collection is None:
            self.store.put(outcome_state(self._aged(slot, st), out, now))
            if not slot.failing:
                _log.warning("collector failing", collector=slot.name, error=out.error)
            slot.failing = True
            return
        self.store.put(outcome_state(st, out, now), out.collection.events)
        if slot.failing:
            _log.info("collector recovered", collector=slot.name, seconds=round(out.duration, 3))
        slot.failing = False

    def _late(self, slot: _Slot, seconds: float) -> None:
        # Late data describes a moment long past: discarded; the next tick collects afresh.
        _log.info("hung collection returned; discarded", collector=slot.name, seconds=round(seconds, 3))
        self._watch(slot)


def _credit(slot: _Slot, now: float) -> float:
    """The slot's kick credit at `now`: one more per KICK_MIN_GAP since its last kick, at most KICK_BURST
    (a token bucket: a storm still starts at most one collection per KICK_MIN_GAP, sustained)."""
    return min(float(KICK_BURST), slot.kick_credit + (now - slot.kicked) / KICK_MIN_GAP)


def _busy(slot: _Slot) -> bool:
    """A collection runs or is not recorded yet, or a timed-out call still holds the worker."""
    return slot.run is not None or slot.runner.busy


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)
