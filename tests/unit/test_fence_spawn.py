"""fencing/spawn.py: a child started by vfork, its pipes and exit awaited on the loop (asyncio's
own and uvloop, the aggregator's), as asyncio's subprocess would: output, exit code, stdin
written while the output is read, and a killed child reaped."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any, Callable, Coroutine

import pytest

from podhealth.fencing import spawn

pytestmark = pytest.mark.timeout(60)


def _loops() -> list[Any]:
    out: list[Any] = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    try:
        import uvloop
    except ImportError:
        return out
    return out + [pytest.param(uvloop.new_event_loop, id="uvloop")]


def run(factory: Callable[[], asyncio.AbstractEventLoop], coro: Coroutine[Any, Any, Any]) -> Any:
    with asyncio.Runner(loop_factory=factory) as r:
        return r.run(coro)


@pytest.mark.parametrize("factory", _loops())
def test_output_exit_code_and_stderr(factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def main() -> tuple[bytes, bytes, int | None]:
        p = spawn.start(["sh", "-c", "echo out; echo err >&2; exit 3"], env=os.environ)
        out, err = await p.communicate()
        return out, err, p.returncode
    assert run(factory, main()) == (b"out\n", b"err\n", 3)


@pytest.mark.parametrize("factory", _loops())
def test_stdin_is_written_while_the_output_is_read(factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    """More than a pipe holds each way (cat echoes as it reads): written first, it would block."""
    data = os.urandom(300_000)

    async def main() -> tuple[bytes, int | None]:
        p = spawn.start(["cat"], env=os.environ, stdin=True)
        out, _ = await p.communicate(data)
        return out, p.returncode
    assert run(factory, main()) == (data, 0)


@pytest.mark.parametrize("factory", _loops())
def test_a_killed_child_is_reaped(factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
    async def main() -> tuple[int, bool]:
        p = spawn.start(["sleep", "60"], env=os.environ)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(p.communicate(), 0.2)
        os.killpg(p.pid, signal.SIGKILL)  # its own session: the group is its own
        rc = await asyncio.wait_for(p.wait(), 10)
        return rc, os.path.exists(f"/proc/{p.pid}")
    rc, present = run(factory, main())
    assert rc == -signal.SIGKILL and not present  # reaped: no zombie left


def test_a_program_that_cannot_start_raises_oserror() -> None:
    with pytest.raises(OSError):
        spawn.start(["/nonexistent/scontrol"], env=os.environ)
