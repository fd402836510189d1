"""The agent's POST /v1/handover runs the handover suite (on a GPU node a burn-in and NCCL), and
POST /v1/gpu-reset and /v1/bundle act or reveal: only for a request signed with the node's agent
key, once (a replay is refused), never without a key configured (closed by default, to local
callers too), never for a cross-site browser; JSON only."""

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
from tests.harness.fakeagent import signed_headers

pytestmark = pytest.mark.timeout(60)
KEY = "agent-secret-0123456789abcdef"


def signed(url: str, body: bytes = b"{}", key: str = KEY, node: str = "dgx01", **extra: str) -> dict[str, str]:
    return signed_headers(key, node, "POST", url, body, **{"Content-Type": "application/json", **extra})


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
    a = await agent_factory(token=KEY)
    host = f"127.0.0.1:{a.agent.port}"
    status, body = await _post(a.url, {**FORM, "Origin": "http://evil.example", "Host": host}, b"x=1")
    assert (status, a.runs) == (403, 0), body
    status, _ = await _post(a.url, {**FORM, "Sec-Fetch-Site": "cross-site"}, b"x=1")
    assert (status, a.runs) == (403, 0)
    # same host, but a form body (text/plain is what a no-preflight fetch would send): 415
    for ctype in ("application/x-www-form-urlencoded", "text/plain", "multipart/form-data; boundary=x"):
        status, body = await _post(a.url, {"Content-Type": ctype})
        assert (status, a.runs) == (415, 0), (ctype, body)
    # a signed request from a cross-site page is still refused
    status, body = await _post(a.url, signed(a.url, Origin="http://evil.example"))
    assert (status, a.runs) == (403, 0), body
    # a local client (podhealth check) with the key signs it: it runs
    status, body = await _post(a.url, signed(a.url))
    assert (status, a.runs) == (200, 1), body
    status, _ = await _post(a.url, signed(a.url, Origin=f"http://{host}"))
    assert (status, a.runs) == (200, 2)


@pytest.mark.parametrize("path", ["/v1/handover", "/v1/gpu-reset", "/v1/bundle"])
async def test_without_a_key_every_protected_route_is_closed_to_local_callers_too(agent_factory: Any,
                                                                                  path: str) -> None:
    """Closed by default: a local user must not run the suite, reset an idle GPU, or take the
    bundle (kernel log lines that user cannot read). It was open to any caller on loopback."""
    a = await agent_factory()
    url = a.url.rsplit("/", 2)[0] + path
    body = b'{"gpu": 0}'
    for headers in ({"Content-Type": "application/json"}, signed(url, body), signed(url, body, key="")):
        status, text = await _post(url, headers, body)
        assert status == 403 and "holds no key" in json.loads(text)["error"], (headers, text)
    assert a.runs == 0


async def test_a_request_not_signed_with_the_nodes_key_is_refused(agent_factory: Any) -> None:
    a = await agent_factory(token=KEY)
    json_ct = {"Content-Type": "application/json"}
    refused = [
        json_ct,  # unsigned, from this host
        {**json_ct, "Authorization": f"Bearer {KEY}"},  # the key itself as a bearer token: never accepted
        signed(a.url, key="another-nodes-key-0123456789"),
        signed(a.url, node="dgx02"),  # signed for another node
        signed(a.url, body=b'{"reason": "other"}'),  # the body changed after signing
        signed(a.url.replace("/v1/handover", "/v1/bundle")),  # signed for another route
    ]
    for headers in refused:
        status, text = await _post(a.url, headers)
        assert status == 401, (headers, text)
    assert (await _post(a.url, {**signed(a.url), **FORM}))[0] == 415
    assert a.runs == 0
    assert (await _post(a.url, signed(a.url)))[0] == 200
    assert a.runs == 1


@pytest.mark.parametrize("path", ["/v1/handover", "/v1/gpu-reset"])
async def test_a_signed_request_replayed_byte_for_byte_is_refused(agent_factory: Any, path: str) -> None:
    """A GPU reset captured on the wire and sent again was carried out twice."""
    import asyncio

    a = await agent_factory(token=KEY)
    url = a.url.rsplit("/", 2)[0] + path
    body = b'{"gpu": 0, "reason": "test"}'
    head = "".join(f"{k}: {v}\r\n" for k, v in signed(url, body).items())
    raw = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{a.agent.port}\r\n{head}Content-Length: {len(body)}\r\n"
           "Connection: close\r\n\r\n").encode() + body
    answers = []
    for _ in range(2):
        reader, writer = await asyncio.open_connection("127.0.0.1", a.agent.port)
        try:
            writer.write(raw)
            await writer.drain()
            answers.append(await asyncio.wait_for(reader.read(), 30))
        finally:
            writer.close()
    assert not answers[0].startswith((b"HTTP/1.1 401", b"HTTP/1.1 409")), answers[0][:200]
    assert answers[1].startswith(b"HTTP/1.1 409") and b"already carried out" in answers[1], answers[1][:300]
    if path == "/v1/handover":
        assert a.runs == 1


