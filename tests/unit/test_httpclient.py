"""core/httpclient.py: the whole exchange has a deadline, against a loopback server that sends one
byte at a time (the trickling agent that kept the prolog running for 90 s); bodies are bounded;
and no module of podhealth opens HTTP any other way."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from podhealth import httpclient
from tests.conftest import REPO
from tests.harness.fakeagent import Impostor, Trickler

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("in_head", [False, True], ids=["body", "head"])
def test_a_trickling_server_ends_at_the_deadline(in_head: bool) -> None:
    # 100,000 bytes at 0.05 s each would take 80 minutes: only the deadline can end this.
    with Trickler(every=0.05, in_head=in_head) as srv:
        with pytest.raises(httpclient.Deadline):
            httpclient.exchange("GET", srv.url + "/health", deadline_s=0.5)


def test_lines_of_a_trickling_stream_end_at_the_deadline() -> None:
    with Trickler(every=0.05) as srv:
        with pytest.raises(httpclient.Deadline):
            httpclient.exchange("POST", srv.url + "/v1/handover", body=b"{}", deadline_s=0.5, on_line=lambda _l: None)


def test_a_whole_answer_arrives_with_its_headers() -> None:
    with Impostor({"status": "OK"}) as srv:
        r = httpclient.exchange("POST", srv.url + "/x?y=1", body=b"{}", deadline_s=5,
                                headers={"Content-Type": "application/json", "X-A": "b"})
    assert r.status == 200 and json.loads(r.body) == {"status": "OK"}
    assert r.header("Content-Type") == "application/json"
    assert srv.requests[0].startswith(b"POST /x?y=1 HTTP/1.1") and b"\r\nX-A: b\r\n" in srv.requests[0]
    assert srv.requests[0].endswith(b"\r\n\r\n{}")


def test_a_body_over_the_bound_is_refused() -> None:
    with Impostor({"pad": "x" * 5000}) as srv:
        with pytest.raises(httpclient.TooLarge):
            httpclient.exchange("GET", srv.url, deadline_s=5, max_bytes=1000)


def test_nothing_listening_is_an_exchange_error() -> None:
    with Impostor({}) as srv:
        url = srv.url
    with pytest.raises(httpclient.ExchangeError) as e:
        httpclient.exchange("GET", url, deadline_s=5)
    assert not isinstance(e.value, httpclient.Deadline)
    with pytest.raises(httpclient.BadUrl):
        httpclient.exchange("GET", "file:///etc/passwd", deadline_s=5)


async def test_the_async_face_has_the_same_deadline() -> None:
    with Trickler(every=0.05) as srv:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(httpclient.Deadline):
                await httpclient.exchange_async(s, "GET", srv.url + "/health", deadline_s=0.5)
    with Impostor({"status": "OK"}) as srv:
        async with aiohttp.ClientSession() as s:
            r = await httpclient.exchange_async(s, "GET", srv.url + "/health", deadline_s=5)
            assert r.status == 200 and json.loads(r.body) == {"status": "OK"}
            with pytest.raises(httpclient.TooLarge):
                await httpclient.exchange_async(s, "GET", srv.url, deadline_s=5, max_bytes=3)
    assert not asyncio.current_task().cancelled()  # type: ignore[union-attr]


def test_no_module_opens_http_another_way() -> None:
    """urlopen's timeout bounds each read, not the exchange: every client goes through httpclient."""
    offenders = []
    for folder in ("core", "agent", "aggregator", "checks", "collectors", "fencing", "sim"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in ("urlopen", "HTTPConnection", "HTTPSConnection"):
                    if Path(path).name != "httpclient.py":
                        offenders.append(f"{path.relative_to(REPO)}:{node.lineno} {node.attr}")
    assert offenders == []
