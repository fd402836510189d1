"""The agent's plug-in seam: a Sink is somewhere the agent sends what it sees.

A sink (the aggregator publisher, the heartbeat, the InfluxDB export) gets the latest snapshot
once per burst of changes, the newly seen kernel-log events, and every verdict transition; it may
add metric families to /metrics. It is built from config by `agent/wiring.py` with only what it
needs (its config section, the node name, a function that reads the node report or the metric
specs), never the whole Agent, and handed to `Agent.add_sink()` before the agent starts.

`Sinks` delivers to every sink the same way. Each sink has its own ordered queue drained by its
own task, so a sink that is slow or hangs only delays itself: the collectors, /metrics and the
other sinks go on. Every call is bounded (a delivery by `hook_timeout`, start and stop by their
own limits), a call that raises or runs out of time is logged through core/logrepeat.py (the
first of a kind at once, then one line a minute with the count) and counted in
`podhealth_sink_errors_total{sink,reason}`. While a sink is behind, consecutive snapshots are
merged into the newest (only the latest state matters); events and transitions wait, up to
`max_pending`, the oldest dropped and counted beyond that.

The hooks are coroutines run on the event loop: a sink must not block it (blocking I/O goes to a
thread, as the InfluxDB export's writes do); a coroutine that awaits too long is cancelled.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from typing import Any, Awaitable, Callable, Iterable, NamedTuple, Protocol, TypeVar

from podhealth import log
from podhealth.agent.metrics.family import Family
from podhealth.logrepeat import Repeats
from podhealth.snapshot import Snapshot
from podhealth.vocab import CheckResult, Event, MetricSpec, Sample

_log = log.get("podhealth.agent.sink")
T = TypeVar("T")

HOOK_TIMEOUT = 5.0  # one delivery to one sink
START_TIMEOUT = 10.0
# Draining a sink's queue and stopping it (the publisher flushes its spool, the InfluxDB export
# tries a last write); sinks stop side by side, well inside systemd's TimeoutStopSec=20.
STOP_TIMEOUT = 10.0
MAX_PENDING = 10_000  # events and transitions waiting for one sink

SINK_ERRORS = MetricSpec(
    "sink_errors", "counter",
    "Calls to a sink (publisher, heartbeat, influxdb) that failed, by sink and reason: error (it raised),\n"
    "timeout (it did not finish in time and was cancelled; the agent went on), dropped (deliveries\n"
    "dropped while the sink was behind).")


class Sink(Protocol):
    """What the agent calls. A sink may subclass it to inherit the defaults (they do nothing) of
    the hooks it does not need; a structural match without subclassing is a Sink as well."""

    name: str  # the sink's label on podhealth_sink_errors_total and in logs

    async def start(self) -> None:
        """After the agent serves (bounded by START_TIMEOUT; a sink that fails to start gets nothing)."""
        return None

    async def stop(self) -> None:
        """Before the agent stops, after the deliveries queued for it (bounded by STOP_TIMEOUT)."""
        return None

    async def on_snapshot(self, snap: Snapshot) -> None:
        """The latest snapshot, once a burst of collections is over (agent.py, HOOK_MAX_DELAY)."""
        return None

    async def on_events(self, events: tuple[Event, ...]) -> None:
        """Kernel-log events (XID, SXid) the agent had not seen before, oldest first."""
        return None

    async def on_transition(self, old: CheckResult | None, new: CheckResult, at: float) -> None:
        """A check's status or action changed (old is None for its first verdict), judged at `at`."""
        return None

    def families(self, snap: Snapshot) -> Iterable[Family]:
        """Metric families to render with `snap`; runs in the render thread: read immutable state only."""
        return ()


class _Delivery(NamedTuple):
    hook: str  # "snapshot", "events", "transition"
    args: tuple[Any, ...]


async def bounded(aw: Awaitable[T], timeout: float) -> T:
    """Await `aw` for at most `timeout` seconds, then cancel it and raise TimeoutError. Unlike
    asyncio.wait_for, never waits for the cancellation to be honoured: a sink that swallows
    CancelledError cannot hold the caller."""
    task = asyncio.ensure_future(aw)
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise TimeoutError(f"did not finish within {timeout:g}s")
    return task.result()


def _retrieve(task: "asyncio.Future[Any]") -> None:
    # A cancelled call's late exception is already counted as a timeout: do not log it again.
    if not task.cancelled():
        task.exception()