async def test_a_request_signed_before_the_agent_started_is_refused(agent_factory: Any) -> None:
    """The nonce cache is in memory: without this, a request captured before a restart could be
    replayed once after it, within the time window."""
    import time

    from podhealth import nodeproof

    a = await agent_factory(token=KEY)
    a.agent.nodeauth.started = int(time.time())  # as if it started just now
    s = nodeproof.sign(KEY, "dgx01", "POST", "/v1/handover", b"{}", time.time() - 20)  # within the window
    status, text = await _post(a.url, {**s.headers, "Content-Type": "application/json"})
    assert status == 409 and "before this agent started" in text and a.runs == 0
    assert (await _post(a.url, signed(a.url)))[0] == 200


async def test_answers_carry_the_proof_of_the_nodes_key(agent_factory: Any) -> None:
    """What the aggregator and the hooks check: the proof is over the node, their nonce and the body."""
    from podhealth import agentclient

    a = await agent_factory(token=KEY)
    base = a.url.rsplit("/", 2)[0]
    async with aiohttp.ClientSession() as s:
        r = await agentclient.ask_async(s, base + "/health", "dgx01", KEY, deadline_s=10, signed=False)
        assert r.status in (200, 503) and json.loads(r.body)["node"] == "dgx01"
        r = await agentclient.ask_async(s, a.url, "dgx01", KEY, "POST", deadline_s=10, body=b"{}",
                                        headers={"Content-Type": "application/json"})
        assert r.status == 200 and a.runs == 1
        with pytest.raises(agentclient.Unproven):
            await agentclient.ask_async(s, base + "/health", "dgx01", "not-the-key-0123456789", deadline_s=10,
                                        signed=False)

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
    a = await agent_factory(token=KEY)
    base = a.url.rsplit("/", 2)[0]
    for path in ("/v1/handover", "/v1/gpu-reset", "/v1/bundle"):
        for coding in ("br", "zstd", "xz", "gzip, br"):
            ok = signed(base + path, b'{"gpu": 0}')
            status, body = await _post(base + path, {**ok, "Content-Encoding": coding}, b'{"gpu": 0}')
            assert status == 415, (path, coding, body)
            out = json.loads(body)
            assert repr(coding) in out["error"] and "gzip, deflate, identity" in out["error"], out
        bad = signed(base + path, b'{"gpu": 0}', key="wrong-key-0123456789")
        status, _ = await _post(base + path, bad, b'{"gpu": 0}')
        assert status == 401
    assert a.runs == 0


async def test_a_gzip_body_is_decoded_on_the_agent(agent_factory: Any) -> None:
    a = await agent_factory(token=KEY)
    url = a.url.rsplit("/", 2)[0] + "/v1/gpu-reset"
    # read and judged: a GPU index out of range (nothing is reset); the signature covers the decoded body
    plain = b'{"gpu": 99, "reason": "test"}'
    status, body = await _post(url, signed(url, plain, **{"Content-Encoding": "gzip"}), gzip.compress(plain))
    assert status == 400 and "expected" in json.loads(body)["error"], body
    status, body = await _post(url, signed(url, b'{"gpu": 0}', **{"Content-Encoding": "gzip"}), b'{"gpu": 0}')
    assert status == 400 and "content-encoding: gzip" in json.loads(body)["error"], body  # says gzip, is not
    ok = signed(url, b" " * (1024 * 1024), **{"Content-Encoding": "gzip"})
    status, body = await _post(url, ok, gzip.compress(b" " * (1024 * 1024)))
    assert status == 413 and "once decoded" in json.loads(body)["error"], body


async def test_a_gpu_reset_body_too_large_or_too_slow_is_a_json_error(agent_factory: Any,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Past client_max_size as sent it was aiohttp's plain-text 413; a body that never finished
    held the handler with no end (a client leaving mid-upload: a traceback in the log)."""
    import asyncio
    from podhealth.agent import gpureset
    monkeypatch.setattr(gpureset, "BODY_TIMEOUT_S", 0.5)
    a = await agent_factory(token=KEY)
    url = a.url.rsplit("/", 2)[0] + "/v1/gpu-reset"
    status, body = await _post(url, signed(url, b" " * (2 * 1024 * 1024)), b" " * (2 * 1024 * 1024))
    assert status == 413 and "exceeds" in json.loads(body)["error"], body
    reader, writer = await asyncio.open_connection("127.0.0.1", a.agent.port)
    try:
        head = "".join(f"{k}: {v}\r\n" for k, v in signed(url, b"{" + b" " * 99).items()).encode()
        writer.write(b"POST /v1/gpu-reset HTTP/1.1\r\nHost: 127.0.0.1\r\n" + head + b"Content-Length: 100\r\n\r\n{")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5s" in answer, answer
