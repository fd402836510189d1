"""A test's agent plugin (agent/plugin.py) made of functions: what the agent hands it goes to them."""

from __future__ import annotations

from typing import Callable, Iterable

from aiohttp import web

from podhealth.agent.plugin import Plugin
from podhealth.snapshot import Snapshot
from podhealth.vocab import Event


class Watcher(Plugin):
    def __init__(self, snapshot: Callable[[Snapshot], object] | None = None,
                 events: Callable[[tuple[Event, ...]], object] | None = None,
                 routes: Iterable[web.AbstractRouteDef] = (), name: str = "watcher") -> None:
        self.name = name
        self._snapshot = snapshot
        self._events = events
        self._routes = list(routes)

    def on_snapshot(self, snap: Snapshot) -> None:
        if self._snapshot is not None:
            self._snapshot(snap)

    def on_events(self, events: tuple[Event, ...]) -> None:
        if self._events is not None:
            self._events(events)

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        return self._routes