class _Lane:
    """One sink's queue and the task that delivers it in order."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink
        self.name = sink.name
        self.queue: deque[_Delivery] = deque()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.accepting = True  # False once its start failed or the agent is stopping
        self.closing = False


class Sinks:
    """The agent's sinks, fed on the event loop by the agent's hooks; never blocks its caller."""

    def __init__(self, *, hook_timeout: float = HOOK_TIMEOUT, start_timeout: float = START_TIMEOUT,
                 stop_timeout: float = STOP_TIMEOUT, max_pending: int = MAX_PENDING) -> None:
        self.hook_timeout = hook_timeout
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.max_pending = max_pending
        self._lanes: list[_Lane] = []
        self._started = False
        # Counts and the log are touched from the loop and from the render thread (families()).
        self._lock = threading.Lock()
        self.errors: dict[tuple[str, str], int] = {}  # (sink, reason: error, timeout, dropped) -> calls
        self._repeats = Repeats(_log)
        # What the agent adds to an event before any sink sees it (agent/jobmap.py: the job on its GPU).
        self.annotate_event: Callable[[Event], Event] | None = None

    def add(self, sink: Sink) -> None:
        if self._started:
            raise RuntimeError("sinks must be added before the agent starts")
        if any(lane.name == sink.name for lane in self._lanes):
            raise ValueError(f"a sink named {sink.name!r} is already installed")
        self._lanes.append(_Lane(sink))

    @property
    def names(self) -> list[str]:
        return [lane.name for lane in self._lanes]

    # ---- feeding (on the loop; only queues) -----------------------------------------------------

    def snapshot(self, snap: Snapshot) -> None:
        self._put(_Delivery("snapshot", (snap,)))

    def events(self, events: tuple[Event, ...]) -> None:
        if self.annotate_event is not None:
            events = tuple(map(self.annotate_event, events))
        self._put(_Delivery("events", (events,)))

    def transition(self, old: CheckResult | None, new: CheckResult, at: float) -> None:
        self._put(_Delivery("transition", (old, new, at)))

    def _put(self, d: _Delivery) -> None:
        for lane in self._lanes:
            if not lane.accepting:
                continue
            q = lane.queue
            if d.hook == "snapshot" and q and q[-1].hook == "snapshot":
                q[-1] = d  # the sink is behind: only the newest state matters
            else:
                if len(q) >= self.max_pending:
                    dropped = q.popleft()
                    self._failed(lane.name, "dropped", f"on_{dropped.hook}",
                                 "sink behind: oldest delivery dropped", pending=len(q))
                q.append(d)
            lane.wake.set()

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        self._started = True
        await asyncio.gather(*(self._start(lane) for lane in self._lanes))

    async def _start(self, lane: _Lane) -> None:
        if not await self._call(lane, "start", lane.sink.start, self.start_timeout):
            _log.error("sink did not start: it gets nothing; the agent goes on without it", sink=lane.name)
            lane.accepting = False
            lane.queue.clear()
            return
        lane.task = asyncio.get_running_loop().create_task(self._run(lane), name=f"sink-{lane.name}")

    async def stop(self) -> None:
        await asyncio.gather(*(self._stop(lane) for lane in self._lanes))

    async def _stop(self, lane: _Lane) -> None:
        """Deliver what is queued, then stop the sink: within stop_timeout (stop() gets at least
        half a second even when a hung delivery used all of it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.stop_timeout
        lane.accepting = False
        lane.closing = True
        lane.wake.set()
        if lane.task is not None:
            done, _ = await asyncio.wait({lane.task}, timeout=self.stop_timeout)
            if not done:
                lane.task.cancel()
                await asyncio.gather(lane.task, return_exceptions=True)
                if lane.queue:
                    self._failed(lane.name, "dropped", "stop", "sink behind at stop: deliveries dropped",
                                 pending=len(lane.queue), count=len(lane.queue))
                    lane.queue.clear()
        await self._call(lane, "stop", lane.sink.stop, max(0.5, deadline - loop.time()))

    async def _run(self, lane: _Lane) -> None:
        hooks: dict[str, Callable[..., Awaitable[None]]] = {
            "snapshot": lane.sink.on_snapshot, "events": lane.sink.on_events,
            "transition": lane.sink.on_transition}
        while True:
            while lane.queue:
                d = lane.queue.popleft()
                await self._call(lane, f"on_{d.hook}", lambda: hooks[d.hook](*d.args), self.hook_timeout)
            if lane.closing:
                return
            lane.wake.clear()
            await lane.wake.wait()

    async def _call(self, lane: _Lane, what: str, fn: Callable[[], Awaitable[None]], timeout: float) -> bool:
        """One bounded call into a sink; True when it returned."""
        try:
            await bounded(fn(), timeout)
        except TimeoutError as e:
            self._failed(lane.name, "timeout", what, "sink call timed out", error=str(e))
            return False
        except Exception as e:  # noqa: BLE001 - a broken sink must not stop the agent or the others
            self._failed(lane.name, "error", what, "sink call failed", error=f"{type(e).__name__}: {e}"[:500])
            return False
        return True

    def _failed(self, sink: str, reason: str, what: str, event: str, count: int = 1, **fields: Any) -> None:
        with self._lock:
            self.errors[(sink, reason)] = self.errors.get((sink, reason), 0) + count
            # One line per sink, call and reason a minute (with how many were held back).
            self._repeats.emit("warning", f"{sink}|{what}|{reason}", event, sink=sink, call=what, **fields)

    # ---- /metrics (render thread) ---------------------------------------------------------------

    def families(self, snap: Snapshot) -> Iterable[Family]:
        out: list[Family] = []
        for lane in self._lanes:
            try:
                out.extend(lane.sink.families(snap))
            except Exception as e:  # noqa: BLE001 - one sink's broken families drop only its own
                self._failed(lane.name, "error", "families", "sink families failed",
                             error=f"{type(e).__name__}: {e}"[:500])
        with self._lock:
            counts = sorted(self.errors.items())
        # Each series appears with its first failure (as publish_spool_errors): a healthy node's
        # sinks add no series to its budget (tests/integration/test_series_budget.py).
        out.append(Family(SINK_ERRORS, tuple(
            Sample.of("sink_errors", float(n), sink=sink, reason=reason) for (sink, reason), n in counts)))
        return out
