"""Reconcile and a deposed leader's late mark (aggregator/lifecycle.py, reconcile.py).

The journal released dgx01 under lease epoch 4; a mark of epoch 4 then appears in the backend
(a leader frozen inside a fence that woke after it was deposed). The periodic reconcile of the
leader of epoch 5 undoes it and alerts; it never adopts it as podhealth's own fence. A mark
without an epoch (an older podhealth) and this leader's own mark are adopted as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.store import Store
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_service import seed, until

pytestmark = pytest.mark.timeout(60)
MARK = "podhealth: xid GPU0 DRAIN [ev-1]"


def journal_released_under_epoch_4(tmp_path: Path) -> None:
    s = seed(tmp_path, dgx01={"fence": "none"}, dgx02={"fence": "none"}, dgx03={"fence": "none"})
    s.apply([("INSERT INTO kv (key, value) VALUES ('lease', ?)", (json.dumps({"epoch": 4}),))])
    for node in ("dgx01", "dgx02", "dgx03"):
        aid = s.begin_action(node, "release", "operator:alice", "checked by hand", 10.0, epoch=4)
        s.apply([Store.op_action_finish(aid, "done", 11.0, "released")], epoch=4)
    s.close()


async def test_a_stale_mark_on_a_released_node_is_undone_and_alerted_never_adopted(tmp_path: Path) -> None:
    journal_released_under_epoch_4(tmp_path)
    fencer = MemFencer()
    async with running(config(tmp_path, nodes=3), [fencer]) as (agg, _):
        assert agg.epoch() == 5
        await until(lambda: not agg.pending and not agg._action_tasks)
        # after the start: the late calls land
        fencer.fenced.update({"dgx01": f"{MARK} e4", "dgx02": MARK, "dgx03": f"{MARK} e5"})
        lines = await agg.reconcile()
        await until(lambda: not agg.pending and not agg._action_tasks)
        nodes = agg.mem.nodes
        # the deposed leader's mark: released again, the store never says fenced
        assert "dgx01" not in fencer.fenced and fencer.count("release", "dgx01") == 1
        assert nodes["dgx01"].fence is FenceMode.NONE
        assert any("stale mark of lease epoch 4" in ln for ln in lines), lines
        assert agg.metrics.stale_marks._value.get() == 1  # the alert's counter
        audit = [a for a in agg.store.audit_tail(100) if a["node"] == "dgx01"]
        assert any(a["what"] == "stale mark" and not a["ok"] for a in audit), audit
        # an older podhealth's mark and this leader's own: adopted, as before
        assert nodes["dgx02"].fence is FenceMode.FENCED and nodes["dgx03"].fence is FenceMode.FENCED
        assert fencer.count("release", "dgx02") == fencer.count("release", "dgx03") == 0
