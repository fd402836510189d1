"""The Slurm hooks believe only the node's agent, on a real loopback Slurm.

While the agent was down, a local user bound its port: with `checks.slurm_drain: always`,
`podhealth-slurm-healthcheck` resumed podhealth's own drain of a failing node on a forged OK,
and drained a healthy node on a forged FAIL; the prolog failed jobs on forged FAILs. An answer
that is not proven with the node's agent key is now UNKNOWN: nothing is resumed or drained, the
job runs. A stand-in holding the key (what the real agent does) is believed, so the same setup
does drain: the test can see a drain when one happens.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from aiohttp import web

from tests.harness.fakeagent import Impostor, proving_middleware
from tests.harness.proc import free_port
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

slurm = slurm_fixture(nodes=2)
KEY = "dgx01-agent-key-" + "0" * 48
HEALTHY = {"node": "dgx01", "version": "x", "profile": "dgx-h100", "time": 1.0,
           "results": [{"check": "xid", "entity": "gpu3", "status": "OK", "action": "NONE"}]}
FAILING = {"node": "dgx01", "version": "x", "profile": "dgx-h100", "time": 1.0,
           "results": [{"check": "xid", "entity": "gpu3", "status": "FAIL", "action": "RESET_GPU",
                        "summary": "XID 79"}]}
OURS = "podhealth: xid gpu3 RESET_GPU [f1]"


def _config(tmp: Path, url: str) -> Path:
    key = tmp / "agent.key"
    key.write_text(KEY + "\n")
    key.chmod(0o600)
    cfg = tmp / "podhealth.yaml"
    cfg.write_text(f"node: {{name: dgx01}}\nauth: {{token_file: {key}}}\n"
                   f"checks: {{slurm_drain: always, agents: {{dgx01: '{url}'}}}}\n"
                   f"collectors: {{jobs: {{state_dir: {tmp / 'jobs'}}}}}\n")
    return cfg


def _hook(c: SlurmCluster, cfg: Path, hook: str, **env: str) -> subprocess.CompletedProcess[str]:
    code = f"import sys; from podhealth.checks.cli.slurm_hooks import {hook}_main as m; sys.exit(m([]))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**c.env, "PODHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "dgx01", **env})


def _state(c: SlurmCluster) -> tuple[str, str]:
    state, reason = c.run("sinfo", "-N", "-h", "-n", "dgx01", "-o", "%T|%E").stdout.strip().split("|", 1)
    return state.rstrip("*"), reason


@pytest.fixture
def node(slurm: SlurmCluster) -> Iterator[SlurmCluster]:
    yield slurm
    if _state(slurm)[0] != "idle":  # RESUME of an idle node is an error in Slurm
        slurm.run("scontrol", "update", "NodeName=dgx01", "State=RESUME")


def test_a_forged_ok_does_not_resume_podhealths_drain(node: SlurmCluster, tmp_path: Path) -> None:
    node.run("scontrol", "update", "NodeName=dgx01", "State=DRAIN", f"Reason={OURS}")
    with Impostor(HEALTHY) as imp:
        r = _hook(node, _config(tmp_path, imp.url), "healthcheck")
    assert r.returncode == 2 and "not proven" in r.stdout, r.stdout + r.stderr
    state, reason = _state(node)
    assert state in ("drained", "draining") and reason == OURS, (state, reason)


@pytest.mark.parametrize("hook", ["healthcheck", "prolog"])
def test_a_forged_fail_drains_nothing(node: SlurmCluster, tmp_path: Path, hook: str) -> None:
    with Impostor(FAILING) as imp:
        r = _hook(node, _config(tmp_path, imp.url), hook, SLURM_JOB_ID="42", SLURM_JOB_GPUS="3")
    assert r.returncode == (2 if hook == "healthcheck" else 0), r.stdout + r.stderr
    assert "not proven" in r.stdout + r.stderr
    assert _state(node)[0] == "idle", _state(node)


async def test_the_real_agents_proven_fail_does_drain(node: SlurmCluster, tmp_path: Path) -> None:
    """The control: a stand-in that proves its answers with the node's key is believed."""
    async def health(request: web.Request) -> web.Response:
        return web.json_response(FAILING, status=503)
    app = web.Application(middlewares=[proving_middleware(KEY, "dgx01")])
    app.router.add_get("/health", health)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        import asyncio

        r: Any = await asyncio.to_thread(_hook, node, _config(tmp_path, f"http://127.0.0.1:{port}"), "healthcheck")
    finally:
        await runner.cleanup()
    assert r.returncode == 1, r.stdout + r.stderr
    state, reason = _state(node)
    assert state in ("drained", "draining") and reason.startswith("podhealth: xid gpu3"), (state, reason)
    assert os.environ.get("PODHEALTH_CONFIG") is None  # nothing leaked into this process
