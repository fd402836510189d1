"""One client address holds at most its share of a server's connections (httpguard.ConnLimits.client_cap).

Real aiohttp servers behind GuardedSite on free loopback ports. The clients come from distinct
loopback addresses (127.0.0.2, 127.0.0.3, ...: Linux routes all of 127/8 to lo), so one test host
plays several clients. Each test runs on asyncio and on uvloop (what the daemons run on), whose
transports call the protocol the same way but are other classes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import http.client
import socket
import struct
import time
from pathlib import Path
from typing import Any, Callable, Coroutine

import pytest
from aiohttp import web
from structlog.testing import capture_logs

from podhealth.agent.agent import HTTP_IDLE_TIMEOUT, HTTP_MAX_CONNECTIONS, Agent
from podhealth.aggregator.serve import start_http
from podhealth.aggregator.service import Aggregator
from podhealth.httpguard import ConnLimits, GuardedSite
from tests.harness.agg import config as agg_config
from tests.harness.proc import free_port
from tests.unit.test_agent_scheduler import cfg_with

pytestmark = pytest.mark.timeout(60)
LOOPS = ["asyncio", "uvloop"]


def test_the_share_is_a_quarter_at_least_8_and_the_whole_cap_on_a_loopback_only_server() -> None:
    agent = ConnLimits(HTTP_MAX_CONNECTIONS, HTTP_IDLE_TIMEOUT)
    assert agent.client_cap("0.0.0.0") == agent.client_cap("") == agent.client_cap(None) == HTTP_MAX_CONNECTIONS // 4
    assert agent.client_cap("10.0.0.5") == agent.client_cap("::") == HTTP_MAX_CONNECTIONS // 4
    assert ConnLimits(20, 1.0).client_cap("0.0.0.0") == 8  # the floor
    assert ConnLimits(3, 1.0).client_cap("0.0.0.0") == 8  # above the cap: the cap decides
    # Bound to loopback, every client has the same address (the simulated fleet, the
    # integration tests, a local proxy): the share is the whole cap.
    agg = ConnLimits(768, 75.0)
    for host in ("127.0.0.1", "::1", "localhost"):
        assert agg.client_cap(host) == 768
    assert ConnLimits(768, 1.0, per_client=5).client_cap("127.0.0.1") == 5  # explicit wins


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


Refusals = list[tuple[int, str | None]]


async def _serve(limits: ConnLimits, refusals: Refusals) -> tuple[web.AppRunner, GuardedSite, int]:
    app = web.Application()
    app.router.add_get("/", _ok)
    runner = web.AppRunner(app, access_log=None, **limits.runner_kwargs())
    await runner.setup()
    port = free_port()
    site = GuardedSite(runner, "127.0.0.1", port, limits, lambda n, client: refusals.append((n, client)))
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner, site, port


async def _connect(port: int, source: str) -> socket.socket:
    s = socket.socket()
    s.setblocking(False)
    try:
        s.bind((source, 0))
        await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
    except BaseException:
        s.close()
        raise
    return s


async def _answer(s: socket.socket, timeout: float) -> bytes:
    """What the server sent (b"" for a close), or b"open" if it did neither within `timeout`."""
    try:
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(s, 4096), timeout) or b""
    except asyncio.TimeoutError:
        return b"open"
    except OSError:
        return b""


async def _until(what: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def _get(port: int, source: str) -> str:
    """A whole GET from `source` (what a scraper or the CLI does), on a connection of its own."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request("GET", "/")
        r = conn.getresponse()
        return f"{r.status} {r.read().decode()}"
    finally:
        conn.close()


