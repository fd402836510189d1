"""An impostor on the agent's port releases nothing, on a real loopback Slurm.

The attack as it was: a node fenced for a real XID 79 (`podhealth agent --simulate`, the Slurm
fencer draining it through scontrol); its agent goes down; a local user binds the agent's port
and answers {"status": "OK"} to every pull and to the handover suite. The aggregator released
the node in 5.2 s, and sent it the node's agent token. Now the answers carry no proof by the
node's agent key: they are "could not tell", the node stays drained with podhealth's reason, and
what reached the impostor carries no credential.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from podhealth.config_aggregator import AggAuthConfig, NodeEntry, RetryConfig
from podhealth.credentials import derive_agent_token
from podhealth.aggregator.model import FenceMode
from podhealth.fencing.slurm import SlurmFencer
from tests.harness.agg import config, running
from tests.harness.fakeagent import Impostor
from tests.harness.proc import free_port, http_get, service
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

slurm = slurm_fixture(nodes=2)
SECRET = "impostor-test-cluster-secret-0123456789"
OK = {"node": "dgx01", "version": "x", "profile": "dgx-h100", "time": 1.0, "status": "OK", "exit_code": 0,
      "results": [{"check": "xid", "entity": "gpu3", "status": "OK", "action": "NONE"}]}


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def _state(c: SlurmCluster) -> tuple[str, str]:
    state, reason = c.run("sinfo", "-N", "-h", "-n", "dgx01", "-o", "%T|%E").stdout.strip().split("|", 1)
    return state.rstrip("*"), reason


@pytest.fixture
def node(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm
    if _state(slurm)[0] != "idle":
        slurm.run("scontrol", "update", "NodeName=dgx01", "State=RESUME")


async def test_an_impostor_on_a_fenced_nodes_agent_port_releases_nothing(node: SlurmCluster, tmp_path: Path) -> None:
    port = free_port()
    agent_cfg = tmp_path / "agent.yaml"
    agent_cfg.write_text(json.dumps({
        "auth": {"token": derive_agent_token(SECRET, "dgx01")},  # as `podhealth token derive --agent` provisions it
        "checks": {"damping": {"fail_after": 1, "recover_after": 1}, "grace": 0},
        "collectors": {"nfs": {"enabled": False}, "kmsg": {"interval": 0.5, "timeout": 2}},
    }))
    url = f"http://127.0.0.1:{port}"
    cfg = dataclasses.replace(
        config(tmp_path, healthy_for=0.5, pull_interval=0.2, pull_timeout=2.0, unreachable_after=3600.0,
               retries=RetryConfig(attempts=1, backoff=0.1, max_backoff=0.5),
               auth=AggAuthConfig(cluster_secret=SECRET)),
        nodes=(NodeEntry(name="dgx01", agent_url=url, partition="gpu"),))
    fencer = SlurmFencer(slurm_conf=node.conf, env=node.env, timeout=5.0)
    argv = [sys.executable, "-m", "podhealth", "agent", "--config", str(agent_cfg), "--simulate", "dgx-h100",
            "--sim-root", str(tmp_path / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"]
    async with running(cfg, [fencer]) as (agg, _):
        with service("agent", argv, tmp_path, port=port, ready=lambda: http_get(f"{url}/health")[0] == 200,
                     ready_timeout=90):
            await until(lambda: agg.mem.nodes["dgx01"].last_seen > 0, 60, "a proven pull of the real agent")
            r = await asyncio.to_thread(
                __import__("subprocess").run,
                [sys.executable, "-m", "podhealth", "simulate", "inject", "dgx01", "xid=79", "gpu=3",
                 "--root", str(tmp_path / "sim")], capture_output=True, timeout=60)
            assert r.returncode == 0, r.stderr
            await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED, 90, "the fence for XID 79")
        # The agent is gone (stopped above); a local user takes its port and says all is well.
        state, reason = _state(node)
        assert state in ("drained", "draining") and reason.startswith("podhealth: xid gpu3"), (state, reason)
        with Impostor(OK, port=port) as imp:
            await until(lambda: agg.mem.nodes["dgx01"].unreachable_since is not None, 30,
                        "the impostor's answers to count as 'could not tell'")
            seen = len(imp.requests)
            # Many times healthy_for of "OK" answers: the old code had released the node by now.
            await until(lambda: len(imp.requests) >= seen + 15, 60, "more pulls of the impostor")
            rec: Any = agg.mem.nodes["dgx01"]
            assert rec.fence is FenceMode.FENCED and rec.handover != "passed"
            assert _state(node) == (state, reason)  # still drained, podhealth's reason untouched
            sent = b"".join(imp.requests)
            assert b"Authorization" not in sent and derive_agent_token(SECRET, "dgx01").encode() not in sent
