"""`podhealth check --slurm-health --drain-self` against a real loopback Slurm and a simulated agent:
a FAIL drains the node with the podhealth reason; a pass resumes only podhealth's own drain,
never a hand drain (LBNL NHC's rule)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Iterator

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

slurm = slurm_fixture(nodes=2)
CONFIG = """
node: {name: dgx01}
listen: {port: %d}
# a port down over 2 s drains (shipped: 240 s); a down/up cycle is a flap WARN for 5 s (shipped: 12 h)
checks: {damping: {fail_after: 1, recover_after: 1}, overrides: {network.down_max_s: 2, network.flap_window_s: 5}}
collectors:
  nvml: {interval: 1, timeout: 2}
  nvlink: {interval: 1, timeout: 2}
  infiniband: {interval: 1, timeout: 2}
  host: {interval: 1, timeout: 2}
  kmsg: {interval: 0.5, timeout: 2}
  nfs: {interval: 1, timeout: 3, mounts: [{path: /home, timeout: 1}, {path: /cm/shared, timeout: 1}]}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("drainself")
    port = free_port()
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG % port)
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp / "sim"), "--listen", f"127.0.0.1:{port}"], tmp, port=port,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200
                 and json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["status"] == "OK", ready_timeout=60) as svc:
        svc.extra.update(root=tmp / "sim", cfg=cfg)
        yield svc


def _status(a: Service) -> str:
    return str(json.loads(http_get(f"{a.url}/health")[1])["status"])


def _health_check(a: Service, c: SlurmCluster) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "check", "--slurm-health", "--drain-self",
                           "--config", str(a.extra["cfg"])], env=c.env, capture_output=True, text=True, timeout=30)


def _sim(a: Service, *args: str) -> None:
    subprocess.run([sys.executable, "-m", "podhealth", "simulate", *args, "--root", str(a.extra["root"])],
                   check=True, capture_output=True, timeout=60)


def _reason(c: SlurmCluster, node: str) -> tuple[str, str]:
    state, reason = c.run("sinfo", "-N", "-h", "-n", node, "-o", "%T|%E").stdout.strip().split("|", 1)
    # A trailing `*` (not responding: a slurmd slow to answer on a loaded host) is not our business.
    return state.rstrip("*"), reason


def test_fail_drains_pass_resumes_only_ours(agent: Service, slurm: SlurmCluster) -> None:
    ok = _health_check(agent, slurm)
    assert ok.returncode == 0 and _reason(slurm, "dgx01")[0] == "idle", ok.stdout + ok.stderr
    _sim(agent, "inject", "dgx01", "fault=ib-down", "device=mlx5_4")
    wait_until(lambda: _status(agent) == "FAIL", 30, 0.2, "the agent to judge FAIL")
    bad = _health_check(agent, slurm)
    assert bad.returncode == 1 and "ib_port mlx5_4/1" in bad.stdout
    state, reason = _reason(slurm, "dgx01")
    assert state in ("drained", "draining") and reason.startswith("podhealth: ib_port mlx5_4/1 DRAIN"), (state, reason)
    again = _health_check(agent, slurm)  # idempotent: the reason is not rewritten
    assert again.returncode == 1 and _reason(slurm, "dgx01")[1] == reason
    _sim(agent, "clear", "dgx01")
    wait_until(lambda: _status(agent) == "OK", 30, 0.2, "the agent to judge OK")
    res = _health_check(agent, slurm)
    assert res.returncode == 0 and "resumed dgx01" in res.stderr
    wait_until(lambda: _reason(slurm, "dgx01")[0] == "idle", 10, 0.1, "dgx01 idle again")


def test_hand_drain_is_never_resumed(agent: Service, slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "NodeName=dgx01", "State=DRAIN", "Reason=bad DIMM, ticket 42")
    try:
        r = _health_check(agent, slurm)
        assert r.returncode == 0
        state, reason = _reason(slurm, "dgx01")
        assert state in ("drained", "draining") and reason == "bad DIMM, ticket 42"
    finally:
        slurm.run("scontrol", "update", "NodeName=dgx01", "State=RESUME")
