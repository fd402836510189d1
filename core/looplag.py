"""How late the event loop runs a timer: the one probe of event-loop stalls.

A handler that runs long, a garbage-collector pause or a housekeeping walk holds every request in
flight; the loop then runs a due timer late by about as much. A task that sleeps `period` and
measures how much later it woke sees every stall of the loop (one shorter than a period may be
seen in part). At 20 looks a second it costs well under 0.1% of a core. The aggregator exports
what it sees (podhealth_aggregator_loop_lag_seconds); bench/aiohttp_floor.py runs the same probe
so the peer pays the same.

Lateness has two causes: the loop was busy (its own stall) or the process waited for a CPU (a
loaded machine). The loop thread's CPU time over the same interval tells them apart: the part of
the lateness it spent running is `busy` (min(late, CPU used)), what requests waited for work of
this process; the rest is the machine's.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable

PERIOD = 0.05


async def probe(observe: Callable[[float, float], None], period: float = PERIOD) -> None:
    """Until cancelled: observe(seconds late, of which busy) after every `period`."""
    loop = asyncio.get_running_loop()
    while True:
        t0, c0 = loop.time(), time.thread_time()
        await asyncio.sleep(period)
        late = max(0.0, loop.time() - t0 - period)
        observe(late, min(late, time.thread_time() - c0))
