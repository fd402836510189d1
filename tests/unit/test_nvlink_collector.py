"""The nvlink collector on the real pynvml, against the NVML simulator (podhealth.sim.nvml_lib)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pynvml
import pytest

from podhealth.checks import profiles
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
    c = create(Config(), links_expected=18, session=session)
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
    c = create(cfg, session=session, **profiles.collector_seams(cfg)["nvlink"])
    try:
        col = c.collect()
    finally:
        c.close()
    assert {s.value for s in find(col, "nvlink_links_expected")} == {16}


def test_one_field_values_call_per_gpu_and_no_per_link_state_calls(
        collector: NvlinkCollector, monkeypatch: pytest.MonkeyPatch) -> None:
    batches: list[list[tuple[int, int]]] = []
    per_link: list[tuple[str, int]] = []
    real_fv = pynvml.nvmlDeviceGetFieldValues
    real_state, real_err = pynvml.nvmlDeviceGetNvLinkState, pynvml.nvmlDeviceGetNvLinkErrorCounter

    def fv(h: object, ids: list[tuple[int, int]]) -> object:
        batches.append(list(ids))
        return real_fv(h, ids)

    def state(h: object, link: int) -> int:
        per_link.append(("state", link))
        return int(real_state(h, link))

    def err(h: object, link: int, counter: int) -> int:
        per_link.append((f"counter{counter}", link))
        return int(real_err(h, link, counter))

    collector.collect()
    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", fv)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkState", state)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter", err)
    col = collector.collect()
    assert len(batches) == 8  # one call per GPU, every link's state and counters in it
    states = [scope for fid, scope in batches[0] if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE]
    assert states == list(range(18))
    # Only the CRC data counter of links 12-17 has no field id (nvml.h stops at _L11).
    assert not [c for c in per_link if c[0] == "state"]
    assert sorted({link for _, link in per_link}) == list(range(12, 18))
    assert {c for c, _ in per_link} == {f"counter{pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA}"}
    assert len(find(col, "nvlink_errors")) == 8 * 18 * 4


def test_nonexistent_links_are_not_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An A100 has 12 links: indexes 12-17 answer INVALID_ARGUMENT in the first batch, then are
    left out of every batch until the re-probe (and its links all have per-link field ids)."""
    from podhealth.sim import nvml_lib

    a100 = SimNode.create(tmp_path, "dgxa", "dgx-a100")
    nvml_lib.install(a100)
    s = NvmlSession()
    a100_cfg = loads("node: {profile: dgx-a100}\n")
    c = create(a100_cfg, session=s, **profiles.collector_seams(a100_cfg)["nvlink"])
    try:
        first = c.collect()
        assert first.errors == ()
        assert {s.label("link") for s in find(first, "nvlink_up", 0)} == {str(n) for n in range(12)}
        batches: list[list[tuple[int, int]]] = []
        real_fv = pynvml.nvmlDeviceGetFieldValues
        def fv(h: object, ids: list[tuple[int, int]]) -> object:
            batches.append(list(ids))
            return real_fv(h, ids)

        monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", fv)
        monkeypatch.setattr(pynvml, "nvmlDeviceGetNvLinkErrorCounter", lambda *a: pytest.fail("per-link call"))
        second = c.collect()
        assert second.errors == () and len(batches) == 8
        assert max(scope for fid, scope in batches[0] if fid == pynvml.NVML_FI_DEV_NVLINK_GET_STATE) == 11
        assert {s.label("type") for s in find(second, "nvlink_errors", 0, link="11")} == ERROR_TYPES
    finally:
        c.close()
        s.shutdown()
        nvml_lib.uninstall()


def comparable(col: Collection) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    # Throughput grows with the clock between two collections: compared apart.
    return {(x.name, x.labels, x.value) for x in col.samples if not x.name.endswith("_bytes")}


@pytest.mark.parametrize("faults", [(), (("fault=nvlink-down", "gpu=3", "link=5"), ("fault=nvlink-down", "gpu=3", "link=16")),
                                    (("fault=fallen-off-bus", "gpu=6"),)])
def test_batched_and_per_link_reads_give_the_same_samples(node: SimNode, session: NvmlSession,
                                                          faults: tuple[tuple[str, ...], ...]) -> None:
    for f in faults:
        inject(node, *f)
    batched = create(Config(), links_expected=18, session=session)
    per_link = NvlinkCollector(session, 18, batch=False)
    try:
        a, b = batched.collect(), per_link.collect()
    finally:
        batched.close()
        per_link.close()
    assert comparable(a) == comparable(b) and len(comparable(a)) > 8 * 18 * 4
    assert sorted(a.errors) == sorted(b.errors)
    assert {(x.name, x.labels) for x in a.samples} == {(x.name, x.labels) for x in b.samples}


