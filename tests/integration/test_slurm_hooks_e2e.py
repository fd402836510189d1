"""Slurm's own hooks as slurmd runs them: HealthCheckProgram and Prolog, no arguments, on a real
loopback Slurm with a simulated agent.

- slurmd itself runs `podhealth-slurm-healthcheck` every HealthCheckInterval: a fault in the
  simulated node drains the node with a `podhealth:` reason; once the node is good again the
  program resumes its own drain.
- `podhealth-slurm-prolog` judges only the job's GPUs (SLURM_JOB_GPUS from a gpu GRES): a job on
  GPUs 0-1 runs while GPU 5 is broken; a job that gets GPU 5 never starts, the node is drained
  with podhealth's reason and the job goes back to the queue.

The wrappers only set what slurmd does not pass (this test's config and slurm.conf paths; on a
real node both live at their default paths) and exec the console scripts with no arguments.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until
from tests.harness.slurm import SlurmCluster, missing_binaries

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONFIG = """
node: {name: dgx01, profile: dgx-h100}
listen: {port: %(port)d}
checks:
  damping: {fail_after: 1, recover_after: 1}
  grace: 0
  slurm_drain: always
  agents: {dgx01: "http://127.0.0.1:%(port)d"}
collectors:
  nvml: {interval: 1, timeout: 2}
  nvlink: {interval: 1, timeout: 2}
  infiniband: {interval: 1, timeout: 2}
  host: {interval: 1, timeout: 2}
  kmsg: {interval: 0.5, timeout: 2}
  nfs: {interval: 1, timeout: 3, mounts: [{path: /home, timeout: 1}]}
  jobs: {state_dir: %(jobs)s}
"""


def _script(name: str) -> str:
    here = Path(sys.executable).parent / name
    found = str(here) if here.exists() else shutil.which(name)
    if not found:
        pytest.skip(f"{name} is not installed (pip install -e . installs the console scripts)")
    return found


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("hooks")
    port = free_port()
    cfg = tmp / "podhealth.yaml"
    cfg.write_text(CONFIG % {"port": port, "jobs": tmp / "jobs"})
    argv = [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
            "--sim-root", str(tmp / "sim"), "--listen", f"127.0.0.1:{port}"]
    with service("agent", argv, tmp, port=port,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200
                 and json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["status"] == "OK",
                 ready_timeout=90) as svc:
        svc.extra.update(root=tmp / "sim", cfg=cfg)
        yield svc


def _wrapper(dirpath: Path, hook: str, cfg: Path, conf: Path) -> Path:
    p = dirpath / f"podhealth-{hook}"
    p.write_text(f"#!/bin/sh\nexport PODHEALTH_CONFIG={cfg} SLURM_CONF={conf}\n"
                 f"exec {_script('podhealth-slurm-' + hook)}\n")
    p.chmod(0o755)
    return p


@pytest.fixture()
def cluster_with(agent: Service) -> Iterator[object]:
    missing = missing_binaries()
    if missing:
        pytest.skip(f"loopback Slurm needs {', '.join(missing)}")
    started: list[tuple[SlurmCluster, Path]] = []

    def start(**hooks: str) -> SlurmCluster:
        # Our own root so the wrappers can name slurm.conf before slurmd first runs them.
        root = Path(tempfile.mkdtemp(prefix="phslurm-", dir="/tmp"))
        root.chmod(0o755)  # munged: every directory above its socket must be o+x
        conf = root / "slurm.conf"
        lines = []
        for key, hook in hooks.items():
            lines.append(f"{key}={_wrapper(root, hook, agent.extra['cfg'], conf)}")
        if "HealthCheckProgram" in hooks:
            lines.append("HealthCheckInterval=2")
        c = SlurmCluster(nodes=1, gpus=8, root=root / "c", extra_conf="\n".join(lines))
        # The wrappers point at <root>/slurm.conf; the cluster writes its own under root/c.
        conf.symlink_to(root / "c" / "slurm.conf")
        c.start()
        started.append((c, root))
        return c

    yield start
    for c, root in started:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


def _sim(a: Service, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "podhealth", "simulate", *args, "--root", str(a.extra["root"])],
                   check=True, capture_output=True, timeout=60)


def _status(a: Service) -> str:
    return str(json.loads(http_get(f"{a.url}/health")[1])["status"])


def _node(c: SlurmCluster) -> tuple[str, str]:
    state, reason = c.run("sinfo", "-N", "-h", "-n", "dgx01", "-o", "%T|%E").stdout.strip().split("|", 1)
    return state.rstrip("*"), reason


def test_slurmd_runs_the_healthcheck_which_drains_and_resumes_its_own(agent: Service, cluster_with) -> None:  # type: ignore[no-untyped-def]
    c = cluster_with(HealthCheckProgram="healthcheck")
    assert _node(c)[0] == "idle"
    _sim(agent, "inject", "dgx01", "fault=dbe", "gpu=3")
    try:
        wait_until(lambda: _node(c)[0] in ("drained", "draining"), 60, 0.2, "slurmd's health check to drain dgx01")
        state, reason = _node(c)
        assert reason.startswith("podhealth: ecc gpu3"), reason
    finally:
        _sim(agent, "clear", "dgx01")
    wait_until(lambda: _status(agent) == "OK", 60, 0.2, "the agent to judge OK")
    wait_until(lambda: _node(c)[0] == "idle", 60, 0.2, "the health check to resume its own drain")


def test_prolog_judges_only_the_jobs_gpus(agent: Service, cluster_with, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    c = cluster_with(Prolog="prolog")
    _sim(agent, "inject", "dgx01", "fault=dbe", "gpu=5")
    try:
        wait_until(lambda: _status(agent) == "FAIL", 60, 0.2, "the agent to judge FAIL")
        ran = tmp_path / "ran-small"
        small = c.run("srun", "-w", "dgx01", "--gres=gpu:2", "sh", "-c", f"echo $SLURM_JOB_ID $CUDA_VISIBLE_DEVICES > {ran}",
                      timeout=60, check=False)
        assert small.returncode == 0, small.stderr
        small_id, visible = ran.read_text().split()
        assert visible == "0,1"
        # The job ran and the prolog left the node in service (it passes through "completing").
        wait_until(lambda: _node(c)[0] == "idle", 60, 0.2, "dgx01 idle again after the small job")

        big = tmp_path / "ran-big"
        job = c.run("sbatch", "--parsable", "-w", "dgx01", "--gres=gpu:8", "-o", "/dev/null",
                    "--wrap", f"touch {big}").stdout.strip()
        wait_until(lambda: _node(c)[0] in ("drained", "draining"), 60, 0.2, "the failed prolog to drain dgx01")
        state, reason = _node(c)
        assert "podhealth: ecc gpu5" in reason, reason
        wait_until(lambda: c.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() == "PENDING",
                   60, 0.2, "the job to be requeued")
        assert not big.exists(), "the job ran on a node whose GPU failed the prolog"
        # The prolog recorded the small job's GPUs (no Epilog here to remove it) and took back the
        # record of the job it failed: that one holds no GPUs on this node.
        assert sorted(p.name for p in (Path(str(agent.extra["root"])).parent / "jobs").iterdir()) == [f"slurm-{small_id}.json"]
        c.run("scancel", job, check=False)
    finally:
        _sim(agent, "clear", "dgx01")
