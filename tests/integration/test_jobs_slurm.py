"""Job-aware actions against a loopback Slurm 22.05 with 8 GPU GRES per node: the jobs on a node
and their GPUs (squeue + scontrol -d show job), a running job requeued by the fatal path and
left alone by the wait path."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator

import aiohttp
import pytest

from podhealth.config_aggregator import CapsConfig, JobsConfig
from podhealth.fencing.slurm import SlurmFencer
from tests.harness.agg import config, running
from tests.harness.slurm import SlurmCluster, missing_binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_binaries(("munged", "slurmctld", "slurmd", "scontrol", "squeue", "sbatch"))
    if missing:
        pytest.skip(f"Slurm binaries missing: {', '.join(missing)}")
    with SlurmCluster(nodes=4, gpus=8, cpus_per_node=4) as c:
        yield c


async def until(pred: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def submit(c: SlurmCluster, node: str, gpus: int) -> str:
    out = c.run("sbatch", "--parsable", "-w", node, f"--gres=gpu:{gpus}", "-c", "1", "-o", "/dev/null",
                "--requeue", "--wrap", "sleep 300").stdout
    return out.strip().split(";")[0]


def job_state(c: SlurmCluster, job: str) -> tuple[str, str]:
    """(state, node list) of a job; ("", "") once it is gone."""
    out = c.run("squeue", "-h", "-j", job, "-o", "%T|%N", check=False).stdout.strip()
    state, _, nodes = out.partition("|")
    return state, nodes


def cancel(c: SlurmCluster, *jobs: str) -> None:
    c.run("scancel", *jobs, check=False)


async def test_jobs_and_gpus_on_a_node_and_requeue(slurm: SlurmCluster) -> None:
    job = submit(slurm, "dgx01", 2)
    other = submit(slurm, "dgx01", 3)
    try:
        await until(lambda: job_state(slurm, job)[0] == job_state(slurm, other)[0] == "RUNNING", 30, "jobs to run")
        f = SlurmFencer(slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)
        jobs = {j.id: j for j in await f.jobs("dgx01")}
        assert set(jobs) == {job, other}
        assert len(jobs[job].gpus) == 2 and len(jobs[other].gpus) == 3
        assert not set(jobs[job].gpus) & set(jobs[other].gpus)  # Slurm's own GRES IDX, disjoint
        assert jobs[job].state == "RUNNING" and jobs[job].owner
        assert await f.jobs("dgx04") == []

        polite = await f.evacuate("dgx01", list(jobs.values()), force=False)
        assert not polite.changed and polite.command == ()
        assert job_state(slurm, job)[0] == "RUNNING"

        from podhealth.fencing.fence import FenceReason
        assert (await f.fence("dgx01", FenceReason("gpu_lost", "gpu0", "REBOOT", "t1"))).changed
        o = await f.evacuate("dgx01", list(jobs.values()), force=True)
        assert o.changed and o.command[:2] == ("scontrol", "requeue"), o
        await until(lambda: job_state(slurm, job)[0] not in ("RUNNING", "COMPLETING"), 30, "the requeue")
        assert job_state(slurm, job)[0] in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING")
        assert (await f.release("dgx01")).changed
    finally:
        cancel(slurm, job, other)


def report(node: str, check: str, action: str, summary: str) -> dict[str, Any]:
    return {"node": node, "time": 1000.0, "results": [
        {"check": check, "entity": "gpu1", "status": "FAIL", "action": action, "summary": summary}]}


async def test_the_fatal_path_requeues_the_wait_path_leaves_the_job_alone(slurm: SlurmCluster, tmp_path: Any) -> None:
    dead = submit(slurm, "dgx02", 2)  # its GPU fell off the bus: the job is already dead
    alive = submit(slurm, "dgx03", 2)  # a DRAIN-worthy failure: the job may finish
    try:
        await until(lambda: job_state(slurm, dead)[0] == job_state(slurm, alive)[0] == "RUNNING", 30, "jobs to run")
        cfg = config(tmp_path, caps=CapsConfig(max_fenced=10, max_percent_per_partition=100.0),
                     jobs=JobsConfig(enabled=True))
        fencer = SlurmFencer(slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)
        async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
            for body in (report("dgx02", "gpu_lost", "REBOOT", "GPU has fallen off the bus"),
                         report("dgx03", "xid", "DRAIN", "XID 13: Graphics engine exception")):
                async with s.post(f"{url}/v1/reports", json=body) as r:
                    assert r.status == 200, await r.text()
            await until(lambda: job_state(slurm, dead)[0] not in ("RUNNING", "COMPLETING"), 60, "the fatal requeue")
            await until(lambda: agg.mem.nodes["dgx03"].fence.value == "fenced", 30, "dgx03 fenced")
            await until(lambda: "dgx03" in {a["node"] for a in agg.store.audit_tail(200)
                                            if a["what"] == "jobs at the fence"}, 30, "dgx03's jobs noted")
            jobs_at_fence = {a["node"]: a["output"] for a in agg.store.audit_tail(200) if a["what"] == "jobs at the fence"}
            assert f"on the node: {dead} (" in jobs_at_fence["dgx02"]
            # ... and in Slurm's reason, after podhealth's own mark (sinfo -R shows it)
            reason = slurm.run("sinfo", "-h", "-n", "dgx03", "-o", "%E").stdout.strip()
            assert reason.startswith("podhealth: xid gpu1 DRAIN [") and " jobs on " in reason
            assert f"on the node: {alive} (" in reason
            assert f"on the node: {alive} (" in jobs_at_fence["dgx03"]
            evac = [a for a in agg.store.audit_tail(200) if a["what"] == "evacuate via slurm"]
            assert [a["node"] for a in evac] == ["dgx02"] and evac[0]["command"][:2] == ["scontrol", "requeue"]
            assert agg.mem.nodes["dgx02"].evacuated == "forced"
            runs = agg.metrics.decisions._value.get()
            await until(lambda: agg.metrics.decisions._value.get() > runs + 20, 30, "more policy runs")
            assert job_state(slurm, alive) == ("RUNNING", "dgx03")  # drained, not killed
            assert agg.mem.nodes["dgx03"].evacuated == ""
            node = agg.node_json("dgx03")
            assert node is not None and [j["id"] for j in node["jobs"]] == [alive]
            assert len(node["jobs"][0]["gpus"]) == 2
    finally:
        cancel(slurm, dead, alive)


async def test_dry_run_says_which_jobs_it_would_requeue_and_touches_nothing(slurm: SlurmCluster,
                                                                           tmp_path: Any) -> None:
    from podhealth.config_aggregator import FencersConfig, SlurmFencerConfig

    job = submit(slurm, "dgx04", 1)
    try:
        await until(lambda: job_state(slurm, job)[0] == "RUNNING", 30, "the job to run")
        cfg = config(tmp_path, dry_run=True, jobs=JobsConfig(enabled=True),
                     fencers=FencersConfig(slurm=SlurmFencerConfig(enabled=True, slurm_conf=str(slurm.conf))))
        async with running(cfg) as (agg, url), aiohttp.ClientSession() as s:
            assert [f.name for f in agg.fencers] == ["dryrun"]
            async with s.post(f"{url}/v1/reports", json=report("dgx04", "gpu_lost", "REBOOT", "lost")) as r:
                assert r.status == 200
            await until(lambda: any(a["what"] == "evacuate via slurm (dry run)" for a in agg.store.audit_tail()),
                        30, "the dry-run evacuation")
            line = next(a for a in agg.store.audit_tail() if a["what"] == "evacuate via slurm (dry run)")
            assert line["output"].startswith(f"would requeue/evict: {job} (") and "GPU 0" in line["output"]
        assert job_state(slurm, job) == ("RUNNING", "dgx04")
        assert "DRAIN" not in slurm.run("scontrol", "show", "node", "dgx04").stdout  # nothing fenced either
    finally:
        cancel(slurm, job)
