"""A fence reads its fencers beside the journal's write of its pending row (issue 32 §4), not
after it: the read changes nothing, and nothing that writes is called before the row is
committed. When the row cannot be written, the read is dropped and nothing is fenced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from podhealth.aggregator.service import OperatorError
from podhealth.fencing.fence import FenceState
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_store_faults import _refuse_actions, until

pytestmark = pytest.mark.timeout(60)


def _watch(fencer: MemFencer, agg: Any) -> list[bool]:
    """Per read of a node: whether its fence was already recorded (in the journal's pending)."""
    recorded: list[bool] = []
    real = fencer.read

    async def read(node: str) -> FenceState:
        recorded.append(any(p.node == node and p.kind == "fence" for p in agg.pending.values()))
        return await real(node)
    fencer.read = read  # type: ignore[method-assign]
    return recorded


async def test_an_operator_fence_reads_before_its_row_is_committed(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, _):
        recorded = _watch(fencer, agg)
        res = await agg.operator_fence("dgx01", "bad fan", "alice", wait=10)
        assert res["state"] == "done" and "dgx01" in fencer.fenced
        assert recorded == [False], "one read, started beside the journal's write"
        assert fencer.count("fence", "dgx01") == 1


async def test_an_unrecorded_fence_calls_nothing_that_writes(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, _):
        await _refuse_actions(agg, True)
        with pytest.raises(OperatorError):
            await agg.operator_fence("dgx01", "bad fan", "alice", wait=5)
        assert [w for w, _ in fencer.calls if w not in ("read", "list")] == [] and not fencer.fenced
        await _refuse_actions(agg, False)
        res = await agg.operator_fence("dgx01", "bad fan", "alice", wait=10)
        assert res["state"] == "done" and "dgx01" in fencer.fenced
        await until(lambda: not agg.pending)
