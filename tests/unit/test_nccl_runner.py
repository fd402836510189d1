"""podhealth's torch.distributed all-reduce runner, really run: two Gloo ranks on this CPU."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from podhealth.checks.active import nccl
from podhealth.vocab import Status

pytest.importorskip("torch", reason="the runner needs PyTorch (pip install torch==2.13.0, the burnin extra)")


def test_two_gloo_ranks_produce_a_parsed_table() -> None:
    r = subprocess.run([sys.executable, "-m", "podhealth.checks.active.nccl_runner", "--nproc", "2", "--device", "cpu",
                        "--min-bytes", "4096", "--max-bytes", "262144", "--iters", "3", "--warmup", "1",
                        "--timeout", "60"], capture_output=True, timeout=120, check=False)
    out = r.stdout.decode()
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    run = nccl.parse(out)
    assert [row.size_bytes for row in run.rows] == [4096 * 2 ** i for i in range(7)]
    assert all(row.wrong == 0 for row in run.rows) and run.out_of_bounds == 0
    assert all(row.oop_time_us > 0 and row.busbw > 0 for row in run.rows)
    # busbw = algbw * 2(n-1)/n with n = 2: equal, as nccl-tests prints for two ranks
    assert all(row.oop_busbw == pytest.approx(row.oop_algbw, rel=0.05, abs=1e-4) for row in run.rows)
    assert [d.rank for d in run.devices] == [0, 1] and run.avg_busbw is not None
    assert nccl.judge(run, nccl.Gates()).status is Status.OK


def test_cli_json_and_injected_rank_failure() -> None:
    """The `podhealth nccl` command end to end; a rank that fails at start makes it FAIL, exit 1."""
    me = socket.gethostname().split(".")[0]
    r = subprocess.run([sys.executable, "-m", "podhealth", "nccl", "--device", "cpu", "--format", "json",
                        "--min-bytes", "4096", "--max-bytes", "8192", "--iters", "2", "--timeout", "20",
                        "--runner-fault", f"fail:{me}", "--profile", "generic"],
                       capture_output=True, timeout=120, check=False)
    rep = json.loads(r.stdout)
    assert r.returncode == 1, r.stdout.decode()[-2000:]
    res = rep["results"][0]
    assert res["check"] == "nccl_allreduce" and res["status"] == "FAIL"
    assert "injected failure" in res["summary"]
