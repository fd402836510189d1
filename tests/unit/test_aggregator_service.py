"""The service loop: restart recovery, reconcile, retries, return to service, pulls, breaker, dry run."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from podhealth.config_aggregator import AggAuthConfig, BreakerConfig, NodeEntry, RetryConfig
from podhealth.fencing.fence import FenceReason, render_reason
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.store import NodeRow, Store
from podhealth.vocab import Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.fakeagent import proving_middleware
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)
R = FenceReason("xid", "GPU0", "RESET_GPU", "abc")
FAST = RetryConfig(attempts=2, backoff=0.01, max_backoff=0.05)


async def until(pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def fail_report(node: str, t: float, status: str = "FAIL") -> dict[str, Any]:
    return {"node": node, "time": t, "results": [{"check": "xid", "entity": "GPU0", "status": status,
                                                  "action": "RESET_GPU" if status != "OK" else "NONE"}]}


class FakeAgent:
    """An agent's /health and /v1/handover, answering what the test says."""

    def __init__(self, node: str, key: str = "agent-secret") -> None:
        self.node = node
        self.key = key  # the node's agent key: it proves its answers with it (an impostor has none)
        self.status = "OK"
        self.handover: tuple[int, dict[str, Any]] = (200, {"status": "OK"})
        self.handovers: list[str] = []
        self.pulled_with: list[str] = []  # the Authorization of each GET /health
        self.t = 1000.0

    async def health(self, request: web.Request) -> web.Response:
        self.pulled_with.append(request.headers.get("Authorization", ""))
        self.t += 1
        return web.json_response(fail_report(self.node, self.t, self.status),
                                 status=200 if self.status == "OK" else 503)

    async def do_handover(self, request: web.Request) -> web.Response:
        # What crossed the wire: a bearer token (never, now) and the request's signature.
        self.handovers.append(request.headers.get("Authorization", "") or
                              ("signed" if request.headers.get("X-Podhealth-Signature") else ""))
        code, body = self.handover
        return web.json_response(body, status=code)

    async def serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application(middlewares=[proving_middleware(lambda: self.key, self.node)])
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/handover", self.do_handover)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"


def seed(tmp_path: Path, **nodes: dict[str, Any]) -> Store:
    s = Store(tmp_path / "agg.db")
    ops = []
    for name, fields in nodes.items():
        ops += [Store.op_node_insert(NodeRow(name, first_seen=1.0)), Store.op_node_fields(name, **fields)]
    s.apply(ops)
    return s


@pytest.mark.parametrize("already", [True, False])
async def test_a_pending_fence_is_completed_on_start_without_fencing_twice(tmp_path: Path, already: bool) -> None:
    s = seed(tmp_path, dgx01={"fence": "fencing", "fence_reason": render_reason(R)})
    s.begin_action("dgx01", "fence", "policy", "xid", 5.0, R, "fence")
    s.close()
    fencer = MemFencer(fenced={"dgx01": render_reason(R)} if already else {})
    async with running(config(tmp_path), [fencer]) as (agg, _):
        assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCED and not agg.pending
        assert fencer.count("fence") == (0 if already else 1)
        # a mark made now carries this aggregator's lease epoch (the first: 1)
        assert fencer.fenced["dgx01"] == render_reason(R if already else dataclasses.replace(R, epoch=1))


async def test_reconcile_on_start_takes_the_stores_side_only_for_our_fences(tmp_path: Path) -> None:
    seed(tmp_path, dgx01={"fence": "fenced", "fence_reason": render_reason(R)},  # lost in the backend
         dgx02={"fence": "none"},                                                # ours in the backend, free here
         dgx03={"fence": "none"}).close()                                        # a human drained it
    fencer = MemFencer(fenced={"dgx02": "podhealth: nfs /home DRAIN [x]", "dgx03": "bad fan -- ops",
                               "dgx77": "podhealth: xid GPU1 DRAIN [y]"})
    async with running(config(tmp_path, nodes=4), [fencer]) as (agg, _):
        await until(lambda: not agg.pending and not agg._action_tasks)
        nodes = agg.mem.nodes
        assert fencer.fenced.get("dgx01") == render_reason(dataclasses.replace(R, epoch=agg.epoch() or 0))
        assert nodes["dgx01"].fence is FenceMode.FENCED
        assert "dgx02" not in fencer.fenced and nodes["dgx02"].fence is FenceMode.NONE
        assert fencer.fenced["dgx03"] == "bad fan -- ops" and nodes["dgx03"].fence is FenceMode.EXTERNAL
        assert nodes["dgx77"].fence is FenceMode.FENCED  # never heard of: adopted, not released
        text = "\n".join(agg.reconcile_report)
        assert "dgx01: fenced in the store but not in any backend" in text and "dgx03: fenced by someone else" in text


