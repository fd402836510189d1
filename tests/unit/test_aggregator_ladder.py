"""The remediation ladder in the running aggregator: reset -> reboot -> REPAIR, journaled, restart-safe.

A real Aggregator (store, writer, decide loop, action runner) with the MemFencer double (which
implements the Remediator extension) and a stand-in agent that answers /health, /v1/handover and
/v1/gpu-reset as the test says. The Slurm reboot and the agent's reset have their own tests
against the real things (tests/integration/test_ladder_slurm.py, test_agent_gpu_reset.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from podhealth import nodeproof
from podhealth.config_aggregator import AggAuthConfig, LadderConfig, NodeEntry, RetryConfig
from podhealth.fencing.fence import FenceReason, render_reason
from podhealth.aggregator.model import BreakerState, FenceMode
from podhealth.aggregator.store import NodeRow, Store
from tests.harness.agg import MemFencer, config, running
from tests.harness.fakeagent import proving_middleware
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)
FAST = RetryConfig(attempts=1, backoff=0.01, max_backoff=0.05)


async def until(pred: Any, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


class Agent:
    """/health (FAIL xid gpu3 RESET_GPU until told OK), /v1/handover and /v1/gpu-reset."""

    def __init__(self, node: str, key: str = "agent-secret") -> None:
        self.node = node
        self.key = key  # the node's agent key: requests must be signed with it, answers are proven with it
        self.status = "FAIL"
        self.action = "RESET_GPU"
        self.reset: tuple[int, dict[str, Any]] = (200, {"ok": True})
        self.resets: list[dict[str, Any]] = []
        self.auth: list[str] = []
        self.handover_status = "OK"
        self.t = 1000.0

    async def health(self, request: web.Request) -> web.Response:
        self.t += 1
        res = [{"check": "xid", "entity": "gpu3", "status": self.status,
                "action": self.action if self.status != "OK" else "NONE"}]
        return web.json_response({"node": self.node, "time": self.t, "results": res},
                                 status=200 if self.status == "OK" else 503)

    async def _credential(self, request: web.Request) -> str:
        """What the caller presented: "signed" (by this node's key), or what else it sent."""
        if request.headers.get("Authorization"):
            return request.headers["Authorization"]
        problem = nodeproof.request_problem(self.key, self.node, request.method, request.raw_path, request.headers,
                                            await request.read(), time.time())
        return problem or "signed"

    async def handover(self, request: web.Request) -> web.Response:
        self.auth.append(await self._credential(request))
        return web.json_response({"status": self.handover_status})

    async def gpu_reset(self, request: web.Request) -> web.Response:
        self.resets.append(await request.json())
        self.auth.append(await self._credential(request))
        code, body = self.reset
        return web.json_response(body, status=code)

    async def serve(self) -> tuple[web.AppRunner, str]:
        app = web.Application(middlewares=[proving_middleware(lambda: self.key, self.node)])
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/handover", self.handover)
        app.router.add_post("/v1/gpu-reset", self.gpu_reset)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner, f"http://127.0.0.1:{port}"


def ladder_cfg(tmp_path: Path, url: str, retries: RetryConfig = FAST,
               auth: AggAuthConfig = AggAuthConfig(agent_token="agent-secret"), **ladder: Any) -> Any:
    lc = LadderConfig(**{"enabled": True, "verify_within": 1.0, "per_minute": 100, **ladder})
    cfg = config(tmp_path, healthy_for=0.2, pull_interval=0.05, retries=retries, ladder=lc, auth=auth)
    return dataclasses.replace(cfg, nodes=(NodeEntry(name="dgx01", agent_url=url, partition="batch"),))


def kinds(agg: Any, node: str = "dgx01") -> list[tuple[str, str, str]]:
    return [(a["kind"], a["state"], a["outcome"]) for a in reversed(agg.store.ladder_attempts(node))]


async def test_reset_fails_then_reboot_does_not_help_then_repair(tmp_path: Path) -> None:
    agent = Agent("dgx01")
    agent.reset = (500, {"error": "nvidia-smi -r -i 3: GPU reset failed"})
    runner, url = await agent.serve()
    fencer = MemFencer()
    try:
        async with running(ladder_cfg(tmp_path, url), [fencer]) as (agg, api):
            await until(lambda: agg.mem.nodes["dgx01"].ladder == "repair" and not agg.pending)
            rec = agg.mem.nodes["dgx01"]
            # rung 1: the agent was asked to reset GPU 3 with the aggregator's agent token, and failed
            assert agent.resets == [{"gpu": 3, "reason": agent.resets[0]["reason"]}]
            assert agent.auth == ["signed"]  # signed with the key; no bearer token crosses the wire
            # rung 2: a reboot through the scheduler; the node stayed FAIL past verify_within
            assert fencer.count("reboot", "dgx01") == 1
            # memory leads; the writer stores the last rows a moment later
            await until(lambda: kinds(agg) == [("reset_gpu", "failed", ""), ("reboot", "done", "failed"),
                                               ("repair", "done", "")])
            # REPAIR: a distinct reason in the backend, held for an operator, never retried
            assert fencer.fenced["dgx01"].startswith("podhealth: REPAIR xid/gpu3 RESET_GPU [")
            assert rec.fence is FenceMode.FENCED and rec.hold and rec.hold_reason.startswith("REPAIR: 2 failed")
            assert rec.state == "repair" and agg.metrics.repairs._value.get() == 1
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{api}/api/v1/repairs") as r:
                    queue = (await r.json())["repairs"]
                async with s.get(f"{api}/metrics") as r:
                    text = await r.text()
            assert [q["node"] for q in queue] == ["dgx01"] and len(queue[0]["attempts"]) == 3
            assert 'podhealth_aggregator_nodes{state="repair"} 1.0' in text
            from tests.unit.test_aggregator_cli import fleet
            rc, out, err = await fleet(api, "repairs", token=None)
            assert rc == 0, err
            assert "dgx01" in out and "podhealth: REPAIR xid/gpu3 RESET_GPU" in out
            assert "reset_gpu failed" in out and "reboot    failed" in out
            # and why the reboot counts as failed: it was carried out, the node just never passed
            assert "failed: the node did not pass the handover suite within 1 s" in out, out
            runs = agg.metrics.decisions._value.get()
            await until(lambda: agg.metrics.decisions._value.get() > runs + 10)
            assert fencer.count("reboot") == 1 and len(agent.resets) == 1 and len(kinds(agg)) == 3
        # A restart continues where it was: still in repair, nothing repeated.
        async with running(ladder_cfg(tmp_path, url), [fencer]) as (agg, _):
            assert agg.mem.nodes["dgx01"].ladder == "repair"
            runs = agg.metrics.decisions._value.get()
            await until(lambda: agg.metrics.decisions._value.get() > runs + 10)
            assert fencer.count("reboot") == 1 and len(agent.resets) == 1 and len(kinds(agg)) == 3
            assert not agg.pending
    finally:
        await runner.cleanup()


async def test_a_reset_that_fixes_the_gpu_returns_the_node_after_the_handover_suite(tmp_path: Path) -> None:
    agent = Agent("dgx01")
    runner, url = await agent.serve()
    fencer = MemFencer()
    try:
        async with running(ladder_cfg(tmp_path, url, verify_within=30.0), [fencer]) as (agg, _):
            await until(lambda: agent.resets and agg.mem.nodes["dgx01"].ladder == "verifying")
            agent.status = "OK"  # the reset cleared it
            await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.NONE and not agg.pending)
            assert "dgx01" not in fencer.fenced and fencer.count("reboot") == 0
            await until(lambda: kinds(agg) == [("reset_gpu", "done", "passed")])  # stored just after memory
            assert agg.mem.nodes["dgx01"].ladder == ""
    finally:
        await runner.cleanup()


