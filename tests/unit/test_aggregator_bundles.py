"""Evidence bundles on the aggregator: fetched from the node's agent after a fence (with the
agent token), stored beside the database with a row, the oldest beyond bundles.keep deleted;
failures are an audit line and never disturb the fence; reading them needs the admin token
(or this host when none is set); `podhealth fleet bundle` downloads and checks the sha256."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import io
import os
import subprocess

import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from podhealth import nodeproof
from podhealth.agent.bundle import Part, pack
from podhealth.aggregator import bundles
from podhealth.config_aggregator import AggAuthConfig, BundlesConfig, NodeEntry
from podhealth.aggregator.model import FenceMode
from tests.harness.agg import MemFencer, config, running
from tests.harness.fakeagent import proving_middleware
from tests.harness.proc import free_port
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = pytest.mark.timeout(90)
ADMIN = "admin-token-0123456789"
AGENT = "agent-token-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}


class BundleAgent:
    """An agent's /health (failing) and /v1/bundle (a real pack() archive, or what the test says)."""

    def __init__(self, node: str, key: str = AGENT) -> None:
        self.node = node
        self.key = key  # "" = an impostor on the port: no key to check requests or prove answers with
        self.calls: list[str] = []
        self.answer: tuple[int, bytes] | None = None
        self.delay = 0.0

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response(fail_report(self.node, time.time()), status=503)

    async def bundle(self, request: web.Request) -> web.Response:
        problem = nodeproof.request_problem(AGENT, self.node, request.method, request.raw_path, request.headers,
                                            await request.read(), time.time())
        self.calls.append(request.headers.get("Authorization", "") or problem or "signed")
        await asyncio.sleep(self.delay)
        if problem and self.key:
            return web.json_response({"error": problem}, status=401)
        if self.answer is not None:
            return web.Response(status=self.answer[0], body=self.answer[1])
        blob, _ = pack([Part("health.json", b'{"node": "%s"}' % self.node.encode())],
                       {"node": self.node, "created": time.time()})
        return web.Response(body=blob, content_type="application/gzip")

    async def serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application(middlewares=[proving_middleware(lambda: self.key, self.node)])
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/bundle", self.bundle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"


def cfg(tmp_path: Path, url: str, admin: str = ADMIN, **kw: Any) -> Any:
    nodes = (NodeEntry(name="dgx01", agent_url=url, partition="batch"),
             *(NodeEntry(name=f"dgx{i:02d}", partition="batch") for i in range(2, 21)))
    c = config(tmp_path, auth=AggAuthConfig(admin_token=admin, agent_token=AGENT), pull_interval=0.2, **kw)
    return dataclasses.replace(c, nodes=nodes)


def audit(agg: Any, node: str) -> list[dict[str, Any]]:
    return [a for a in agg.store.audit_tail(500) if a["node"] == node]


