"""Request bodies the aggregator cannot or need not read whole: a Content-Encoding that lies is a
400, a chunked admin body is read like any other, and a client that aborts its upload costs one
structured log line (never aiohttp's plain-text traceback outside the JSON log)."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import zlib
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from podhealth.aggregator import server
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)
AUTH = AggAuthConfig(node_tokens={"dgx01": "n1tok"}, admin_token="atok")


async def exchange(url: str, request: bytes, answer: bool = True) -> bytes:
    """Send raw bytes (what aiohttp's client would not let a test send) and read the answer."""
    host, port = url.split("//")[1].split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        if not answer:
            return b""
        return await asyncio.wait_for(reader.read(65536), 10)
    finally:
        writer.close()


def head(path: str, token: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {token}\r\nConnection: close\r\n{extra}\r\n").encode()


def status_and_body(answer: bytes) -> tuple[int, object]:
    top, _, body = answer.partition(b"\r\n\r\n")
    return int(top.split(b" ")[1]), json.loads(body)


async def test_a_body_that_is_not_what_its_content_encoding_says_is_a_400(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url):
        before = agg.store.counts() if agg.store else None
        body = b"not gzip at all"
        answer = await exchange(url, head("/v1/reports", "n1tok",
                                          f"Content-Encoding: gzip\r\nContent-Length: {len(body)}\r\n") + body)
        status, out = status_and_body(answer)
        assert status == 400 and "content-encoding: gzip" in str(out)
        assert agg.store is not None and agg.store.counts() == before
        # and the server still answers on a new connection
        ok = json.dumps({"node": "dgx01", "time": 1.0, "results": []}).encode()
        status, _ = status_and_body(await exchange(url, head("/v1/reports", "n1tok", f"Content-Length: {len(ok)}\r\n")
                                                   + ok))
        assert status == 200
    assert not [r for r in caplog.records if r.exc_info], "no traceback logged"


async def test_a_chunked_admin_body_is_read(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url):
        body = json.dumps({"reason": "bad DIMM, ticket 42", "who": "alice"}).encode()
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in (body[:7], body[7:])) + b"0\r\n\r\n"
        answer = await exchange(url, head("/api/v1/nodes/dgx01/fence", "atok", "Transfer-Encoding: chunked\r\n")
                                + chunks)
        status, out = status_and_body(answer)
        assert status == 200 and isinstance(out, dict) and out["state"] == "done", out
        assert "dgx01" in fencer.fenced
        assert agg.store is not None
        audit = [a for a in agg.store.history("dgx01") if a.get("type") == "audit"]
        assert any(a["who"] == "operator:alice" and a["why"] == "bad DIMM, ticket 42" for a in audit)
        # chunked but empty: no body, so no reason, refused as before
        answer = await exchange(url, head("/api/v1/nodes/dgx02/fence", "atok", "Transfer-Encoding: chunked\r\n")
                                + b"0\r\n\r\n")
        assert status_and_body(answer)[0] == 400


async def test_an_aborted_upload_is_one_structured_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url):
        with capture_logs() as logs:
            await exchange(url, head("/v1/events", "n1tok", "Content-Length: 5000\r\n") + b'{"node": "dgx01", "ev',
                           answer=False)
            deadline = asyncio.get_running_loop().time() + 10
            while not any(e["event"].startswith("client closed") for e in logs):
                assert asyncio.get_running_loop().time() < deadline, logs
                await asyncio.sleep(0.01)
        line = next(e for e in logs if e["event"].startswith("client closed"))
        assert line["path"] == "/v1/events" and line["expected"] == 5000
        aborted = agg.metrics.ingest_requests.labels("events", "aborted")._value.get()  # type: ignore[attr-defined]
        assert aborted == 1
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("aiohttp") and r.levelno >= logging.ERROR]


async def test_a_body_that_trickles_in_past_the_timeout_is_a_408_and_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The idle timeout ends at the request head; a token holder trickling its body held the
    # connection and the handler for ever. Both ingest and admin bodies have a deadline.
    monkeypatch.setattr(server, "BODY_TIMEOUT", 0.5)
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url):
        before = agg.store.counts() if agg.store else None
        host, port = url.split("//")[1].split(":")
        for path, token in (("/v1/reports", "n1tok"), ("/api/v1/nodes/dgx01/fence", "atok")):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(head(path, token, "Content-Length: 1000\r\n") + b'{"node": "dgx01", ')
                await writer.drain()
                answer = await asyncio.wait_for(reader.read(), 10)  # read() to EOF: the server closed it
            finally:
                writer.close()
            status, out = status_and_body(answer)
            assert status == 408 and "did not arrive within 0.5s" in str(out), path
        assert agg.store is not None and agg.store.counts() == before