async def test_without_a_shared_agent_token_each_agent_gets_its_own_derived_one(tmp_path: Path) -> None:
    """Root on dgx02 holds dgx02's agent token: what the aggregator sends dgx01 is not it."""
    from podhealth.credentials import derive_agent_token
    secret = "cluster-secret-" + "x" * 20
    agent = Agent("dgx01", key=derive_agent_token(secret, "dgx01"))
    runner, url = await agent.serve()
    fencer = MemFencer()
    try:
        cfg = ladder_cfg(tmp_path, url, auth=AggAuthConfig(cluster_secret=secret), verify_within=30.0)
        async with running(cfg, [fencer]) as (agg, _):
            await until(lambda: agent.resets and agg.mem.nodes["dgx01"].ladder == "verifying")
            agent.status = "OK"
            await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.NONE and not agg.pending)
        mine = derive_agent_token(secret, "dgx01")
        assert mine not in (derive_agent_token(secret, "dgx02"), secret)
        # the reset, then the handover: each signed with dgx01's own key (dgx02's would not verify)
        assert len(agent.auth) >= 2 and set(agent.auth) == {"signed"}, agent.auth
    finally:
        await runner.cleanup()


async def test_a_busy_gpu_is_retried_later_not_counted_as_a_failed_attempt(tmp_path: Path) -> None:
    agent = Agent("dgx01")
    agent.reset = (409, {"error": "2 processes use GPU 3"})
    runner, url = await agent.serve()
    fencer = MemFencer()
    try:
        # retried every ~0.5 s: far from the STEP_POSTPONEMENTS that would give up on it
        slow = RetryConfig(attempts=1, backoff=0.25, max_backoff=0.5)
        async with running(ladder_cfg(tmp_path, url, slow, verify_within=30.0), [fencer]) as (agg, _):
            await until(lambda: len(agent.resets) >= 2)
            assert agg.mem.nodes["dgx01"].ladder == "acting" and agg.mem.nodes["dgx01"].ladder_failures == ()
            assert [p.kind for p in agg.pending.values()] == ["reset_gpu"]
            agent.reset = (200, {"ok": True})
            await until(lambda: agg.mem.nodes["dgx01"].ladder == "verifying")
            assert fencer.count("reboot") == 0 and kinds(agg) == [("reset_gpu", "done", "verifying")]
    finally:
        await runner.cleanup()


