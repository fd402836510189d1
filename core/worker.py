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

A `Lane` is a Worker shared by several callers whose calls are short (the agent's collectors):
the calls submitted in one loop iteration go to its thread together and their results come back
in one wake-up of the loop, when its queue runs dry, instead of one thread and one wake-up per
caller (issue 32: hand-offs were ~30% of the agent's CPU). A call that outlives its caller's
timeout is given up (`abandon`): it keeps the old thread, which exits when it returns, and a new
thread takes the calls queued behind it, so one hung call never holds up the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

_Job = tuple[Callable[[], object], "asyncio.Future[object]"]
_WAKE = "wake"  # wakes an idle Worker for a call given to submit_first


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
        self._jobs: queue.SimpleQueue[_Job | str | None] = queue.SimpleQueue()
        self._first: deque[_Job] = deque()  # appended on the loop, taken only on the thread
        self._thread = threading.Thread(target=self._run, name=f"podhealth-{name}", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], T]) -> "asyncio.Future[T]":
        """Queue `fn`; must be called from the event loop that awaits the result."""
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._jobs.put((fn, fut))
        return fut  # type: ignore[return-value]

    def submit_first(self, fn: Callable[[], T]) -> "asyncio.Future[T]":
        """Like `submit`, but `fn` goes before every call queued, and runs at the next `between()`
        of the call in flight: a short urgent call (the agent's fast XID judgement) waits for one
        step of a long one (the full evaluation), not all of it, on the same thread (no race on
        what both use)."""
        fut: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self._first.append((fn, fut))
        self._jobs.put(_WAKE)
        return fut  # type: ignore[return-value]

    def between(self) -> None:
        """Called by the call in flight, on this worker's thread, between its steps: runs the
        calls given to `submit_first` meanwhile."""
        if threading.current_thread() is not self._thread:
            raise RuntimeError("between() is for the call in flight, on the worker's thread")
        while self._first:
            self._call(*self._first.popleft())

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            while self._first:
                self._call(*self._first.popleft())
            if isinstance(job, tuple):
                self._call(*job)

    @staticmethod
    def _call(fn: Callable[[], object], fut: "asyncio.Future[object]") -> None:
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


@dataclass(eq=False)
class LaneCall(Generic[T]):
    """One call on a Lane: its future, and when the lane's thread started and ended it (monotonic)."""

    fn: Callable[[], T]
    future: "asyncio.Future[T]"
    started: float | None = None
    ended: float | None = None
    value: object = None
    exc: BaseException | None = field(default=None, repr=False)


class Lane:
    """Short blocking calls of several callers on one daemon thread; each loop iteration's calls
    are handed over together and their results come back in one loop wake-up."""

    def __init__(self, name: str, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self._mono = monotonic
        self._cond = threading.Condition(threading.Lock())
        self._calls: deque[LaneCall[Any]] = deque()  # queued, not started
        self._done: list[LaneCall[Any]] = []  # returned, waiting for the queue to run dry
        self._running: LaneCall[Any] | None = None
        self._gen = 0  # which thread owns the queue; a thread of an older generation exits
        self._closed = False
        self._pending: list[LaneCall[Any]] = []  # submitted in this loop iteration, not yet handed over
        self._flush_scheduled = False
        self.threads_started = 0
        self.wakeups = 0  # times the thread woke the loop (one per batch, one per late call)
        self._spawn()

    def _spawn(self) -> None:
        self.threads_started += 1
        suffix = "" if self.threads_started == 1 else f"-{self.threads_started}"
        threading.Thread(target=self._run, args=(self._gen,), name=f"podhealth-{self.name}{suffix}",
                         daemon=True).start()

    def submit(self, fn: Callable[[], T]) -> LaneCall[T]:
        """Queue `fn` (from the event loop that awaits `.future`); it reaches the thread with the
        other calls of this loop iteration."""
        loop = asyncio.get_running_loop()
        call: LaneCall[T] = LaneCall(fn, loop.create_future())
        self._pending.append(call)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self._flush)
        return call

    def _flush(self) -> None:
        self._flush_scheduled = False
        calls, self._pending = self._pending, []
        with self._cond:
            self._calls.extend(calls)
            self._cond.notify()

    def _run(self, gen: int) -> None:
        while True:
            with self._cond:
                while gen == self._gen and not self._calls and not self._closed:
                    self._cond.wait()
                if gen != self._gen or (self._closed and not self._calls):
                    return
                call = self._calls.popleft()
                call.started = self._mono()
                self._running = call
            try:
                call.value = call.fn()
            except BaseException as e:  # noqa: BLE001 - handed to the awaiting coroutine
                call.exc = e
            with self._cond:
                call.ended = self._mono()
                if gen != self._gen:  # given up while it ran: the lane has a new thread
                    self.wakeups += 1
                    settle_from_thread(call.future, call.value, call.exc)
                    return
                self._running = None
                self._done.append(call)
                done: list[LaneCall[Any]] = []
                if not self._calls:
                    done, self._done = self._done, []
                    self.wakeups += 1
            if done:
                _settle_all_from_thread(done)

    def abandon(self, call: LaneCall[Any]) -> bool:
        """Give up on `call`, which is running (from the loop, at its caller's timeout): it keeps
        this thread, a new one takes the queue. False when it is not running (not started yet,
        or returned already: its result is on its way)."""
        with self._cond:
            if self._running is not call or call.ended is not None:
                return False
            self._gen += 1
            self._running = None
            done, self._done = self._done, []
            if not self._closed:
                self._spawn()
        # The calls that returned before it were waiting for the queue to run dry: hand them over now.
        for c in done:
            _settle(c.future, c.value, c.exc)
        return True

    def close(self) -> None:
        """Let the thread exit once the calls already submitted have run."""
        self._flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    @property
    def busy(self) -> bool:
        with self._cond:
            return self._running is not None or bool(self._calls) or bool(self._pending)


def _settle_all_from_thread(calls: list[LaneCall[Any]]) -> None:
    with contextlib.suppress(RuntimeError):
        calls[0].future.get_loop().call_soon_threadsafe(_settle_all, calls)


def _settle_all(calls: list[LaneCall[Any]]) -> None:
    for c in calls:
        _settle(c.future, c.value, c.exc)


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
