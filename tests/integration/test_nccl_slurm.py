"""Multi-node NCCL localisation for real: pair tests through srun on the loopback Slurm cluster
(dgx01..04, all on this host) with podhealth's CPU (Gloo) runner, one rank per node.

dgx03 is made slow through the runner's documented fault seam (`--fault slow:dgx03`: the rank
on that Slurm node sleeps in every timed iteration), so every pair containing it measures a
lower bus bandwidth; the localiser must name dgx03 and only dgx03.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.harness.slurm import slurm_fixture

pytestmark = pytest.mark.integration
pytest.importorskip("torch", reason="the runner needs PyTorch (pip install torch==2.13.0, the burnin extra)")

slurm = slurm_fixture(nodes=4)


def test_pairwise_localises_the_slow_node(slurm) -> None:  # type: ignore[no-untyped-def]
    argv = [sys.executable, "-m", "podhealth", "nccl", "--nodes", "dgx[01-04]", "--device", "cpu",
            "--min-bytes", "262144", "--max-bytes", "1048576", "--iters", "3", "--warmup", "1",
            "--timeout", "90", "--slow-pct", "50", "--runner-fault", "slow:dgx03", "--format", "json",
            "--profile", "generic"]
    r = subprocess.run(argv, env=slurm.env, capture_output=True, timeout=400, check=False)
    out = r.stdout.decode()
    assert out.strip(), r.stderr.decode()[-3000:]
    rep = json.loads(out)
    by = {x["entity"]: x for x in rep["results"]}
    assert set(by) == {"dgx01", "dgx02", "dgx03", "dgx04"}, out
    assert by["dgx03"]["status"] == "WARN", out      # slow, not broken: WARN with DRAIN advice
    assert by["dgx03"]["action"] == "DRAIN" and "known-good" in by["dgx03"]["evidence"]["reason"]
    assert all(by[n]["status"] == "OK" for n in ("dgx01", "dgx02", "dgx04")), out
    # Round one (dgx01-dgx02, dgx03-dgx04), then dgx03 and dgx04 against good nodes: four real jobs.
    pairs = by["dgx03"]["evidence"]["pairs"].split("; ")
    assert len(pairs) == 2 and all(":fail" in p for p in pairs)
    assert r.returncode == 0          # WARN passes; the report, not the exit code, carries the advice