async def test_a_failed_handover_after_a_reboot_is_a_failed_attempt(tmp_path: Path) -> None:
    agent = Agent("dgx01")
    agent.action = "REBOOT"
    agent.handover_status = "FAIL"
    runner, url = await agent.serve()
    fencer = MemFencer()
    try:
        async with running(ladder_cfg(tmp_path, url, verify_within=30.0, max_attempts=1), [fencer]) as (agg, _):
            await until(lambda: fencer.count("reboot") == 1 and agg.mem.nodes["dgx01"].ladder == "verifying")
            agent.status = "OK"  # the node comes back looking fine, but the handover suite fails
            await until(lambda: agg.mem.nodes["dgx01"].ladder == "repair")
            assert agent.resets == []  # REBOOT asked: no reset rung
            await until(lambda: kinds(agg) == [("reboot", "done", "failed"), ("repair", "done", "")])  # journaled after
    finally:
        await runner.cleanup()


async def test_restart_never_repeats_a_reboot_that_was_carried_out(tmp_path: Path) -> None:
    """The previous process asked for the reboot and died before hearing back (the action is
    pending); the backend already shows the reboot requested: it is not asked again."""
    reason = FenceReason("xid", "gpu3", "REBOOT", "ev1")
    s = Store(tmp_path / "agg.db")
    s.apply([Store.op_node_insert(NodeRow("dgx01", first_seen=1.0)),
             Store.op_node_fields("dgx01", fence="fenced", fence_reason=render_reason(reason), ladder="acting",
                                  ladder_at=5.0)])
    s.begin_action("dgx01", "reboot", "policy", "reboot", 5.0, reason, "")
    s.close()
    agent = Agent("dgx01")
    agent.action = "REBOOT"
    runner, url = await agent.serve()
    fencer = MemFencer(fenced={"dgx01": render_reason(reason)}, rebooting={"dgx01"})
    try:
        async with running(ladder_cfg(tmp_path, url, verify_within=30.0), [fencer]) as (agg, _):
            await until(lambda: agg.mem.nodes["dgx01"].ladder == "verifying" and not agg.pending)
            assert fencer.rebooting == {"dgx01"} and fencer.count("reboot") == 1
            audit = [a["output"] for a in agg.store.audit_tail() if a["what"] == "reboot via mem"]
            assert audit == ["reboot already requested"]
    finally:
        await runner.cleanup()


async def test_the_breaker_holds_every_rung(tmp_path: Path) -> None:
    reason = FenceReason("xid", "gpu3", "RESET_GPU", "ev1")
    s = Store(tmp_path / "agg.db")
    s.apply([Store.op_node_insert(NodeRow("dgx01", first_seen=1.0)),
             Store.op_node_fields("dgx01", fence="fenced", fence_reason=render_reason(reason)),
             Store.op_breaker(BreakerState(tripped=True, tripped_at=1.0, reason="test"))])
    s.close()
    agent = Agent("dgx01")
    runner, url = await agent.serve()
    fencer = MemFencer(fenced={"dgx01": render_reason(reason)})
    try:
        async with running(ladder_cfg(tmp_path, url), [fencer]) as (agg, _):
            await until(lambda: agg.mem.nodes["dgx01"].status.value == "FAIL")
            runs = agg.metrics.decisions._value.get()
            await until(lambda: agg.metrics.decisions._value.get() > runs + 10)
            assert agent.resets == [] and agg.mem.nodes["dgx01"].ladder == ""
            assert "breaker tripped" in agg.last_decision.notes_of("ladder_held")[0].detail
            await agg.breaker_reset("test", "outage over")
            await until(lambda: agent.resets)
    finally:
        await runner.cleanup()


