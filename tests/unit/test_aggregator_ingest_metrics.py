"""The /v1/reports metrics are counted in batches (metrics.IngestTally): a scrape still shows
every answered request, and a busy aggregator folds them in every FLUSH_AT requests."""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest

from podhealth.aggregator import metrics as agg_metrics
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import config, running
from tests.unit.test_aggregator_api import call, report

pytestmark = pytest.mark.timeout(60)

AUTH = AggAuthConfig(cluster_token="ctok", cluster_token_for_agents=True)


def sample(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m is not None, f"{name} not in /metrics"
    return float(m.group(1))


async def test_a_scrape_shows_every_answered_report(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH), []) as (_agg, url), aiohttp.ClientSession() as s:
        ok = [await call(s, "POST", f"{url}/v1/reports", report("dgx01", t=1000.0 + i, status="OK"), "ctok")
              for i in range(3)]
        assert [status for status, _ in ok] == [200, 200, 200]
        digest = ok[-1][1]["digest"]
        lease = {"node": "dgx01", "time": 1010.0, "boot_id": "boot-1", "seq": 1010000, "digest": digest}
        assert (await call(s, "POST", f"{url}/v1/reports", lease, "ctok"))[0] == 200
        assert (await call(s, "POST", f"{url}/v1/reports", {"node": "dgx01"}, "ctok"))[0] == 400
        text = await (await s.get(f"{url}/metrics")).text()
        assert sample(text, 'podhealth_aggregator_ingest_requests_total{endpoint="reports",result="ok"}') == 4
        assert sample(text, 'podhealth_aggregator_ingest_requests_total{endpoint="reports",result="bad_request"}') == 1
        # the first report applied, the next two and the lease unchanged (same verdicts)
        assert sample(text, 'podhealth_aggregator_ingest_events_total{result="applied"}') == 1
        assert sample(text, 'podhealth_aggregator_ingest_events_total{result="unchanged"}') == 3
        assert sample(text, 'podhealth_aggregator_ingest_duration_seconds_count{endpoint="reports"}') == 5
        # a second scrape counts nothing twice
        again = await (await s.get(f"{url}/metrics")).text()
        assert sample(again, 'podhealth_aggregator_ingest_duration_seconds_count{endpoint="reports"}') == 5


def test_a_tally_folds_in_every_flush_at_requests_without_a_scrape() -> None:
    m = agg_metrics.Metrics()
    tally = m.ingest_tally("reports")
    ok = m.ingest_requests.labels("reports", "ok")
    for _ in range(agg_metrics.FLUSH_AT - 1):
        tally.ok(0.001, "unchanged")
    assert ok._value.get() == 0  # type: ignore[attr-defined]  # held, not yet folded in
    tally.ok(0.002, "applied")
    assert ok._value.get() == agg_metrics.FLUSH_AT  # type: ignore[attr-defined]
    assert m.ingest_events.labels("applied")._value.get() == 1  # type: ignore[attr-defined]
    assert m.ingest_tally("reports") is tally
