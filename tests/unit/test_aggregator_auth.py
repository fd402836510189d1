"""Closed by default: who may speak for which node, what config may fence, and what the breaker counts.

Each test here is an attack that worked before issue 14 (anonymous ingest fenced a made-up node,
one token spoke for every node, ghost nodes diluted the breaker, `config check` passed a Slurm
fencer with no credentials).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth import config as config_mod
from podhealth.aggregator import cmd as agg_cmd
from podhealth.config_aggregator import AggAuthConfig, BreakerConfig
from podhealth.aggregator.model import Condition, FleetState, NodeView
from podhealth.aggregator.policy import Policy, decide
from podhealth.credentials import derive_node_token
from podhealth.vocab import Action, Status
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)

SECRET = "unit-test-cluster-secret-0123456789"
AUTH = AggAuthConfig(cluster_secret=SECRET, cluster_token="ctok", admin_token="atok")


def tok(node: str) -> str:
    return derive_node_token(SECRET, node)


def report(node: str, status: str = "FAIL") -> dict[str, Any]:
    now = time.time()
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": now,
            "results": [{"check": "xid", "entity": "GPU0", "status": status,
                         "action": "RESET_GPU" if status == "FAIL" else "NONE", "since": now - 1}]}


async def post(s: aiohttp.ClientSession, url: str, body: Any, token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with s.post(url, json=body, headers=headers) as r:
        return r.status, json.loads(await r.text())


async def until(pred: Any, timeout: float = 15.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.02)


def test_derived_token_is_hmac_sha256_of_the_node_name() -> None:
    import hashlib
    import hmac
    want = hmac.new(SECRET.encode(), b"podhealth-node:dgx01", hashlib.sha256).hexdigest()
    assert tok("dgx01") == want and tok("dgx02") != want and len(want) == 64


async def test_anonymous_report_for_a_made_up_node_is_refused_and_fences_nothing(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        status, out = await post(s, f"{url}/v1/reports", report("ghost01"), None)
        assert (status, out["error"]) == (401, "missing bearer token")
        status, _ = await post(s, f"{url}/v1/reports", report("ghost01"), "not-a-token")
        assert status == 401
        assert "ghost01" not in agg.mem.nodes and fencer.fenced == {}


async def test_open_ingest_refuses_a_dns_rebound_browser(tmp_path: Path) -> None:
    # No credential configured (allowed on loopback only). A page on evil.example re-resolved to
    # 127.0.0.1 reaches the socket from loopback and posts text/plain (no preflight) with an
    # Origin that matches its Host, so the cross-site check passes: the Host it names gives it away.
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        port = url.rsplit(":", 1)[1]
        browser = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}",
                   "Sec-Fetch-Site": "same-origin", "Content-Type": "text/plain"}
        for path, body in (("/v1/reports", report("ghost01")),
                           ("/v1/events", {"node": "ghost01", "events": []}),
                           ("/v1/alertmanager", {"alerts": []})):
            async with s.post(f"{url}{path}", data=json.dumps(body), headers=browser) as r:
                assert r.status == 403, path
                assert "loopback Host" in (await r.json())["error"]
        assert "ghost01" not in agg.mem.nodes and fencer.fenced == {}
        # the same report from a caller on this host that names it: taken
        status, out = await post(s, f"{url}/v1/reports", report("dgx01", "OK"), None)
        assert (status, out["applied"]) == (200, 1)


async def test_a_token_that_is_not_utf8_is_refused_not_a_500(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        for path in ("/v1/reports", "/v1/alertmanager", "/api/v1/nodes/dgx01/fence", "/api/v1/breaker/reset"):
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 2\r\nConnection: close\r\n".encode()
                         + b"Authorization: Bearer \xff\xfe\r\n\r\n{}")
            answer = await asyncio.wait_for(reader.read(), 10)
            writer.close()
            assert answer.startswith(b"HTTP/1.1 401 "), (path, answer[:80])
        assert "dgx01" not in agg.mem.nodes or agg.mem.nodes["dgx01"].fence.value == "none"


async def test_a_node_token_speaks_for_its_node_alone(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH, learn_nodes=False), [fencer]) as (agg, url), \
            aiohttp.ClientSession() as s:
        # dgx01's token reporting (or sending events) for dgx02: refused, dgx02 untouched
        status, out = await post(s, f"{url}/v1/reports", report("dgx02"), tok("dgx01"))
        assert (status, out["error"]) == (401, "invalid token for dgx02")
        ev = {"node": "dgx02", "events": [{"id": "e1", "type": "transition", "time": time.time(), "old": None,
                                           "new": {"check": "xid", "entity": "GPU1", "status": "FAIL",
                                                   "action": "RESET_GPU", "since": time.time()}}]}
        assert (await post(s, f"{url}/v1/events", ev, tok("dgx01")))[0] == 401
        assert agg.mem.conditions_of("dgx02") == []
        # ... and once dgx01's token was seen (cached), still not for dgx02
        assert (await post(s, f"{url}/v1/reports", report("dgx01", "OK"), tok("dgx01")))[0] == 200
        status, out = await post(s, f"{url}/v1/reports", report("dgx02"), tok("dgx01"))
        assert (status, out["error"]) == (401, "this token speaks for dgx01, not dgx02")
        # the raw secret and the shared cluster token are no agent credentials
        for bad in (SECRET, "ctok"):
            assert (await post(s, f"{url}/v1/reports", report("dgx02"), bad))[0] == 401
        # learn_nodes is off: even a correctly derived token cannot add a node
        status, out = await post(s, f"{url}/v1/reports", report("dgx77"), tok("dgx77"))
        assert status == 403 and "unknown node dgx77" in out["error"]
        # the node's own token works, and fences through the ordinary policy
        assert (await post(s, f"{url}/v1/reports", report("dgx02"), tok("dgx02")))[0] == 200
        await until(lambda: "dgx02" in fencer.fenced)
        assert set(fencer.fenced) == {"dgx02"}
        # the cluster token still posts Alertmanager alerts (a central sender), a node token cannot
        assert (await post(s, f"{url}/v1/alertmanager", {"alerts": []}, "ctok"))[0] == 200
        assert (await post(s, f"{url}/v1/alertmanager", {"alerts": []}, tok("dgx01")))[0] == 401


def test_learn_nodes_is_off_by_default() -> None:
    assert config_mod.Config().aggregator.learn_nodes is False
    assert config_mod.Config().aggregator.listen.address == "127.0.0.1"


async def test_learned_nodes_are_vouched_by_their_own_token_and_forgotten_when_silent(tmp_path: Path) -> None:
    clock = [time.time()]
    cfg = config(tmp_path, auth=AUTH, learn_nodes=True, forget_learned_after=600.0)
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        agg.clock = lambda: clock[0]
        assert (await post(s, f"{url}/v1/reports", report("dgx50", "OK"), tok("dgx50")))[0] == 200
        rec = agg.mem.nodes["dgx50"]
        assert rec.learned and rec.vouched and agg.mem.views["dgx50"].counted
        clock[0] += 599
        assert agg.forget_ops(clock[0]) == [] and "dgx50" in agg.mem.nodes
        clock[0] += 2
        ops = agg.forget_ops(clock[0])
        await agg.commit(ops)
        assert "dgx50" not in agg.mem.nodes and "dgx50" not in agg.mem.views
        assert "dgx50" not in {r.name for r in agg.store.load(clock[0], 3600.0).nodes}
        assert "dgx01" in agg.mem.nodes  # configured nodes are never forgotten


def _views(real: int, ghosts: int) -> dict[str, NodeView]:
    views = {f"dgx{i:03d}": NodeView(f"dgx{i:03d}", partition="batch") for i in range(real)}
    views.update({f"ghost{i:04d}": NodeView(f"ghost{i:04d}", counted=False) for i in range(ghosts)})
    return views


def test_ghost_nodes_do_not_dilute_the_breaker() -> None:
    now = 10_000.0
    bad = [Condition(node=f"dgx{i:03d}", check="xid", entity="GPU0", status=Status.FAIL, action=Action.RESET_GPU,
                     since=now - 5, observed=now, opened=now - 5) for i in range(3)]
    policy = Policy.from_config(config(Path("/tmp"), breaker=BreakerConfig(share_percent=10.0, window=300.0,
                                                                          min_nodes=3)))
    # 3 of 10 real nodes turn bad: 30 % > 10 %, however many names merely arrived
    d = decide(bad, FleetState(nodes=_views(10, 1000)), now, policy)
    assert d.breaker.tripped and "3 of 10 nodes" in d.breaker.reason
    assert d.of_kind("fence") == []
    # the same 3 of 100 real nodes: 3 % — fenced, breaker quiet
    d = decide(bad, FleetState(nodes=_views(100, 0)), now, policy)
    assert not d.breaker.tripped and len(d.of_kind("fence")) == 3


async def test_ghosts_posted_with_the_shared_token_do_not_keep_the_breaker_quiet(tmp_path: Path) -> None:
    fencer = MemFencer()
    auth = AggAuthConfig(cluster_secret=SECRET, cluster_token="ctok", cluster_token_for_agents=True)
    cfg = config(tmp_path, nodes=10, auth=auth, learn_nodes=True,
                 breaker=BreakerConfig(share_percent=10.0, window=300.0, min_nodes=3))
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        for i in range(200):  # before: 200 healthy ghosts made the fleet 210 nodes
            assert (await post(s, f"{url}/v1/reports", report(f"ghost{i:03d}", "OK"), "ctok"))[0] == 200
        assert not agg.mem.views["ghost000"].counted
        for node in ("dgx01", "dgx02", "dgx03"):
            assert (await post(s, f"{url}/v1/reports", report(node), tok(node)))[0] == 200
        await until(lambda: agg.mem.breaker.tripped)
        assert "of 10 nodes" in agg.mem.breaker.reason
        assert len(fencer.fenced) < 3  # the breaker, not the cap, stopped the third fence


def _config_error(text: str, tmp_path: Path) -> str:
    path = tmp_path / "podhealth.yaml"
    path.write_text(text)
    with pytest.raises(config_mod.ConfigError) as e:
        config_mod.load(path)
    return str(e.value)


def test_config_check_refuses_a_fencer_on_unauthenticated_ingest(tmp_path: Path, capsys: Any) -> None:
    old_default_with_slurm = "aggregator:\n  fencers:\n    slurm:\n      enabled: true\n"
    msg = _config_error(old_default_with_slurm, tmp_path)
    assert msg.startswith("podhealth.yaml:4: aggregator.fencers.slurm.enabled: the slurm fencer is on but ingest "
                          "is unauthenticated"), msg
    # the CLI says the same and fails
    from podhealth.cli import main
    assert main(["config", "check", str(tmp_path / "podhealth.yaml")]) == 2
    assert "aggregator.fencers.slurm.enabled" in capsys.readouterr().err
    # Kubernetes too; the dry-run fencer, or dry_run, fences nothing and is fine
    assert "kubernetes fencer is on" in _config_error("aggregator:\n  fencers: {kubernetes: {enabled: true}}\n",
                                                      tmp_path)
    config_mod.loads("aggregator:\n  dry_run: true\n  fencers: {slurm: {enabled: true}}\n")
    config_mod.loads("aggregator:\n  fencers: {dryrun: {enabled: true}}\n")
    # with a credential (inline, as a file, or in the environment) it passes
    config_mod.loads(f"aggregator:\n  auth: {{cluster_secret: {SECRET}}}\n  fencers: {{slurm: {{enabled: true}}}}\n")
    config_mod.loads("aggregator:\n  auth: {cluster_secret_file: /etc/podhealth/secret}\n"
                     "  fencers: {slurm: {enabled: true}}\n")


def test_config_check_refuses_a_network_listen_without_credentials(tmp_path: Path, monkeypatch: Any) -> None:
    msg = _config_error("aggregator:\n  listen:\n    address: 0.0.0.0\n", tmp_path)
    assert msg.startswith('podhealth.yaml:3: aggregator.listen.address: binding "0.0.0.0" without credentials'), msg
    config_mod.loads("aggregator:\n  listen: {address: '::1'}\n")
    monkeypatch.setenv("PODHEALTH_CLUSTER_SECRET", SECRET)
    config_mod.loads("aggregator:\n  listen:\n    address: 0.0.0.0\n")


def test_short_secrets_and_secret_in_two_places_are_config_errors(tmp_path: Path) -> None:
    assert "at least 16 characters" in _config_error("aggregator:\n  auth: {cluster_secret: short}\n", tmp_path)
    assert "not both" in _config_error(
        f"aggregator:\n  auth: {{cluster_secret: {SECRET}, cluster_secret_file: /x}}\n", tmp_path)
    assert "absolute path" in _config_error("publish:\n  token_file: token\n", tmp_path)


def test_the_aggregator_refuses_to_start_open_on_the_network(tmp_path: Path, capsys: Any) -> None:
    from podhealth.cli import main
    rc = main(["aggregator", "--listen", "0.0.0.0:0", "--db", str(tmp_path / "a.db")])
    assert rc == 2
    assert "aggregator.listen.address" in capsys.readouterr().err


def test_secrets_come_from_files_and_the_environment(tmp_path: Path, monkeypatch: Any) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    conf = tmp_path / "agg.yaml"
    conf.write_text(f"aggregator:\n  auth:\n    cluster_secret_file: {secret_file}\n")
    monkeypatch.setenv("PODHEALTH_ADMIN_TOKEN", "from-env")
    args = argparse.Namespace(config=str(conf), listen=None, db=None, dry_run=False)
    _, agg = agg_cmd.effective_config(args)
    assert (agg.auth.cluster_secret, agg.auth.admin_token, agg.auth.cluster_secret_file) == (SECRET, "from-env", "")
    # an unreadable file is a clear error at start, naming it
    conf.write_text(f"aggregator:\n  auth:\n    cluster_secret_file: {tmp_path / 'missing'}\n")
    from podhealth.credentials import CredentialError
    with pytest.raises(CredentialError, match="cannot read .*missing"):
        agg_cmd.effective_config(args)
    # the agent's publish token from a file
    tfile = tmp_path / "node.token"
    tfile.write_text(tok("dgx01") + "\n")
    cfg = config_mod.loads(f"publish:\n  token_file: {tfile}\n")
    assert cfg.publish.resolved().token == tok("dgx01")
    monkeypatch.setenv("PODHEALTH_NODE_TOKEN", "env-token")
    assert config_mod.Config().publish.resolved().token == "env-token"



READS = ("/", "/ui", "/ui/node/dgx01", "/ui/static/fleet.js", "/ui/api/fleet", "/ui/api/fleet-history",
         "/api/v1/nodes", "/api/v1/nodes/dgx01", "/api/v1/nodes/dgx01/history", "/api/v1/fleet",
         "/api/v1/repairs", "/api/v1/fleet/versions", "/metrics", "/healthz")


async def test_a_loopback_aggregator_answers_reads_only_to_a_loopback_host(tmp_path: Path) -> None:
    """DNS rebinding: a page on evil.example re-resolved to 127.0.0.1 is same-origin with the
    loopback-bound aggregator and could read the fleet (node names, evidence, /metrics). It names
    its own Host; a loopback name, or one in allowed_hosts (a local reverse proxy), is answered."""
    cfg = config(tmp_path, auth=AUTH, allowed_hosts=("Podhealth.Example",))
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        port = url.rsplit(":", 1)[1]
        for path in READS:
            async with s.get(f"{url}{path}", headers={"Host": f"evil.example:{port}"}, allow_redirects=False) as r:
                assert r.status == 421, path
                assert "aggregator.allowed_hosts" in (await r.json())["error"]
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"podhealth.example:{port}"):
                async with s.get(f"{url}{path}", headers={"Host": host}, allow_redirects=False) as r:
                    assert r.status < 400, (path, host, r.status)
        async with s.get(f"{url}/api/v1/fleet", headers={"Host": "[::1"}) as r:
            assert r.status == 421


async def test_an_aggregator_bound_beyond_loopback_answers_any_host() -> None:
    """Behind a Service or a proxy the Host is theirs: the guard changes nothing there."""
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from podhealth.webguard import host_guard

    async def ok(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    for bound, want in (("0.0.0.0", 200), ("10.0.0.5", 200), ("127.0.0.1", 421), ("::1", 421)):
        handler = host_guard(bound)(ok)
        r = await handler(make_mocked_request("GET", "/api/v1/fleet", headers={"Host": "podhealth.example"}))
        assert r.status == want, bound