async def test_jobs_requeued_once_per_fence_even_across_a_restart(tmp_path: Path) -> None:
    from podhealth.config_aggregator import JobsConfig
    from podhealth.fencing.fence import Job

    fencer = MemFencer(jobs_on={"dgx01": [Job("4102", "bob", "eval", "RUNNING", (3, 5)), Job("4103", "carol")]})
    cfg = config(tmp_path, jobs=JobsConfig(enabled=True))
    body = {"node": "dgx01", "time": 10.0, "results": [
        {"check": "gpu_lost", "entity": "gpu3", "status": "FAIL", "action": "REBOOT", "summary": "fallen off"}]}
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/reports", json=body) as r:
            assert r.status == 200
        await until(lambda: agg.mem.nodes["dgx01"].evacuated == "forced")
        await until(lambda: any(a["what"] == "jobs at the fence" for a in agg.store.audit_tail()))
        noted = [a["output"] for a in agg.store.audit_tail() if a["what"] == "jobs at the fence"]
        assert noted == ["on gpu3: 4102 (bob, GPU 3,5); on the node: 4102 (bob, GPU 3,5), 4103 (carol)"]
        assert fencer.count("evacuate force") == 1 and fencer.jobs_on["dgx01"] == []
        assert agg.node_json("dgx01")["evacuated_jobs"] == 2  # type: ignore[index]
    fencer.jobs_on["dgx01"] = [Job("4200", "dave")]  # came back later: this fence already requeued
    async with running(cfg, [fencer]) as (agg, _):
        assert agg.mem.nodes["dgx01"].evacuated == "forced"
        runs = agg.metrics.decisions._value.get()
        await until(lambda: agg.metrics.decisions._value.get() > runs + 10)
        assert fencer.count("evacuate force") == 1 and fencer.jobs_on["dgx01"] == [Job("4200", "dave")]


async def test_dry_run_climbs_on_paper_and_never_asks_the_agent(tmp_path: Path) -> None:
    agent = Agent("dgx01")
    runner, url = await agent.serve()
    try:
        cfg = dataclasses.replace(ladder_cfg(tmp_path, url, verify_within=30.0), dry_run=True)
        async with running(cfg) as (agg, _):
            await until(lambda: agg.mem.nodes["dgx01"].ladder == "verifying")
            assert agent.resets == [] and [f.name for f in agg.fencers] == ["dryrun"]
            # memory leads the writer: wait for the audit row, not only for the state
            await until(lambda: any(a["what"] == "gpu reset via agent (dry run)" for a in agg.store.audit_tail()))
            line = next(a for a in agg.store.audit_tail() if a["what"] == "gpu reset via agent (dry run)")
            assert line["output"] == "would reset (dry run)"
    finally:
        await runner.cleanup()


async def test_the_rung_rate_limit_survives_a_restart(tmp_path: Path) -> None:
    """A reboot the previous process began 10 s ago still counts against ladder.per_minute."""
    import time as _time

    s = Store(tmp_path / "agg.db")
    s.apply([Store.op_node_insert(NodeRow("dgx09", first_seen=1.0))])
    s.begin_action("dgx09", "reboot", "policy", "earlier", _time.time() - 10, FenceReason("x", "node", "REBOOT", "e"))
    s.close()
    agent = Agent("dgx01")
    runner, url = await agent.serve()
    try:
        async with running(ladder_cfg(tmp_path, url, per_minute=1), [MemFencer()]) as (agg, _):
            await until(lambda: agg.last_decision.notes_of("ladder_held"))
            assert "1 resets/reboots in the last minute" in agg.last_decision.notes_of("ladder_held")[0].detail
            assert agent.resets == []
    finally:
        await runner.cleanup()


async def test_an_evacuation_with_no_jobs_says_so(tmp_path: Path) -> None:
    # the node page read "jobs moved off: requeued / evicted" when no job had been running
    from podhealth.config_aggregator import JobsConfig

    fencer = MemFencer(jobs_on={"dgx01": []})
    cfg = config(tmp_path, jobs=JobsConfig(enabled=True))
    body = {"node": "dgx01", "time": 10.0, "results": [
        {"check": "gpu_lost", "entity": "gpu3", "status": "FAIL", "action": "REBOOT", "summary": "fallen off"}]}
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/reports", json=body) as r:
            assert r.status == 200
        await until(lambda: agg.mem.nodes["dgx01"].evacuated == "forced")
        assert agg.node_json("dgx01")["evacuated_jobs"] == 0  # type: ignore[index]
    js = (Path(__file__).resolve().parents[2] / "aggregator" / "static" / "node.js").read_text()
    assert 'n.evacuated_jobs === 0) add("jobs", "none were running to move off")' in js
