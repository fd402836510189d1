"""The two images (deploy/Containerfile) and the extras they install: a GPU node's agent image
carries no Kubernetes client, only grpcio for the kubelet's PodResources API (issue 31 §5)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import yaml

from tests.conftest import REPO


def _stages() -> dict[str, str]:
    text = (REPO / "deploy" / "Containerfile").read_text()
    parts = re.split(r"^FROM\s+\S+\s+AS\s+(\w+)\s*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def _extras(stage: str) -> set[str]:
    m = re.search(r'\$\{whl\}\[([a-z,]+)\]', stage)
    assert m, stage
    return set(m.group(1).split(","))


def test_an_agent_image_and_an_aggregator_image() -> None:
    stages = _stages()
    assert {"base", "agent", "aggregator"} <= set(stages)
    assert _extras(stages["agent"]) == {"podresources", "influx"}
    assert _extras(stages["aggregator"]) == {"kubernetes", "postgresql"}


def test_the_podresources_extra_is_grpcio_alone() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [d.split(">")[0] for d in extras["podresources"]] == ["grpcio"]
    assert not any(d.startswith("grpcio") for d in extras["kubernetes"])


def test_the_bundle_runs_each_role_from_its_image() -> None:
    base = REPO / "deploy" / "kubernetes" / "base"
    images = {}
    for f in ("agent-daemonset.yaml", "aggregator.yaml"):
        for doc in yaml.safe_load_all((base / f).read_text()):
            if doc and doc.get("kind") in ("DaemonSet", "Deployment"):
                images[doc["kind"]] = {c["image"] for c in doc["spec"]["template"]["spec"]["containers"]}
    assert images == {"DaemonSet": {"podhealth/agent:0.1.0"}, "Deployment": {"podhealth/aggregator:0.1.0"}}


def test_without_grpcio_the_kubelet_source_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from podhealth.collectors import podresources

    monkeypatch.setitem(sys.modules, "grpc", None)  # as on a node installed without the extra
    with pytest.raises(podresources.GrpcMissing, match=r"pip install 'podhealth\[podresources\]'"):
        podresources.list_gpu_pods(tmp_path / "kubelet.sock", 1.0)
