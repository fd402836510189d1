"""Agents fail over between aggregator replicas (publish.aggregators): events and heartbeats go
to the replica that answers, the spool keeps everything while none does, nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.publisher import Publisher
from podhealth.config import PublishConfig
from podhealth.vocab import CheckResult, NodeReport, Status
from tests.harness.proc import free_port
from tests.unit.test_publisher import Sink, sink_server, until, xid

pytestmark = pytest.mark.timeout(60)


def cfg(tmp_path: Path, urls: list[str]) -> PublishConfig:
    return PublishConfig(aggregators=tuple(urls), spool_dir=tmp_path / "spool", timeout=1.0)


async def test_events_go_to_the_replica_that_answers_and_none_is_lost(tmp_path: Path) -> None:
    a, b = Sink(), Sink()
    ra, ua = await sink_server(a)
    rb, ub = await sink_server(b)
    pub = Publisher(cfg(tmp_path, [ua, ub]), "dgx01", max_backoff=0.2)
    await pub.start()
    try:
        for i in range(10):
            pub.publish_event(xid(i))
        await until(lambda: len(a.ids) == 10)
        assert b.ids == [] and pub.url.startswith(ua)
        a.status = 503  # the first replica's store cannot write: move on
        for i in range(10, 20):
            pub.publish_event(xid(i))
        await until(lambda: len(b.ids) == 10)
        assert pub.url.startswith(ub) and pub.replicas.moves == 1
        # none answers: everything waits in the spool ...
        b.status = 503
        for i in range(20, 30):
            pub.publish_event(xid(i))
        await until(lambda: pub.stats.send_failures >= 2)
        assert len(a.ids) + len(b.ids) == 20 and pub.stats.spool_bytes > 0
        # ... and reaches whichever comes back first, in order
        a.status = 200
        await until(lambda: len(a.ids) == 20)
        assert sorted(a.ids + b.ids) == [f"ev{i:05d}" for i in range(30)]
    finally:
        await pub.stop()
        await ra.cleanup()
        await rb.cleanup()


async def test_a_replica_that_refuses_a_push_with_4xx_is_not_failed_over(tmp_path: Path) -> None:
    a, b = Sink(), Sink()
    ra, ua = await sink_server(a)
    rb, ub = await sink_server(b)
    a.reject_ids = {"ev00000"}
    pub = Publisher(cfg(tmp_path, [ua, ub]), "dgx01", max_backoff=0.2)
    await pub.start()
    try:
        pub.publish_event(xid(0))
        await until(lambda: pub.stats.rejected == 1)
        assert b.ids == [] and pub.replicas.moves == 0
    finally:
        await pub.stop()
        await ra.cleanup()
        await rb.cleanup()


async def test_heartbeats_move_to_the_next_replica_when_one_is_down(tmp_path: Path) -> None:
    got: list[str] = []

    async def reports(request: web.Request) -> web.Response:
        got.append((await request.json())["node"])
        return web.json_response({"applied": True})
    app = web.Application()
    app.router.add_post("/v1/reports", reports)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    hb = Heartbeat(cfg(tmp_path, [down, f"http://127.0.0.1:{port}"]))
    await hb.start()
    try:
        rep = NodeReport("dgx01", "0.1", "dgx-h100", (CheckResult("nfs", Status.OK, "/home"),))
        assert await hb.send(rep) and got == ["dgx01"]
        assert hb.replicas.moves == 1 and hb.url.endswith(f":{port}/v1/reports")
        assert await hb.send(rep) and hb.replicas.moves == 1  # stays with the one that answers
    finally:
        await hb.stop()
        await runner.cleanup()


def test_aggregator_url_still_works(tmp_path: Path) -> None:
    c = PublishConfig(aggregator_url="http://127.0.0.1:1", spool_dir=tmp_path / "s")
    assert c.urls() == ("http://127.0.0.1:1",)
    assert Publisher(c, "dgx01").url == "http://127.0.0.1:1/v1/events"
    assert PublishConfig(aggregators=("ftp://x",)).validate() == ("aggregators", 'expected http(s):// base URLs, got "ftp://x"')
