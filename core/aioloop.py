"""Which event loop the daemons run on: uvloop when it is installed, else asyncio's own.

uvloop (libuv underneath, Cython on top) is a drop-in asyncio loop. On the aggregator's ingest
path it is most of the difference between aiohttp costing ~210 and ~135 us of CPU per request
on the 2-core CI machines (bench/aggregator_scale.py prints both). `PODHEALTH_EVENT_LOOP=asyncio`
forces the standard loop (to rule uvloop out while debugging); `=uvloop` makes its absence an
error instead of a silent fallback.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Coroutine, TypeVar

T = TypeVar("T")
ENV = "PODHEALTH_EVENT_LOOP"
CHOICES = ("auto", "uvloop", "asyncio")


def choice() -> str:
    value = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV}={value!r}: expected one of {', '.join(CHOICES)}")
    return value


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run(main) on the chosen loop."""
    try:
        want = choice()
    except ValueError:
        main.close()  # never awaited: say nothing about it
        raise
    if want != "asyncio":
        try:
            import uvloop
        except ImportError:
            if want == "uvloop":
                main.close()
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def running_loop_name() -> str:
    """'uvloop' or 'asyncio', for the startup log line and build info."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
