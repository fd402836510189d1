"""Detail levels (agent/metrics/detail.py over checks/data/export_detail.yaml): what `basic` exports, that
sums stay exact, that `full` and per-family switches work, and that the checks still see every
sample (detail is an export decision, not a collection decision)."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Iterator

import pytest

from podhealth.agent.agent import Agent
from podhealth.agent.metrics.blocks import BlockEncoder
from podhealth.agent.metrics.detail import ExportFilter, load_rules, unknown_families
from podhealth.agent.metrics.exposition import RenderContext
from podhealth.collectors import nvlink
from podhealth.collectors.base import Collection
from podhealth.collectors.nvml_session import NvmlSession
from podhealth.config import Config, loads
from podhealth.sim.node import SimNode
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import MetricSpec, Sample
from tests.harness.nvmlsim import inject, node, session  # noqa: F401 - fixtures
from tests.harness.plugins import Watcher
from tests.harness.proc import wait_until
from tests.oracles.exposition import Encoder, families

pytestmark = pytest.mark.timeout(60)


def nfs_samples() -> list[Sample]:
    out = []
    for mp in ("/home", "/cm/shared"):
        for i, op in enumerate(("READ", "WRITE", "GETATTR", "RENAME", "READDIR", "SEQUENCE")):
            out.append(Sample.of("nfs_operation_requests", 10 * (i + 1), mountpoint=mp, export="x:" + mp, operation=op))
            out.append(Sample.of("nfs_operation_sent_bytes", 99, mountpoint=mp, export="x:" + mp, operation=op))
    for version, n in (("3", 0.0), ("4", 5.0)):
        for proc in ("READ", "LINK", "RENAME"):
            out.append(Sample.of("nfs_rpc_procedure_requests", n, version=version, procedure=proc))
    return out


def by_key(samples: list[Sample]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, s.labels): s.value for s in samples}


def test_nfs_operations_fold_into_other_and_sums_stay_exact() -> None:
    flt = ExportFilter({}, {})
    src = nfs_samples()
    out = flt.samples("nfs", src)
    reqs = [s for s in out if s.name == "nfs_operation_requests"]
    assert {s.label("operation") for s in reqs} == {"READ", "WRITE", "GETATTR", "OTHER"}
    for mp in ("/home", "/cm/shared"):
        got = sum(s.value for s in reqs if s.label("mountpoint") == mp)
        want = sum(s.value for s in src if s.name == "nfs_operation_requests" and s.label("mountpoint") == mp)
        assert got == want == 210
        other = [s for s in reqs if s.label("mountpoint") == mp and s.label("operation") == "OTHER"]
        assert len(other) == 1 and other[0].value == 40 + 50 + 60 and other[0].label("export") == "x:" + mp
    assert not [s for s in out if s.name == "nfs_operation_sent_bytes"]  # per-mount bytes exist elsewhere
    # Per procedure: READ and the folded rest, only for the version in use (v3 is all zero).
    procs = {(s.label("version"), s.label("procedure")): s.value for s in out if s.name == "nfs_rpc_procedure_requests"}
    assert procs == {("4", "READ"): 5.0, ("4", "OTHER"): 10.0}


def test_full_and_family_switches() -> None:
    src = nfs_samples()
    assert by_key(ExportFilter({"nfs": "full"}, {}).samples("nfs", src)) == by_key(src)
    flt = ExportFilter({}, {"nfs": {"nfs_operation_sent_bytes": "full", "nfs_rpc_procedure_requests": "none"}})
    out = flt.samples("nfs", src)
    assert len([s for s in out if s.name == "nfs_operation_sent_bytes"]) == 12
    assert not [s for s in out if s.name == "nfs_rpc_procedure_requests"]
    assert len([s for s in out if s.name == "nfs_operation_requests"]) == 8  # still basic
    # A family switched back to basic under a full collector keeps its rule (through state() too).
    flt = ExportFilter({"nfs": "full"}, {"nfs": {"nfs_operation_requests": "basic"}})
    st = flt.state("nfs", CollectorState("nfs", samples=tuple(src)))
    assert len([s for s in st.samples if s.name == "nfs_operation_requests"]) == 8
    assert len([s for s in st.samples if s.name == "nfs_operation_sent_bytes"]) == 12
    # A family without a rule can be switched off too; an unknown name is reported.
    flt = ExportFilter({}, {"host": {"systemd_unit_active": "none", "no_such_metric": "full"}})
    host = [Sample.of("systemd_unit_active", 1, unit="a"), Sample.of("host_load1", 0.5)]
    assert flt.samples("host", host) == []
    assert unknown_families(flt, {"host": {"systemd_unit_active": MetricSpec("systemd_unit_active", "gauge", "")}}) == \
        ["host.no_such_metric"]


@pytest.fixture
def sim_nvlink(node: SimNode, session: NvmlSession) -> Iterator[list[Sample]]:
    inject(node, "fault=nvlink-crc", "gpu=3", "link=5", "rate=200")
    inject(node, "fault=nvlink-down", "gpu=1", "link=2")
    c = nvlink.create(Config(), links_expected=18, session=session)
    try:
        # The CRC counter climbs with time: collect until it has counted.
        wait_until(lambda: any(s.value for s in c.collect().samples if s.name == "nvlink_errors"), 5, 0.05, "CRC errors")
        yield list(c.collect().samples)
    finally:
        c.close()


def test_nvlink_per_gpu_sum_and_only_links_that_count(sim_nvlink: list[Sample]) -> None:
    flt = ExportFilter({}, {})
    out = flt.samples("nvlink", sim_nvlink)
    errors = [s for s in sim_nvlink if s.name == "nvlink_errors"]
    assert len(errors) == 8 * 18 * 4
    per_link = [s for s in out if s.name == "nvlink_errors"]
    assert per_link and all(s.value != 0 for s in per_link)
    assert {(s.label("gpu"), s.label("link")) for s in per_link} == {("3", "5")}
    # The down link names itself; the 143 that are up are not exported.
    assert [(s.label("gpu"), s.label("link"), s.value) for s in out if s.name == "nvlink_up"] == [("1", "2", 0.0)]
    sums = [s for s in out if s.name == "nvlink_gpu_errors"]
    assert len(sums) == 8 * 4 and not any(s.label("link") for s in sums)
    for s in sums:
        want = sum(e.value for e in errors if e.label("gpu") == s.label("gpu") and e.label("type") == s.label("type"))
        assert s.value == want
    assert sum(s.value for s in sums) == sum(s.value for s in errors) > 0
    assert flt.specs("nvlink", {"nvlink_errors": MetricSpec("nvlink_errors", "counter", "x")})[
        "nvlink_gpu_errors"].kind == "counter"


def test_rules_file_is_valid_and_rejects_bad_rules() -> None:
    rules = load_rules()
    assert "nvlink_errors" in rules["nvlink"] and rules["nvlink"]["nvlink_errors"].sum is not None
    with pytest.raises(ValueError, match="keep"):
        load_rules("nfs:\n  nfs_operation_requests: {keep: sometimes}\n")
    with pytest.raises(ValueError, match="need a label"):
        load_rules("nfs:\n  nfs_operation_requests: {values: [READ]}\n")
    with pytest.raises(ValueError, match="unknown keys"):
        load_rules("nfs:\n  nfs_operation_requests: {kep: none}\n")


SPECS = {"host": MappingProxyType({
    "host_load1": MetricSpec("host_load1", "gauge", "1-minute load average."),
    "systemd_unit_active": MetricSpec("systemd_unit_active", "gauge", "Unit active."),
})}


def snap(load: float) -> Snapshot:
    st = CollectorState("host", samples=(Sample.of("host_load1", load), Sample.of("systemd_unit_active", 1, unit="a")),
                        last_success=1.0, stale=False)
    return Snapshot(time=1.0, collectors=MappingProxyType({"host": st}))


def test_renderers_agree_and_the_snapshot_keeps_everything() -> None:
    flt = ExportFilter({}, {})
    ctx = RenderContext("dgx01", "0", "dgx-h100", SPECS, (), flt)
    blocks = BlockEncoder("dgx01")
    for load in (0.5, 0.5, 2.0):
        s = snap(load)
        body = blocks.render(s, ctx, False)
        assert body == Encoder("dgx01").encode(families(s, ctx), False)
        assert b"podhealth_host_load1" not in body and b"podhealth_systemd_unit_active" in body
        # What the checks engine reads (the snapshot) still has the sample.
        assert [x.value for x in s.samples("host_load1")] == [load]
    st = snap(1.0).collectors["host"]
    assert flt.state("host", st) is flt.state("host", st)  # memoised by the state it came from
    full = RenderContext("dgx01", "0", "dgx-h100", SPECS, (), ExportFilter({"host": "full"}, {}))
    assert b"podhealth_host_load1 " in BlockEncoder("dgx01").render(snap(1.0), full, False)


async def test_checks_see_what_basic_does_not_export() -> None:
    """The agent's snapshot hooks (the checks engine is one, agent/wiring.py) get every sample."""

    class Host:
        name = "host"
        metrics = SPECS["host"]

        def collect(self) -> Collection:
            return Collection(samples=(Sample.of("host_load1", 3.5),))

    cfg = loads("listen: {address: 127.0.0.1, port: 0}\ncollectors: {host: {interval: 0.2, timeout: 1}}\n")
    agent = Agent(cfg, node="dgx01", factories={"host": lambda c: Host()})
    seen: list[float] = []
    agent.add_plugin(Watcher(lambda s: seen.extend(x.value for x in s.samples("host_load1"))))
    await agent.start()
    try:
        for _ in range(200):
            if seen:
                break
            await asyncio.sleep(0.02)
        body = await agent.exposition.current()
    finally:
        await agent.stop()
    assert seen and seen[-1] == 3.5
    assert b"podhealth_collector_success{" in body and b"podhealth_host_load1" not in body


def test_a_family_whose_samples_did_not_change_gives_the_same_samples() -> None:
    """Unchanged samples (the same objects) give the same thinned, folded and summed samples
    (the same objects too: the renderer reuses their lines); one changed sample is seen."""
    flt = ExportFilter({}, {})
    src = nfs_samples()
    first = flt.samples("nfs", src)
    again = flt.samples("nfs", list(src))
    assert len(again) == len(first) and all(a is b for a, b in zip(again, first))
    i = next(i for i, s in enumerate(src) if s.name == "nfs_operation_requests" and s.label("operation") == "RENAME")
    moved = [*src[:i], Sample(src[i].name, src[i].value + 7, src[i].labels), *src[i + 1:]]
    got = flt.samples("nfs", moved)
    assert by_key(got) == by_key(ExportFilter({}, {}).samples("nfs", moved)) != by_key(first)
    procs = [s for s in got if s.name == "nfs_rpc_procedure_requests"]
    assert procs and all(any(p is f for f in first) for p in procs)  # the other family kept its objects
