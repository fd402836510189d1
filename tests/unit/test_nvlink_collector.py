"""The nvlink collector on the real pynvml, against the NVML simulator (podhealth.sim.nvml_lib)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pynvml
import pytest

from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.base import Collection
from podhealth.collectors.nvlink import METRICS, NvlinkCollector, create
from podhealth.collectors.nvml import create as create_nvml
from podhealth.collectors.nvml_session import NvmlSession
from podhealth.config import Config, loads
from podhealth.sim.node import SimNode
from podhealth.vocab import Sample
from tests.harness.nvmlsim import inject, node, session  # noqa: F401 - fixtures
from tests.harness.proc import wait_until

REPO = Path(__file__).resolve().parents[2]
ERROR_TYPES = {"crc_flit", "crc_data", "replay", "recovery"}


@pytest.fixture
def collector(session: NvmlSession) -> Iterator[NvlinkCollector]:
    c = create(Config(), session=session)
    try:
        yield c
    finally:
        c.close()


def find(col: Collection, name: str, gpu: int | None = None, **labels: str) -> list[Sample]:
    return [s for s in col.samples if s.name == name
            and (gpu is None or s.label("gpu") == str(gpu))
            and all(s.label(k) == v for k, v in labels.items())]


def value(col: Collection, name: str, gpu: int, **labels: str) -> float:
    found = find(col, name, gpu, **labels)
    assert len(found) == 1, f"{name} gpu={gpu} {labels}: {found}"
    return found[0].value


def test_every_link_of_every_gpu_up_with_zero_errors(node: SimNode, collector: NvlinkCollector) -> None:
    col = collector.collect()
    assert col.errors == ()
    for g in node.state.gpus:
        i = g.index
        links = {s.label("link") for s in find(col, "nvlink_up", i)}
        # Only the links the GPU has: indexes beyond them answer INVALID_ARGUMENT and are absent.
        assert links == {str(n) for n in range(g.nvlink_count)} and g.nvlink_count == 18
        assert all(s.value == 1 for s in find(col, "nvlink_up", i))
        assert all(s.label("uuid") == g.uuid for s in find(col, "nvlink_up", i))
        for link in range(g.nvlink_count):
            errs = {s.label("type"): s.value for s in find(col, "nvlink_errors", i, link=str(link))}
            assert errs == {t: 0 for t in ERROR_TYPES}
        assert value(col, "nvlink_links_up", i) == 18
        assert value(col, "nvlink_links_expected", i) == 18
    for s in find(col, "nvlink_links_up") + find(col, "nvlink_links_expected"):
        assert s.label("link") == ""  # per-GPU series carry no link label


def test_link_down_counts_on_that_gpu_only(node: SimNode, collector: NvlinkCollector) -> None:
    inject(node, "fault=nvlink-down", "gpu=3", "link=5")
    col = collector.collect()
    assert value(col, "nvlink_up", 3, link="5") == 0
    assert value(col, "nvlink_up", 3, link="4") == 1
    assert value(col, "nvlink_links_up", 3) == 17
    assert value(col, "nvlink_links_expected", 3) == 18
    assert value(col, "nvlink_links_up", 2) == 18
    # A down link still exists: its counters keep being reported.
    assert {s.label("type") for s in find(col, "nvlink_errors", 3, link="5")} == ERROR_TYPES


def test_crc_errors_climb_between_two_collections(node: SimNode, collector: NvlinkCollector) -> None:
    inject(node, "fault=nvlink-crc", "gpu=0", "link=7", "rate=200")
    first = value(collector.collect(), "nvlink_errors", 0, link="7", type="crc_flit")
    second = wait_until(
        lambda: (v := value(collector.collect(), "nvlink_errors", 0, link="7", type="crc_flit")) > first and v,
        timeout=5, what="CRC flit errors to climb")
    assert isinstance(second, float) and second > first
    col = collector.collect()
    assert value(col, "nvlink_errors", 0, link="6", type="crc_flit") == 0
    assert value(col, "nvlink_errors", 1, link="7", type="crc_flit") == 0
    assert value(col, "nvlink_up", 0, link="7") == 1


def test_lost_gpu_reports_expected_links_and_an_error_others_flow(node: SimNode, collector: NvlinkCollector) -> None:
    collector.collect()
    inject(node, "fault=fallen-off-bus", "gpu=6")
    col = collector.collect()
    assert not find(col, "nvlink_up", 6) and not find(col, "nvlink_links_up", 6)
    assert value(col, "nvlink_links_expected", 6) == 18
    assert col.errors and all(e.startswith("gpu 6:") for e in col.errors)
    for i in range(8):
        if i != 6:
            assert value(col, "nvlink_links_up", i) == 18


def test_expected_links_come_from_the_profile_and_its_overrides(session: NvmlSession) -> None:
    cfg = loads("node: {profile: dgx-h100}\nchecks: {overrides: {nvlink_links: 16}}\n")
    c = create(cfg, session=session)
    try:
        col = c.collect()
    finally:
        c.close()
    assert {s.value for s in find(col, "nvlink_links_expected")} == {16}


def test_nonexistent_links_are_not_asked_again(collector: NvlinkCollector, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = pynvml.nvmlDeviceGetNvLinkState

    def counted(h: object, link: int) -> int:
        calls.append(link)
        return int(real(h, link))

    collector.collect()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", counted)
    collector.collect()
    assert len(calls) == 8 * 18 and max(calls) == 17


def test_shares_one_session_with_nvml(node: SimNode, session: NvmlSession) -> None:
    nv = create_nvml(Config(), session=session)
    link = create(Config(), session=session)
    try:
        a = nv.collect()
        gen = session.generation
        b = link.collect()
        assert session.generation == gen  # nvlink reused the initialised session
        uuids_nvml = {s.label("gpu"): s.label("uuid") for s in a.samples if s.name == "gpu_up"}
        uuids_link = {s.label("gpu"): s.label("uuid") for s in b.samples if s.name == "nvlink_links_up"}
        assert uuids_nvml == uuids_link and len(uuids_link) == 8
    finally:
        nv.close()
        link.close()


def test_registered_and_documented() -> None:
    assert REGISTRY["nvlink"] == "podhealth.collectors.nvlink:create"
    c = factory("nvlink")(Config())
    try:
        assert c.name == "nvlink" and c.metrics is METRICS
    finally:
        c.close()
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    m = re.search(r"^## nvlink\b.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m
    names = set()
    for line in m.group(1).splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            names.update(re.findall(r"\b[a-z][a-z0-9_]+\b", line.split("|")[1]))
    assert set(METRICS) <= names, sorted(set(METRICS) - names)
    for spec in METRICS.values():
        assert spec.help and spec.kind in ("gauge", "counter")
