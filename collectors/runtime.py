"""The one way podhealth builds a collector and runs it: `build` and `Runner.collect_once`.

The agent's scheduler (every interval), the handover suite and `podhealth check` / `podhealth
profile` (once, with no agent running) all go through here, so a collector behaves the same
everywhere: its factory runs off the event loop with a timeout (nvmlInit on a wedged GPU must not
hang the caller), each collect() runs on a worker thread (core/worker.py `Lane`: the collector's
own, or in the agent one shared by its short collectors, whose results reach the loop together)
with its own timeout, and a call still running at its timeout gives a timed-out outcome -- the
collector is stale and its checks UNKNOWN -- while the thread is left to finish (a thread cannot
be cancelled; a shared lane goes on with the other collectors on a new thread) and whatever it
returns late is discarded. `outcome_state` turns an outcome into the
CollectorState every consumer reads.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from podhealth import log
from podhealth.collectors.base import Collection, Collector, CollectorDisabled
from podhealth.config import CollectorConfig, Config
from podhealth.snapshot import CollectorState
from podhealth.worker import Lane, LaneCall, call_with_timeout

_log = log.get("podhealth.collectors.runtime")

Factory = Callable[..., Collector]

# A factory may open a vendor library (nvmlInit on 8 GPUs takes seconds): give it at least this long.
MIN_FACTORY_TIMEOUT = 10.0
MAX_ERRORS = 16
MAX_ERROR_CHARS = 512


def registry_factory(name: str) -> Factory:
    """The factory of collectors.REGISTRY[name], imported when called (a missing library disables one)."""
    def make(cfg: Config, **seams: Any) -> Collector:
        from podhealth.collectors import factory
        return factory(name)(cfg, **seams)
    return make


def registry_factories() -> dict[str, Factory]:
    """Every collector in collectors.REGISTRY, imported lazily."""
    from podhealth.collectors import REGISTRY
    return {name: registry_factory(name) for name in REGISTRY}


def collector_config(cfg: Config, name: str) -> CollectorConfig:
    cc = getattr(cfg.collectors, name, None)
    if isinstance(cc, CollectorConfig):
        return cc
    from podhealth.collectors import site

    check = site.site_check(cfg, name)
    return site.collector_config(check) if check is not None else CollectorConfig()


def all_factories(cfg: Config) -> dict[str, Factory]:
    """Every collector this config runs: the registry's, then one per site check (collectors/site.py)."""
    from podhealth.collectors import site

    return {**registry_factories(), **site.factories(cfg)}


def factory_timeout(cc: CollectorConfig) -> float:
    return max(cc.timeout, MIN_FACTORY_TIMEOUT)


