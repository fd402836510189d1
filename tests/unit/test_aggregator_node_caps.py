"""One node's own token cannot fill the store (issue 27 §9): record size, per-node push rate and
per-node stored bytes are capped; over a cap the answer is 429 with Retry-After, counted per
node, and that node's FAIL transitions are still applied. The rate bucket runs on a clock the
test holds still, so what is refused does not depend on how fast the machine is."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from podhealth.config_aggregator import AggAuthConfig, NodeIngestConfig
from podhealth.vocab import Action, CheckResult, Status
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_publisher import until

pytestmark = pytest.mark.timeout(60)
AUTH = AggAuthConfig(node_tokens={"dgx01": "n1tok", "dgx02": "n2tok"}, admin_token="atok")
TEXT = 20_000  # bytes of kernel text per event: five make a 100 KB push


def events(node: str, first: int, n: int = 5, text: int = TEXT) -> dict[str, Any]:
    t = time.time()
    return {"node": node, "events": [
        {"id": f"{node}-{i}", "type": "event", "time": t,
         "event": {"kind": "xid", "code": 13, "time": t, "text": "x" * text}} for i in range(first, first + n)]}


def fail(node: str, eid: str) -> dict[str, Any]:
    new = CheckResult("xid", Status.FAIL, "GPU0", action=Action.REBOOT, summary="XID 79")
    return {"id": eid, "type": "transition", "time": time.time(), "old": None, "new": new.to_json()}


async def post(s: aiohttp.ClientSession, url: str, body: Any, token: str) -> tuple[int, dict[str, str], Any]:
    async with s.post(f"{url}/v1/events", json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, dict(r.headers), await r.json()


def stored(db: Path, node: str) -> int:
    with sqlite3.connect(db) as c:
        return int(c.execute("SELECT COALESCE(SUM(LENGTH(body)), 0) FROM events WHERE node = ?", (node,)).fetchone()[0])


async def metric(s: aiohttp.ClientSession, url: str) -> str:
    async with s.get(f"{url}/metrics") as r:
        return await r.text()


async def test_a_flooding_node_is_throttled_and_its_fail_still_gets_through(tmp_path: Path) -> None:
    caps = NodeIngestConfig(rate=10_000, burst=300_000, stored_bytes=1 << 30)
    async with running(config(tmp_path, auth=AUTH, node_ingest=caps), [MemFencer()]) as (agg, url), \
            aiohttp.ClientSession() as s:
        agg.quota.mono = lambda: 1000.0  # the bucket never refills during the test
        answers = [await post(s, url, events("dgx01", 5 * i), "n1tok") for i in range(20)]
        codes = [a[0] for a in answers]
        assert codes[:2] == [200, 200] and set(codes[3:]) == {429}  # ~100 KB each against a 300 KB burst
        _, headers, body = answers[-1]
        assert int(headers["Retry-After"]) >= 1 and "node_ingest.rate" in body["error"]
        assert stored(tmp_path / "agg.db", "dgx01") <= 300_000  # what the flood added stopped at the burst

        # Still throttled: its FAIL transition is applied, the routine records beside it are not.
        batch = events("dgx01", 1000)
        batch["events"].insert(0, fail("dgx01", "t-79"))
        st, headers, _ = await post(s, url, batch, "n1tok")
        assert st == 429 and "Retry-After" in headers
        assert agg.mem.nodes["dgx01"].status is Status.FAIL
        with sqlite3.connect(tmp_path / "agg.db") as c:
            ids = {r[0] for r in c.execute("SELECT id FROM events WHERE node = 'dgx01'")}
        assert "t-79" in ids and "dgx01-1000" not in ids

        # Its heartbeat has a bucket of its own: a backlog of events never makes the node look silent.
        rep = {"node": "dgx01", "agent_version": "0.1.0", "profile": "dgx-h100", "time": time.time(), "results": []}
        async with s.post(f"{url}/v1/reports", json=rep, headers={"Authorization": "Bearer n1tok"}) as r:
            assert r.status == 200

        # Another node is not held back by it; the refusals are counted per node.
        assert (await post(s, url, events("dgx02", 0), "n2tok"))[0] == 200
        refused = codes.count(429) + 1
        samples = {(m.name, tuple(sorted(m.labels.items()))): m.value
                   for f in text_string_to_metric_families(await metric(s, url)) for m in f.samples}
        throttled = {k: v for k, v in samples.items() if k[0] == "podhealth_aggregator_ingest_throttled_total"}
        assert throttled == {("podhealth_aggregator_ingest_throttled_total",
                              (("node", "dgx01"), ("reason", "rate"))): refused}
        assert samples[("podhealth_aggregator_ingest_requests_total",
                        (("endpoint", "events"), ("result", "throttled")))] == refused


async def test_a_node_over_its_stored_bytes_is_refused_across_a_restart(tmp_path: Path) -> None:
    caps = NodeIngestConfig(rate=1 << 30, burst=1 << 30, stored_bytes=250_000)
    cfg = config(tmp_path, auth=AUTH, node_ingest=caps)
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        codes = [(await post(s, url, events("dgx01", 5 * i), "n1tok"))[0] for i in range(6)]
        assert codes[:3] == [200, 200, 200] and set(codes[3:]) == {429}
        st, headers, body = await post(s, url, events("dgx01", 900), "n1tok")
        assert st == 429 and "node_ingest.stored_bytes" in body["error"] and int(headers["Retry-After"]) >= 1
        assert 'reason="stored"' in await metric(s, url)
    assert stored(tmp_path / "agg.db", "dgx01") < 250_000 + 110_000  # one push past the cap, no more
    # The count comes back from the store: a restart does not reopen the tap.
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert (await post(s, url, events("dgx01", 2000), "n1tok"))[0] == 429
        st, _, _ = await post(s, url, {"node": "dgx01", "events": [fail("dgx01", "t-2")]}, "n1tok")
        assert st == 429 and agg.mem.nodes["dgx01"].status is Status.FAIL


async def test_a_record_larger_than_the_cap_is_refused_whole(tmp_path: Path) -> None:
    caps = dataclasses.replace(NodeIngestConfig(), max_event_bytes=10_000)
    async with running(config(tmp_path, auth=AUTH, node_ingest=caps), [MemFencer()]) as (agg, url), \
            aiohttp.ClientSession() as s:
        st, _, body = await post(s, url, events("dgx01", 0, n=2, text=12_000), "n1tok")
        assert st == 413 and "dgx01-0" in body["error"] and "max_event_bytes" in body["error"]
        assert stored(tmp_path / "agg.db", "dgx01") == 0


async def test_the_agent_behind_a_throttle_still_gets_its_fail_through(tmp_path: Path) -> None:
    """The real publisher against the real aggregator, the node over its rate: its FAIL
    transition (the priority lane, sent first) is applied at once; its routine records wait; a
    record larger than the cap is set aside, not retried for ever."""
    from podhealth.agent.publisher import Publisher
    from podhealth.config import PublishConfig
    from podhealth.vocab import Event

    caps = NodeIngestConfig(rate=1, burst=150_000, max_event_bytes=50_000)
    async with running(config(tmp_path, auth=AUTH, node_ingest=caps), [MemFencer()]) as (agg, url):
        agg.quota.mono = lambda: 1000.0  # the bucket never refills during the test
        pub = Publisher(PublishConfig(aggregator_url=url, token="n1tok", spool_dir=tmp_path / "spool", timeout=2.0),
                        "dgx01", max_backoff=0.2)
        await pub.start()
        try:
            t = time.time()
            pub.publish_event(Event(kind="xid", code=13, time=t, text="y" * 60_000, id="huge"))
            for i in range(40):  # ~800 KB of routine XIDs: far over the burst
                pub.publish_event(Event(kind="xid", code=13, time=t, text="x" * TEXT, id=f"r{i:03d}"))
            pub.publish_transition(None, CheckResult("xid", Status.FAIL, "GPU0", action=Action.REBOOT))
            await until(lambda: agg.mem.nodes.get("dgx01") is not None
                        and agg.mem.nodes["dgx01"].status is Status.FAIL)
            await until(lambda: pub.stats.rejected == 1 and pub.stats.send_failures >= 2)
            assert stored(tmp_path / "agg.db", "dgx01") < 150_000 + 2 * TEXT
            lines = (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()
            assert [json.loads(x)["record"]["id"] for x in lines] == ["huge"]
        finally:
            await pub.stop(drain=0)
