"""The agent knows which Slurm job holds each GPU: slurmd runs the real `podhealth-slurm-prolog`
for a real job on the loopback Slurm, the prolog records the job's GPUs (SLURM_JOB_ID,
SLURM_JOB_USER, SLURM_JOB_GPUS as slurmd sets them), and the simulated agent then reports the job
for those GPUs: `gpu_job_info` on /metrics, `job` in the GPU's /health evidence, and
dcgm-exporter's job-mapping files. An XID on one of the job's GPUs reaches a real aggregator
(`podhealth aggregator`, the agent pushing to it) naming the job, in the event and in the GPU's
evidence. When the job ends, the real epilog removes the record and the agent says no job again.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.credentials import derive_node_token
from tests.harness.proc import Service, free_port, http_get, service, wait_until
from tests.harness.slurm import SlurmCluster, missing_binaries
from tests.integration.test_ui_browser import SECRET, start_aggregator

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONFIG = """
node: {name: dgx01, profile: dgx-h100}
listen: {port: %(port)d}
publish: {aggregator_url: "%(agg)s", token: "%(token)s"}
checks:
  grace: 0
  slurm_drain: never
  agents: {dgx01: "http://127.0.0.1:%(port)d"}
collectors:
  jobs: {interval: 0.5, timeout: 2, state_dir: %(jobs)s, dcgm_job_mapping_dir: %(map)s}
  nvml: {interval: 1, timeout: 2}
  nfs: {interval: 1, timeout: 3, mounts: [{path: /home, timeout: 1}]}
