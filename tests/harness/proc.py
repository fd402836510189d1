"""Starting real servers in tests: free loopback ports, readiness polling, stop by PID.

Every process started here is registered and killed (process group, SIGTERM then SIGKILL) when
its `Service` closes, also when the test fails, so no leaked daemon can hang CI.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

import pytest


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def need(binary: str) -> str:
    """Path of `binary`, or skip the test with a clear reason (CI installs all of them)."""
    path = shutil.which(binary) or (binary if os.path.isabs(binary) and os.access(binary, os.X_OK) else None)
    if path is None:
        pytest.skip(f"{binary} is not installed (bash scripts/setup.sh --test installs it)")
    return path


def wait_until(pred: Callable[[], object], timeout: float = 15.0, interval: float = 0.05, what: str = "condition") -> object:
    """Poll `pred` until it returns a truthy value; fail the test with `what` on timeout."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = pred()
            if v:
                return v
        except Exception as e:  # noqa: BLE001 - polling a server that is still starting
            last_exc = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}" + (f" (last error: {last_exc})" if last_exc else ""))


def http_get(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0
    extra: dict[str, object] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self, timeout: float = 5.0) -> None:
        stop_pid(self.proc, timeout)


def stop_pid(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


def kill_pidfile(path: Path, timeout: float = 5.0) -> None:
    """Stop a daemon that forked itself (slurmctld, munged) by the PID it wrote."""
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def service(name: str, argv: Sequence[str], log_dir: Path, port: int = 0,
            ready: Callable[[], object] | None = None, ready_timeout: float = 20.0,
            env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[Service]:
    """Run argv in its own process group, wait for `ready`, and always stop it afterwards."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen(list(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, env={**os.environ, **(env or {})}, cwd=cwd)
    svc = Service(name, proc, log, port)
    try:
        if ready is not None:
            def _ready() -> object:
                if proc.poll() is not None:
                    raise AssertionError(f"{name} exited with {proc.returncode}:\n{svc.log_tail()}")
                return ready()
            try:
                wait_until(_ready, ready_timeout, what=f"{name} to be ready")
            except AssertionError as e:
                raise AssertionError(f"{e}\n--- {name} log ---\n{svc.log_tail()}") from None
        yield svc
    finally:
        svc.stop()
        fh.close()
