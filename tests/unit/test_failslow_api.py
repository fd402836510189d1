"""Fail-slow through a real aggregator: POST /v1/perf from simulated nodes, the judge's conditions
going through the policy (a drain only when configured, a fleet-wide shift fences nobody), the
reads, /metrics, and bad bodies refused without changing anything."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import aiohttp
import pytest

from podhealth.config_aggregator import AggAuthConfig
from podhealth.config_failslow import FailslowAggConfig, FailslowJudgeConfig, MetricRule
from podhealth.sim import faults, perfmodel
from podhealth.sim.state import NodeState, default_state
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_api import call

pytestmark = pytest.mark.timeout(60)
NODES = 20
AUTH = AggAuthConfig(node_tokens={f"dgx{i:02d}": f"tok{i:02d}" for i in range(1, NODES + 1)}, admin_token="atok")


def fs_config(tmp_path: Path, action: str = "drain", **kw: Any) -> Any:
    judge = replace(FailslowJudgeConfig(), metrics=MappingProxyType(
        {"gemm_tflops": MetricRule(action=action, act_consecutive=1)}))  # type: ignore[arg-type]
    return config(tmp_path, nodes=NODES, auth=AUTH, learn_nodes=False,
                  failslow=FailslowAggConfig(judge=judge, interval=1.0, window=1.0), **kw)


def body(st: NodeState, at: float, scale: float = 1.0) -> dict[str, Any]:
    return {"node": st.name, "profile": st.profile, "driver": st.driver_version,
            "probes": [{"entity": r.entity, "metric": r.metric, "value": r.value * scale, "firmware": r.firmware}
                       for r in perfmodel.fingerprint(st, 3, at)]}


def fleet(slow: int | None = None, pct: float = 25.0) -> list[NodeState]:
    nodes = [default_state(f"dgx{i:02d}", "dgx-h100", now=0.0) for i in range(1, NODES + 1)]
    if slow is not None:
        nodes[slow - 1] = nodes[slow - 1].with_fault(faults.parse(["fault=slow-gpu", "gpu=3", f"pct={pct}"], 0.0))
    return nodes


async def post_all(s: aiohttp.ClientSession, url: str, nodes: list[NodeState], scale: float = 1.0) -> None:
    at = time.time()
    for i, st in enumerate(nodes, 1):
        assert await call(s, "POST", f"{url}/v1/perf", body(st, at, scale), f"tok{i:02d}") == (200, {"applied": 76})


async def until(pred: Callable[[], object], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def cli(*argv: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "podhealth", *argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def named(s: aiohttp.ClientSession, url: str) -> bool:
    _, out = await call(s, "GET", f"{url}/api/v1/failslow/stragglers")
    return bool(out["stragglers"])


async def judged_after(s: aiohttp.ClientSession, url: str, t: float) -> bool:
    _, out = await call(s, "GET", f"{url}/api/v1/failslow/outliers")
    return bool(out["scored_at"] > t)


async def test_slow_gpu_is_drained_through_the_policy(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(fs_config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await post_all(s, url, fleet(slow=7))
        await until(lambda: ("dgx07", "failslow_gemm", "gpu3") in agg.mem.conditions, "the finding's condition")
        c = agg.mem.conditions[("dgx07", "failslow_gemm", "gpu3")]
        assert (c.status.value, c.action.value, c.source) == ("FAIL", "DRAIN", "aggregator")
        assert c.summary.startswith("gpu3 GEMM ") and "of 160 dgx-h100 GPUs on 565.57.01" in c.summary
        await until(lambda: fencer.count("fence", "dgx07") == 1, "the fence")
        assert {n for n, *_ in agg.mem.conditions} == {"dgx07"}
        st, out = await call(s, "GET", f"{url}/api/v1/failslow/outliers?metric=gemm")
        assert st == 200 and [f["node"] for f in out["findings"]] == ["dgx07"]
        assert out["cohorts"][0]["size"] == 160 and len(out["cohorts"][0]["z"]) == 160
        st, hist = await call(s, "GET", f"{url}/api/v1/failslow/nodes/dgx07")
        assert st == 200 and any(e["entity"] == "gpu3" and e["points"][-1]["flagged"] for e in hist["entities"])
        st, text = await call(s, "GET", f"{url}/metrics")
        assert 'podhealth_aggregator_failslow_finding_z{driver="565.57.01",entity="gpu3",metric="gemm_tflops",node="dgx07"' in text
        # `podhealth fleet outliers`, as a person runs it
        rc, out_json, _ = await cli("fleet", "--url", url, "outliers", "--metric", "gemm", "--format", "json")
        assert rc == 0 and [f["node"] for f in json.loads(out_json)["findings"]] == ["dgx07"]
        rc, table, _ = await cli("fleet", "--url", url, "outliers")
        assert rc == 0 and "dgx07" in table and "GEMM" in table and "FAIL" in table
        rc, _, err = await cli("fleet", "--url", url, "outliers", "--metric", "speed")
        assert rc == 64 and "invalid choice" in err
        # Repaired: the next round closes the condition.
        await post_all(s, url, fleet())
        await until(lambda: ("dgx07", "failslow_gemm", "gpu3") not in agg.mem.conditions, "the condition closed")


async def test_warn_by_default_fences_nobody(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(fs_config(tmp_path, action="warn"), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await post_all(s, url, fleet(slow=4))
        await until(lambda: ("dgx04", "failslow_gemm", "gpu3") in agg.mem.conditions, "the finding")
        assert agg.mem.conditions[("dgx04", "failslow_gemm", "gpu3")].status.value == "WARN"
        opened = agg.clock()
        await until(lambda: agg.last_decision_at > opened, "a decision after the finding")
        assert fencer.count("fence") == 0


async def test_fleet_wide_shift_fences_nobody(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(fs_config(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await post_all(s, url, fleet())
        first = agg.clock()
        await until(lambda: judged_after(s, url, first), "a judgement")
        await post_all(s, url, fleet(), scale=0.9)  # every GPU 10% slower (a site-wide change)
        shifted = agg.clock()
        await until(lambda: judged_after(s, url, shifted), "a judgement after the shift")
        assert not [k for k in agg.mem.conditions if k[1].startswith("failslow_")]
        assert fencer.count("fence") == 0


@pytest.mark.parametrize("bad,why", [
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1"}, "expected probes"),
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1",
      "probes": [{"entity": "gpu0", "metric": "speed", "value": 1}]}, "metric"),
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1",
      "probes": [{"entity": "gpu0", "metric": "gemm_tflops", "value": -1}]}, "finite number"),
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1",
      "probes": [{"entity": "gpu0", "metric": "gemm_tflops", "value": 1}] * 513}, "at most 512"),
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1", "job": {"id": "1", "gpus": [{"gpu": True}]}}, "GPU index"),
    ({"node": "dgx01", "profile": "dgx-h100", "driver": "1", "probes": [],
      "passive": [{"entity": "gpu0", "signal": "temp_margin_c", "value": "hot"}], "job": None}, "finite number"),
])
async def test_bad_bodies_are_refused(tmp_path: Path, bad: dict[str, Any], why: str) -> None:
    async with running(fs_config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        st, out = await call(s, "POST", f"{url}/v1/perf", bad, "tok01")
        assert st == 400 and why in out["error"]
        st, out = await call(s, "GET", f"{url}/api/v1/failslow/outliers")
        assert out["cohorts"] == []


async def test_a_node_speaks_only_for_itself(tmp_path: Path) -> None:
    async with running(fs_config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        st, _ = await call(s, "POST", f"{url}/v1/perf", body(fleet()[1], time.time()), "tok01")
        assert st in (401, 403)
        st, _ = await call(s, "POST", f"{url}/v1/perf", body(fleet()[0], time.time()))
        assert st == 401
        st, out = await call(s, "GET", f"{url}/api/v1/failslow/outliers?metric=nope")
        assert st == 400


async def test_straggler_named_on_metrics_and_api(tmp_path: Path) -> None:
    nodes = fleet()
    hot = faults.parse(["fault=thermal", "gpu=2"], 0.0)
    nodes[10] = nodes[10].with_fault(hot)
    async with running(fs_config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        for _ in range(3):  # three 1 s windows
            at = time.time()
            for i, st in enumerate(nodes[:16], 1):
                gpus = [{"gpu": w.gpu, "sm_active": w.sm_active, "power_w": w.power_w, "sm_clock_mhz": w.sm_clock_mhz,
                         "throttle": list(w.throttle), "nvlink_gbs": w.nvlink_gbs, "ib_gbs": w.ib_gbs}
                        for w in perfmodel.job_window(st, 1, at)]
                b = {"node": st.name, "profile": st.profile, "driver": st.driver_version,
                     "job": {"id": "4242", "owner": "alice", "gpus": gpus}}
                assert (await call(s, "POST", f"{url}/v1/perf", b, f"tok{i:02d}"))[0] == 200
            bucket = int(time.time())
            await until(lambda: int(time.time()) > bucket, "the next window")
        await until(lambda: named(s, url), "the straggler", timeout=10)
        _, out = await call(s, "GET", f"{url}/api/v1/failslow/stragglers")
        assert {x["node"] for x in out["stragglers"]} == {"dgx11"}
        st, text = await call(s, "GET", f"{url}/metrics")
        assert 'podhealth_job_straggler{gpu="2",job="4242",job_id="4242",node="dgx11",owner="alice",reason="thermal"} 1.0' in text
        assert not [k for k in agg.mem.conditions if k[0] == "dgx11"]  # WARN only: never a condition


async def test_a_restart_keeps_the_finding_until_the_part_is_judged_again(tmp_path: Path) -> None:
    key = ("dgx05", "failslow_gemm", "gpu3")
    async with running(fs_config(tmp_path, action="warn"), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        await post_all(s, url, fleet(slow=5))
        await until(lambda: key in agg.mem.conditions, "the finding")
    # a new aggregator on the same store: no figures in memory yet
    async with running(fs_config(tmp_path, action="warn"), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert key in agg.mem.conditions
        started = agg.clock()
        await until(lambda: judged_after(s, url, started), "a judgement with no figures")
        assert key in agg.mem.conditions  # not judged: kept
        await post_all(s, url, fleet())  # the part at its cohort again
        await until(lambda: key not in agg.mem.conditions, "the condition closed once judged")


async def test_a_node_cannot_flood_the_job_table(tmp_path: Path) -> None:
    from podhealth.aggregator.failslow_fleet import MAX_JOBS_PER_NODE

    gpus = [{"gpu": 0, "sm_active": 0.9, "power_w": 600, "sm_clock_mhz": 1980, "nvlink_gbs": 1, "ib_gbs": 1}]
    async with running(fs_config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        for i in range(MAX_JOBS_PER_NODE):
            b = {"node": "dgx01", "profile": "dgx-h100", "driver": "1", "job": {"id": f"j{i}", "gpus": gpus}}
            assert (await call(s, "POST", f"{url}/v1/perf", b, "tok01"))[0] == 200
        b = {"node": "dgx01", "profile": "dgx-h100", "driver": "1", "job": {"id": "one-too-many", "gpus": gpus}}
        st, out = await call(s, "POST", f"{url}/v1/perf", b, "tok01")
        assert st == 400 and "running jobs" in out["error"]
        b["job"]["id"] = "j0"  # a job it is in: still taken
        assert (await call(s, "POST", f"{url}/v1/perf", b, "tok01"))[0] == 200
