"""The agent keeps one connection to the aggregator from one heartbeat to the next, and a
connection the aggregator closed just as it was reused costs neither a report nor a duplicate:
the push goes out once more on a new connection, and the aggregator applies it once (reports by
their seq, records by their id). A replica that stops under a kept connection is failed over
within the same heartbeat."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import AsyncIterator, Awaitable, Callable

import pytest
from aiohttp import web

from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.publisher import Publisher
from podhealth.aggregator.serve import budget_problems, http_limits
from podhealth.aggregator.service import Aggregator
from podhealth.config import PublishConfig
from podhealth.config_aggregator import AGENT_KEEPALIVE_MAX_S, ConnectionsConfig
from podhealth.fdlimit import soft_limit
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_heartbeat import Clock, healthy, sequencer
from tests.unit.test_publisher import until, xid

pytestmark = pytest.mark.timeout(60)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Connections:
    """A middleware in front of the aggregator's routes: the client end of the connection of each
    request, and, when `drop` is set, the next request's connection closed without an answer,
    before the aggregator sees the request or after it applied it."""

    def __init__(self) -> None:
        self.peers: list[object] = []
        self.answers: list[dict[str, object]] = []
        self.drop: str = ""  # "", "before" or "after"

    def middleware(self) -> object:
        async def handle(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await self._handle(request, handler)
        return web.middleware(handle)

    async def _handle(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        drop, self.drop = self.drop, ""
        if drop == "before":
            request.transport.close()  # the server's idle timeout fired as the request came in
            return web.Response()
        resp = await handler(request)
        if isinstance(resp, web.Response) and isinstance(resp.body, bytes):
            self.answers.append(json.loads(resp.body))
        if drop == "after":
            request.transport.close()  # applied, but the answer never reaches the agent
        return resp


def test_the_connection_is_kept_past_the_next_heartbeat_and_the_aggregator_keeps_it_longer() -> None:
    agent = PublishConfig(report_interval=30.0).keepalive()
    assert agent > 30.0, "aiohttp's 15 s default closed it before every heartbeat"
    assert ConnectionsConfig().idle_for(heartbeat_interval=30.0) > agent
    assert PublishConfig(report_interval=3600.0).keepalive() == AGENT_KEEPALIVE_MAX_S  # below NAT/LB idle timeouts
    assert ConnectionsConfig().idle_for(3600.0) > AGENT_KEEPALIVE_MAX_S
    assert ConnectionsConfig(idle_timeout=20.0).idle_for(30.0) == 20.0


@contextlib.asynccontextmanager
async def beating(tmp_path: Path) -> AsyncIterator[tuple[Aggregator, Heartbeat, Connections, Clock]]:
    """A real aggregator behind `Connections`, and a started heartbeat to it."""
    conns, clock = Connections(), Clock()
    async with running(config(tmp_path), [MemFencer()], middlewares=[conns.middleware()]) as (agg, url):
        hb = Heartbeat(PublishConfig(aggregator_url=url), clock=clock, sequencer=sequencer(tmp_path, clock))
        await hb.start()
        try:
            yield agg, hb, conns, clock
        finally:
            await hb.stop()


async def test_a_tls_reload_renews_the_kept_connection(tmp_path: Path) -> None:
    """After the agent's certificate was reloaded, the next push goes on a new connection (a
    new handshake, with the new certificate), and that one is kept in turn."""
    reloads = [0]
    conns, clock = Connections(), Clock()
    async with running(config(tmp_path), [MemFencer()], middlewares=[conns.middleware()]) as (_, url):
        hb = Heartbeat(PublishConfig(aggregator_url=url), clock=clock, sequencer=sequencer(tmp_path, clock),
                       tls_reloads=lambda: reloads[0])
        await hb.start()
        try:
            assert await hb.send(healthy(1000)) and await hb.send(healthy(1030))
            reloads[0] += 1
            assert await hb.send(healthy(1060)) and await hb.send(healthy(1090))
            assert len(conns.peers) == 4 and conns.peers[0] == conns.peers[1] != conns.peers[2] == conns.peers[3]
            assert hb.stats.failures == 0
        finally:
            await hb.stop()


async def test_heartbeats_reuse_one_connection(tmp_path: Path) -> None:
    async with beating(tmp_path) as (_, hb, conns, clock):
        for i in range(6):
            clock.t += 30
            assert await hb.send(healthy(1000 + 30 * i))
        assert (hb.stats.full, hb.stats.leases) == (1, 5)
        assert len(conns.peers) == 6 and len(set(conns.peers)) == 1, conns.peers


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_connection_closed_under_a_heartbeat_costs_no_report_and_no_duplicate(tmp_path: Path, when: str) -> None:
    async with beating(tmp_path) as (agg, hb, conns, clock):
        assert await hb.send(healthy(1000))
        clock.t += 30
        conns.drop = when
        assert await hb.send(healthy(1030)), "sent again on a new connection"
        assert hb.stats.failures == 0 and (hb.stats.full, hb.stats.leases) == (1, 1)
        assert len(set(conns.peers)) == 2 and conns.peers[-1] != conns.peers[0]
        assert agg.mem.nodes["dgx01"].report_seq == 5030e9, "the resent lease is the one applied"
        if when == "after":  # the aggregator saw the same lease twice: applied once, then stale
            assert [(a["unchanged"], a["stale"]) for a in conns.answers[-2:]] == [(1, 0), (0, 1)]
        clock.t += 30
        assert await hb.send(healthy(1060)) and len(set(conns.peers)) == 2, "the new connection is kept"


async def test_events_resent_after_a_dropped_answer_are_stored_once(tmp_path: Path) -> None:
    conns = Connections()
    async with running(config(tmp_path), [MemFencer()], middlewares=[conns.middleware()]) as (agg, url):
        pub = Publisher(PublishConfig(aggregator_url=url, spool_dir=tmp_path / "spool"), "dgx01", max_backoff=0.2)
        await pub.start()
        try:
            pub.publish_event(xid(0))
            await until(lambda: pub.stats.delivered == 1)
            conns.drop = "after"
            pub.publish_event(xid(1))
            await until(lambda: pub.stats.delivered == 2)
            assert pub.stats.send_failures == 0, "sent again at once, not after a backoff"
            # ev00001 arrived twice: applied the first time, a duplicate the second
            assert [(a["applied"], a["duplicate"]) for a in conns.answers] == [(1, 0), (1, 0), (0, 1)]
            assert {"ev00000", "ev00001"} <= agg.mem.seen_ids
        finally:
            await pub.stop()


async def test_a_replica_that_stops_under_a_kept_connection_is_failed_over(tmp_path: Path) -> None:
    clock = Clock()
    async with contextlib.AsyncExitStack() as b_stack:
        agg_b, url_b = await b_stack.enter_async_context(running(config(tmp_path / "b"), [MemFencer()]))
        async with contextlib.AsyncExitStack() as a_stack:
            conns = Connections()
            _, url_a = await a_stack.enter_async_context(
                running(config(tmp_path / "a"), [MemFencer()], middlewares=[conns.middleware()]))
            hb = Heartbeat(PublishConfig(aggregators=(url_a, url_b)), clock=clock, sequencer=sequencer(tmp_path, clock))
            await hb.start()
            try:
                assert await hb.send(healthy(1000)) and await hb.send(healthy(1030))
                assert len(set(conns.peers)) == 1 and hb.replicas.moves == 0  # one connection, kept
                await a_stack.aclose()  # replica a stops: its kept connection is closed under the agent
                clock.t += 30
                assert await hb.send(healthy(1060)), "the next replica took it in the same heartbeat"
                assert hb.replicas.moves == 1 and hb.url.startswith(url_b) and hb.stats.failures == 0
                # b never saw the full report the lease names: it refused it, and took the full one
                assert hb.stats.conflicts == 1 and agg_b.mem.nodes["dgx01"].report_seq == 5030e9 + 1
            finally:
                await hb.stop()


def test_the_aggregator_warns_of_a_budget_that_cannot_hold_its_agents(tmp_path: Path) -> None:
    ok = config(tmp_path)
    assert http_limits(ok).idle_timeout == 75.0 and budget_problems(ok, http_limits(ok)) == []
    short = config(tmp_path, connections=ConnectionsConfig(idle_timeout=40.0))  # agents keep theirs 45 s
    too_many = config(tmp_path, connections=ConnectionsConfig(max=soft_limit()))
    assert [m.split(" ")[0] for m, _ in budget_problems(short, http_limits(short))] == ["connections.idle_timeout"]
    assert [m.split(" ")[0] for m, _ in budget_problems(too_many, http_limits(too_many))] == ["connections.max"]
