"""CPU the simulated NVML library spends inside the process that loads it (bench accounting).

On a real node pynvml calls C in libnvidia-ml; here it calls Python callbacks (sim/nvml_lib.py)
that build every reading. That work runs in the agent's threads, so a CPU figure of the agent
includes it. bench/agent_overhead.py sets CPU_FILE_ENV to a file path; then every entry of the
simulated library adds its thread CPU time (time.thread_time(), so a simulated hang's sleep
counts nothing) to a slot of that file, one 8-byte slot per calling thread, and the bench sums
the slots at the start and end of a window to take the library out of the agent's figure.

The file is mmap'ed: a call updates memory, no syscall, and the bench can read it at any moment.
Without the variable nothing is opened and `timed` returns the callback unchanged: the
production agent (which never loads this library) and the tests pay nothing.

What is not counted: ctypes' own marshalling before and after each callback (the C to Python
transition), and nvmlErrorString; both stay in the agent's figure, so a net figure is an upper
bound of the agent's own cost.
"""

from __future__ import annotations

import mmap
import os
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable

CPU_FILE_ENV = "PODHEALTH_SIM_NVML_CPU_FILE"
SLOTS = 64  # calling threads; a thread beyond them shares the last slot (only undercounts on a race)
_SLOT = struct.Struct("dQ")  # seconds, calls


class _Account:
    def __init__(self, path: Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, SLOTS * _SLOT.size)
            self.map = mmap.mmap(fd, SLOTS * _SLOT.size)
        finally:
            os.close(fd)
        self.lock = threading.Lock()
        self.next = 0
        self.local = threading.local()

    def slot(self) -> int:
        s: int | None = getattr(self.local, "slot", None)
        if s is None:
            with self.lock:
                s = min(self.next, SLOTS - 1)
                self.next += 1
            self.local.slot = s
        return s

    def add(self, seconds: float) -> None:
        off = self.slot() * _SLOT.size
        total, calls = _SLOT.unpack_from(self.map, off)
        _SLOT.pack_into(self.map, off, total + seconds, calls + 1)


_account: _Account | None = None
_account_lock = threading.Lock()


def _current() -> _Account | None:
    """The account named by the environment, opened once per process; None without the variable."""
    global _account
    path = os.environ.get(CPU_FILE_ENV)
    if not path:
        return None
    with _account_lock:
        if _account is None:
            _account = _Account(Path(path))
        return _account


def timed(fn: Callable[..., int]) -> Callable[..., int]:
    """`fn` (a simulated library entry point) adding its thread CPU to the account, when the
    environment names one; else `fn` itself."""
    account = _current()
    if account is None:
        return fn

    def call(*args: Any) -> int:
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            account.add(time.thread_time() - t0)
    call.__name__ = getattr(fn, "__name__", "call")
    return call


def read(path: Path) -> tuple[float, int]:
    """(CPU seconds, calls) of the library so far, all threads together; (0.0, 0) before the
    first call made the file. The calls let a reader bound what the timing itself costs."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0.0, 0
    slots = [_SLOT.unpack_from(data, i * _SLOT.size) for i in range(len(data) // _SLOT.size)]
    return sum(s for s, _ in slots), sum(c for _, c in slots)


def reset_for_tests() -> None:
    """Forget the opened account, so that a test can name another file (or none)."""
    global _account
    with _account_lock:
        if _account is not None:
            _account.map.close()
        _account = None
