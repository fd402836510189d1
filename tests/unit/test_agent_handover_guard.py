"""The agent's POST /v1/handover runs the handover suite (on a GPU node a burn-in and NCCL): only
for its token, or for a caller on this host; never for a cross-site browser; JSON only."""

from __future__ import annotations

import dataclasses
import gzip
import json
from pathlib import Path
from typing import Any, AsyncIterator
from unittest import mock

import aiohttp
import pytest
from aiohttp.test_utils import make_mocked_request

from podhealth import webguard
from podhealth.agent import health
from podhealth.agent.agent import Agent
from podhealth.checks.handover.report import SuiteReport
from podhealth.config import AuthConfig, Config, ListenConfig

pytestmark = pytest.mark.timeout(60)


class Started:
    def __init__(self, agent: Agent, h: health.Health) -> None:
        self.agent, self.health, self.runs = agent, h, 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.agent.port}/v1/handover"


@pytest.fixture
async def agent_factory() -> AsyncIterator[Any]:
    started: list[Agent] = []

    async def make(token: str = "") -> Started:
        cfg = dataclasses.replace(Config(), listen=ListenConfig(address="127.0.0.1", port=0),
                                  auth=AuthConfig(token=token))
        agent = Agent(cfg, node="dgx01", factories={})
        h = health.install(agent, active_tests=lambda: [])
        out = Started(agent, h)

        async def run_handover(progress: Any = None) -> SuiteReport:
            out.runs += 1  # what a refused request must never reach
            return SuiteReport(node="dgx01", profile="dgx-h100", results=())
        h.run_handover = run_handover  # type: ignore[method-assign]
        await agent.start()
        started.append(agent)
        return out

    yield make
    for a in started:
        await a.stop()


async def _post(url: str, headers: dict[str, str], data: bytes = b"{}") -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(url, data=data, headers=headers) as r:
        return r.status, await r.text()


FORM = {"Content-Type": "application/x-www-form-urlencoded"}


async def test_a_cross_origin_form_post_is_refused_and_runs_nothing(agent_factory: Any) -> None:
    a = await agent_factory()
    host = f"127.0.0.1:{a.agent.port}"
    status, body = await _post(a.url, {**FORM, "Origin": "http://evil.example", "Host": host}, b"x=1")
    assert (status, a.runs) == (403, 0), body
    status, _ = await _post(a.url, {**FORM, "Sec-Fetch-Site": "cross-site"}, b"x=1")
    assert (status, a.runs) == (403, 0)
    # same host, but a form body (text/plain is what a no-preflight fetch would send): 415
    for ctype in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        status, body = await _post(a.url, {"Content-Type": ctype})
        assert (status, a.runs) == (415, 0), (ctype, body)
    # DNS rebinding: the socket is loopback, the Host is the attacker's name
    status, body = await _post(a.url, {"Content-Type": "application/json", "Host": f"evil.example:{a.agent.port}"})
    assert (status, a.runs) == (403, 0), body
    assert "only a caller on this host" in body
    # a local client (podhealth check, curl) with JSON and no Origin runs it
    status, body = await _post(a.url, {"Content-Type": "application/json"})
    assert (status, a.runs) == (200, 1), body
    status, _ = await _post(a.url, {"Content-Type": "application/json", "Origin": f"http://{host}"})
    assert (status, a.runs) == (200, 2)


async def test_with_a_token_the_token_is_required(agent_factory: Any) -> None:
    a = await agent_factory(token="agent-secret")
    json_ct = {"Content-Type": "application/json"}
    assert (await _post(a.url, json_ct))[0] == 401
    assert (await _post(a.url, {**json_ct, "Authorization": "Bearer wrong"}))[0] == 401
    assert (await _post(a.url, {**json_ct, "Authorization": "Bearer agent-secret", "Origin": "http://evil.example"}))[0] == 403
    assert (await _post(a.url, {**FORM, "Authorization": "Bearer agent-secret"}))[0] == 415
    assert a.runs == 0
    assert (await _post(a.url, {**json_ct, "Authorization": "Bearer agent-secret"}))[0] == 200
    assert a.runs == 1


