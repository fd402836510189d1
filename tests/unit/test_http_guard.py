"""Connection floods never exhaust the agent or the aggregator, and error storms never flood the log.

Many idle (and one slowloris) loopback connections against a real agent and a real aggregator:
beyond the cap they are refused with a 503 and counted, the idle ones are closed after the idle
timeout, and /healthz answers again. The timeouts are shortened through the same ConnLimits the
daemons build from their defaults (agent.http_limits; the aggregator's `connections:` config).
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import structlog

from podhealth import log as plog
from podhealth.agent.agent import Agent
from podhealth.aggregator.serve import http_limits, start_http
from podhealth.aggregator.service import Aggregator
from podhealth.config_aggregator import ConnectionsConfig
from podhealth.httpguard import ConnLimits
from podhealth.logrepeat import Repeats, loop_exception_handler
from tests.harness.agg import config as agg_config
from tests.harness.proc import free_port
from tests.unit.test_agent_scheduler import Fake, cfg_with

pytestmark = pytest.mark.timeout(60)
CAP, IDLE = 20, 1.0


async def _connect_many(port: int, n: int) -> list[socket.socket]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        out.append(s)
    return out


async def _answer(s: socket.socket, timeout: float = 3.0) -> bytes:
    """What the server sent before closing (b"" for a plain close), or b"open" if it did neither."""
    loop = asyncio.get_running_loop()
    try:
        return await asyncio.wait_for(loop.sock_recv(s, 4096), timeout) or b""
    except asyncio.TimeoutError:
        return b"open"
    except OSError:
        return b""


def _get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.status, r.read().decode()


async def _flood_then_recover(port: int, path: str = "/healthz") -> tuple[int, float]:
    """Open 2 x CAP idle connections (and one trickling a header); returns (refused, seconds until
    every idle one was closed by the server)."""
    socks = await _connect_many(port, 2 * CAP)
    answers = await asyncio.gather(*(_answer(s, timeout=0.3) for s in socks))
    refused = sum(a.startswith(b"HTTP/1.1 503") for a in answers)
    kept = [s for s, a in zip(socks, answers) if a == b"open"]
    t0 = time.monotonic()
    closed = await asyncio.gather(*(_answer(s, timeout=IDLE * 5) for s in kept))
    took = time.monotonic() - t0
    assert all(c == b"" for c in closed), "an idle connection outlived the idle timeout"
    for s in socks:
        s.close()
    return refused, took


async def _slowloris(port: int) -> float:
    """Seconds until the server closes a client that sends a request head a byte at a time."""
    loop = asyncio.get_running_loop()
    [s] = await _connect_many(port, 1)
    t0 = time.monotonic()
    try:
        for b in b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 200:
            await loop.sock_sendall(s, bytes([b]))
            await asyncio.sleep(0.05)
            if time.monotonic() - t0 > IDLE * 5:
                break
        return await _closed_after(s, t0)
    except OSError:
        return time.monotonic() - t0
    finally:
        s.close()


async def _closed_after(s: socket.socket, t0: float) -> float:
    await _answer(s, timeout=IDLE * 5)
    return time.monotonic() - t0


async def test_agent_caps_and_times_out_idle_and_slow_connections() -> None:
    agent = Agent(cfg_with(nvml=(0.2, 1.0)), node="n1", factories={"nvml": lambda c: Fake()})
    agent.http_limits = ConnLimits(CAP, IDLE)
    await agent.start()
    try:
        refused, took = await _flood_then_recover(agent.port)
        assert refused >= CAP - 2  # the cap (a connection closing as the next arrives may slip in)
        assert took < IDLE * 4
        assert await _slowloris(agent.port) < IDLE * 4
        status, _ = await asyncio.to_thread(_get, agent.url + "/healthz")
        assert status == 200
        # counted, and on /metrics once the next collection re-renders it
        assert agent.http_refused == refused
        deadline = time.monotonic() + 10
        while True:
            _, body = await asyncio.to_thread(_get, agent.url + "/metrics")
            if f"podhealth_http_connections_refused_total{{node=\"n1\"}} {float(refused)}" in body:
                break
            assert time.monotonic() < deadline, [ln for ln in body.splitlines() if "refused" in ln]
            await asyncio.sleep(0.1)
    finally:
        await agent.stop()


async def test_aggregator_caps_and_times_out_idle_connections(tmp_path: Path) -> None:
    port = free_port()
    cfg = agg_config(tmp_path, connections=ConnectionsConfig(idle_timeout=IDLE, max=CAP))  # as an operator sets them
    cfg = dataclasses.replace(cfg, listen=dataclasses.replace(cfg.listen, address="127.0.0.1", port=port))
    agg = await Aggregator.open(cfg)
    try:
        runner = await start_http(agg, http_limits(cfg))
    except BaseException:
        await agg.stop()
        raise
    try:
        refused, took = await _flood_then_recover(port)
        assert refused >= CAP - 2 and took < IDLE * 4
        assert await _slowloris(port) < IDLE * 4
        status, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and json.loads(body)["status"] == "ok"
        _, text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        assert f"podhealth_aggregator_http_connections_refused_total {float(refused)}" in text
        assert f"podhealth_aggregator_http_connections_max {float(CAP)}" in text
        open_now = [ln for ln in text.splitlines() if ln.startswith("podhealth_aggregator_http_connections ")]
        assert len(open_now) == 1 and 1 <= float(open_now[0].split()[1]) < CAP, "this scrape's own connection at least"
    finally:
        await runner.cleanup()


@pytest.fixture(autouse=True)
def _restore_logging() -> Any:
    yield
    structlog.reset_defaults()  # _capture configured structlog for the whole process


def _capture() -> tuple[io.StringIO, Any]:
    buf = io.StringIO()
    plog.setup("info", "json", stream=buf)
    return buf, structlog.get_logger("t")


def test_a_storm_of_identical_errors_is_one_line_per_interval() -> None:
    buf, logger = _capture()
    now = [0.0]
    rep = Repeats(logger, interval=60.0, clock=lambda: now[0])
    for i in range(100_000):
        now[0] = i * 0.001  # 100 s of a thousand errors a second
        rep.emit("error", "accept|OSError|24", "socket.accept() out of system resource", error="[Errno 24]")
    lines = [json.loads(x) for x in buf.getvalue().splitlines()]
    assert len(lines) == 2 and rep.logged == 2 and rep.held == 99_998
    assert "repeated" not in lines[0] and lines[1]["repeated"] == 59_999  # held back in the first minute
    rep.emit("error", "another", "something else")  # a different kind is not held back
    assert len(buf.getvalue().splitlines()) == 3


async def test_the_event_loop_handler_logs_a_kind_once_not_a_traceback_each_time() -> None:
    buf, logger = _capture()
    loop = asyncio.get_running_loop()
    old = loop.get_exception_handler()
    loop.set_exception_handler(loop_exception_handler(Repeats(logger)))
    try:
        for _ in range(1000):
            loop.call_exception_handler({"message": "socket.accept() out of system resource",
                                         "exception": OSError(24, "Too many open files")})
    finally:
        loop.set_exception_handler(old)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1 and "Traceback" not in lines[0]
    assert json.loads(lines[0])["error"] == "OSError: [Errno 24] Too many open files"


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_a_refused_client_reads_the_503_on_either_event_loop(loop: str) -> None:
    """The daemons run on uvloop, whose transports are not asyncio.Transport subclasses."""
    from aiohttp import web

    from podhealth.httpguard import GuardedSite

    async def main() -> str:
        app = web.Application()
        runner = web.AppRunner(app, access_log=None, **ConnLimits(1, 5.0).runner_kwargs())
        await runner.setup()
        port = free_port()
        site = GuardedSite(runner, "127.0.0.1", port, ConnLimits(1, 5.0))
        await site.start()
        try:
            [hold] = await _connect_many(port, 1)
            await asyncio.sleep(0.1)
            try:
                await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/")
            except urllib.error.HTTPError as e:
                return f"{e.code} {e.read().decode().strip()}"
            finally:
                hold.close()
            return "not refused"
        finally:
            await runner.cleanup()

    if loop == "uvloop":
        import uvloop
        got = uvloop.run(main())
    else:
        got = asyncio.run(main())
    assert got == "503 too many open connections"
