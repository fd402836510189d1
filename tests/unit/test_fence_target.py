"""Each fencer maps a node to its own backend name (issue 15 item 1): the action runner asks the
fencer, it never switches on fencer names. Slurm takes nodes[].slurm_name, Kubernetes
nodes[].k8s_name, the others podhealth's own name; an unset backend name means the node's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.client import ApiClient, Configuration

from podhealth.fencing.fence import DryRunFencer, Fencer, NodeNames
from podhealth.fencing.filefence import FileFencer
from podhealth.fencing.kube import KubeFencer
from podhealth.fencing.slurm import SlurmFencer


def _kube() -> KubeFencer:
    cfg = Configuration()
    cfg.host = "http://127.0.0.1:9"  # never called: target() is pure
    return KubeFencer(api_client=ApiClient(cfg))


@pytest.mark.parametrize("make, expected", [
    (lambda tmp: SlurmFencer(), "node-0001"),
    (lambda tmp: _kube(), "dgx01.cluster.local"),
    (lambda tmp: FileFencer(tmp / "fence.json"), "dgx01"),
    (lambda tmp: DryRunFencer(), "dgx01"),
])
def test_each_fencer_picks_its_own_name(tmp_path: Path, make, expected: str) -> None:  # type: ignore[no-untyped-def]
    f = make(tmp_path)
    assert isinstance(f, Fencer)
    assert f.target(NodeNames("dgx01", slurm="node-0001", kubernetes="dgx01.cluster.local")) == expected
    # No backend name configured: the node's own name everywhere.
    assert f.target(NodeNames("dgx01")) == "dgx01"
