"""A killable probe helper: a long-lived child process per target that answers "is it responsive?".

A statfs on a dead hard NFS mount blocks in the kernel; a Python thread doing it can never be
cancelled, so the blocking call runs in a child process instead, which the collector kills (its
whole process group) when the answer is late. The child is started once and asked once per
collection over a pipe, instead of a new `stat -f` process per probe: starting a process costs
~1 ms of CPU here, which at one probe per mount per second was a fifth of the agent's CPU, and
the latency measured is then the mount's alone, not a process start's.

The helper's protocol (the simulator's stand-in and the tests' fakes speak it too): it writes
`ready` once started; then for each newline on its stdin it probes and writes one line, `ok` or
`fail <why>`. It exits at EOF on stdin, so helpers end with the agent (a helper still blocked in
the kernel exits as soon as the call returns).

Several targets are probed at once from one thread (`send` to each, then `answers`: one poll over
their pipes), not from a thread per target: a thread per probe was two thread hand-offs per
mount per collection (issue 32 §5).

A child blocked in an uninterruptible NFS wait may outlive SIGKILL for a while. `Probe` keeps
such a child and refuses to start another until it is gone, so a hung mount costs one process,
not one per cycle.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Sequence

from podhealth.collectors.base import SourceUnreadable, raise_if_local

_DETAIL_BYTES = 512
_REAP_GRACE = 0.5  # seconds to wait for a killed child before leaving it for the next cycle
# Starting the helper (an interpreter) does not touch the target, so it gets its own allowance,
# not the probe's timeout; a slow start on a loaded node is not a slow mount.
STARTUP_TIMEOUT = 10.0

# The real helper: statfs, which NFS always answers from the server (FSSTAT), unlike stat,
# which the attribute cache may answer for a while after the server is gone. -I -S: no site,
# no user paths, no environment: the smallest interpreter (~8 MiB) and nothing to inherit.
STATFS_HELPER = """\
import os, sys
mp = sys.argv[1]
os.write(1, b"ready\\n")
while True:
    try:
        req = os.read(0, 64)
    except InterruptedError:
        continue
    if not req:
        break
    for _ in range(req.count(b"\\n")):
        try:
            os.statvfs(mp)
            os.write(1, b"ok\\n")
        except OSError as e:
            os.write(1, ("fail %s: %s\\n" % (e.strerror or e, mp)).encode("utf-8", "replace"))
