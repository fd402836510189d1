"""Progress of long work (`dcgm-diag -r 3` runs up to an hour, `nccl --nodes` many pair tests).

On a terminal: a rich progress line on stderr. Elsewhere (a pipe, a CI log, a Slurm job's
output file) a bar is noise, and silence for an hour looks like a hang: one plain line every
`interval` seconds instead, with the elapsed time and what is known so far.
"""

from __future__ import annotations

import concurrent.futures
import sys
import threading
import time
from typing import IO, Any, Callable, TypeVar

from podhealth.console import console, is_tty

T = TypeVar("T")
DEFAULT_INTERVAL = 30.0


class LongWork:
    """Use as a context manager; call `update()` from any thread, `tick()` from the waiting one."""

    def __init__(self, label: str, total: float | None = None, *, stream: IO[str] | None = None,
                 interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic,
                 tty: bool | None = None) -> None:
        self.label = label
        self.total = total
        self.done = 0.0
        self.note = ""
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.clock = clock
        self.tty = is_tty(self.stream) if tty is None else tty
        self._lock = threading.Lock()
        self._started = clock()
        self._last_line = self._started
        self._bar: Any = None
        self._task: Any = None

    def __enter__(self) -> "LongWork":
        self._started = self._last_line = self.clock()
        if self.tty:
            from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                                 TextColumn("{task.fields[count]}"), TimeElapsedColumn(), transient=True,
                                 console=console(self.stream))
            self._bar.start()
            self._task = self._bar.add_task(self.label, total=self.total, count="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()

    def update(self, done: float | None = None, total: float | None = None, note: str | None = None) -> None:
        with self._lock:
            if done is not None:
                self.done = done
            if total is not None:
                self.total = total
            if note is not None:
                self.note = note
            if self._bar is not None:
                desc = f"{self.label}: {self.note}" if self.note else self.label
                self._bar.update(self._task, completed=self.done, total=self.total, description=desc,
                                 count=self._count())

    def _count(self) -> str:
        return f"{self.done:g}/{self.total:g}" if self.total else (f"{self.done:g}" if self.done else "")

    def line(self) -> str:
        """The plain progress line (no markup: it goes to logs)."""
        elapsed = self.clock() - self._started
        parts = [f"{self.label}: {elapsed:.0f}s elapsed"]
        if self.total:
            parts.append(f"{self._count()} done")
        if self.note:
            parts.append(self.note)
        return ", ".join(parts)

    def tick(self) -> bool:
        """Write the plain line when `interval` has passed since the last one (off a TTY only).
        Returns whether a line was written."""
        if self.tty:
            return False
        now = self.clock()
        if now - self._last_line < self.interval:
            return False
        self._last_line = now
        with self._lock:
            text = self.line()
        self.stream.write(text + "\n")
        self.stream.flush()
        return True

    def run(self, fn: Callable[[], T], poll: float = 1.0) -> T:
        """Run blocking `fn` in a worker thread (it carries its own timeout) and tick while it works."""
        with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="longwork") as ex:
            fut = ex.submit(fn)
            while True:
                try:
                    return fut.result(timeout=min(poll, self.interval))
                except concurrent.futures.TimeoutError:
                    self.tick()