@pytest.mark.parametrize(("peer", "host", "ok"), [
    ("127.0.0.1", "127.0.0.1:9410", True),
    ("::1", "[::1]:9410", True),
    ("127.0.0.1", "localhost:9410", True),
    ("127.0.0.1", "evil.example:9410", False),  # DNS rebinding
    ("10.1.2.3", "127.0.0.1:9410", False),  # another host naming loopback
    ("10.1.2.3", "dgx01:9410", False),
    ("127.0.0.1", "[::1", False),  # an unclosed IPv6 bracket: refused, not a 500
])
def test_from_this_host(peer: str, host: str, ok: bool) -> None:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda key, default=None: (peer, 1234) if key == "peername" else default
    req = make_mocked_request("POST", "/v1/handover", headers={"Host": host}, transport=transport)
    assert webguard.from_this_host(req) is ok


def test_the_agent_app_refuses_an_unguarded_mutating_route(tmp_path: Path) -> None:
    from aiohttp import web

    from podhealth.agent.server import build_app

    async def handler(request: web.Request) -> web.Response:
        return web.Response()
    agent = Agent(Config(), node="dgx01", factories={})
    with pytest.raises(RuntimeError, match="POST /v1/reboot is not wrapped"):
        build_app(agent, [web.post("/v1/reboot", handler)])


async def test_a_content_encoding_not_decoded_here_is_a_json_415_on_every_post(agent_factory: Any) -> None:
    """`Content-Encoding: br` was aiohttp's plain-text 400 before any handler ran (zstd the same;
    xz passed on undecoded): on each POST route it is the JSON 415 naming what is decoded, after
    the token is checked, and nothing runs."""
    a = await agent_factory(token="agent-secret")
    base = a.url.rsplit("/", 2)[0]
    ok = {"Content-Type": "application/json", "Authorization": "Bearer agent-secret"}
    for path in ("/v1/handover", "/v1/gpu-reset", "/v1/bundle"):
        for coding in ("br", "zstd", "xz", "gzip, br"):
            status, body = await _post(base + path, {**ok, "Content-Encoding": coding}, b'{"gpu": 0}')
            assert status == 415, (path, coding, body)
            out = json.loads(body)
            assert repr(coding) in out["error"] and "gzip, deflate, identity" in out["error"], out
        status, _ = await _post(base + path, {**ok, "Authorization": "Bearer wrong", "Content-Encoding": "br"})
        assert status == 401
    assert a.runs == 0


async def test_a_gzip_body_is_decoded_on_the_agent(agent_factory: Any) -> None:
    a = await agent_factory(token="agent-secret")
    url = a.url.rsplit("/", 2)[0] + "/v1/gpu-reset"
    ok = {"Content-Type": "application/json", "Authorization": "Bearer agent-secret",
          "Content-Encoding": "gzip"}
    # read and judged: a GPU index out of range (nothing is reset)
    status, body = await _post(url, ok, gzip.compress(b'{"gpu": 99, "reason": "test"}'))
    assert status == 400 and "expected" in json.loads(body)["error"], body
    status, body = await _post(url, ok, b'{"gpu": 0}')  # says gzip, is not
    assert status == 400 and "content-encoding: gzip" in json.loads(body)["error"], body
    status, body = await _post(url, ok, gzip.compress(b" " * (1024 * 1024)))
    assert status == 413 and "once decoded" in json.loads(body)["error"], body


async def test_a_gpu_reset_body_too_large_or_too_slow_is_a_json_error(agent_factory: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past client_max_size as sent it was aiohttp's plain-text 413; a body that never finished
    held the handler with no end (a client leaving mid-upload: a traceback in the log)."""
    import asyncio
    from podhealth.agent import gpureset
    monkeypatch.setattr(gpureset, "BODY_TIMEOUT_S", 0.5)
    a = await agent_factory(token="agent-secret")
    url = a.url.rsplit("/", 2)[0] + "/v1/gpu-reset"
    ok = {"Content-Type": "application/json", "Authorization": "Bearer agent-secret"}
    status, body = await _post(url, ok, b" " * (2 * 1024 * 1024))
    assert status == 413 and "exceeds" in json.loads(body)["error"], body
    reader, writer = await asyncio.open_connection("127.0.0.1", a.agent.port)
    try:
        writer.write(b"POST /v1/gpu-reset HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer agent-secret\r\nContent-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5s" in answer, answer
