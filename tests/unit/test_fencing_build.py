"""fencing/build.py: the fencer registry is a literal table; build_fencers turns on what the config
says, in table order, each fencer with its own `fencers.<name>.timeout`."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from podhealth.config_aggregator import (
    AggregatorConfig, FencersConfig, FileFencerConfig, KubeFencerConfig, SlurmFencerConfig,
)
from podhealth.fencing.build import EXTRAS, REGISTRY, build_fencers, factory
from podhealth.fencing.fence import DryRunFencer, Fencer
from podhealth.fencing.filefence import FileFencer
from podhealth.fencing.slurm import SlurmFencer


def test_every_entry_is_a_config_section_and_a_factory() -> None:
    sections = {f.name for f in dataclasses.fields(FencersConfig)}
    assert set(REGISTRY) == sections
    for name in REGISTRY:
        if name in EXTRAS:
            pytest.importorskip(EXTRAS[name])
        assert callable(factory(name)), name


def test_fencer_protocol_has_its_own_timeout() -> None:
    assert "timeout" in typing.get_type_hints(Fencer)


def _cfg(tmp_path: Path, **fencers: object) -> AggregatorConfig:
    return AggregatorConfig(db=tmp_path / "agg.db", fencers=FencersConfig(**fencers))  # type: ignore[arg-type]


def test_nothing_on_is_the_dry_run_fencer(tmp_path: Path) -> None:
    fs = build_fencers(_cfg(tmp_path))
    assert [type(f) for f in fs] == [DryRunFencer]


def test_on_fencers_in_table_order_each_with_its_own_timeout(tmp_path: Path) -> None:
    fs = build_fencers(_cfg(tmp_path, slurm=SlurmFencerConfig(enabled=True, timeout=7.0),
                            file=FileFencerConfig(enabled=True, path=str(tmp_path / "f.json"))))
    assert [type(f) for f in fs] == [SlurmFencer, FileFencer]
    assert fs[0].timeout == 7.0 and all(isinstance(f, Fencer) for f in fs)


def test_dry_run_replaces_every_fencer(tmp_path: Path) -> None:
    cfg = dataclasses.replace(_cfg(tmp_path, slurm=SlurmFencerConfig(enabled=True)), dry_run=True)
    assert [type(f) for f in build_fencers(cfg)] == [DryRunFencer]


def test_kubernetes_gets_its_own_timeout(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters: [{name: k, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\nusers: [{name: u, user: {token: t}}]\n")
    fs = build_fencers(_cfg(tmp_path, kubernetes=KubeFencerConfig(enabled=True, kubeconfig=str(kubeconfig), timeout=3.0)))
    assert [f.name for f in fs] == ["kubernetes"] and fs[0].timeout == 3.0
