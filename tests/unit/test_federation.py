"""Issue 32: the read-only view over several aggregator sets, tested with two real loopback sets
(each its own aggregator and SQLite database), a set that never answers and one that redirects.

Each set sits behind a "proxy" (a middleware in front of its routes) that records the bearer
token of every API read and refuses any but its own set's: a tile that reads proves its token
arrived, and the records prove no other set's token ever did.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from podhealth import config as pconfig
from podhealth.aggregator import federation
from podhealth.config_aggregator import RuleConfig
from podhealth.config_federation import FederatedSet, FederationConfig
from tests.harness.agg import config, running
from tests.harness.proc import free_port

REPO = Path(__file__).resolve().parents[2]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def proxy(token: str, seen: list[str]) -> Any:
    @web.middleware
    async def mw(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith("/api/"):
            seen.append(request.headers.get("Authorization", ""))
            if request.headers.get("Authorization") != f"Bearer {token}":
                return web.json_response({"error": "this set's token required"}, status=401)
        return await handler(request)
    return mw


def report(node: str, status: str = "OK") -> dict[str, Any]:
    return {"node": node, "time": 1000.0, "results": [
        {"check": "xid", "entity": "gpu3", "status": status, "action": "REBOOT" if status == "FAIL" else "NONE",
         "since": 990.0, "summary": "XID 79" if status == "FAIL" else ""}]}


@contextlib.asynccontextmanager
async def black_hole() -> AsyncIterator[str]:
    """Accepts connections and never answers (a set whose host hangs)."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for w in held:
            w.close()
        server.close()
        await server.wait_closed()


