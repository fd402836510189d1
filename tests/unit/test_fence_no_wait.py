"""A FAIL the policy fences on waits for no timer and no batching window (issue 32 §4).

The decide loop coalesces bursts of ingest with a short gap after each run; an actionable FAIL
ends that gap at once. The gap and the decide interval are set to ten minutes here, so the fence
can only come from the FAIL itself; the test waits for the fence, never for a time.
"""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from podhealth.aggregator import service
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = pytest.mark.timeout(60)
LONG = 600.0


async def test_an_actionable_fail_is_dispatched_inside_the_decide_gap(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service, "MIN_DECIDE_GAP", LONG)
    fencer = MemFencer()
    async with running(config(tmp_path, nodes=4, decide_interval=LONG), [fencer]) as (agg, url), \
            aiohttp.ClientSession() as http:
        # an OK report: the loop runs for it, then sits in its (ten-minute) gap
        async with http.post(f"{url}/v1/reports", json=fail_report("dgx01", 10, "OK")) as r:
            assert r.status == 200
        await until(lambda: agg.mem.nodes["dgx01"].report_time > 0 and agg.last_decision_at > 0)
        runs = agg.metrics.decisions._value.get()
        # a WARN (no action to take) is coalesced: it does not end the gap
        warn = {"node": "dgx03", "time": 11, "results": [{"check": "xid", "entity": "GPU0", "status": "WARN",
                                                          "action": "NONE"}]}
        async with http.post(f"{url}/v1/reports", json=warn) as r:
            assert r.status == 200
        async with http.post(f"{url}/v1/reports", json=fail_report("dgx02", 12)) as r:
            assert r.status == 200
        await until(lambda: "dgx02" in fencer.fenced and not agg.pending, timeout=20)
        assert agg.metrics.decisions._value.get() == runs + 1, "one run, for the FAIL, within the gap"
        assert [c for c in fencer.calls if c[0] == "fence"] == [("fence", "dgx02")]
