"""Agents fail over between aggregator replicas (publish.aggregators): events and heartbeats go
to the replica that answers, the spool keeps everything while none does, nothing is lost."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from aiohttp import web

from podhealth.agent.failover import Replicas, node_order
from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.publisher import Publisher
from podhealth.config import PublishConfig
from podhealth.vocab import CheckResult, NodeReport, Status
from tests.harness.proc import free_port
from tests.unit.test_publisher import Sink, sink_server, until, xid

pytestmark = pytest.mark.timeout(60)


def cfg(tmp_path: Path, urls: list[str]) -> PublishConfig:
    return PublishConfig(aggregators=tuple(urls), spool_dir=tmp_path / "spool", timeout=1.0)


async def two_replicas(node: str) -> tuple[Sink, Sink, web.AppRunner, web.AppRunner, str, str]:
    """Two stand-in replicas, in `node`'s order: its pick first (agent/failover.py)."""
    s1, s2 = Sink(), Sink()
    r1, u1 = await sink_server(s1)
    r2, u2 = await sink_server(s2)
    if node_order([u1, u2], node) == [u2, u1]:
        return s2, s1, r2, r1, u2, u1
    return s1, s2, r1, r2, u1, u2


async def test_events_go_to_the_replica_that_answers_and_none_is_lost(tmp_path: Path) -> None:
    a, b, ra, rb, ua, ub = await two_replicas("dgx01")
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
    a, b, ra, rb, ua, ub = await two_replicas("dgx01")
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


HEADS = ("http://head1:9420", "http://head2:9420", "http://head3:9420")
FLEET = [f"dgx{i:05d}" for i in range(1, 3001)]


def base(url: str) -> str:
    return url.rsplit("/v1/", 1)[0]


def test_a_fleet_spreads_its_pushes_over_the_replicas(tmp_path: Path) -> None:
    c = PublishConfig(aggregators=HEADS, spool_dir=tmp_path / "spool")
    picks = Counter(base(Heartbeat(c, node=n).url) for n in FLEET)
    assert sorted(picks) == list(HEADS)
    assert all(900 <= k <= 1100 for k in picks.values()), picks  # 1,000 each; +-100 is about 4 standard deviations
    # A node's events and heartbeats start at the same replica, the same one on every start.
    assert all(base(Publisher(c, n).url) == base(Heartbeat(c, node=n).url) for n in FLEET[:50])
    assert node_order(HEADS, "dgx00001") == node_order(list(reversed(HEADS)), "dgx00001")
    assert Replicas(HEADS, "/v1/reports").url == HEADS[0] + "/v1/reports"  # no node name: the list's order


def test_a_lost_replicas_nodes_spread_over_the_others() -> None:
    on_first = [n for n in FLEET if node_order(HEADS, n)[0] == HEADS[0]]
    nexts = Counter(node_order(HEADS, n)[1] for n in on_first)
    assert sorted(nexts) == list(HEADS[1:]) and min(nexts.values()) >= 0.4 * len(on_first), nexts


def test_a_new_replica_takes_only_its_share_from_each() -> None:
    before = {n: node_order(HEADS[:2], n)[0] for n in FLEET}
    moved = [n for n in FLEET if node_order(HEADS, n)[0] != before[n]]
    assert all(node_order(HEADS, n)[0] == HEADS[2] for n in moved)
    assert 800 <= len(moved) <= 1200


async def test_heartbeats_of_a_fleet_reach_every_replica_and_move_only_off_a_lost_one(tmp_path: Path) -> None:
    got: dict[int, list[str]] = {}
    answer = {0: 200, 1: 200}

    def replica(i: int) -> web.Application:
        async def reports(request: web.Request) -> web.Response:
            if answer[i] != 200:
                return web.json_response({"error": "down"}, status=answer[i])
            got.setdefault(i, []).append((await request.json())["node"])
            return web.json_response({"applied": True})
        app = web.Application()
        app.router.add_post("/v1/reports", reports)
        return app
    runners, urls = [], []
    for i in range(2):
        runner = web.AppRunner(replica(i), access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{port}")
    beats = {f"dgx{i:02d}": Heartbeat(cfg(tmp_path, urls), node=f"dgx{i:02d}") for i in range(1, 21)}
    for hb in beats.values():
        await hb.start()

    async def beat_all() -> None:
        for node, hb in beats.items():
            assert await hb.send(NodeReport(node, "0.1", "dgx-h100", (CheckResult("nfs", Status.OK, "/home"),)))
    try:
        await beat_all()
        assert len(got[0]) + len(got[1]) == 20 and got[0] and got[1]  # both replicas take a share
        stayed = set(got[1])
        answer[0] = 503  # replica 0's store cannot write: its nodes move, replica 1's stay
        got.clear()
        await beat_all()
        assert sorted(got[1]) == sorted(beats) and 0 not in got
        assert all(hb.replicas.moves == (0 if node in stayed else 1) for node, hb in beats.items())
    finally:
        for hb in beats.values():
            await hb.stop()
        for runner in runners:
            await runner.cleanup()
