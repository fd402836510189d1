"""What the NVML collectors (nvml, nvlink) share: a hold on the session, the retry after a
driver reload, and a memory per GPU of what it does not support.

The memory is kept per GPU index and NVML generation: a re-init (driver reload) or another GPU at
that index starts it afresh. What a GPU answered NOT_SUPPORTED is not asked again until the
re-probe every REPROBE_EVERY collections (a driver update can add it).
"""

from __future__ import annotations

from typing import Callable, ClassVar, Generic, Protocol, TypeVar

from podhealth.collectors.base import Collection
from podhealth.collectors.nvml_session import REPROBE_EVERY, SLOW_CALL_S, Device, NvmlSession, collect_with_reinit
from podhealth.collectors.samplecache import SampleCache


class _State(Protocol):
    generation: int
    unsupported: set[str]


S = TypeVar("S", bound=_State)


class SessionCollector(Generic[S]):
    """Holds the session from construction to close(); `collect` runs `_collect_once`, again once
    after a driver reload. Subclasses call `_next_run` at the start of each collection, take
    each GPU's memory from `_state` and make their Samples through `_cache`."""

    # The NVML lane: NVML collectors share a thread apart from the file readers, so a wedged GPU
    # that hangs NVML delays no other source (collectors/runtime.py).
    lane: ClassVar[str] = "nvml"

    def __init__(self, session: NvmlSession, new_state: Callable[[int], S], slow_call_s: float = SLOW_CALL_S) -> None:
        self._session = session
        self._slow_s = slow_call_s
        self._new_state = new_state
        self._session.acquire()
        self._states: dict[int, S] = {}
        self._runs = 0
        # Most readings (error counters, link states, clocks, limits) hold from one cycle to the
        # next: by series, they are handed on as last cycle's Sample objects (collectors/samplecache.py).
        self._cache = SampleCache()

    def close(self) -> None:
        self._session.release()

    def collect(self) -> Collection:
        out = collect_with_reinit(self._session, self._collect_once)
        self._cache.commit()
        return out

    def _collect_once(self) -> Collection:
        raise NotImplementedError

    def _next_run(self) -> None:
        self._runs += 1
        if self._runs % REPROBE_EVERY == 0:
            for st in self._states.values():
                st.unsupported.clear()

    def _state(self, dev: Device) -> S:
        st = self._states.get(dev.index)
        if st is None or st.generation != dev.generation:
            st = self._states[dev.index] = self._new_state(dev.generation)
        return st
