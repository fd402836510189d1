"""The runner's tasks in flight: each action (and what follows it) runs as its own task, is
logged once if it fails, and all are cancelled together when this replica stops leading (what was
recorded stays pending in the journal)."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Coroutine, TypeVar

from podhealth import log as plog

from podhealth.aggregator.actions.journal import OperatorError

log = plog.get("podhealth.aggregator")
T = TypeVar("T")
S = TypeVar("S")


def _retrieve(t: "asyncio.Task[Any]") -> None:
    """An unrecorded action was logged where it happened (and an operator gets its 503); any
    other failure is logged here, once, instead of by asyncio at exit."""
    if t.cancelled():
        return
    e = t.exception()
    if e is not None and not isinstance(e, OperatorError):
        log.error("action task failed", error=f"{type(e).__name__}: {e}")


class Tasks(set["asyncio.Task[Any]"]):
    def spawn(self, coro: Awaitable[Any]) -> "asyncio.Task[Any]":
        t = asyncio.ensure_future(coro)
        self.add(t)
        t.add_done_callback(self.discard)
        t.add_done_callback(_retrieve)
        return t

    async def cancel_all(self) -> None:
        """Stop every action in flight; what was recorded stays pending in the journal."""
        tasks = list(self)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def beside(main: Awaitable[T], side: Coroutine[Any, Any, S]) -> tuple[T, "asyncio.Future[S]"]:
    """`main`'s result, with `side` running as a task beside it from the start; when `main`
    fails, `side` is cancelled (and awaited: no failure left unretrieved) and the failure goes up."""
    task = asyncio.ensure_future(side)
    try:
        return await main, task
    except BaseException:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        raise


__all__ = ["Tasks", "beside"]