def test_crc_errors_climb_on_the_same_link_either_way(node: SimNode, session: NvmlSession) -> None:
    inject(node, "fault=nvlink-crc", "gpu=0", "link=14", "rate=500")
    batched = create(Config(), links_expected=18, session=session)
    per_link = NvlinkCollector(session, 18, batch=False)
    try:
        got = wait_until(lambda: (v := value(batched.collect(), "nvlink_errors", 0, link="14", type="crc_flit")) > 0 and v,
                         timeout=5, what="CRC flit errors through field values")
        later = value(per_link.collect(), "nvlink_errors", 0, link="14", type="crc_flit")
        assert isinstance(got, float) and later >= got
        assert value(batched.collect(), "nvlink_errors", 0, link="13", type="crc_flit") == 0
    finally:
        batched.close()
        per_link.close()


def test_a_field_not_supported_drops_its_reading_not_the_gpu(node: SimNode, session: NvmlSession,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Per-field nvmlReturn: the replay counter answering NOT_SUPPORTED (a driver without it)
    gives no replay series, the GPU's other readings stay, and it is not asked again."""
    real_fv = pynvml.nvmlDeviceGetFieldValues
    asked: list[int] = []

    def fv(h: object, ids: list[tuple[int, int]]) -> object:
        values = real_fv(h, ids)
        for i, (fid, _) in enumerate(ids):
            asked.append(fid)
            if fid == pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY:
                values[i].nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return values

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", fv)
    c = create(Config(), links_expected=18, session=session)
    try:
        col = c.collect()
        assert col.errors == ()
        assert not find(col, "nvlink_errors", type="replay")
        assert {s.label("type") for s in find(col, "nvlink_errors", 2, link="3")} == ERROR_TYPES - {"replay"}
        assert value(col, "nvlink_links_up", 2) == 18
        asked.clear()
        c.collect()
        assert asked and pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY not in asked
    finally:
        c.close()


def test_a_driver_without_field_values_is_read_per_link(node: SimNode, session: NvmlSession,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(h: object, ids: object) -> object:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetFieldValues", missing)
    c = create(Config(), links_expected=18, session=session)
    try:
        col = c.collect()
    finally:
        c.close()
    assert col.errors == ()
    assert value(col, "nvlink_links_up", 0) == 18 and len(find(col, "nvlink_errors")) == 8 * 18 * 4


def test_shares_one_session_with_nvml(node: SimNode, session: NvmlSession) -> None:
    nv = create_nvml(Config(), session=session)
    link = create(Config(), links_expected=18, session=session)
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
    c = factory("nvlink")(Config(), **profiles.collector_seams(Config())["nvlink"])
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


def test_without_the_profiles_link_count_the_collector_is_disabled_not_guessing(session: NvmlSession) -> None:
    """collectors/ sits below checks/ and never reads a profile: the builder passes the count."""
    from podhealth.collectors.base import CollectorDisabled

    with pytest.raises(CollectorDisabled, match="links_expected"):
        create(Config(), session=session)
    cfg = loads("node: {profile: dgx-a100}\n")
    assert profiles.collector_seams(cfg)["nvlink"] == {"links_expected": 12}
    assert profiles.collector_seams(cfg, {"nvlink": {"links_expected": 4}, "nvml": {"x": 1}}) == {
        "nvlink": {"links_expected": 4}, "nvml": {"x": 1}}


def test_unchanged_readings_are_handed_on_as_the_same_objects(node: SimNode, collector: NvlinkCollector) -> None:
    """collectors/samplecache.py: a reading that holds is last cycle's Sample (the exposition
    reuses its line); one that moved is a new Sample with the same labels."""
    inject(node, "fault=nvlink-crc", "gpu=0", "link=7", "rate=200")
    first = {(s.name, s.labels): s for s in collector.collect().samples}
    crc = ("nvlink_errors", find(Collection(tuple(first.values())), "nvlink_errors", 0, link="7", type="crc_flit")[0].labels)
    second = wait_until(lambda: (c := {(s.name, s.labels): s for s in collector.collect().samples})[crc].value
                        > first[crc].value and c, timeout=5, what="CRC flit errors to climb")
    assert isinstance(second, dict) and second.keys() == first.keys()
    assert second[crc] is not first[crc] and second[crc].labels is first[crc].labels
    quiet = ("nvlink_errors", find(Collection(tuple(first.values())), "nvlink_errors", 1, link="2", type="replay")[0].labels)
    assert second[quiet] is first[quiet] and second[quiet].value == 0
    up = [k for k in first if k[0] == "nvlink_up"]
    assert len(up) == 8 * 18 and all(second[k] is first[k] for k in up)
