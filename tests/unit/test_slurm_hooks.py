"""The Slurm hook entry points' pure parts: the job's GPUs, which results count, when to drain."""

from __future__ import annotations

import dataclasses
import os
import resource
import subprocess
import sys

import pytest

from podhealth.checks.cli.slurm_hooks import agent_base, for_job, job_gpus, node_name, prolog_main, should_drain
from podhealth.collectors.job_records import GpuListOutOfBounds
from podhealth.config import Config
from podhealth.vocab import Action, CheckResult, Status
from tests.conftest import REPO


def _r(check: str, entity: str, status: Status = Status.FAIL) -> CheckResult:
    return CheckResult(check=check, status=status, entity=entity, action=Action.DRAIN)


@pytest.mark.parametrize("env,want", [
    ({"SLURM_JOB_GPUS": "0,1"}, {0, 1}),
    ({"SLURM_JOB_GPUS": "2-4,7"}, {2, 3, 4, 7}),
    ({"CUDA_VISIBLE_DEVICES": "5"}, {5}),
    ({"SLURM_JOB_GPUS": "", "CUDA_VISIBLE_DEVICES": ""}, None),
    ({"CUDA_VISIBLE_DEVICES": "GPU-1234"}, None),  # UUIDs: no index to filter by, judge all GPUs
    ({}, None),
])
def test_job_gpus(env: dict[str, str], want: set[int] | None) -> None:
    got = job_gpus(env)
    assert (None if got is None else set(got)) == want


def test_only_the_jobs_gpus_but_every_node_wide_result() -> None:
    rs = [_r("ecc", "gpu5"), _r("ecc", "gpu1"), _r("ib_port", "mlx5_0/1"), _r("nfs_mount", "/home"), _r("gpu_count", "node")]
    kept = [r.entity for r in for_job(rs, frozenset({0, 1}))]
    assert kept == ["gpu1", "mlx5_0/1", "/home", "node"]
    assert len(for_job(rs, None)) == len(rs)


def test_drain_mode_follows_the_aggregator() -> None:
    cfg = Config()
    assert should_drain(cfg)  # no aggregator: the health check is the only one who can drain
    with_agg = dataclasses.replace(cfg, publish=dataclasses.replace(cfg.publish, aggregator_url="http://agg:9420"))
    assert not should_drain(with_agg)
    always = dataclasses.replace(with_agg, checks=dataclasses.replace(with_agg.checks, slurm_drain="always"))
    never = dataclasses.replace(cfg, checks=dataclasses.replace(cfg.checks, slurm_drain="never"))
    assert should_drain(always) and not should_drain(never)


def test_node_and_agent_come_from_slurmd_and_config() -> None:
    cfg = Config()
    assert node_name(cfg, {"SLURMD_NODENAME": "dgx07"}) == "dgx07"
    agents = dataclasses.replace(cfg, checks=dataclasses.replace(cfg.checks, agents={"dgx07": "http://127.0.0.1:1234/"}))
    assert agent_base(agents, "dgx07") == "http://127.0.0.1:1234"
    assert agent_base(cfg, "dgx07") == f"http://127.0.0.1:{cfg.listen.port}"