async def test_a_down_backend_leaves_the_action_pending_and_it_is_retried(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, retries=FAST), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        fencer.fail = 5  # 2 attempts per try: pending after the first, done on the third
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", 10))
        await until(lambda: any(p.attempts for p in agg.pending.values()))
        assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCING
        assert agg.store.pending_actions()[0].attempts >= 1
        await until(lambda: "dgx01" in fencer.fenced and not agg.pending)
        assert agg.mem.nodes["dgx01"].fence is FenceMode.FENCED and fencer.fail == 0
        audit = [a["what"] for a in agg.store.audit_tail() if a["node"] == "dgx01"]
        assert audit.count("fence attempt failed") >= 1 and audit.count("fence done") == 1


async def test_human_drained_node_is_never_fenced_over_nor_resumed(tmp_path: Path) -> None:
    fencer = MemFencer(fenced={"dgx02": "ops: RMA"})
    async with running(config(tmp_path, healthy_for=0.1), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem.nodes["dgx02"].fence is FenceMode.EXTERNAL
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", 10))
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", 11, "OK"))
        runs = agg.metrics.decisions._value.get()
        await until(lambda: agg.metrics.decisions._value.get() > runs + 5)
        assert fencer.fenced["dgx02"] == "ops: RMA" and fencer.count("fence") == fencer.count("release") == 0
        r = await s.post(f"{url}/api/v1/nodes/dgx02/release", json={"reason": "x"},
                         headers={"Authorization": "Bearer a"})
        assert r.status == 403  # no admin token configured at all


@pytest.mark.parametrize("answer, released", [
    ((200, {"status": "OK", "suite": "handover"}), True),
    ((200, {"status": "WARN", "exit_code": 0, "summary": "PASS (with warnings)"}), True),
    ((200, {"status": "FAIL"}), False),
    ((200, {"status": "FAIL", "exit_code": 1, "results": [{"check": "gpu"}] * 50,
            "summary": "dgx01: FAIL: 1 fail (ib_port:mlx5_1/1), 17 unknown"}), False),
    ((200, {"status": "UNKNOWN"}), False),
    ((404, {"error": "no such endpoint"}), False),
])
async def test_return_to_service_only_on_a_passed_handover(tmp_path: Path, answer: Any, released: bool) -> None:
    agent = FakeAgent("dgx01")
    agent.handover = answer
    arunner, aurl = await agent.serve()
    fencer = MemFencer()
    cfg = dataclasses.replace(config(tmp_path, healthy_for=0.3, pull_interval=0.1,
                                     auth=AggAuthConfig(agent_token="agent-secret")),
                              nodes=(NodeEntry(name="dgx01", agent_url=aurl),))
    try:
        agent.status = "FAIL"
        async with running(cfg, [fencer]) as (agg, _):
            await until(lambda: "dgx01" in fencer.fenced)
            agent.status = "OK"
            await until(lambda: agent.handovers)
            assert agent.handovers[0] == "signed"  # signed with the key, which never crosses the wire
            # the agent token goes only where it is needed: never with a pull of the open /health
            assert agent.pulled_with and set(agent.pulled_with) == {""}
            if released:
                await until(lambda: "dgx01" not in fencer.fenced and agg.mem.nodes["dgx01"].fence is FenceMode.NONE)
                assert agg.mem.nodes["dgx01"].status is Status.OK
            else:
                await until(lambda: agg.mem.nodes["dgx01"].handover == "failed")
                await asyncio.sleep(0.1)
                assert "dgx01" in fencer.fenced and agg.mem.nodes["dgx01"].fence is FenceMode.FENCED
                if "summary" in answer[1]:  # the audit carries the report's own line, not its JSON
                    out = [a["output"] for a in agg.store.audit_tail() if a["what"] == "handover suite"]
                    assert out == [f"HTTP 200: {answer[1]['summary']}"]
    finally:
        await arunner.cleanup()


async def test_an_impostor_on_the_agents_port_releases_nothing(tmp_path: Path) -> None:
    """The agent of a node fenced for a real failure is down; a local user binds its port and
    answers {"status": "OK"} to every pull and to the handover. That released the node in 5 s."""
    agent = FakeAgent("dgx01")
    arunner, aurl = await agent.serve()
    fencer = MemFencer()
    cfg = dataclasses.replace(config(tmp_path, healthy_for=0.2, pull_interval=0.1,
                                     auth=AggAuthConfig(agent_token="agent-secret")),
                              nodes=(NodeEntry(name="dgx01", agent_url=aurl),))
    try:
        agent.status = "FAIL"
        async with running(cfg, [fencer]) as (agg, _):
            await until(lambda: "dgx01" in fencer.fenced)
            agent.key = ""  # the impostor: same port, same answers, no key to prove them with
            agent.status = "OK"
            agent.handover = (200, {"status": "OK", "exit_code": 0})
            # Its answers are "could not tell" (as if no one answered), never OK.
            await until(lambda: agg.mem.nodes["dgx01"].unreachable_since is not None)
            pulled = len(agent.pulled_with)
            await until(lambda: len(agent.pulled_with) >= pulled + 5)  # > healthy_for of "OK" answers
            assert "dgx01" in fencer.fenced and agg.mem.nodes["dgx01"].fence is FenceMode.FENCED
            assert agg.mem.nodes["dgx01"].handover != "passed"
            # and no credential ever went to it (a pull carries none; a handover only a signature)
            assert not any(a.startswith("Bearer") for a in agent.pulled_with + agent.handovers)
    finally:
        await arunner.cleanup()


async def test_manual_release_waits_for_the_operator(tmp_path: Path) -> None:
    agent = FakeAgent("dgx01")
    arunner, aurl = await agent.serve()
    fencer = MemFencer()
    cfg = dataclasses.replace(config(tmp_path, healthy_for=0.1, pull_interval=0.1, manual_release=True,
                                     auth=AggAuthConfig(admin_token="atok", agent_token="agent-secret")),
                              nodes=(NodeEntry(name="dgx01", agent_url=aurl),))
    try:
        agent.status = "FAIL"
        async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
            await until(lambda: "dgx01" in fencer.fenced)
            agent.status = "OK"
            await until(lambda: any(n.kind == "awaiting_manual_release" for n in agg.last_decision.notes))
            assert agent.handovers == [] and "dgx01" in fencer.fenced
            r = await s.post(f"{url}/api/v1/nodes/dgx01/release", json={"reason": "checked by hand"},
                             headers={"Authorization": "Bearer atok"})
            assert r.status == 200 and (await r.json())["state"] == "done" and "dgx01" not in fencer.fenced
    finally:
        await arunner.cleanup()


async def test_unreachable_agent_is_unknown_then_node_unreachable_and_never_fenced(tmp_path: Path) -> None:
    fencer = MemFencer()
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = dataclasses.replace(config(tmp_path, pull_interval=0.1, pull_timeout=0.5, unreachable_after=0.5),
                              nodes=(NodeEntry(name="dgx01", agent_url=dead),))
    async with running(cfg, [fencer]) as (agg, _):
        await until(lambda: ("dgx01", "agent_reachable", "node") in agg.mem.conditions)
        assert agg.mem.nodes["dgx01"].status is Status.UNKNOWN
        await until(lambda: ("dgx01", "node_unreachable", "node") in agg.mem.conditions)
        await until(lambda: agg.mem.conditions[("dgx01", "node_unreachable", "node")].notified)
        assert fencer.count("fence") == 0


async def test_storm_trips_the_breaker_and_a_reset_replays_nothing(tmp_path: Path) -> None:
    fencer = MemFencer()
    cfg = config(tmp_path, nodes=20, breaker=BreakerConfig(share_percent=10, window=60, min_nodes=3),
                 auth=AggAuthConfig(admin_token="atok"))
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        batch = [s.post(f"{url}/v1/reports", json=fail_report(f"dgx{i:02d}", 10)) for i in range(1, 11)]
        await asyncio.gather(*batch)
        await until(lambda: agg.mem.breaker.tripped)
        fenced_at_trip = len(fencer.fenced)
        assert fenced_at_trip <= 2  # 2 of 20 is not more than 10%: the third trips it
        metrics = await (await s.get(f"{url}/metrics")).text()
        assert "podhealth_aggregator_breaker_tripped 1.0" in metrics
        fleet = await (await s.get(f"{url}/api/v1/fleet")).json()
        assert fleet["breaker"]["tripped"] and "turned bad" in fleet["breaker"]["reason"]
        r = await s.post(f"{url}/api/v1/breaker/reset", json={"reason": "storage fixed"},
                         headers={"Authorization": "Bearer atok"})
        assert r.status == 200 and (await r.json())["was_tripped"]
        runs = agg.metrics.decisions._value.get()
        await until(lambda: agg.metrics.decisions._value.get() > runs + 5)
        assert len(fencer.fenced) == fenced_at_trip and not agg.mem.breaker.tripped  # nothing replayed
        # a node seen failing again after the reset is judged afresh
        await s.post(f"{url}/v1/reports", json=fail_report("dgx10", 20, "WARN"))
        await s.post(f"{url}/v1/reports", json=fail_report("dgx10", 21))
        await until(lambda: "dgx10" in fencer.fenced)


async def test_dry_run_touches_no_real_fencer(tmp_path: Path) -> None:
    cfg = config(tmp_path, dry_run=True)
    async with running(cfg) as (agg, url), aiohttp.ClientSession() as s:
        assert [f.name for f in agg.fencers] == ["dryrun"]
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", 10))
        await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED)
        hist = await (await s.get(f"{url}/api/v1/nodes/dgx01/history")).json()
        cmds = [i["command"] for i in hist["items"] if i["type"] == "audit" and i["command"]]
        assert cmds and all(c[0] == "dryrun" for c in cmds)
        assert (await (await s.get(f"{url}/api/v1/fleet")).json())["dry_run"] is True