"""


def statfs_helper_argv(target: str) -> list[str]:
    return [sys.executable, "-I", "-S", "-c", STATFS_HELPER, target]


@dataclass(frozen=True, slots=True)
class ProbeResult:
    ok: bool
    seconds: float
    detail: str  # "" when ok; else why ("timed out after 2s", the helper's reason, ...)


def _killpg(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Sent:
    """A probe asked and not yet answered (`Probe.send`)."""

    probe: "Probe"
    proc: subprocess.Popen[bytes]
    started: float
    timeout: float

    @property
    def deadline(self) -> float:
        return self.started + self.timeout


class Probe:
    """One probe target (one mount) and its helper. Not thread-safe: one run at a time per
    Probe; several Probes are probed concurrently with `send` and `answers`."""

    def __init__(self, argv: Sequence[str]) -> None:
        self.argv = list(argv)
        self._proc: subprocess.Popen[bytes] | None = None
        self._buf = b""
        self._lingering: subprocess.Popen[bytes] | None = None  # killed but not yet reaped

    @property
    def lingering(self) -> bool:
        """True while a helper killed on an earlier timeout has still not exited."""
        if self._lingering is not None and self._lingering.poll() is not None:
            self._close_pipes(self._lingering)
            self._lingering = None
        return self._lingering is not None

    def run(self, timeout: float) -> ProbeResult:
        sent = self.send(timeout)
        if isinstance(sent, ProbeResult):
            return sent
        return self.answer(sent, self._line(sent.proc, sent.deadline))

    def send(self, timeout: float) -> "ProbeResult | Sent":
        """Ask the helper (started first when none runs); a ProbeResult when it cannot be asked.
        Every Sent must be answered (`answers`), or the helper's reply is read as the next one's."""
        if self.lingering:
            return ProbeResult(False, timeout, "previous probe still hung")
        proc = self._proc
        if proc is not None and proc.poll() is not None:
            self._reap(proc)  # died between probes (killed by someone, OOM): start another
            proc = None
        if proc is None:
            try:
                proc = self._start()
            except OSError as e:
                # No fds or process slots for the helper says nothing about the mount.
                raise_if_local(e, f"start {self.argv[0]!r}")
                return ProbeResult(False, 0.0, f"cannot start {self.argv[0]!r}: {e.strerror or e}")
            line = self._line(proc, time.monotonic() + max(timeout, STARTUP_TIMEOUT))
            if line != b"ready":
                return self._failed_start(proc, line, timeout)
        started = time.monotonic()
        try:
            assert proc.stdin is not None
            os.write(proc.stdin.fileno(), b"\n")
        except OSError:
            return self._gone(proc, 0.0)
        return Sent(self, proc, started, timeout)

    def answer(self, sent: Sent, line: bytes | None) -> ProbeResult:
        """The result of `sent` given the helper's line (b"" at EOF, None at the deadline)."""
        proc, timeout = sent.proc, sent.timeout
        seconds = time.monotonic() - sent.started
        if line is None:
            self._kill(proc)
            return ProbeResult(False, timeout, f"timed out after {timeout:g}s")
        if line == b"":
            return self._gone(proc, seconds)
        if line == b"ok":
            return ProbeResult(True, seconds, "")
        text = line[:_DETAIL_BYTES].decode("utf-8", "replace")
        if text.startswith("fail "):
            return ProbeResult(False, seconds, text[5:].strip())
        self._kill(proc)  # out of step: start over with a new helper
        return ProbeResult(False, seconds, f"unexpected answer from the probe helper: {text!r}")

    def _start(self) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, close_fds=True)
        self._proc, self._buf = proc, b""
        return proc

    def _take_line(self) -> bytes | None:
        if b"\n" not in self._buf:
            return None
        line, self._buf = self._buf.split(b"\n", 1)
        return line.strip()

    def _line(self, proc: subprocess.Popen[bytes], deadline: float) -> bytes | None:
        """The helper's next line without its newline; b"" at EOF; None at the deadline."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        poller = select.poll()  # not select(): an agent may hold more than 1024 fds
        poller.register(fd, select.POLLIN)
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            if not poller.poll(max(1, int(left * 1000 + 0.999))):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return b""
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.strip()

    def _failed_start(self, proc: subprocess.Popen[bytes], line: bytes | None, timeout: float) -> ProbeResult:
        if line == b"":
            return self._gone(proc, 0.0)
        self._kill(proc)
        if line is None:
            # An interpreter that cannot start in time is a starved host, not a hung mount.
            raise SourceUnreadable(f"probe helper did not start within {max(timeout, STARTUP_TIMEOUT):g}s")
        return ProbeResult(False, 0.0, f"unexpected answer from the probe helper: {line[:_DETAIL_BYTES]!r}")

    def _gone(self, proc: subprocess.Popen[bytes], seconds: float) -> ProbeResult:
        """The helper exited: its exit status and stderr say why (the next run starts a new one)."""
        try:
            _, err = proc.communicate(timeout=_REAP_GRACE)
        except subprocess.TimeoutExpired:  # closed its stdout but lives on: make it go
            self._kill(proc)
            return ProbeResult(False, seconds, "probe helper closed its output")
        self._proc = None
        self._close_pipes(proc)
        msg = err[:_DETAIL_BYTES].decode("utf-8", "replace").strip() if err else ""
        return ProbeResult(False, seconds, f"exit {proc.returncode}" + (f": {msg}" if msg else ""))

    def _reap(self, proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.communicate(timeout=_REAP_GRACE)
        self._proc = None
        self._close_pipes(proc)

    def _kill(self, proc: subprocess.Popen[bytes]) -> None:
        # Not yet reaped, so its pid (= the group id) cannot have been reused: safe to kill.
        _killpg(proc)
        self._proc = None
        try:
            proc.wait(_REAP_GRACE)
            self._close_pipes(proc)
        except subprocess.TimeoutExpired:
            self._lingering = proc  # stuck in D state: reaped on a later cycle

    @staticmethod
    def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
        for f in (proc.stdin, proc.stdout, proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()

    @property
    def pid(self) -> int | None:
        """The running helper's pid (None when none runs)."""
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Stop the helper: EOF first (it exits on its own), then SIGKILL for one that does not."""
        for p in (self._proc, self._lingering):
            if p is None:
                continue
            if p.stdin is not None:
                with contextlib.suppress(OSError):
                    p.stdin.close()
            try:
                p.wait(0.2)
            except subprocess.TimeoutExpired:
                _killpg(p)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(_REAP_GRACE)
            self._close_pipes(p)
        self._proc = self._lingering = None


def answers(sent: Sequence[Sent]) -> list[ProbeResult]:
    """Wait for every sent probe at once (one poll over their pipes, each to its own deadline)."""
    lines: dict[int, bytes | None] = {}
    poller = select.poll()  # not select(): an agent may hold more than 1024 fds
    waiting: dict[int, int] = {}  # fd -> index into sent
    for i, s in enumerate(sent):
        line = s.probe._take_line()
        if line is not None:
            lines[i] = line
            continue
        assert s.proc.stdout is not None
        fd = s.proc.stdout.fileno()
        waiting[fd] = i
        poller.register(fd, select.POLLIN)
    while waiting:
        now = time.monotonic()
        for fd, i in list(waiting.items()):
            if sent[i].deadline <= now:
                lines[i] = None
                poller.unregister(fd)
                del waiting[fd]
        if not waiting:
            break
        left = min(sent[i].deadline for i in waiting.values()) - now
        for fd, _ in poller.poll(max(1, int(left * 1000 + 0.999))):
            i = waiting[fd]
            probe = sent[i].probe
            chunk = os.read(fd, 4096)
            line = b"" if not chunk else None
            if chunk:
                probe._buf += chunk
                line = probe._take_line()
            if line is not None:
                lines[i] = line
                poller.unregister(fd)
                del waiting[fd]
    return [s.probe.answer(s, lines[i]) for i, s in enumerate(sent)]
