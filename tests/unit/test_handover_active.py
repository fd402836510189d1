"""The handover suite's active tests: chosen by config and CUDA, run as subprocesses, JSON parsed."""

from __future__ import annotations

import dataclasses

import pytest

from podhealth.checks.handover import active as handover_active
from podhealth.config import ChecksConfig, Config
from podhealth.vocab import Status


def _cfg(mode: str) -> Config:
    return dataclasses.replace(Config(), checks=ChecksConfig(handover_active=mode))  # type: ignore[arg-type]


def test_never_and_auto_without_cuda_run_nothing() -> None:
    assert handover_active.active_tests(_cfg("never")) == []
    if handover_active.cuda_devices() == 0:
        assert handover_active.active_tests(_cfg("auto")) == []


def test_always_lists_burnin_nccl_and_perfprobe() -> None:
    names = [t.name for t in handover_active.active_tests(_cfg("always"))]
    assert names == ["burnin", "nccl_allreduce", "perfprobe"]


async def test_perfprobe_in_the_handover_is_unknown_without_cuda() -> None:
    if handover_active.cuda_devices():
        pytest.skip("a CUDA GPU is here: tests/hardware/test_perfprobe_gpu.py measures it")
    (probe,) = [t for t in handover_active.active_tests(_cfg("always")) if t.name == "perfprobe"]
    res = await probe.run()
    assert res and all(r.status is Status.UNKNOWN for r in res)


async def test_subprocess_report_is_parsed_and_failures_are_unknown() -> None:
    pytest.importorskip("torch")
    res = await handover_active._run_json("burnin", ["burnin", "--duration", "1", "--device", "cpu", "--size", "32"], 120)
    assert res and {r.check for r in res} >= {"burnin_correctness"}
    assert all(r.status in (Status.OK, Status.WARN) for r in res if r.check == "burnin_correctness")
    bad = await handover_active._run_json("nccl_allreduce", ["nccl", "--all-reduce-perf", "/nonexistent/all_reduce_perf"], 60)
    assert bad and all(r.status in (Status.UNKNOWN, Status.FAIL) for r in bad)
