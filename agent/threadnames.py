"""Thread names the kernel can see (top -H, ps -L, /proc/<pid>/task/*/comm), from Python's.

Python names its threads only for itself: to the kernel every one of them is "python". With
`install()`, each thread started afterwards carries its Python name (less the "podhealth-"
prefix, cut to the kernel's 15 characters), so an operator, and bench/agent_overhead.py, can
see which collector, the renderer or the checks use the CPU.
"""

from __future__ import annotations

import sys
import threading
from types import FrameType
from typing import Any

_PREFIX = "podhealth-"
COMM_MAX = 15  # TASK_COMM_LEN - 1


def native_name(name: str) -> str:
    return name.removeprefix(_PREFIX)[:COMM_MAX]


def set_native_name(name: str) -> None:
    """Name the calling thread for the kernel; a no-op where /proc does not allow it."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w", encoding="utf-8") as f:
            f.write(native_name(name))
    except OSError:
        pass


def _on_first_call(_frame: FrameType, _event: str, _arg: Any) -> None:
    # threading runs this profile hook in each new thread before its run(): name the thread
    # once, then take the hook away again so it costs nothing afterwards.
    sys.setprofile(None)
    set_native_name(threading.current_thread().name)


def install() -> None:
    """Name every thread started from now on (call once, early, in the daemon's main)."""
    threading.setprofile(_on_first_call)
