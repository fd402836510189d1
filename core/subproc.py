"""Run a program to completion: no shell, a deadline, bounded output, its own process group,
optionally as another (unprivileged) user. The one way podhealth runs a foreign program and
waits for its answer (a site's checks, collectors/site.py; `dcgmi diag`, checks/active/dcgm.py;
the NCCL pair tests' srun, checks/active/nccl_slurm.py);
collectors/probe.py keeps its long-lived helpers.

Why each piece:
- no shell: argv goes to execve as given, so a config value is never parsed as shell syntax;
- a new session (process group): a timeout kills the program *and* whatever it started (a probe
  that runs `nvidia-smi` which hangs in the driver), not only the direct child;
- bounded output: a runaway program (a loop printing) cannot grow the agent's memory; what is
  beyond `max_output` is read and dropped so the program is not blocked on a full pipe;
- the environment is only what the caller passes (never the agent's own, which may hold the
  node's aggregator token);
- `user`: where the agent runs as root it drops to that user's uid, gid and no supplementary
  groups before exec (Popen's user/group/extra_groups); where it does not run as root it cannot
  switch and runs the program as itself, and says so.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import select
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

DEFAULT_MAX_OUTPUT = 64 * 1024
_REAP_GRACE = 1.0  # seconds to wait for a killed group's leader before leaving it


@dataclass(frozen=True, slots=True)
class ProgramRun:
    """How one run ended. `exit_code` is None when the program did not exit on its own within
    the deadline (`timed_out`), was killed by a signal (`signal`), or could not start (`error`)."""

    exit_code: int | None
    stdout: bytes = b""
    stderr: bytes = b""
    duration: float = 0.0
    timed_out: bool = False
    signal: int | None = None
    truncated: bool = False  # stdout or stderr went past max_output (the rest was dropped)
    error: str = ""  # why it could not start (no such file, not executable, unknown user)
    ran_as: str = ""  # the user it ran as

    @property
    def why(self) -> str:
        """Words for a run with no exit code ("" when it exited)."""
        if self.error:
            return self.error
        if self.timed_out:
            return f"did not finish within {self.duration:.3g}s (killed)"
        if self.signal is not None:
            return f"killed by signal {self.signal} ({_signame(self.signal)})"
        return ""


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return "?"


def resolve_user(user: str) -> tuple[int, int, str] | str:
    """(uid, gid, name) of `user` (a name or a number), or why it cannot be used."""
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
    except (KeyError, ValueError):
        return f"no such user {user!r}"
    return pw.pw_uid, pw.pw_gid, pw.pw_name


def run(argv: Sequence[str], timeout: float, *, env: Mapping[str, str] | None = None, user: str = "",
        max_output: int = DEFAULT_MAX_OUTPUT, cwd: str = "/", term_grace: float = 0.0,
        merge_stderr: bool = False) -> ProgramRun:
    """Run `argv` to completion or `timeout`, whichever comes first. Blocking: call it off the
    event loop (a collector's worker thread). Never raises for the program's own failures.
    `term_grace` > 0: at the timeout the group gets SIGTERM first and that long to go (a client
    such as dcgmi then tells its server to stop the work), then SIGKILL. `merge_stderr`: stderr
    goes into stdout, interleaved as written (a tool whose log lines are part of what is parsed)."""
    if not argv:
        return ProgramRun(None, error="empty argv")
    kw: dict[str, object] = {}
    ran_as = _current_user()
    if user and user != ran_as:
        who = resolve_user(user)
        if isinstance(who, str):
            return ProgramRun(None, error=who)
        uid, gid, name = who
        if os.geteuid() == 0:
            kw = {"user": uid, "group": gid, "extra_groups": []}
            ran_as = name
        # Not root: cannot switch; the program runs as the agent's (already unprivileged) user.
    started = time.monotonic()
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                start_new_session=True, close_fds=True,
                                env=dict(env or {}), cwd=cwd, **kw)  # type: ignore[call-overload]
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e)
        return ProgramRun(None, error=f"cannot run {argv[0]}: {why}", ran_as=ran_as)
    out, err, truncated, timed_out = _read(proc, started + timeout, max_output)
    if not timed_out:
        # Both pipes closed: the program is ending, or went on without them until the deadline.
        try:
            proc.wait(max(0.0, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    if timed_out and term_grace > 0:
        _kill_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(term_grace)
    if timed_out:
        _kill_group(proc)
    try:
        rc = proc.wait(_REAP_GRACE)
    except subprocess.TimeoutExpired:  # stuck in the kernel (D state) even after SIGKILL
        _kill_group(proc)
        rc = None
    finally:
        for f in (proc.stdout, proc.stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
    duration = time.monotonic() - started
    if not timed_out and rc is not None and rc >= 0:
        # The leader exited; anything it left running in its group goes with it.
        _kill_group(proc)
        return ProgramRun(rc, out, err, duration, truncated=truncated, ran_as=ran_as)
    sig = -rc if rc is not None and rc < 0 and not timed_out else None
    return ProgramRun(None, out, err, duration, timed_out=timed_out, signal=sig, truncated=truncated, ran_as=ran_as)


def _current_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def _read(proc: "subprocess.Popen[bytes]", deadline: float, limit: int) -> tuple[bytes, bytes, bool, bool]:
    """The pipes until they close or the deadline passes: (stdout, stderr, truncated, timed out)."""
    assert proc.stdout is not None
    out_fd = proc.stdout.fileno()
    err_fd = proc.stderr.fileno() if proc.stderr is not None else -1
    bufs = {out_fd: bytearray(), **({err_fd: bytearray()} if err_fd >= 0 else {})}
    truncated = False
    poller = select.poll()  # not select(): the agent may hold more than 1024 descriptors
    for fd in bufs:
        poller.register(fd, select.POLLIN)
    open_fds = set(bufs)
    while open_fds:
        left = deadline - time.monotonic()
        if left <= 0:
            return bytes(bufs[out_fd]), bytes(bufs.get(err_fd, b"")), truncated, True
        for fd, _ in poller.poll(max(1, int(left * 1000 + 0.999))):
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                poller.unregister(fd)
                open_fds.discard(fd)
                continue
            room = limit - len(bufs[fd])
            if len(chunk) > room:
                truncated = True
            if room > 0:
                bufs[fd] += chunk[:room]
    return bytes(bufs[out_fd]), bytes(bufs.get(err_fd, b"")), truncated, False


def _kill_group(proc: "subprocess.Popen[bytes]", sig: int = signal.SIGKILL) -> None:
    # The group id is the leader's pid: the kernel does not hand it to a new process while the
    # group still has members, so this never signals a stranger.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