def test_a_prolog_that_cannot_judge_lets_the_job_run(monkeypatch: pytest.MonkeyPatch, tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    # A broken config is our problem, not the node's: a non-zero prolog would drain it.
    bad = tmp_path / "podhealth.yaml"
    bad.write_text("checks: {prolog_budget: -1}\n")
    monkeypatch.setenv("PODHEALTH_CONFIG", str(bad))
    assert prolog_main([]) == 0
    assert "could not judge" in capsys.readouterr().err


@pytest.mark.parametrize("raw", ["0-99999999", "64", "0-64", "9" * 5000, ",".join(["0-7"] * 400),
                                 "1" + "0" * 4000])
def test_a_gpu_list_beyond_any_node_is_refused_before_it_is_expanded(raw: str) -> None:
    with pytest.raises(GpuListOutOfBounds):
        job_gpus({"SLURM_JOB_GPUS": raw})


def test_a_huge_gpu_range_leaves_the_job_undecided_and_running(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """SLURM_JOB_GPUS=0-99999999 once grew the prolog to 13 GiB. Run as slurmd would, in a child
    whose address space is capped at 1 GiB: it exits 0 (the job runs, the node is not drained),
    says why on stderr, and never expands the range (a MemoryError would read "could not judge")."""
    cfg = tmp_path / "podhealth.yaml"
    cfg.write_text(f"collectors: {{jobs: {{state_dir: {tmp_path / 'jobs'}}}}}\n")
    env = {"PATH": os.environ.get("PATH", ""), "PODHEALTH_CONFIG": str(cfg), "SLURM_JOB_ID": "1234",
           "SLURM_JOB_GPUS": "0-99999999", "SLURMD_NODENAME": "dgx01"}

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    r = subprocess.run([sys.executable, "-c", "import sys; from podhealth.checks.cli.slurm_hooks import prolog_main;"
                        " sys.exit(prolog_main())"], env=env, capture_output=True, text=True, timeout=60,
                       preexec_fn=cap, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert "job 1234 on dgx01: undecided" in r.stderr and "out of bounds" in r.stderr, r.stderr
    assert "could not judge" not in r.stderr and not (tmp_path / "jobs").exists()


def test_an_index_beyond_the_nodes_profile_is_out_of_bounds() -> None:
    assert job_gpus({"SLURM_JOB_GPUS": "0-7"}, node_gpus=8) == frozenset(range(8))
    with pytest.raises(GpuListOutOfBounds, match="0 to 7"):
        job_gpus({"SLURM_JOB_GPUS": "6-8"}, node_gpus=8)  # a DGX H100 has no GPU 8
    assert job_gpus({"SLURM_JOB_GPUS": "40"}, node_gpus=0) == frozenset({40})  # a profile without a count


@pytest.mark.parametrize("hook", ["healthcheck", "prolog", "epilog"])
def test_help_version_and_stray_arguments_judge_and_change_nothing(tmp_path, hook: str) -> None:  # type: ignore[no-untyped-def]
    """`podhealth-slurm-healthcheck --help` judged the host and tried to drain it."""
    import subprocess
    import sys

    from tests.harness.fakeagent import Impostor

    with Impostor({"node": "dgx01", "results": [{"check": "xid", "entity": "gpu0", "status": "FAIL",
                                                 "action": "DRAIN"}]}) as agent:
        cfg = tmp_path / "podhealth.yaml"
        cfg.write_text(f"node: {{name: dgx01}}\nchecks: {{slurm_drain: always, agents: {{dgx01: '{agent.url}'}}}}\n")
        code = f"import sys; from podhealth.checks.cli.slurm_hooks import {hook}_main as m; sys.exit(m())"
        env = {"PATH": "/nonexistent", "PODHEALTH_CONFIG": str(cfg), "SLURM_JOB_ID": "7", "SLURMD_NODENAME": "dgx01"}

        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60,
                                  env=env, cwd=tmp_path)
        for args in (["--help"], ["-h"]):
            p = run(*args)
            assert p.returncode == 0 and f"usage: podhealth-slurm-{hook}" in p.stdout, p
        p = run("--version")
        assert p.returncode == 0 and p.stdout.startswith(f"podhealth-slurm-{hook} "), p
        for args in (["--drain"], ["now"], ["--help", "x"]):
            p = run(*args)
            assert p.returncode == 64 and "nothing was judged" in p.stderr, p
        assert agent.requests == []  # the agent was never asked: nothing judged, nothing drained
        assert not (tmp_path / "jobs").exists()


@pytest.mark.parametrize("hook", ["healthcheck", "prolog"])
def test_a_trickling_agent_does_not_hold_a_hook_past_its_budget(tmp_path, hook: str) -> None:  # type: ignore[no-untyped-def]
    """An agent sending 1 byte every 1.5 s kept the prolog (budget 5 s) and the health check (10 s)
    running for more than 90 s: each read was within urlopen's timeout, the exchange never ended.
    Here the stand-in would take hours; the hook must be done long before the test's timeout."""
    import subprocess
    import sys

    from tests.harness.fakeagent import Trickler

    with Trickler(every=0.3, in_head=True) as agent:
        cfg = tmp_path / "podhealth.yaml"
        cfg.write_text(f"node: {{name: dgx01}}\nauth: {{token: {'k' * 64}}}\n"
                       f"checks: {{slurm_drain: never, healthcheck_budget: 1, prolog_budget: 1, "
                       f"agents: {{dgx01: '{agent.url}'}}}}\ncollectors: {{jobs: {{state_dir: {tmp_path / 'jobs'}}}}}\n")
        code = f"import sys; from podhealth.checks.cli.slurm_hooks import {hook}_main as m; sys.exit(m([]))"
        env = {"PATH": "/usr/bin:/bin", "PODHEALTH_CONFIG": str(cfg), "SLURMD_NODENAME": "dgx01", "SLURM_JOB_ID": "9"}
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                           cwd=tmp_path)
        assert agent.requests, "the hook never asked the agent: the test would prove nothing"
    assert p.returncode in (0, 1, 2), p  # judged from local sources, or undecided: it ended