async def test_a_fence_fetches_stores_and_serves_the_bundle(tmp_path: Path) -> None:
    agent = BundleAgent("dgx01")
    runner, agent_url = await agent.serve()
    fencer = MemFencer()
    try:
        async with running(cfg(tmp_path, agent_url), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
            await until(lambda: agg.store.bundles_of("dgx01"))
            assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCED and agent.calls == ["signed"]
            [row] = agg.store.bundles_of("dgx01")
            fence_id = next(a.id for a in agg.store.actions_of("dgx01") if a.kind == "fence")
            path = tmp_path / "bundles" / "dgx01" / f"{fence_id}.tar.gz"
            assert row["fence_id"] == fence_id and row["path"] == str(path) and path.is_file()
            blob = path.read_bytes()
            assert row["size"] == len(blob) and row["sha256"] == hashlib.sha256(blob).hexdigest()
            await until(lambda: any(a["what"] == "bundle stored" for a in audit(agg, "dgx01")))  # right after the row
            # reads need the admin token
            assert (await s.get(f"{url}/api/v1/nodes/dgx01/bundles")).status == 401
            assert (await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{row['id']}")).status == 401
            assert (await s.get(f"{url}/api/v1/nodes/dgx01/bundles",
                                headers={"Authorization": "Bearer nope"})).status == 401
            listing = await (await s.get(f"{url}/api/v1/nodes/dgx01/bundles", headers=H)).json()
            assert [b["id"] for b in listing["bundles"]] == [row["id"]] and "path" not in listing["bundles"][0]
            r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{row['id']}", headers=H)
            assert r.status == 200 and await r.read() == blob
            assert r.headers["X-Podhealth-Sha256"] == row["sha256"]
            assert "attachment" in r.headers["Content-Disposition"]
            assert (await s.get(f"{url}/api/v1/nodes/dgx02/bundles/{row['id']}", headers=H)).status == 404
            assert (await s.get(f"{url}/api/v1/nodes/dgx01/bundles/x", headers=H)).status == 400
            assert (await s.get(f"{url}/api/v1/nodes/dgx99/bundles", headers=H)).status == 404
            # the CLI downloads it and checks its sha256
            out = tmp_path / "rma.tar.gz"
            cli = [sys.executable, "-m", "podhealth", "fleet", "--url", url, "--token", ADMIN, "bundle", "dgx01"]
            p = await asyncio.to_thread(subprocess.run, [*cli, "-o", str(out)], capture_output=True, text=True,
                                        timeout=60)
            assert p.returncode == 0, p.stderr
            assert out.read_bytes() == blob and row["sha256"] in p.stderr
            p = await asyncio.to_thread(subprocess.run, [*cli, "--list"], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and row["sha256"] in p.stdout
            p = await asyncio.to_thread(subprocess.run, [*cli, "--id", "999"], capture_output=True, text=True,
                                        timeout=60)
            assert p.returncode == 1 and "no bundle 999" in p.stderr
            path.unlink()  # a file lost on disk: said so, not a 500
            assert (await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{row['id']}", headers=H)).status == 410
    finally:
        await runner.cleanup()


async def test_only_the_newest_bundles_are_kept(tmp_path: Path) -> None:
    agent = BundleAgent("dgx01")
    runner, agent_url = await agent.serve()
    try:
        c = cfg(tmp_path, agent_url, bundles=BundlesConfig(keep=2))
        async with running(c, [MemFencer()]) as (agg, _):
            await until(lambda: agg.store.bundles_of("dgx01"))  # the fence's own
            for fence_id in (901, 902, 903):
                assert await bundles.fetch(agg.evidence, agg.context(), "dgx01", fence_id) is not None
            rows = agg.store.bundles_of("dgx01")
            assert [r["fence_id"] for r in rows] == [903, 902]
            files = sorted(p.name for p in (tmp_path / "bundles" / "dgx01").iterdir())
            assert files == ["902.tar.gz", "903.tar.gz"]
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("answer, why", [
    ((500, b'{"error": "boom"}'), "HTTP 500"),
    ((200, b"not a tarball at all"), "not a tar.gz"),
    ((200, b"\x1f\x8b" + b"x" * 1000), "not a valid tar.gz"),
    ((200, b"\x1f\x8b" + b"x" * 3000), "exceeds bundles.max_bytes"),
])
async def test_a_failed_fetch_is_an_audit_note_and_the_fence_stands(tmp_path: Path, answer: tuple[int, bytes],
                                                                   why: str) -> None:
    agent = BundleAgent("dgx01")
    agent.answer = answer
    runner, agent_url = await agent.serve()
    try:
        c = cfg(tmp_path, agent_url, bundles=BundlesConfig(max_bytes=2048))
        async with running(c, [MemFencer()]) as (agg, _):
            await until(lambda: any(a["what"] == "bundle failed" for a in audit(agg, "dgx01")))
            note = next(a for a in audit(agg, "dgx01") if a["what"] == "bundle failed")
            assert why in note["output"] and not note["ok"]
            assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCED
            # a row that says why there is no evidence for this fence, and no file
            [row] = agg.store.bundles_of("dgx01")
            assert why in row["error"] and row["path"] == "" and row["size"] == 0
            assert not (tmp_path / "bundles" / "dgx01").exists() or not any((tmp_path / "bundles" / "dgx01").iterdir())
    finally:
        await runner.cleanup()


async def test_an_impostor_gets_no_credential_and_its_bundle_is_not_stored(tmp_path: Path) -> None:
    """The agent token used to go, as a bearer token, to whatever listened on the agent's port."""
    agent = BundleAgent("dgx01")
    runner, agent_url = await agent.serve()
    try:
        async with running(cfg(tmp_path, agent_url), [MemFencer()]) as (agg, _):
            await until(lambda: agg.store.bundles_of("dgx01"))  # fenced, its bundle fetched from the agent
            agent.key = ""  # the agent is gone; something else answers on its port
            assert await bundles.fetch(agg.evidence, agg.context(), "dgx01", 999) is None
            await until(lambda: any(a["what"] == "bundle failed" for a in audit(agg, "dgx01")))
            note = next(a for a in audit(agg, "dgx01") if a["what"] == "bundle failed")
            assert "not this node's agent" in note["output"]
            # the fence's own bundle stays the one stored; the impostor's is a row that says why, no file
            newest, stored = agg.store.bundles_of("dgx01")
            assert stored["error"] == "" and "not this node's agent" in newest["error"] and newest["path"] == ""
            # what reached it proves the key without revealing it: a signature, no bearer token
            assert agent.calls == ["signed", "signed"]
    finally:
        await runner.cleanup()


async def test_a_slow_agent_times_out_without_holding_up_fencing(tmp_path: Path) -> None:
    agent = BundleAgent("dgx01")
    agent.delay = 5.0  # past bundles.timeout
    runner, agent_url = await agent.serve()
    fencer = MemFencer()
    try:
        c = cfg(tmp_path, agent_url, bundles=BundlesConfig(timeout=3.0))
        async with running(c, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
            await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED)
            await until(lambda: agent.calls)
            await s.post(f"{url}/v1/reports", json=fail_report("dgx02", time.time()))
            await until(lambda: "dgx02" in fencer.fenced)  # decide and act go on while the fetch waits
            assert not any(a["what"].startswith("bundle") for a in audit(agg, "dgx01"))
            await until(lambda: any(a["what"] == "bundle failed" for a in audit(agg, "dgx01")))
            assert "no complete answer within 3s" in next(a for a in audit(agg, "dgx01")
                                                          if a["what"] == "bundle failed")["output"]
    finally:
        await runner.cleanup()


async def test_without_an_admin_token_bundles_are_readable_from_this_host_only(tmp_path: Path) -> None:
    async with running(config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.cfg.auth.admin_token == ""
        r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles")
        assert r.status == 200 and (await r.json())["bundles"] == []
        # a name that is not this host (DNS rebinding, a proxy forwarding from elsewhere): refused,
        # here already by the loopback bind's host guard (webguard.host_guard: 421) ...
        r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles", headers={"Host": "agg.example:9420"})
        assert r.status == 421 and "loopback" in (await r.json())["error"]
    # ... and by the bundle reader itself where that name is allowed (a local proxy's): the
    # evidence wants the admin token or a caller on this host naming it
    cfg = config(tmp_path / "proxy", allowed_hosts=("agg.example",))
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles", headers={"Host": "agg.example:9420"})
        assert r.status == 403 and "only from this host" in (await r.json())["error"]


async def test_a_bundle_id_is_ascii_digits_within_sqlite_integer(tmp_path: Path) -> None:
    # A 26-digit id overflowed the SQLite query (500); int() also took "1_0" and Unicode digits.
    async with running(config(tmp_path, auth=AggAuthConfig(admin_token=ADMIN)), [MemFencer()]) as (agg, url), \
            aiohttp.ClientSession() as s:
        for bid in ("9" * 26, str(2**63), "1_0", "%D9%A1", "-1", "+1"):
            r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{bid}", headers=H)
            assert r.status == 400, bid
            assert (await r.json())["error"] == "a bundle id is an integer"
        r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{2**63 - 1}", headers=H)
        assert r.status == 404  # the largest id is read, and there is none


async def test_a_dry_run_fetches_no_bundle(tmp_path: Path) -> None:
    agent = BundleAgent("dgx01")
    runner, agent_url = await agent.serve()
    try:
        async with running(cfg(tmp_path, agent_url, dry_run=True), [MemFencer()]) as (agg, _):
            await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED)  # by the dry-run fencer
            runs = agg.metrics.decisions._value.get()
            await until(lambda: agg.metrics.decisions._value.get() > runs + 5)
            assert agent.calls == [] and agg.store.bundles_of("dgx01") == []
    finally:
        await runner.cleanup()


# ---- whole or refused ----------------------------------------------------------------------------

def big_bundle(size: int = 470_000) -> bytes:
    """A real pack() archive of several hundred KB (random bytes: gzip cannot shrink them)."""
    blob, _ = pack([Part("dmesg.txt", os.urandom(size)), Part("health.json", b'{"node": "dgx01"}')],
                   {"node": "dgx01", "created": time.time()})
    return blob


class ChunkedAgent(BundleAgent):
    """Sends the bundle in pieces, as a real agent's large answer arrives: several reads. `cut`
    ends the body there (the connection closes early); `sha` is the X-Podhealth-Sha256 it claims."""

    def __init__(self, node: str, blob: bytes, cut: int | None = None, sha: str | None = None) -> None:
        super().__init__(node)
        self.blob, self.cut = blob, cut
        self.sha = sha if sha is not None else hashlib.sha256(blob).hexdigest()

    async def bundle(self, request: web.Request) -> web.StreamResponse:
        self.calls.append(request.headers.get("Authorization", ""))
        # proven as the real agent proves its answer (over the whole body it means to send)
        proof = nodeproof.prove(self.key, self.node, request.method, request.raw_path,
                                nodeproof.nonce_of(request.headers), 200, self.blob, time.time())
        resp = web.StreamResponse(headers={"Content-Type": "application/gzip", "X-Podhealth-Sha256": self.sha,
                                           **proof})
        resp.content_length = len(self.blob)
        await resp.prepare(request)
        end = len(self.blob) if self.cut is None else self.cut
        for i in range(0, end, 32 * 1024):
            await resp.write(self.blob[i:min(end, i + 32 * 1024)])
            await asyncio.sleep(0.005)  # a sender's pace: each piece is its own read on the other side
        if self.cut is not None:
            assert request.transport is not None
            request.transport.close()  # the body ends early
            return resp
        await resp.write_eof()
        return resp


async def test_a_bundle_of_several_hundred_kb_is_stored_whole(tmp_path: Path) -> None:
    blob = big_bundle()
    assert len(blob) > 400_000
    agent = ChunkedAgent("dgx01", blob)
    runner, agent_url = await agent.serve()
    try:
        async with running(cfg(tmp_path, agent_url), [MemFencer()]) as (agg, _):
            await until(lambda: any(a["what"].startswith("bundle") for a in audit(agg, "dgx01")))
            [row] = agg.store.bundles_of("dgx01")
            assert row["error"] == "", row
            assert row["size"] == len(blob) and row["sha256"] == hashlib.sha256(blob).hexdigest()
            assert Path(row["path"]).read_bytes() == blob
    finally:
        await runner.cleanup()


@pytest.mark.parametrize("case, why", [
    ("cut", "incomplete"),
    ("sha", "is not the agent's"),
    ("manifest", "does not match manifest.json"),
])
async def test_a_bundle_that_is_not_whole_or_not_the_agent_s_is_refused_and_said_so(
        tmp_path: Path, case: str, why: str) -> None:
    blob = big_bundle()
    if case == "manifest":  # a part that is not what the agent's manifest says
        blob = _with_part_replaced(blob, "health.json", b'{"node": "dgx99"}')
    agent = ChunkedAgent("dgx01", blob, cut=103_125 if case == "cut" else None,
                         sha="0" * 64 if case == "sha" else None)
    runner, agent_url = await agent.serve()
    try:
        async with running(cfg(tmp_path, agent_url), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
            await until(lambda: any(a["what"].startswith("bundle") for a in audit(agg, "dgx01")))
            assert not any(a["what"] == "bundle stored" for a in audit(agg, "dgx01"))
            [row] = agg.store.bundles_of("dgx01")
            assert why in row["error"] and row["path"] == "" and row["sha256"] == "", row
            assert not (tmp_path / "bundles" / "dgx01").exists() or not any((tmp_path / "bundles" / "dgx01").iterdir())
            # the API lists the reason and refuses the download with it
            listing = await (await s.get(f"{url}/api/v1/nodes/dgx01/bundles", headers=H)).json()
            assert why in listing["bundles"][0]["error"]
            r = await s.get(f"{url}/api/v1/nodes/dgx01/bundles/{row['id']}", headers=H)
            assert r.status == 409 and why in (await r.json())["error"]
            # `fleet bundle` says why, and fails
            cli = [sys.executable, "-m", "podhealth", "fleet", "--url", url, "--token", ADMIN, "bundle", "dgx01"]
            p = await asyncio.to_thread(subprocess.run, [*cli, "-o", str(tmp_path / "out.tar.gz")],
                                        capture_output=True, text=True, timeout=60)
            assert p.returncode != 0 and why in p.stderr and "not stored" in p.stderr, (p.returncode, p.stderr)
            assert not (tmp_path / "out.tar.gz").exists()
            p = await asyncio.to_thread(subprocess.run, [*cli, "--list"], capture_output=True, text=True, timeout=60)
            assert p.returncode == 0 and "NOT STORED" in p.stdout and why in p.stdout
    finally:
        await runner.cleanup()


def _with_part_replaced(blob: bytes, name: str, data: bytes) -> bytes:
    """The same archive (manifest included) with one part's bytes changed."""
    src = tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz")
    out = io.BytesIO()
    with src, tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as dst:
        for m in src.getmembers():
            f = src.extractfile(m)
            body = data if m.name == name else (f.read() if f is not None else b"")
            info = tarfile.TarInfo(m.name)
            info.size = len(body)
            dst.addfile(info, io.BytesIO(body))
    return out.getvalue()


def test_check_is_pure_and_names_what_is_wrong() -> None:
    blob, _ = pack([Part("a.txt", b"hello")], {"node": "dgx01", "created": 1.0})
    sha = hashlib.sha256(blob).hexdigest()
    ok = bundles.Received(blob, len(blob), sha)
    assert bundles.check(ok, 1 << 20) == ""
    assert bundles.check(bundles.Received(blob, None, ""), 1 << 20) == ""  # an agent without the headers
    assert "received 10 of" in bundles.check(bundles.Received(blob[:10], len(blob), sha), 1 << 20)
    assert "is not the agent's" in bundles.check(bundles.Received(blob[:10], None, sha), 1 << 20)
    assert "not a valid tar.gz" in bundles.check(bundles.Received(blob[:-20], None, ""), 1 << 20)
    assert "does not match" in bundles.check(
        bundles.Received(_with_part_replaced(blob, "a.txt", b"HELLO"), None, ""), 1 << 20)
    no_manifest = io.BytesIO()
    with tarfile.open(fileobj=no_manifest, mode="w:gz") as t:
        info = tarfile.TarInfo("a.txt")
        info.size = 5
        t.addfile(info, io.BytesIO(b"hello"))
    assert "no manifest.json" in bundles.check(bundles.Received(no_manifest.getvalue(), None, ""), 1 << 20)
