"""Repeated identical errors, logged once and then counted: the log stays readable under a storm.

An agent whose file descriptors ran out once wrote 550 MB of log in 2.5 minutes: the same
accept() error and the same traceback, thousands of times a second. `Repeats` logs the first
occurrence of a kind of message at once; later ones within `interval` seconds are only counted,
and the first one after the interval is logged with `repeated=N` (how many were held back), which
starts the next interval. The log volume is then at most one line per kind per interval.

`loop_exception_handler` applies it to the event loop's own error reports (a failed accept(),
a protocol's exception), which asyncio would otherwise log in full every time.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

import structlog

MAX_KINDS = 1024  # kinds remembered; the oldest is forgotten first (a flood of distinct messages)


@dataclass
class _Kind:
    since: float  # start of the current interval
    held: int = 0  # occurrences not logged in it


class Repeats:
    def __init__(self, logger: structlog.typing.FilteringBoundLogger, interval: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log = logger
        self.interval = interval
        self._clock = clock
        self._kinds: OrderedDict[str, _Kind] = OrderedDict()
        self.logged = 0
        self.held = 0

    def emit(self, level: str, key: str, event: str, **fields: Any) -> bool:
        """Log `event` at `level` unless this `key` was logged less than `interval` ago (then it
        is counted). Returns whether it was logged."""
        now = self._clock()
        k = self._kinds.get(key)
        if k is not None and now - k.since < self.interval:
            k.held += 1
            self.held += 1
            return False
        if k is not None and k.held:
            fields["repeated"] = k.held  # held back since the last line of this kind
            fields["over_seconds"] = round(now - k.since, 1)
        self._kinds[key] = _Kind(since=now)
        self._kinds.move_to_end(key)
        while len(self._kinds) > MAX_KINDS:
            self._kinds.popitem(last=False)
        getattr(self.log, level)(event, **fields)
        self.logged += 1
        return True


def loop_exception_handler(repeats: Repeats) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """An event loop exception handler that logs each kind (message + exception type) through
    `repeats`, as one structured line with the exception's text, never a bare traceback."""

    def handle(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message") or "event loop error")
        exc = context.get("exception")
        kind = type(exc).__name__ if exc is not None else ""
        fields: dict[str, Any] = {}
        if exc is not None:
            fields["error"] = f"{kind}: {exc}"[:500]
        repeats.emit("error", f"{message}|{kind}|{getattr(exc, 'errno', '')}", message, **fields)

    return handle