async def build(name: str, factory: Factory, cfg: Config, seams: Mapping[str, Any],
                timeout: float) -> tuple[Collector | None, str]:
    """(the collector, "") or (None, why it is disabled): the factory raised CollectorDisabled or
    anything else, did not return within `timeout`, or returned something that cannot collect."""
    try:
        collector = await call_with_timeout(f"init-{name}", lambda: factory(cfg, **seams), timeout)
    except CollectorDisabled as e:
        reason = str(e) or "disabled by its factory"
    except TimeoutError:
        reason = f"initialisation did not finish within {timeout:g}s"
    except Exception as e:  # noqa: BLE001 - one broken source must not stop the others
        reason = f"initialisation failed: {type(e).__name__}: {e}"
    else:
        if not callable(getattr(collector, "collect", None)):
            return None, f"factory returned {type(collector).__name__}, not a Collector"
        return collector, ""
    _log.warning("collector disabled", collector=name, reason=reason)
    return None, reason


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one collect_once() came to: a collection, or an error (`timed_out` when it hung)."""

    collection: Collection | None
    error: str = ""
    timed_out: bool = False
    duration: float = 0.0


def outcome_state(st: CollectorState, out: Outcome, now: float) -> CollectorState:
    """`st` after `out`, stamped `now`. A failure empties the samples but leaves `stale` to the
    caller (the scheduler ages it; a fresh CollectorState is stale already); a timeout is stale."""
    if out.timed_out:
        return replace(st, stale=True, samples=(), reports=(), errors=(out.error,), last_attempt=now,
                       last_duration=out.duration, runs=st.runs + 1, failures=st.failures + 1)
    if out.collection is None:
        return replace(st, samples=(), reports=(), errors=(out.error,), last_attempt=now, last_duration=out.duration,
                       runs=st.runs + 1, failures=st.failures + 1)
    col = out.collection
    return replace(st, samples=col.samples, reports=col.reports,
                   errors=tuple(e[:MAX_ERROR_CHARS] for e in col.errors[:MAX_ERRORS]),
                   last_success=now, last_attempt=now, last_duration=out.duration, stale=False, runs=st.runs + 1)


SHARED_LANE = "collectors"


def lane_of(collector: Collector) -> str | None:
    """The shared lane a collector's calls run on in the agent, or None for a thread of its own.
    A collector whose collections wait by design (NFS probes up to their mounts' timeouts, a site
    check's program, a separate service) or that must start the moment it is asked (kmsg, the XID
    fast path) says `own_worker = True`; the ones behind one vendor library name their lane
    (`lane = "nvml"`: a hung library then delays only them); the rest read local files and share
    SHARED_LANE. A hung call on a lane is given up at its timeout, and the calls queued behind it
    wait at most that long."""
    if getattr(collector, "own_worker", False):
        return None
    lane = getattr(collector, "lane", SHARED_LANE)
    return lane if isinstance(lane, str) and lane else SHARED_LANE


class Runner:
    """One collector, the lane its calls run on (its own, or one shared with other short
    collectors: core/worker.py `Lane`) and its timeout."""

    def __init__(self, name: str, collector: Collector, timeout: float,
                 monotonic: Callable[[], float] = time.monotonic, lane: Lane | None = None) -> None:
        self.name = name
        self.collector = collector
        self.timeout = timeout
        self._mono = monotonic
        self._own_lane = lane is None
        self.lane = lane if lane is not None else Lane(name, monotonic)
        self._call: LaneCall[Collection] | None = None
        self._hung: LaneCall[Collection] | None = None  # the call that outlived its timeout
        self.on_late: Callable[[float], None] | None = None  # a timed-out call returned after (seconds)

    @property
    def busy(self) -> bool:
        """A collect() is queued or running (also one past its timeout)."""
        return self._call is not None

    def collect_once(self) -> "asyncio.Task[Outcome]":
        """Start one collect() on the lane now (the runner is busy from this call on) and return
        the task that ends with its Outcome: the collection, its error, or a timeout `timeout`
        seconds after the call started on the thread (a call queued behind another collector's is
        not charged for the wait; the thread may run on: see on_late). Must run on the event loop."""
        if self._call is not None:
            raise RuntimeError(f"collector {self.name!r} is still collecting")
        call = self.lane.submit(self.collector.collect)
        self._call = call
        call.future.add_done_callback(lambda f: self._returned(call))
        return asyncio.get_running_loop().create_task(self._outcome(call), name=f"collect-once-{self.name}")

    async def _outcome(self, call: "LaneCall[Collection]") -> Outcome:
        fut = call.future
        wait = self.timeout
        while True:
            # asyncio.wait never cancels `fut`: a hung thread keeps it pending until it returns.
            done, _ = await asyncio.wait((fut,), timeout=wait)
            if done:
                break
            started = call.started
            if started is None or call.ended is not None:
                wait = self.timeout  # queued behind another call, or returned and on its way
                continue
            wait = started + self.timeout - self._mono()
            if wait > 0:
                continue
            if self.lane.abandon(call):  # the lane's other calls go on on a new thread
                self._hung = call
                return Outcome(None, f"timed out after {self.timeout:g}s", True, self.timeout)
            wait = self.timeout
        duration = _duration(call)
        if fut.cancelled():
            return Outcome(None, "CancelledError: collection cancelled", False, duration)
        exc = fut.exception()
        if exc is None and not isinstance(fut.result(), Collection):
            exc = TypeError(f"collect() returned {type(fut.result()).__name__}, not Collection")
        if exc is not None:
            return Outcome(None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS], False, duration)
        return Outcome(fut.result(), "", False, duration)

    def _returned(self, call: "LaneCall[Collection]") -> None:
        if self._call is call:
            self._call = None
        if self._hung is call:
            self._hung = None
            if self.on_late is not None:
                self.on_late(_duration(call))

    async def close(self, timeout: float) -> bool:
        """Close the collector on its lane, then let an own lane's thread go. A collect() in flight
        within its own timeout is given `timeout` to return first (a shutdown that lands
        mid-collection still closes the collector). False, and nothing closed, when the call is
        hung (past its timeout) or still running after that: the thread exits when the call returns."""
        call = self._call
        if call is not None:
            if call is self._hung:
                return False
            await asyncio.wait((call.future,), timeout=timeout)  # never cancels the call
            if not call.future.done():
                return False
        closing: LaneCall[None] | None = None
        try:
            closing = self.lane.submit(self.collector.close)
            await asyncio.wait_for(asyncio.shield(closing.future), timeout)
        except TimeoutError:
            if closing is not None:
                self.lane.abandon(closing)  # the other collectors on a shared lane close on a new thread
            _log.warning("collector close() timed out", collector=self.name, timeout=timeout)
        except Exception as e:  # noqa: BLE001 - shutting down anyway
            _log.warning("collector close() failed", collector=self.name, error=repr(e))
        finally:
            if self._own_lane:
                self.lane.close()
        return True


def _duration(call: "LaneCall[Collection]") -> float:
    """How long the call ran on the thread (not the time it waited in the lane's queue)."""
    if call.started is None or call.ended is None:
        return 0.0
    return call.ended - call.started
