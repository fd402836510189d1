"""The agent's current Snapshot, replaced whole on every change, plus change callbacks.

Only the event loop touches the store, so it needs no lock; readers (the renderer thread, the
checks engine) get an immutable Snapshot and keep using it while the next one is built.
"""

from __future__ import annotations

import time
from collections import deque
from types import MappingProxyType
from typing import Callable, Iterable

from podhealth import log
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Event

SnapshotCallback = Callable[[Snapshot], None]
EventsCallback = Callable[[tuple[Event, ...]], None]

_log = log.get("podhealth.agent.store")

SLOW_CALLBACK_S = 0.02


class SnapshotStore:
    def __init__(self, keep_events: int = 256, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._keep = keep_events
        self._events: deque[Event] = deque(maxlen=keep_events)
        # Ids of the kept events: collectors may return their whole recent-event ring every time.
        self._event_ids: deque[str] = deque(maxlen=keep_events * 2)
        self._event_id_set: set[str] = set()
        self.snapshot = Snapshot(time=clock(), collectors=MappingProxyType({}))
        self.version = 0
        self.on_snapshot: list[SnapshotCallback] = []
        self.on_events: list[EventsCallback] = []
        self._slow_warned: set[str] = set()

    def get(self, name: str) -> CollectorState | None:
        return self.snapshot.collectors.get(name)

    def put(self, state: CollectorState, events: Iterable[Event] = ()) -> None:
        """Replace one collector's state (and add its new events); call the change callbacks."""
        fresh = self._merge_events(events)
        collectors = dict(self.snapshot.collectors)
        collectors[state.name] = state
        self.snapshot = Snapshot(
            time=self._clock(),
            collectors=MappingProxyType(collectors),
            events=tuple(self._events) if fresh else self.snapshot.events,
        )
        self.version += 1
        if fresh:
            self.call_each(self.on_events, fresh)
        self.call_each(self.on_snapshot, self.snapshot)

    def call_each(self, callbacks: list[Callable[..., None]], arg: object) -> None:
        """Call every callback with `arg`; one that raises is logged and does not stop the rest."""
        for cb in list(callbacks):
            self._call(cb, arg)

    def _merge_events(self, events: Iterable[Event]) -> tuple[Event, ...]:
        fresh: list[Event] = []
        for ev in events:
            if ev.id in self._event_id_set:
                continue
            if len(self._event_ids) == self._event_ids.maxlen:
                self._event_id_set.discard(self._event_ids[0])
            self._event_ids.append(ev.id)
            self._event_id_set.add(ev.id)
            self._events.append(ev)
            fresh.append(ev)
        if fresh:
            ordered = sorted(self._events, key=lambda e: e.time)
            self._events.clear()
            self._events.extend(ordered)
        return tuple(fresh)

    def _call(self, cb: Callable[..., None], arg: object) -> None:
        # A broken hook must not stop collection or the other hooks.
        t0 = time.perf_counter()
        try:
            cb(arg)
        except Exception:  # noqa: BLE001
            _log.exception("snapshot callback failed", callback=getattr(cb, "__qualname__", repr(cb)))
        elapsed = time.perf_counter() - t0
        if elapsed > SLOW_CALLBACK_S:
            # Hooks run on the event loop: a slow one delays /metrics and the watchdog. Say so, once.
            name = getattr(cb, "__qualname__", repr(cb))
            if name not in self._slow_warned:
                self._slow_warned.add(name)
                _log.warning("slow snapshot callback blocks the event loop", callback=name,
                             ms=round(elapsed * 1e3, 1))