"""


def _script(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e . installs the console scripts)")
    return found


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Service, SlurmCluster, Path]]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"loopback Slurm needs {', '.join(missing)}")
    if os.geteuid() != 0:
        pytest.skip("the loopback Slurm harness is only supported as root (munged, slurmd)")
    tmp = tmp_path_factory.mktemp("jobs")
    port = free_port()
    agg_port = free_port()
    cfg = tmp / "podhealth.yaml"
    cfg.write_text(CONFIG % {"port": port, "jobs": tmp / "jobs", "map": tmp / "map",
                             "agg": f"http://127.0.0.1:{agg_port}", "token": derive_node_token(SECRET, "dgx01")})
    # Our own root so the hook wrappers can name slurm.conf before slurmd first runs them.
    root = Path(tempfile.mkdtemp(prefix="phjobs-", dir="/tmp"))
    root.chmod(0o755)  # munged: every directory above its socket must be o+x
    conf = root / "slurm.conf"
    lines = []
    for key, hook in (("Prolog", "prolog"), ("Epilog", "epilog")):
        w = root / f"podhealth-{hook}"
        # Only what slurmd does not pass: this test's config and slurm.conf paths.
        w.write_text(f"#!/bin/sh\nexport PODHEALTH_CONFIG={cfg} SLURM_CONF={conf}\n"
                     f"exec {_script('podhealth-slurm-' + hook)}\n")
        w.chmod(0o755)
        lines.append(f"{key}={w}")
    argv = [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
            "--sim-root", str(tmp / "sim"), "--listen", f"127.0.0.1:{port}"]
    cluster = SlurmCluster(nodes=1, gpus=8, root=root / "c", extra_conf="\n".join(lines))
    conf.symlink_to(root / "c" / "slurm.conf")
    (tmp / "agg").mkdir()
    try:
        with start_aggregator(tmp / "agg", None, {}, port=agg_port) as agg, \
                service("agent", argv, tmp, port=port, ready_timeout=90,
                        ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200
                        and bool(json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["results"])) as agent:
            agent.extra["agg"] = agg
            cluster.start()
            try:
                yield agent, cluster, tmp
            finally:
                cluster.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _sim(agent: Service, tmp: Path, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "podhealth", "simulate", *args, "--root", str(tmp / "sim")],
                   check=True, capture_output=True, timeout=60)


def _agg_events(agg: Service) -> list[dict[str, object]]:
    items = json.loads(http_get(f"{agg.url}/api/v1/nodes/dgx01/history?limit=300")[1]).get("items", [])
    return [i["event"]["event"] for i in items if i.get("type") == "event" and (i.get("event") or {}).get("event")]


def _agg_evidence(agg: Service) -> dict[tuple[str, str], str]:
    rep = json.loads(http_get(f"{agg.url}/api/v1/nodes/dgx01")[1]).get("report") or {}
    return {(r["check"], r["entity"]): r["evidence"].get("job", "") for r in rep.get("results", [])}


def _job_series(agent: Service) -> set[tuple[str, str, str]]:
    text = http_get(f"{agent.url}/metrics")[1].decode()
    out = set()
    for line in text.splitlines():
        if line.startswith("podhealth_gpu_job_info{"):
            labels = dict(kv.split("=", 1) for kv in line[line.index("{") + 1:line.index("}")].split(","))
            out.add((labels["gpu"].strip('"'), labels["job_id"].strip('"'), labels.get("user", "").strip('"')))
    return out


def _evidence_jobs(agent: Service) -> dict[str, str]:
    body = json.loads(http_get(f"{agent.url}/health")[1])
    return {r["entity"]: r["evidence"]["job"] for r in body["results"] if "job" in r["evidence"]}


def test_prolog_records_the_job_and_the_agent_reports_it(setup: tuple[Service, SlurmCluster, Path]) -> None:
    agent, c, tmp = setup
    assert _job_series(agent) == set()
    job = c.run("sbatch", "--parsable", "-w", "dgx01", "--gres=gpu:2", "-o", "/dev/null", "--wrap", "sleep 120").stdout.strip()
    try:
        wait_until(lambda: c.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "RUNNING",
                   60, 0.2, "the job to run")
        # Which GPUs slurmd gave it, as Slurm itself says (scontrol -d: GRES=gpu:2(IDX:0-1)).
        detail = c.run("scontrol", "-d", "show", "job", job).stdout
        assert "IDX:0-1" in detail, detail
        user = c.run("squeue", "-h", "-j", job, "-o", "%u").stdout.strip()
        want = {("0", job, user), ("1", job, user)}
        wait_until(lambda: _job_series(agent) == want, 30, 0.2, f"the agent to report job {job} on GPUs 0-1")
        label = f"slurm job {job} ({user})"
        wait_until(lambda: {e for e, j in _evidence_jobs(agent).items() if j == label} >= {"gpu0", "gpu1"},
                   30, 0.2, "the GPUs' /health evidence to name the job")
        assert not [e for e in _evidence_jobs(agent) if e not in ("gpu0", "gpu1")]
        rec = json.loads((tmp / "jobs" / f"slurm-{job}.json").read_text())
        assert (rec["job_id"], rec["user"], rec["gpus"]) == (job, user, [0, 1])
        wait_until(lambda: sorted(os.listdir(tmp / "map")) == ["0", "1"], 30, 0.2, "dcgm-exporter mapping files")
        assert (tmp / "map" / "0").read_text() == f"{job}\n"

        # An XID 79 on the job's GPU 1: the aggregator hears which job it hurts.
        _sim(agent, tmp, "inject", "dgx01", "xid=79", "gpu=1")
        agg = agent.extra["agg"]
        assert isinstance(agg, Service)
        wait_until(lambda: [e for e in _agg_events(agg) if e.get("gpu") == 1 and e.get("code") == 79], 60, 0.2,
                   "the XID event at the aggregator")
        # (the kernel's line and NVML's event for the same XID: each names the job)
        assert {e.get("job") for e in _agg_events(agg) if e.get("gpu") == 1} == {label}
        wait_until(lambda: _agg_evidence(agg).get(("xid", "gpu1")) == label, 60, 0.2,
                   "the aggregator's report of gpu1 to name the job")
    finally:
        c.run("scancel", job, check=False)
        _sim(agent, tmp, "clear", "dgx01")
    # The epilog removes the record: the job is gone from the series, the evidence and the files.
    wait_until(lambda: not (tmp / "jobs" / f"slurm-{job}.json").exists(), 60, 0.2, "the epilog to remove the record")
    wait_until(lambda: _job_series(agent) == set(), 30, 0.2, "the agent to report no job")
    wait_until(lambda: not _evidence_jobs(agent), 30, 0.2, "the evidence to drop the job")
    wait_until(lambda: os.listdir(tmp / "map") == [], 30, 0.2, "the mapping files to go")