ENCODED_AUTH = AggAuthConfig(node_tokens={"dgx01": "n1tok"}, admin_token="atok", cluster_token="ctok")
REPORT = {"node": "dgx01", "time": 1.0, "results": []}


def _ingested(agg: Any, endpoint: str, result: str) -> float:
    return float(agg.metrics.ingest_requests.labels(endpoint, result)._value.get())


async def test_a_content_encoding_not_decoded_here_is_a_415_naming_those_that_are(tmp_path: Path) -> None:
    """br and zstd were a plain-text 400 from aiohttp's parser (or decoded, where their modules
    happened to be installed); xz and lists were passed on undecoded. Every one is now the JSON
    415 of every route that reads a body, before the body is read, and changes nothing."""
    async with running(config(tmp_path, auth=ENCODED_AUTH), [MemFencer()]) as (agg, url):
        before = agg.store.counts() if agg.store else None
        body = json.dumps(REPORT).encode()
        routes = (("/v1/reports", "n1tok"), ("/v1/events", "n1tok"), ("/v1/alertmanager", "ctok"),
                  ("/api/v1/nodes/dgx01/fence", "atok"))
        for coding in ("br", "zstd", "xz", "gzip, br", "compress", "BR"):
            for path, token in routes:
                answer = await exchange(url, head(path, token, f"Content-Encoding: {coding}\r\n"
                                                               f"Content-Length: {len(body)}\r\n") + body)
                status, out = status_and_body(answer)
                assert status == 415, (coding, path, answer[:300])
                assert isinstance(out, dict) and set(out) == {"error"}
                assert repr(coding) in out["error"] and "gzip, deflate, identity" in out["error"], out
        assert _ingested(agg, "reports", "unsupported_encoding") == 6
        assert _ingested(agg, "alertmanager", "unsupported_encoding") == 6
        assert agg.store is not None and agg.store.counts() == before
        # the caller is told before being believed: without its token it is a 401, not a 415
        answer = await exchange(url, head("/v1/reports", "wrong", f"Content-Encoding: br\r\n"
                                                                  f"Content-Length: {len(body)}\r\n") + body)
        assert status_and_body(answer)[0] == 401


async def test_gzip_and_deflate_bodies_are_decoded_here(tmp_path: Path) -> None:
    """What aiohttp decoded before (bodies now arrive as sent): gzip (also in members, and as
    x-gzip), deflate in the zlib format and bare, identity."""
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url):
        body = json.dumps(REPORT).encode()
        bare = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        variants = {"gzip": gzip.compress(body), "x-gzip": gzip.compress(body),
                    "GZip": gzip.compress(body[:9]) + gzip.compress(body[9:]),
                    "deflate": zlib.compress(body), " deflate ": bare.compress(body) + bare.flush(),
                    "identity": body}
        for coding, data in variants.items():
            answer = await exchange(url, head("/v1/reports", "n1tok", f"Content-Encoding: {coding}\r\n"
                                                                      f"Content-Length: {len(data)}\r\n") + data)
            status, out = status_and_body(answer)
            assert status == 200 and isinstance(out, dict) and "error" not in out, (coding, out)
        assert agg.mem.nodes["dgx01"].report_time > 0


async def test_a_body_that_inflates_past_the_limit_is_a_413(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH, max_body_bytes=64 * 1024), [MemFencer()]) as (agg, url):
        before = agg.store.counts() if agg.store else None
        bomb = gzip.compress(b" " * (16 * 1024 * 1024))  # 16 KB that inflate to 16 MB
        for coding, data in (("gzip", bomb), ("deflate", zlib.compress(b" " * (64 * 1024 + 1)))):
            answer = await exchange(url, head("/v1/reports", "n1tok", f"Content-Encoding: {coding}\r\n"
                                                                      f"Content-Length: {len(data)}\r\n") + data)
            status, out = status_and_body(answer)
            assert status == 413 and "exceeds 65536 bytes once decoded" in str(out), out
        truncated = gzip.compress(json.dumps(REPORT).encode())[:-9]
        answer = await exchange(url, head("/v1/reports", "n1tok", f"Content-Encoding: gzip\r\n"
                                                                  f"Content-Length: {len(truncated)}\r\n") + truncated)
        status, out = status_and_body(answer)
        assert status == 400 and "content-encoding: gzip" in str(out), out
        assert _ingested(agg, "reports", "too_large") == 2
        assert agg.store is not None and agg.store.counts() == before
