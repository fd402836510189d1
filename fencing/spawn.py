"""Start a program from the event loop with vfork (subprocess.Popen) and await its output and exit.

Why not asyncio.create_subprocess_exec: on uvloop (the aggregator's loop, core/aioloop.py) it
forks through libuv, and a fork copies the parent's page tables while the loop waits: 3-10 ms
per run at 50-150 MB of RSS here, 26 ms at 300 MB, against ~1 ms for Popen, which uses vfork
(bench/README.md, "Fault to fence"). A fence runs scontrol twice on its critical path. So the
child is started by Popen; its pipes are read through the loop (connect_read_pipe) and its exit
is seen by a pidfd turning readable (Linux 5.3+; elsewhere a worker thread waits for it).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence

from podhealth.worker import offload


class Process:
    """A running child: `communicate()` as asyncio's, `wait()`, and `pid` for killing its group."""

    def __init__(self, popen: "subprocess.Popen[bytes]") -> None:
        self._popen = popen
        self.pid = popen.pid

    @property
    def returncode(self) -> int | None:
        return self._popen.returncode

    def kill(self) -> None:
        self._popen.kill()

    async def communicate(self, stdin: bytes | None = None) -> tuple[bytes, bytes]:
        """Write `stdin` (then close it), read stdout and stderr to their end, and wait for the exit.
        Cancelled (a timeout), the pipes are closed; the caller kills the process."""
        p = self._popen
        assert p.stdout is not None and p.stderr is not None
        try:
            # Written while the output is read: a child that answers as it reads never blocks on a full pipe.
            _, out, err = await asyncio.gather(self._feed(stdin or b""), _read_all(p.stdout.fileno()),
                                               _read_all(p.stderr.fileno()))
        finally:
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    f.close()
        await self.wait()
        return out, err

    async def _feed(self, data: bytes) -> None:
        f = self._popen.stdin
        if f is not None:
            await _write_all(f.fileno(), data)
            f.close()  # its end of input

    async def wait(self) -> int:
        p = self._popen
        rc = p.poll()
        if rc is not None:
            return rc
        try:
            fd = os.pidfd_open(p.pid)
        except (AttributeError, OSError):  # no pidfd (Linux < 5.3, not Linux): a thread waits
            return await offload(p.wait)
        try:
            if p.poll() is None:  # it may have exited before the pidfd was opened
                await _readable(fd)
        finally:
            os.close(fd)
        return p.wait()  # reaps it: the pidfd said it has exited


def start(argv: Sequence[str], *, env: Mapping[str, str], stdin: bool = False) -> Process:
    """Start `argv` (no shell) in its own session (process group), stdout and stderr piped, stdin
    piped when `stdin` else /dev/null. OSError when it cannot be started."""
    popen = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env), start_new_session=True)
    return Process(popen)


async def _readable(fd: int) -> None:
    await _ready(fd, write=False)


async def _ready(fd: int, write: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)
    (loop.add_writer if write else loop.add_reader)(fd, wake)
    try:
        await ready
    finally:
        (loop.remove_writer if write else loop.remove_reader)(fd)


async def _read_all(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            await _readable(fd)
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


async def _write_all(fd: int, data: bytes) -> None:
    os.set_blocking(fd, False)
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _ready(fd, write=True)
        except (BrokenPipeError, ConnectionError):
            return  # it exited without reading it all: its answer says why