async def test_a_node_no_fencer_knows_fails_once_and_is_not_retried_in_a_loop(tmp_path: Path) -> None:
    fencer = MemFencer(missing={"dgx01"})
    async with running(config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", 10))
        await until(lambda: any(a["what"] == "fence failed" for a in agg.store.audit_tail()))
        runs = agg.metrics.decisions._value.get()
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", 10, "WARN"))  # wake the policy up
        await until(lambda: agg.metrics.decisions._value.get() > runs + 3)
        assert agg.mem.nodes["dgx01"].fence is FenceMode.NONE and not agg.pending
        assert sum(1 for a in agg.store.audit_tail() if a["what"] == "fence requested") == 1


async def test_a_push_only_node_is_unknown_after_missing_heartbeats_not_after_one_late(tmp_path: Path) -> None:
    cfg = config(tmp_path, heartbeat_interval=30.0, unreachable_after=120.0)
    async with running(cfg, [MemFencer()], housekeeping=3600) as (agg, url):
        mem = agg.mem
        t0 = agg.started_at + 1000
        mem.apply_report("dgx01", (), 500.0, "{}", t0)  # heard from at t0 (agent time is its own)
        mem.apply_report("dgx02", (), 500.0, "{}", t0)

        def state(node: str) -> str:
            return mem.nodes[node].state

        assert agg.silence_ops(t0 + 45) == [] and state("dgx01") == "OK", "one heartbeat late is not news"
        mem.apply_report("dgx02", (), 560.0, "{}", t0 + 60)  # dgx02 keeps reporting
        agg.silence_ops(t0 + 75)
        assert state("dgx01") == "UNKNOWN" and state("dgx02") == "OK"
        assert ("dgx01", "node_unreachable", "node") not in mem.conditions
        agg.silence_ops(t0 + 120)
        assert ("dgx01", "node_unreachable", "node") in mem.conditions
        # it reports again: reachable at once
        mem.apply_report("dgx01", (), 630.0, "{}", t0 + 130)
        assert state("dgx01") == "OK" and ("dgx01", "node_unreachable", "node") not in mem.conditions


async def test_after_a_restart_silence_counts_from_the_start(tmp_path: Path) -> None:
    cfg = config(tmp_path, heartbeat_interval=30.0, unreachable_after=120.0)
    async with running(cfg, [MemFencer()], housekeeping=3600) as (agg, url):
        _, ops = agg.mem.apply_report("dgx01", (), 500.0, "{}", agg.started_at)
        await agg.commit(ops)
    async with running(cfg, [MemFencer()], housekeeping=3600) as (agg, url):
        # the aggregator was down for a long while: the node was last heard long ago
        agg.started_at = agg.mem.nodes["dgx01"].last_seen + 3600
        assert agg.silence_ops(agg.started_at + 10) == [] and agg.mem.nodes["dgx01"].state == "OK"
        agg.silence_ops(agg.started_at + 75)
        assert agg.mem.nodes["dgx01"].state == "UNKNOWN"
        assert ("dgx01", "node_unreachable", "node") not in agg.mem.conditions, "counted from the start"
