"""core/worker.py `Worker.submit_first`: an urgent call goes before every call queued, and runs at
the next `between()` of the call in flight instead of after it (issue 32 §4: the agent's fast XID
judgement waited behind a whole full evaluation). Ordered by events, never timed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from podhealth.worker import Worker

pytestmark = pytest.mark.timeout(60)


def test_an_urgent_call_runs_at_the_next_step_of_the_call_in_flight() -> None:
    async def main() -> None:
        w: Worker[object] = Worker("t")
        order: list[str] = []
        entered, go = threading.Event(), threading.Event()

        def long() -> str:
            order.append("step 1")
            entered.set()
            assert go.wait(10)
            w.between()  # the urgent call submitted meanwhile runs here
            order.append("step 2")
            return "long"

        try:
            first = w.submit(long)
            queued = w.submit(lambda: order.append("queued"))
            await asyncio.get_running_loop().run_in_executor(None, entered.wait, 10)
            def now_please() -> str:
                order.append("urgent")
                return "urgent"
            urgent = w.submit_first(now_please)
            go.set()
            assert await urgent == "urgent"
            assert await first == "long"
            await queued
            assert order == ["step 1", "urgent", "step 2", "queued"]
        finally:
            w.close()

    asyncio.run(main())


def test_an_urgent_call_on_an_idle_worker_runs_and_its_failure_comes_back() -> None:
    async def main() -> None:
        w: Worker[object] = Worker("t")
        try:
            assert await w.submit_first(lambda: 7) == 7
            with pytest.raises(ZeroDivisionError):
                await w.submit_first(lambda: 1 // 0)
            assert await w.submit(lambda: "still serving") == "still serving"
        finally:
            w.close()

    asyncio.run(main())


def test_between_is_only_for_the_call_in_flight() -> None:
    w: Worker[object] = Worker("t")
    try:
        with pytest.raises(RuntimeError):
            w.between()
    finally:
        w.close()