@contextlib.asynccontextmanager
async def redirector(to: str, seen: list[str]) -> AsyncIterator[str]:
    """A "set" that sends every read elsewhere (a token following it would leave its set)."""
    async def go(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        raise web.HTTPFound(to + request.path_qs)

    app = web.Application()
    app.router.add_get("/{tail:.*}", go)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@dataclasses.dataclass
class Sets:
    a: str
    b: str
    hole: str
    redirect: str
    seen: dict[str, list[str]]


@contextlib.asynccontextmanager
async def two_sets(tmp_path: Path) -> AsyncIterator[Sets]:
    seen: dict[str, list[str]] = {"a": [], "b": [], "redirect": []}
    notify = (RuleConfig(do="notify"),)  # the FAIL stays a FAIL (a fence would race the reads)
    cfg_a = config(tmp_path / "a", nodes=3, rules=notify)
    cfg_b = config(tmp_path / "b", nodes=2, rules=notify)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    async with running(cfg_a, middlewares=[proxy("tok-a", seen["a"])]) as (agg_a, url_a), \
            running(cfg_b, middlewares=[proxy("tok-b", seen["b"])]) as (agg_b, url_b), \
            black_hole() as hole, redirector(url_a, seen["redirect"]) as redirect:
        assert agg_a.store.where != agg_b.store.where  # two databases, never one shared
        async with aiohttp.ClientSession() as http:
            for url, node, status in ((url_a, "dgx01", "OK"), (url_a, "dgx02", "FAIL"), (url_b, "dgx01", "OK")):
                async with http.post(url + "/v1/reports", json=report(node, status)) as r:
                    assert r.status == 200, await r.text()
            headers = {"Authorization": "Bearer tok-a"}
            async with http.get(url_a + "/api/v1/nodes?not_state=OK", headers=headers) as r:
                assert [n["name"] for n in (await r.json())["nodes"]] == ["dgx02", "dgx03"]
            seen["a"].clear()
        yield Sets(url_a, url_b, hole, redirect, seen)


def the_sets(s: Sets) -> list[federation.SetReader]:
    return [federation.SetReader(FederatedSet(name="pod-a", url=s.a), "tok-a"),
            federation.SetReader(FederatedSet(name="pod-b", url=s.b), "tok-b"),
            federation.SetReader(FederatedSet(name="hung", url=s.hole), "tok-hung"),
            federation.SetReader(FederatedSet(name="moved", url=s.redirect), "tok-moved")]


async def test_each_set_is_read_with_its_own_token_and_its_failures_stay_its_own(tmp_path: Path) -> None:
    async with two_sets(tmp_path) as s:
        readers = the_sets(s)
        try:
            a, b, hung, moved = await federation.read_all(readers, timeout=1.0)
        finally:
            for r in readers:
                await r.close()
        assert a.ok and a.nodes == 3 and a.counts["FAIL"] == 1 and a.counts["OK"] == 1
        assert [(p.node, p.state, p.checks) for p in a.problems] == [("dgx02", "FAIL", ("xid",)),
                                                                     ("dgx03", "UNKNOWN", ())]
        assert b.ok and b.nodes == 2 and b.counts["OK"] == 1
        assert not hung.ok and "no answer within 1 s" in hung.error
        assert not moved.ok and "not followed" in moved.error
        # No set ever saw another set's token: the redirect was not followed with tok-moved.
        assert set(s.seen["a"]) == {"Bearer tok-a"} and set(s.seen["b"]) == {"Bearer tok-b"}
        assert s.seen["redirect"] and set(s.seen["redirect"]) == {"Bearer tok-moved"}

        # Without its token a set refuses: the tile says so, the others are not affected.
        wrong = [federation.SetReader(FederatedSet(name="pod-a", url=s.a), "tok-b"),
                 federation.SetReader(FederatedSet(name="pod-b", url=s.b), "tok-b")]
        try:
            a2, b2 = await federation.read_all(wrong, timeout=5.0)
        finally:
            for r in wrong:
                await r.close()
        assert not a2.ok and "HTTP 401" in a2.error and b2.ok


async def test_the_ui_tiles_the_sets_and_never_shows_their_tokens(tmp_path: Path) -> None:
    async with two_sets(tmp_path) as s:
        fed = FederationConfig(sets=(FederatedSet(name="pod-a", url=s.a, token="tok-a"),
                                     FederatedSet(name="pod-b", url=s.b, token="tok-b"),
                                     FederatedSet(name="hung", url=s.hole)), timeout=1.0)
        (tmp_path / "view").mkdir()
        async with running(config(tmp_path / "view", nodes=1, federation=fed)) as (_, url), \
                aiohttp.ClientSession() as http:
            async with http.get(url + "/ui/api/federation") as r:
                assert r.status == 200
                text = await r.text()
            async with http.get(url + "/ui/federation") as r:
                assert r.status == 200 and "federation.js" in await r.text()
                assert "default-src 'self'" in r.headers["Content-Security-Policy"]
            async with http.get(url + "/ui/static/federation.js") as r:
                assert r.status == 200
        assert "tok-a" not in text and "tok-b" not in text
        view = json.loads(text)
        assert [(t["name"], t["ok"]) for t in view["sets"]] == [("pod-a", True), ("pod-b", True), ("hung", False)]
        assert view["sets"][0]["problems"][0]["node"] == "dgx02"
        assert set(s.seen["a"]) == {"Bearer tok-a"} and set(s.seen["b"]) == {"Bearer tok-b"}


async def test_fleet_federate_prints_every_set_and_sends_no_token_across(tmp_path: Path) -> None:
    async with two_sets(tmp_path) as s:
        (tmp_path / "tok-b").write_text("tok-b\n")
        cfg = tmp_path / "view.yml"
        cfg.write_text(f"""aggregator:
  federation:
    timeout: 1
    sets:
      - {{name: pod-a, url: "{s.a}", token: tok-a}}
      - {{name: pod-b, url: "{s.b}", token_file: "{tmp_path / 'tok-b'}"}}
""")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "podhealth", "fleet", "--config", str(cfg), "--token", "LOCAL-ADMIN",
            "--format", "json", "--federate", s.a, f"pod-b={s.b}", s.hole,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 2, err  # one set could not be read: "could not decide"
        view = json.loads(out)
        assert [(t["name"], t["ok"]) for t in view["sets"]] == [("pod-a", True), ("pod-b", True),
                                                                (s.hole.split("//")[1], False)]
        assert set(s.seen["a"]) == {"Bearer tok-a"} and set(s.seen["b"]) == {"Bearer tok-b"}

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "podhealth", "fleet", "--config", str(cfg), "--federate",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err
        lines = out.decode().splitlines()
        assert lines[0].startswith("pod-a") and "FAIL=1" in lines[0]
        assert lines[1].split() == ["dgx02", "FAIL", "xid"]


@pytest.mark.parametrize("entry, key", [
    ('{name: p, url: "http://10.0.0.1:9420", token: t}', "url"),  # a token in clear over the network
    ('{name: p, url: "https://user:pw@pod.example"}', "url"),
    ('{name: "p q", url: "https://pod.example"}', "name"),
    ('{name: p, url: "ftp://pod.example"}', "url"),
    ('{name: p, url: "http://127.0.0.1:1", ca_file: /ca.pem}', "ca_file"),
])
def test_a_bad_set_is_a_config_error_naming_its_key(entry: str, key: str) -> None:
    with pytest.raises(pconfig.ConfigError, match=rf"federation\.sets\[0\]\.{key}"):
        pconfig.loads(f"aggregator:\n  federation:\n    sets:\n      - {entry}\n", "agg.yml")


def test_a_set_answer_that_is_not_an_aggregators_is_refused() -> None:
    s = FederatedSet(name="p", url="https://p.example")
    fleet = {"nodes": 1, "counts": {"FAIL": 1}, "breaker": {"tripped": False}, "fence_budget": {"used": 0, "limit": 5}}
    ok = federation.parse_set(s, fleet, {"nodes": [{"name": "dgx01", "state": "FAIL", "checks": ["xid"]}]}, 0.1)
    assert ok.ok and ok.problems[0].node == "dgx01"
    with pytest.raises(federation.SetError, match="name"):
        federation.parse_set(s, fleet, {"nodes": [{"name": "<img src=x>", "state": "FAIL"}]}, 0.1)
    with pytest.raises(federation.SetError, match="counts"):
        federation.parse_set(s, {**fleet, "counts": {"FAIL": "many"}}, {"nodes": []}, 0.1)
    with pytest.raises(federation.SetError):
        federation.SetReader(FederatedSet(name="p", url="http://10.1.1.1:9420"), "tok")
