"""The short active tests of the handover suite: burn-in, single-node NCCL and the fail-slow probes,
when CUDA is usable.

Each runs as its own `podhealth burnin|nccl --format json` process: PyTorch and the GPU work stay
out of the agent (its memory and its event loop), and a crash or hang there is one UNKNOWN
result, not a dead agent.
"""

from __future__ import annotations

import asyncio
import json
import sys
from functools import lru_cache

from podhealth.checks.handover.suite import ActiveTest
from podhealth.checks.handover.report import SuiteReport
from podhealth.checks.passive.result import unknown
from podhealth.config import Config
from podhealth.vocab import CheckResult

HANDOVER_BURNIN_S = 30.0
GRACE_S = 120.0


@lru_cache(maxsize=1)
def cuda_devices() -> int:
    """CUDA devices PyTorch can use (0 without torch or a GPU). Asked in a subprocess: importing
    torch costs the agent hundreds of MiB it would never give back."""
    import subprocess

    try:
        r = subprocess.run([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
                           capture_output=True, text=True, timeout=60)
        return int(r.stdout.strip() or 0) if r.returncode == 0 else 0
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return 0


async def _run_json(name: str, argv: list[str], timeout: float) -> list[CheckResult]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "podhealth", *argv, "--format", "json",
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        return [unknown(name, "node", f"`podhealth {' '.join(argv)}` did not finish within {timeout:g}s")]
    try:
        return list(SuiteReport.from_json(json.loads(out)).results)
    except (ValueError, KeyError, TypeError):
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        return [unknown(name, "node", f"`podhealth {' '.join(argv)}` exited {proc.returncode}: {tail[0][:200]}")]


def active_tests(cfg: Config) -> list[ActiveTest]:
    mode = cfg.checks.handover_active
    if mode == "never" or (mode == "auto" and cuda_devices() == 0):
        return []
    burn_s = min(cfg.active.burnin.duration, HANDOVER_BURNIN_S)
    return [
        ActiveTest("burnin", lambda: _run_json("burnin", ["burnin", "--duration", f"{burn_s:g}"], burn_s + GRACE_S)),
        ActiveTest("nccl_allreduce", lambda: _run_json("nccl_allreduce", ["nccl"], GRACE_S * 2)),
        # The fail-slow fingerprint: figures (with their fraction of the profile's peak) for the
        # report; the aggregator judges them against the fleet when the agent sends them.
        ActiveTest("perfprobe", lambda: _run_json("perfprobe", ["perfprobe", "--budget", f"{cfg.failslow.budget:g}"],
                                                  cfg.failslow.budget + GRACE_S)),
    ]
