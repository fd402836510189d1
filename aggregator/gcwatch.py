"""The cyclic garbage collector's pauses: measured, and kept short by freezing what lives long.

A full collection walks every tracked object. At 100,000 nodes (their records, views, conditions,
the heard index) one took 130-232 ms of the event loop: every request in flight waited for it.
Those objects live as long as the process, so once a large load has arrived (the first contact of
the fleet, a takeover that loads the store) they are moved out of the collector's reach with
`gc.freeze()`; a prototype cut the pauses to 13-29 ms. A young collection first, so the garbage
of the load itself is not frozen with it; what becomes garbage later is still freed by reference
counting (only reference cycles among frozen objects would wait, and these records hold none).

Every pause is noted through `gc.callbacks` and handed to the metrics by `drain()` (each
housekeeping pass: podhealth_aggregator_gc_pause_seconds by generation), so a bench or an operator
can see what freezing does. The callback only appends to a list: it runs inside a collection, in
whichever thread allocated, where taking a metric's lock could wait on the thread itself.
"""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

MAX_NOTED = 10_000  # pauses held between drains (a drain every 5 s sees far fewer)
# A load is large when the fleet grew by this share since the last freeze, and by at least MIN_GROWTH nodes.
GROWTH = 0.10
MIN_GROWTH = 1000


class Freezer:
    def __init__(self, enabled: bool, observe: Callable[[int, float], None]) -> None:
        """`observe(generation, seconds)`: called by drain() for every collection since the last."""
        self.enabled = enabled
        self.frozen_at_nodes = 0
        self.freezes = 0
        self._observe = observe
        self._started = 0.0
        self._installed = False
        self._noted: list[tuple[int, float]] = []

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif len(self._noted) < MAX_NOTED:
            self._noted.append((int(info.get("generation", 0)), time.perf_counter() - self._started))

    def drain(self) -> None:
        """Hand the pauses noted since the last drain to `observe`."""
        noted, self._noted = self._noted, []
        for generation, seconds in noted:
            self._observe(generation, seconds)

    def after_load(self, nodes: int) -> bool:
        """Freeze when the fleet in memory grew by a large load since the last freeze (called by
        every housekeeping pass; a compare when nothing grew). True when it froze."""
        if not self.enabled or nodes - self.frozen_at_nodes < max(MIN_GROWTH, GROWTH * self.frozen_at_nodes):
            return False
        self.freeze(nodes)
        return True

    def freeze(self, nodes: int) -> None:
        gc.collect(1)
        gc.freeze()
        self.frozen_at_nodes = nodes
        self.freezes += 1
