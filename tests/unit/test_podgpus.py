"""`podhealth check --gpus`: a pod's GPUs from $NVIDIA_VISIBLE_DEVICES, and the results that concern it."""

from __future__ import annotations

import pytest

from podhealth.checks.cli import podgpus
from podhealth.checks.passive.result import fail, ok
from podhealth.vocab import Action

RESULTS = [fail("ecc", "gpu1", "DBE", Action.RESET_GPU, uuid="GPU-b"), ok("ecc", "gpu0", "", uuid="GPU-a"),
           ok("ecc", "gpu2", "", uuid="GPU-c"), fail("ib_port", "mlx5_1/1", "down", Action.DRAIN)]


def _kept(sel: str) -> list[str]:
    return [f"{r.check}:{r.entity}" for r in podgpus.for_pod(RESULTS, podgpus.parse(sel))[0]]


def test_indices_and_uuids_pick_the_pods_gpus_and_keep_node_wide_results() -> None:
    assert _kept("0,2") == ["ecc:gpu0", "ecc:gpu2", "ib_port:mlx5_1/1"]
    assert _kept("GPU-b") == ["ecc:gpu1", "ib_port:mlx5_1/1"]
    assert _kept("none") == ["ib_port:mlx5_1/1"] and _kept("void") == ["ib_port:mlx5_1/1"]
    assert len(_kept("all")) == len(RESULTS) and podgpus.parse("") is None


def test_a_uuid_no_result_names_judges_every_gpu_and_says_so() -> None:
    kept, why = podgpus.for_pod(RESULTS, podgpus.parse("MIG-x"))
    assert kept == RESULTS and "MIG-x" in why


@pytest.mark.parametrize("bad", ["gpu1", "0,x", "0-99999999", "3-1"])
def test_bad_lists_are_errors(bad: str) -> None:
    with pytest.raises(ValueError):
        podgpus.parse(bad)
