"""The one bridge from a blocking call on a thread to an asyncio future.

Every blocking call podhealth makes from its event loop with its own thread (a collector's
collect(), a collector factory, the checks engine's evaluation, the simulated node's refresh)
goes through a Worker: one daemon thread that runs submitted callables one at a time and settles
an asyncio future on the submitting loop. A Python thread cannot be cancelled: callers never
submit a second call to a worker whose previous call has not returned when that call may hang,
and the thread is a daemon so a call hung forever (NVML on a wedged GPU) cannot keep the process
from exiting. `concurrent.futures` is not used because its executor threads are joined at
interpreter exit, which is exactly what a hung call must not block. A thread of its own that
settles futures itself (the aggregator's DB writer, committing in groups) does it through
`settle_from_thread`. Bounded local work that cannot hang for ever (SQLite, spool and bundle
files) goes through `offload`, the loop's default executor, so every hop off the loop is here.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], object], "asyncio.Future[object]"]


def _settle(fut: "asyncio.Future[Any]", value: object, exc: BaseException | None) -> None:
    if fut.cancelled():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


def settle_from_thread(fut: "asyncio.Future[Any]", value: object, exc: BaseException | None = None) -> None:
    """From any thread: give `fut` its result (or `exc`) on its own loop. A loop already closed
    (a call that outlived shutdown) is nobody's to tell: nothing happens."""
    with contextlib.suppress(RuntimeError):
        fut.get_loop().call_soon_threadsafe(_settle, fut, value, exc)


class Worker(Generic[T]):
    """Runs submitted callables one at a time on its own daemon thread; results come back as asyncio futures."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"podhealth-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> "asyncio.Future[T]":
        """Queue `fn`; must be called from the event loop that awaits the result."""
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._jobs.put((fn, fut))
        return fut  # type: ignore[return-value]

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, fut = job
            value: object = None
            exc: BaseException | None = None
            try:
                value = fn()
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                exc = e
            settle_from_thread(fut, value, exc)

    def close(self) -> None:
        """Let the thread exit after its current call (if any) returns."""
        self._jobs.put(None)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()


async def call_with_timeout(name: str, fn: Callable[[], T], timeout: float) -> T:
    """Run one blocking call on a throwaway daemon thread; raise TimeoutError if it does not return in time.

    Used for one-off calls (collector factories, close()) where a dedicated worker is overkill; a
    call that hangs keeps its thread, which dies with the process.
    """
    worker: Worker[T] = Worker(name)
    try:
        return await asyncio.wait_for(asyncio.shield(worker.submit(fn)), timeout)
    finally:
        worker.close()


async def call_off_loop(name: str, fn: Callable[[], T]) -> T:
    """Run one blocking call that bounds itself (a subprocess with its own timeout) on a throwaway
    daemon thread, without tying up the event loop."""
    worker: Worker[T] = Worker(name)
    try:
        return await asyncio.shield(worker.submit(fn))
    finally:
        worker.close()


async def offload(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """Bounded local work (SQLite, spool and bundle files: nothing that can hang for ever) on the
    loop's default executor, whose threads are reused. A call that can hang (a vendor library,
    NFS, a subprocess) goes to a Worker instead: interpreter exit joins executor threads."""
    return await asyncio.to_thread(fn, *args, **kwargs)