def _run(loop: str, main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop == "uvloop":
        import uvloop
        uvloop.run(main())
    else:
        asyncio.run(main())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_client_over_its_share_is_refused_while_others_still_connect(loop: str) -> None:
    async def main() -> None:
        refusals: Refusals = []
        runner, site, port = await _serve(ConnLimits(20, 30.0, per_client=4), refusals)
        socks: list[socket.socket] = []
        try:
            for _ in range(4):
                socks.append(await _connect(port, "127.0.0.2"))
            await _until(lambda: site.by_client.get("127.0.0.2") == 4)
            extra = await _connect(port, "127.0.0.2")
            socks.append(extra)
            assert (await _answer(extra, 3.0)).startswith(b"HTTP/1.1 503 Service Unavailable")
            assert site.refused == 1 and refusals == [(4, "127.0.0.2")]  # the on_refuse path: open, who
            # the four it holds stay open, and another client is answered
            assert [await _answer(s, 0.2) for s in socks[:4]] == [b"open"] * 4
            assert await asyncio.to_thread(_get, port, "127.0.0.3") == "200 ok"
            assert site.refused == 1
            # a slot freed is the client's again
            socks[0].close()
            await _until(lambda: site.by_client.get("127.0.0.2") == 3)
            assert await asyncio.to_thread(_get, port, "127.0.0.2") == "200 ok"
        finally:
            for s in socks:
                s.close()
            await runner.cleanup()
    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_total_cap_still_holds_across_clients(loop: str) -> None:
    async def main() -> None:
        refusals: Refusals = []
        runner, site, port = await _serve(ConnLimits(6, 30.0, per_client=4), refusals)
        socks: list[socket.socket] = []
        try:
            for source in ("127.0.0.2", "127.0.0.3", "127.0.0.4"):
                for _ in range(2):
                    socks.append(await _connect(port, source))
            await _until(lambda: site.open == 6)
            late = await _connect(port, "127.0.0.5")  # a client with none open, over the total
            socks.append(late)
            assert (await _answer(late, 3.0)).startswith(b"HTTP/1.1 503")
            assert refusals == [(6, None)] and "127.0.0.5" not in site.by_client  # None: the server was full
        finally:
            for s in socks:
                s.close()
            await runner.cleanup()
    _run(loop, main)


def _reset(s: socket.socket) -> None:
    """Close with a TCP reset instead of a FIN (a killed client)."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


@pytest.mark.parametrize("loop", LOOPS)
def test_the_counts_return_to_zero_however_connections_end(loop: str) -> None:
    """Closed by the client, reset by it, closed by the server's idle timeout, refused, after a
    request or before one: after all of them nothing is counted, and no address is remembered."""
    async def main() -> None:
        refusals: Refusals = []
        idle = 3.0  # long enough that none is closed before the counts below are read
        runner, site, port = await _serve(ConnLimits(40, idle, per_client=6), refusals)
        sources = [f"127.0.0.{i}" for i in range(2, 8)]
        socks: list[socket.socket] = []
        try:
            for src in sources:
                socks += [await _connect(port, src) for _ in range(7)]  # one over each share
            await _until(lambda: len(refusals) == len(sources))
            assert site.open == 6 * len(sources) and set(site.by_client.values()) == {6}
            answers = await asyncio.gather(*(_answer(s, 0.3) for s in socks))
            assert sum(a.startswith(b"HTTP/1.1 503") for a in answers) == len(sources)
            kept = [s for s, a in zip(socks, answers) if a == b"open"]
            assert len(kept) == 6 * len(sources)
            loop_ = asyncio.get_running_loop()
            for i, s in enumerate(kept):
                if i % 3 == 0:
                    s.close()
                elif i % 3 == 1:
                    _reset(s)
                else:  # a request on a keep-alive connection, then left to the idle timeout
                    await loop_.sock_sendall(s, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            for i in range(4):  # whole requests meanwhile, from other clients
                assert await asyncio.to_thread(_get, port, f"127.0.0.{20 + i}") == "200 ok"
            await _until(lambda: site.open == 0 and site.by_client == {}, timeout=idle * 4)
            assert site.refused == len(sources)
        finally:
            for s in socks:
                s.close()
            await runner.cleanup()
    _run(loop, main)


@pytest.mark.parametrize("loop", LOOPS)
def test_the_counts_return_to_zero_when_the_server_shuts_down(loop: str) -> None:
    async def main() -> None:
        runner, site, port = await _serve(ConnLimits(20, 30.0), [])
        socks = [await _connect(port, "127.0.0.2") for _ in range(5)]
        try:
            await _until(lambda: site.open == 5)
        finally:
            await runner.cleanup()
            for s in socks:
                s.close()
        await _until(lambda: site.open == 0 and site.by_client == {})
    _run(loop, main)


async def _flood_one_client(port: int, n: int) -> list[socket.socket]:
    """`n` connections from 127.0.0.2, once each is answered or left open."""
    socks = [await _connect(port, "127.0.0.2") for _ in range(n)]
    await asyncio.gather(*(_answer(s, 0.3) for s in socks))
    return socks


async def test_the_agent_counts_and_logs_a_client_over_its_share() -> None:
    agent = Agent(cfg_with(), node="n1", factories={})
    agent.http_limits = ConnLimits(20, 30.0, per_client=3)
    await agent.start()
    socks: list[socket.socket] = []
    try:
        with capture_logs() as logs:
            socks = await _flood_one_client(agent.port, 5)
        assert agent.http_refused == 2
        [line] = [e for e in logs if e["event"].startswith("HTTP connection refused")]  # once, not per refusal
        assert line["event"] == "HTTP connection refused: the client holds its share" and line["client"] == "127.0.0.2"
        assert await asyncio.to_thread(_get_path, agent.port, "127.0.0.3", "/healthz") == 200  # another client
    finally:
        for s in socks:
            s.close()
        await agent.stop()


async def test_the_aggregator_counts_and_logs_a_client_over_its_share(tmp_path: Path) -> None:
    port = free_port()
    cfg = agg_config(tmp_path)
    cfg = dataclasses.replace(cfg, listen=dataclasses.replace(cfg.listen, address="127.0.0.1", port=port))
    agg = await Aggregator.open(cfg)
    try:
        runner = await start_http(agg, ConnLimits(20, 30.0, per_client=3))
    except BaseException:
        await agg.stop()
        raise
    socks: list[socket.socket] = []
    try:
        with capture_logs() as logs:
            socks = await _flood_one_client(port, 5)
        [line] = [e for e in logs if e["event"].startswith("HTTP connection refused")]
        assert (line["client"], line["per_client"]) == ("127.0.0.2", 3)
        assert await asyncio.to_thread(_get_path, port, "127.0.0.3", "/healthz") == 200
        assert agg.metrics.http_refused._value.get() == 2
    finally:
        for s in socks:
            s.close()
        await runner.cleanup()


def _get_path(port: int, source: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()
