"""A killable subprocess probe: run argv with a deadline, kill its whole process group on timeout.

A stat on a dead hard NFS mount blocks in the kernel; a Python thread doing it can never be
cancelled, so the blocking call runs in a child process instead. The child gets its own process
group so that a wrapper (the simulator's nfsprobe, a shell) dies with everything it started.

A child blocked in an uninterruptible NFS wait may outlive SIGKILL for a while. `Probe` keeps such
a child and refuses to start another until it is gone, so a hung mount costs one process, not one
per cycle.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Sequence

_DETAIL_BYTES = 512
_REAP_GRACE = 0.5  # seconds to wait for a killed child before leaving it for the next cycle


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    seconds: float
    detail: str  # "" when ok; else why (exit code and stderr, "timed out", ...)


def run_probe(argv: Sequence[str], timeout: float) -> tuple[bool, float, str]:
    """Run argv once; (ok, seconds, detail). ok means exit 0 within `timeout`; on timeout seconds
    is the timeout and the process group is killed."""
    r = Probe(argv).run(timeout)
    return r.ok, r.seconds, r.detail


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


class Probe:
    """One probe target (one mount). Not thread-safe: one run at a time per Probe; run several
    Probes from several threads to probe several targets concurrently."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self._lingering: subprocess.Popen[bytes] | None = None  # killed but not yet reaped

    @property
    def lingering(self) -> bool:
        """True while a child killed on an earlier timeout has still not exited."""
        if self._lingering is not None and self._lingering.poll() is not None:
            self._close(self._lingering)
            self._lingering = None
        return self._lingering is not None

    def start(self, timeout: float) -> ProbeResult | None:
        """Start the child; a result when it could not be started, else None."""
        if self.lingering:
            return ProbeResult(False, timeout, "previous probe still hung")
        # Timed from before the spawn: the probe's latency includes starting it, as a user's
        # `ls` would, and the deadline then bounds the whole thing.
        self._started = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE, start_new_session=True, close_fds=True)
        except OSError as e:
            self._proc = None
            return ProbeResult(False, 0.0, f"cannot start {self.argv[0]!r}: {e.strerror or e}")
        return None

    def finish(self, timeout: float) -> ProbeResult:
        """Wait until `timeout` seconds after start(); kill the group when it is still running."""
        proc = self._proc
        if proc is None:
            return ProbeResult(False, timeout, "not started")
        self._proc = None
        remaining = max(0.0, self._started + timeout - time.monotonic())
        try:
            _, err = proc.communicate(timeout=remaining)
        except subprocess.TimeoutExpired:
            # Not yet reaped, so its pid (= the group id) cannot have been reused: safe to kill.
            _killpg(proc)
            try:
                proc.wait(_REAP_GRACE)
                self._close(proc)
            except subprocess.TimeoutExpired:
                self._lingering = proc  # stuck in D state: reaped on a later cycle
            return ProbeResult(False, timeout, f"timed out after {timeout:g}s")
        seconds = time.monotonic() - self._started
        self._close(proc)
        if proc.returncode == 0:
            return ProbeResult(True, seconds, "")
        msg = err[:_DETAIL_BYTES].decode("utf-8", "replace").strip() if err else ""
        return ProbeResult(False, seconds, f"exit {proc.returncode}" + (f": {msg}" if msg else ""))

    def run(self, timeout: float) -> ProbeResult:
        early = self.start(timeout)
        return early if early is not None else self.finish(timeout)

    @staticmethod
    def _close(proc: subprocess.Popen[bytes]) -> None:
        if proc.stderr is not None:
            with contextlib.suppress(OSError):
                proc.stderr.close()

    def close(self) -> None:
        """Kill whatever is still running (agent shutdown)."""
        for p in (self._proc, self._lingering):
            if p is not None:
                _killpg(p)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(_REAP_GRACE)
                self._close(p)
        self._proc = self._lingering = None
