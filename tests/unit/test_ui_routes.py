"""The web UI's routes (aggregator/ui.py) and static assets, against a real in-process aggregator."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict

from podhealth.aggregator import ui
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)

STATIC = Path(ui.__file__).parent / "static"
ADMIN = "admin-secret"


def report(node: str, t: float, failing: bool) -> dict[str, Any]:
    gpu3 = ({"check": "xid", "entity": "gpu3", "status": "FAIL", "action": "RESET_GPU", "since": t - 1,
             "evidence": {"xid": "79", "text": "<img src=x onerror=alert(1)>"}, "summary": "GPU fell off the bus"}
            if failing else {"check": "xid", "entity": "gpu3", "status": "OK", "action": "NONE"})
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t,
            "results": [gpu3, {"check": "nfs_mount", "entity": "/home", "status": "OK", "action": "NONE"}]}


async def get(s: aiohttp.ClientSession, url: str, **kw: Any) -> tuple[int, CIMultiDict[str], bytes]:
    async with s.get(url, allow_redirects=False, **kw) as r:
        return r.status, CIMultiDict(r.headers), await r.read()


async def post(s: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    async with s.post(url, json=body, headers=headers or {}) as r:
        return r.status, await r.json(content_type=None)


def cfg(tmp_path: Path, **kw: Any) -> Any:
    return config(tmp_path, nodes=4, auth=AggAuthConfig(admin_token=ADMIN), **kw)


# ---- pages and assets ------------------------------------------------------------------------------


async def test_pages_assets_and_headers(tmp_path: Path) -> None:
    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        status, headers, _ = await get(s, url + "/")
        assert (status, headers["Location"]) == (302, "/ui")
        status, headers, body = await get(s, url + "/ui")
        assert status == 200 and headers["Content-Type"].startswith("text/html")
        assert "default-src 'self'" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert b"/ui/static/fleet.js" in body
        status, headers, body = await get(s, url + "/ui/node/dgx02")
        assert status == 200 and b"/ui/static/node.js" in body and "Content-Security-Policy" in headers
        status, _, body = await get(s, url + "/ui/node/bad;name")
        assert status == 400 and b"node name" in body
        status, headers, body = await get(s, url + "/ui/static/fleet.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert body == (STATIC / "fleet.js").read_bytes()
        status, _, _ = await get(s, url + "/ui/static/fleet.js", headers={"If-None-Match": headers["ETag"]})
        assert status == 304
        for bad in ("/ui/static/__init__.py", "/ui/static/..%2Fserver.py", "/ui/static/nope.js"):
            status, _, _ = await get(s, url + bad)
            assert status == 404, bad


def test_assets_are_self_contained_and_csp_clean() -> None:
    """Offline and CSP-proof: no remote URLs, no inline script/style/handlers, no innerHTML with data."""
    files = {p.name: p.read_text() for p in STATIC.iterdir() if p.suffix in (".html", ".js", ".css")}
    assert {"fleet.html", "node.html", "common.js", "fleet.js", "node.js", "podhealth.css"} <= set(files)
    assert set(ui.load_assets()) == set(files)  # what the server ships is exactly what is in the folder
    for name, text in files.items():
        assert not re.search(r"(?:src|href|url\()\s*=?\s*[\"']?(?:https?:)?//", text), f"{name} loads something remote"
        assert "innerHTML" not in text and "outerHTML" not in text and "insertAdjacentHTML" not in text, name
        assert "eval(" not in text and "new Function" not in text, name
    for name in ("fleet.html", "node.html"):
        html = files[name]
        assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), f"inline script in {name}"
        assert not re.search(r"\sstyle=|<style", html), f"inline style in {name}"
        assert not re.search(r"\son[a-z]+=", html), f"inline event handler in {name}"
        for ref in re.findall(r"(?:src|href)=\"(/ui/static/[^\"]+)\"", html):
            assert ref.rsplit("/", 1)[1] in files, f"{name} references a missing asset {ref}"
    for name in ("fleet.js", "node.js"):
        for ref in re.findall(r"from \"(/ui/static/[^\"]+)\"", files[name]):
            assert ref.rsplit("/", 1)[1] in files, f"{name} imports a missing module {ref}"


def test_mutations_send_the_token_only_in_a_header() -> None:
    js = (STATIC / "common.js").read_text()
    assert 'credentials: "omit"' in js and "Authorization" in js and "sessionStorage" in js
    assert "document.cookie" not in js and "localStorage" not in js


# ---- the fleet view and the stream ---------------------------------------------------------------


async def test_fleet_view_tiles_follow_reports(tmp_path: Path) -> None:
    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        for i in (1, 2, 3, 4):
            assert (await post(s, url + "/v1/reports", report(f"dgx{i:02d}", now, False)))[0] == 200
        status, _, body = await get(s, url + "/ui/api/fleet")
        view = json.loads(body)
        assert status == 200 and {t["name"]: t["state"] for t in view["nodes"]} == {
            "dgx01": "OK", "dgx02": "OK", "dgx03": "OK", "dgx04": "OK"}
        assert view["summary"]["counts"]["OK"] == 4 and "time" not in view["summary"]
        assert view["summary"]["fence_budget"] == {"used": 0, "limit": 10}
        assert (await post(s, url + "/v1/reports", report("dgx02", now + 1, True)))[0] == 200
        _, _, body = await get(s, url + "/ui/api/fleet?node=dgx02")
        (tile,) = json.loads(body)["nodes"]
        assert tile["status"] == "FAIL" and ["xid", "gpu3", "FAIL"] in tile["problems"]
        status, _, _ = await get(s, url + "/ui/api/fleet?node=../x")
        assert status == 400


async def read_event(resp: aiohttp.ClientResponse, timeout: float = 10.0) -> tuple[str, Any]:
    """Next `event:`/`data:` pair from an SSE stream (comments and retry lines skipped)."""
    name = ""
    async with asyncio.timeout(timeout):
        while True:
            line = (await resp.content.readline()).decode().rstrip("\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                return name, json.loads(line[6:])


async def test_stream_sends_snapshot_then_only_changes(tmp_path: Path) -> None:
    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        for i in (1, 2, 3, 4):
            await post(s, url + "/v1/reports", report(f"dgx{i:02d}", now, False))
        async with s.get(url + "/ui/events") as all_, s.get(url + "/ui/events?node=dgx03") as one:
            assert all_.headers["Content-Type"] == "text/event-stream"
            assert "default-src 'self'" in all_.headers["Content-Security-Policy"]
            kind, snap = await read_event(all_)
            assert kind == "snapshot" and len(snap["nodes"]) == 4
            kind, snap1 = await read_event(one)
            assert kind == "snapshot" and [t["name"] for t in snap1["nodes"]] == ["dgx03"]
            await post(s, url + "/v1/reports", report("dgx03", now + 1, True))
            kind, delta = await read_event(all_)
            while not delta["upsert"]:  # a summary-only delta (e.g. the rate window) may come first
                kind, delta = await read_event(all_)
            assert kind == "delta" and [t["name"] for t in delta["upsert"]] == ["dgx03"]
            assert delta["upsert"][0]["status"] == "FAIL" and delta["remove"] == []
            kind, delta1 = await read_event(one)
            while not delta1["upsert"]:
                kind, delta1 = await read_event(one)
            assert [t["name"] for t in delta1["upsert"]] == ["dgx03"]
        assert agg.mem is not None


async def test_open_stream_does_not_hold_up_shutdown(tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as s:
        t0 = 0.0
        async with running(cfg(tmp_path), [MemFencer()]) as (agg, url):
            resp = await s.get(url + "/ui/events")
            assert (await read_event(resp))[0] == "snapshot"
            t0 = time.monotonic()
        assert time.monotonic() - t0 < 10  # aiohttp would otherwise wait out its shutdown timeout
        resp.close()


def test_feed_rebuilds_only_on_change(tmp_path: Path) -> None:
    class FakeAgg:
        def __init__(self) -> None:
            from podhealth.aggregator.state import Memory
            self.mem = Memory()
            self.mem.ensure_node("dgx01", 1.0)
            self.calls = 0

        def fleet_json(self) -> dict[str, Any]:
            self.calls += 1
            return {"time": self.calls, "counts": {}, "last_decision": {"notes": [{"kind": "cap_reached"}]}}

    clock = [0.0]
    agg = FakeAgg()
    feed = ui.Feed(agg, clock=lambda: clock[0])  # type: ignore[arg-type]
    g1, tiles, summary = feed.current()
    assert set(tiles) == {"dgx01"} and summary == {"counts": {}, "notes": {"cap_reached": 1}}
    assert feed.current()[0] == g1 and agg.calls == 1  # nothing changed, nothing recomputed
    clock[0] += ui.SUMMARY_EVERY
    assert feed.current()[0] == g1 and agg.calls == 2  # recomputed, but equal: same generation
    agg.mem.ensure_node("dgx02", 2.0)
    g2, tiles, _ = feed.current()
    assert g2 == g1 + 1 and set(tiles) == {"dgx01", "dgx02"}


# ---- CSRF guard ----------------------------------------------------------------------------------


async def test_cross_origin_mutations_are_refused_and_change_nothing(tmp_path: Path) -> None:
    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem is not None and agg.store is not None
        before = agg.store.counts()
        auth = {"Authorization": f"Bearer {ADMIN}"}
        for headers in ({"Origin": "http://evil.example"}, {"Origin": "null"}, {"Sec-Fetch-Site": "cross-site"}):
            status, body = await post(s, url + "/api/v1/nodes/dgx01/fence", {"reason": "x"}, {**auth, **headers})
            assert status == 403 and "cross-origin" in body["error"], headers
            status, _ = await post(s, url + "/v1/reports", report("dgx09", time.time(), True), headers)
            assert status == 403
        assert agg.store.counts() == before and "dgx09" not in agg.mem.nodes
        assert agg.mem.nodes["dgx01"].fence.value == "none"
        # The same request from the aggregator's own origin reaches the handler (which wants the token).
        host = url.removeprefix("http://")
        status, _ = await post(s, url + "/api/v1/nodes/dgx01/fence", {"reason": "x"}, {"Origin": f"http://{host}"})
        assert status == 401
        status, body = await post(s, url + "/api/v1/nodes/dgx01/fence", {"reason": "disk smoke"},
                                  {**auth, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"})
        assert status == 200 and agg.mem.nodes["dgx01"].fence.value == "fenced", body
