"""Snapshot -> exposition: names, labels, types, negotiation, and real `promtool check metrics`."""

from __future__ import annotations

import gzip
import subprocess
import urllib.request
from types import MappingProxyType

import pytest

from podhealth import config
from podhealth.agent.metrics import compat
from podhealth.agent.agent import Agent
from podhealth.agent.metrics.exposition import RenderContext
from podhealth.agent.metrics.family import Family
from podhealth.agent.metrics.blocks import BlockEncoder
from podhealth.agent.metrics.render import Format, negotiate, wants_gzip
from podhealth.collectors.base import Collection, specs
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Event, MetricSpec, Sample, labels_of
from tests.harness.plugins import Watcher
from tests.harness.proc import need
from tests.oracles.exposition import render

pytestmark = pytest.mark.timeout(60)

SPECS = specs(
    MetricSpec("gpu_temperature_celsius", "gauge", "GPU core temperature.", "celsius"),
    MetricSpec("gpu_energy_joules", "counter", "Total energy since driver load.", "joules"),
    MetricSpec("gpu_info", "info", "GPU versions."),
    MetricSpec("gpu_utilization_ratio", "gauge", "GPU busy 0..1."),
    MetricSpec("gpu_memory_used_bytes", "gauge", "Framebuffer used.", "bytes"),
)
GPU = dict(gpu=0, uuid="GPU-1", pci_bus_id="00000000:18:00.0", model="NVIDIA H100 80GB HBM3")


def snapshot(*samples: Sample, events: tuple[Event, ...] = (), name: str = "nvml", **state: object) -> Snapshot:
    st = CollectorState(name=name, samples=samples, last_success=100.0, last_attempt=100.0,
                        last_duration=0.25, stale=False, runs=3, overruns=2, **state)  # type: ignore[arg-type]
    return Snapshot(time=100.0, collectors=MappingProxyType({
        name: st, "dcgm": CollectorState(name="dcgm", enabled=False, disabled_reason="no bindings\nat /x")}),
        events=events)


def ctx(**kw: object) -> RenderContext:
    base: dict[str, object] = dict(node="dgx01", version="0.1.0", profile="dgx-h100", specs={"nvml": SPECS})
    base.update(kw)
    return RenderContext(**base)  # type: ignore[arg-type]


def text(snap: Snapshot, c: RenderContext | None = None, fmt: Format = Format.TEXT) -> str:
    """What the agent's renderer makes of `snap` (a fresh one: nothing reused from a prior render)."""
    c = c or ctx()
    return BlockEncoder(c.node).render(snap, c, fmt is Format.OPENMETRICS).decode()


def promtool_problems(body: str) -> list[str]:
    promtool = need("promtool")
    p = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30)
    problems = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    assert (p.returncode == 0) == (not problems), (p.returncode, problems)
    return problems


def lint(body: str) -> None:
    problems = promtool_problems(body)
    assert not problems, "promtool:\n" + "\n".join(problems)


BASIC = (
    Sample.of("gpu_temperature_celsius", 41, **GPU),
    Sample.of("gpu_energy_joules", 12345.5, **GPU),
    Sample.of("gpu_info", 1, gpu=0, driver_version="550.54.15", vbios_version="96.00.74.00.01"),
    Sample.of("gpu_utilization_ratio", 0.5, **GPU),
)


def test_names_types_help_and_node_label() -> None:
    body = text(snapshot(*BASIC))
    assert "# HELP podhealth_gpu_temperature_celsius GPU core temperature.\n" in body
    assert "# TYPE podhealth_gpu_temperature_celsius gauge\n" in body
    assert ('podhealth_gpu_temperature_celsius{gpu="0",model="NVIDIA H100 80GB HBM3",node="dgx01",'
            'pci_bus_id="00000000:18:00.0",uuid="GPU-1"} 41.0') in body
    assert "# TYPE podhealth_gpu_energy_joules_total counter\n" in body
    assert "podhealth_gpu_energy_joules_total{" in body
    assert 'podhealth_gpu_info{driver_version="550.54.15",gpu="0",node="dgx01",vbios_version="96.00.74.00.01"} 1.0' in body
    for line in body.splitlines():
        if not line.startswith("#"):
            assert 'node="dgx01"' in line, line


def test_self_metrics() -> None:
    body = text(snapshot(*BASIC))
    assert 'podhealth_collector_enabled{collector="nvml",node="dgx01"} 1.0' in body
    assert 'podhealth_collector_enabled{collector="dcgm",node="dgx01"} 0.0' in body
    # Newlines in a reason are folded so the label stays one line.
    assert 'podhealth_collector_disabled_info{collector="dcgm",node="dgx01",reason="no bindings at /x"} 1.0' in body
    assert 'podhealth_collector_success{collector="nvml",node="dgx01"} 1.0' in body
    assert 'podhealth_collector_duration_seconds{collector="nvml",node="dgx01"} 0.25' in body
    assert 'podhealth_collector_last_success_timestamp_seconds{collector="nvml",node="dgx01"} 100.0' in body
    assert 'podhealth_collector_stale{collector="nvml",node="dgx01"} 0.0' in body
    assert 'podhealth_collector_overruns_total{collector="nvml",node="dgx01"} 2.0' in body
    assert 'podhealth_build_info{node="dgx01",profile="dgx-h100",version="0.1.0"} 1.0' in body


def test_promtool_accepts_the_exposition() -> None:
    lint(text(snapshot(*BASIC)))


def test_promtool_catches_what_we_would_get_wrong() -> None:
    # The linter is really consulted: a counter without _total fails it.
    need("promtool")
    with pytest.raises(AssertionError, match="_total"):
        lint("# HELP x_bytes a\n# TYPE x_bytes counter\nx_bytes 1\n")


def test_bad_samples_are_dropped_not_fatal() -> None:
    snap = snapshot(
        Sample("gpu_temperature_celsius", 40.0, labels_of(gpu=0)),
        Sample("gpu_temperature_celsius", 41.0, (("bad-label", "x"),)),  # invalid label name
        Sample("gpu_energy_joules", -5.0, labels_of(gpu=0)),  # negative counter
        Sample("gpu_utilization_ratio", 0.1, labels_of(gpu=1)),
        Sample("gpu_utilization_ratio", 0.2, labels_of(gpu=1)),  # duplicate label set: last wins
        Sample("no spaces allowed", 1.0),  # invalid name, no spec
        Sample("undocumented_thing", 3.0),  # valid name without a MetricSpec
    )
    body = text(snap)
    assert 'podhealth_gpu_temperature_celsius{gpu="0",node="dgx01"} 40.0' in body
    assert "bad-label" not in body and "podhealth_gpu_energy_joules_total{" not in body
    assert body.count("podhealth_gpu_utilization_ratio{") == 1 and 'gpu="1",node="dgx01"} 0.2' in body
    assert "no spaces" not in body
    assert 'podhealth_undocumented_thing{node="dgx01"} 3.0' in body
    lint(body)


def test_openmetrics_rendering_and_negotiation() -> None:
    body = text(snapshot(*BASIC), fmt=Format.OPENMETRICS)
    assert body.endswith("# EOF\n")
    assert "# TYPE podhealth_gpu_energy_joules counter\n" in body
    assert "# UNIT podhealth_gpu_energy_joules joules\n" in body
    assert "# TYPE podhealth_gpu info\n" in body
    prom_default = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                    "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
    assert negotiate(prom_default) is Format.OPENMETRICS
    assert negotiate("text/plain;version=0.0.4") is Format.TEXT
    assert negotiate("") is Format.TEXT
    assert negotiate("application/openmetrics-text; q=0") is Format.TEXT
    assert wants_gzip("gzip, deflate") and not wants_gzip("identity") and not wants_gzip("")


def test_metric_sources_and_compat_names() -> None:
    check_spec = MetricSpec("check_status", "gauge", "Check verdicts.")

    def checks(snap: Snapshot) -> list[Family]:
        return [Family(check_spec, (Sample.of("check_status", 2, check="gpu_ecc", entity="gpu0", action="DRAIN"),))]

    def broken(snap: Snapshot) -> list[Family]:
        raise RuntimeError("source bug")

    ev = Event(kind="xid", code=79, time=1.0, gpu=0)
    gpu_up = Sample.of("gpu_up", 1, **GPU)
    used = Sample.of("gpu_memory_used_bytes", 2 * 1024**3, **GPU)
    snap = snapshot(*BASIC, gpu_up, used, events=(ev,))
    snap = Snapshot(time=snap.time, events=snap.events, collectors=MappingProxyType(
        {**snap.collectors, "kmsg": CollectorState(name="kmsg", stale=False)}))
    body = text(snap, ctx(sources=(checks, broken, compat.source("dcgm-exporter", "dgx01"))))
    assert 'podhealth_check_status{action="DRAIN",check="gpu_ecc",entity="gpu0",node="dgx01"} 2.0' in body

    def dcgm(name: str) -> dict[str, str]:
        lines = [ln for ln in body.splitlines() if ln.startswith(name + "{")]
        assert len(lines) == 1, (name, lines)
        labels, value = lines[0][len(name) + 1:].rsplit("} ", 1)
        d = dict(kv.split("=", 1) for kv in labels.split('",'))
        return {k: v.strip('"') for k, v in d.items()} | {"value": value}

    temp = dcgm("DCGM_FI_DEV_GPU_TEMP")
    assert temp["value"] == "41.0" and temp["UUID"] == "GPU-1" and temp["device"] == "nvidia0"
    assert temp["Hostname"] == "dgx01" and temp["node"] == "dgx01" and temp["gpu"] == "0"
    assert dcgm("DCGM_FI_DEV_FB_USED")["value"] == "2048.0"
    assert dcgm("DCGM_FI_DEV_XID_ERRORS")["value"] == "79.0"
    assert "# TYPE DCGM_FI_DEV_GPU_TEMP gauge" in body
    assert "_total" not in "".join(ln for ln in body.splitlines() if ln.startswith("DCGM_"))
    # dcgm-exporter's own label names (UUID, modelName, Hostname) are camelCase: that is the one
    # lint finding compat mode accepts, since dashboards query exactly those names.
    # Its counters carry no `_total` (typed counter, as dcgm-exporter serves them): the other one.
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter" in body
    problems = promtool_problems(body)
    assert problems and all(p.startswith("DCGM_FI_") and ("camelCase" in p or 'should have "_total" suffix' in p)
                            for p in problems), problems
    om = render(snap, ctx(sources=(compat.source("dcgm-exporter", "dgx01"),)), [(Format.OPENMETRICS, False)])
    # OpenMetrics wants `_total` on a counter's samples: the verbatim name is declared unknown there
    assert b"# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION unknown" in om[(Format.OPENMETRICS, False)]
    # Without a kernel-log collector there is no XID series at all.
    body = text(snapshot(*BASIC, gpu_up), ctx(sources=(compat.source("dcgm-exporter", "dgx01"),)))
    assert "DCGM_FI_DEV_XID_ERRORS" not in body and "DCGM_FI_DEV_GPU_TEMP{" in body
    with pytest.raises(ValueError, match="unknown compat mode"):
        compat.source("nvidia-smi", "x")


class _One:
    name = "nvml"
    metrics = SPECS

    def collect(self) -> Collection:
        return Collection(BASIC)

    def close(self) -> None:
        pass


def _get(url: str, headers: dict[str, str]) -> tuple[dict[str, str], bytes]:
    req = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(req, timeout=5) as r:
        return dict(r.headers), r.read()


async def test_http_content_negotiation_gzip_and_healthz() -> None:
    import asyncio
    import json

    cfg = config.loads("listen: {address: 127.0.0.1, port: 0}\ncollectors: {nvml: {interval: 0.2, timeout: 1}}\n")
    agent = Agent(cfg, node="dgx01", factories={"nvml": lambda c: _One()})
    await agent.start()
    try:
        for _ in range(200):
            if agent.snapshot.collectors["nvml"].last_success:
                break
            await asyncio.sleep(0.02)
        await agent.exposition.current()
        url = agent.url + "/metrics"
        h, body = await asyncio.to_thread(_get, url, {})
        assert h["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert b"podhealth_gpu_temperature_celsius{" in body
        h, body = await asyncio.to_thread(_get, url, {"Accept": "application/openmetrics-text; version=1.0.0"})
        assert h["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
        assert body.endswith(b"# EOF\n")
        h, body = await asyncio.to_thread(_get, url, {"Accept-Encoding": "gzip"})
        assert h["Content-Encoding"] == "gzip"
        assert b"podhealth_build_info{" in gzip.decompress(body)
        h, body = await asyncio.to_thread(_get, agent.url + "/healthz", {})
        doc = json.loads(body)
        assert doc["status"] == "ok" and doc["uptime"] >= 0 and doc["node"] == "dgx01"
        _, body = await asyncio.to_thread(_get, agent.url + "/", {})
        assert b"/metrics" in body and b"/healthz" in body
    finally:
        await agent.stop()


async def test_routes_hook_and_app_key() -> None:
    import asyncio

    from aiohttp import web

    from podhealth.agent.server import AGENT_KEY

    async def health(request: web.Request) -> web.Response:
        agent = request.app[AGENT_KEY]
        return web.json_response({"node": agent.node, "collectors": sorted(agent.snapshot.collectors)})

    cfg = config.loads("listen: {address: 127.0.0.1, port: 0}\n")
    agent = Agent(cfg, node="dgx07", factories={"nvml": lambda c: _One()})
    agent.add_plugin(Watcher(routes=[web.get("/health", health)]))
    await agent.start()
    try:
        _, body = await asyncio.to_thread(_get, agent.url + "/health", {})
        assert body == b'{"node": "dgx07", "collectors": ["nvml"]}'
        with pytest.raises(RuntimeError):
            agent.add_plugin(Watcher(routes=[web.get("/late", health)]))
    finally:
        await agent.stop()


def test_cached_encoder_is_byte_identical_to_prometheus_client() -> None:
    from prometheus_client import exposition as text_exposition
    from prometheus_client.openmetrics import exposition as om_exposition

    from tests.oracles.exposition import Encoder, SnapshotCollector

    tricky = (
        Sample.of("gpu_temperature_celsius", 41, gpu=0, model='quote " back \\ slash\nnewline', extra="ünïcode"),
        Sample.of("gpu_temperature_celsius", float("nan"), gpu=1),
        Sample.of("gpu_temperature_celsius", float("inf"), gpu=2),
        Sample.of("gpu_temperature_celsius", -1e-7, gpu=3),
        Sample.of("gpu_energy_joules", 123456789012.5, gpu=0),
        Sample.of("gpu_energy_joules", 0, gpu=1),
        Sample.of("gpu_info", 1, gpu=0, driver_version="550"),
        Sample.of("gpu_memory_used_bytes", 2**40, gpu=0),
    )
    snap = snapshot(*tricky)
    c = ctx(specs={"nvml": {**SPECS, "gpu_temperature_celsius": MetricSpec(
        "gpu_temperature_celsius", "gauge", 'Help with "quotes", \\ and\nnewline.', "celsius")}})
    enc = Encoder("dgx01")
    for _ in range(2):  # the second round is served from the label cache
        ours = render(snap, c, [(Format.TEXT, False), (Format.OPENMETRICS, False)], enc)
        assert ours[(Format.TEXT, False)] == text_exposition.generate_latest(SnapshotCollector(snap, c))  # type: ignore[arg-type]
        assert ours[(Format.OPENMETRICS, False)] == om_exposition.generate_latest(SnapshotCollector(snap, c))


def test_value_format_and_content_type_match_prometheus_client() -> None:
    import math
    import random

    from prometheus_client.openmetrics import exposition as om_exposition
    from prometheus_client.utils import floatToGoString

    from podhealth.agent.metrics.encode import format_value

    rnd = random.Random(7)
    values = [0.0, -0.0, 1.0, 0.5, float("inf"), float("-inf"), float("nan"), 999999.5, 1234567.0, 1e6,
              100000000.0, 9999999999999998.0, 1e16, 1.5e300, 5e-324, -1234567.0, 123456789012.5]
    for _ in range(20_000):
        values += [float(rnd.randrange(2**64)), rnd.uniform(-1e18, 1e18), math.ldexp(rnd.random(), rnd.randrange(-60, 80)),
                   rnd.randrange(10 ** rnd.randrange(1, 19)) / 1000.0]
    assert [format_value(v) for v in values] == [floatToGoString(v) for v in values]
    assert Format.OPENMETRICS.content_type == om_exposition.CONTENT_TYPE_LATEST


def test_block_encoder_matches_a_full_render_as_snapshots_change() -> None:
    """The agent's incremental renderer (agent/metrics/blocks.py) gives exactly the bytes of a render from
    scratch, whatever changed: values, series appearing and going, duplicates, invalid samples,
    families shared by two origins, a failing source, a collector going stale."""
    from tests.oracles.exposition import Encoder, families

    ib_specs = specs(MetricSpec("infiniband_port_stat", "counter", "IB counter."),
                     MetricSpec("infiniband_info", "info", "HCA."),
                     MetricSpec("gpu_temperature_celsius", "gauge", "Shared with nvml.", "celsius"))
    shared_spec = MetricSpec("gpu_temperature_celsius", "gauge", "From a source.", "celsius")
    extra: list[Sample] = []

    def source(snap: Snapshot) -> list[Family]:
        return [Family(shared_spec, tuple(extra))] if extra else []

    def broken(snap: Snapshot) -> list[Family]:
        raise RuntimeError("source bug")

    c = ctx(specs={"nvml": SPECS, "infiniband": ib_specs}, sources=(source, broken))
    lab = {d: labels_of(device="mlx5_0", port="1", counter=d) for d in ("a", "b", "c")}
    ib = [Sample("infiniband_port_stat", float(i), lab[d]) for i, d in enumerate("abc")]
    ib.append(Sample.of("infiniband_info", 1, device="mlx5_0", board_id="MT_1"))
    nvml = list(BASIC)

    def snap(ib_samples: list[Sample], nvml_samples: list[Sample], ib_stale: bool = False) -> Snapshot:
        base = snapshot(*nvml_samples)
        ib_state = CollectorState(name="infiniband", samples=() if ib_stale else tuple(ib_samples),
                                  last_success=99.0, last_attempt=100.0, stale=ib_stale)
        return Snapshot(time=100.0, collectors=MappingProxyType({**base.collectors, "infiniband": ib_state}))

    steps = [snap(ib, nvml)]
    steps.append(steps[-1])  # nothing changed at all
    ib = ib[:1] + [Sample("infiniband_port_stat", 7.0, lab["b"])] + ib[2:]  # one value changed
    steps.append(snap(ib, nvml))
    nvml = nvml + [Sample.of("gpu_temperature_celsius", 45, gpu=1)]  # a series appears
    steps.append(snap(ib, nvml))
    extra.append(Sample.of("gpu_temperature_celsius", 50, gpu=9))  # a source joins a collector's family
    steps.append(snap(ib, nvml))
    extra.append(Sample.of("gpu_temperature_celsius", 51, gpu=9))  # duplicate label set: last wins
    steps.append(snap(ib, nvml))
    ib = ib + [Sample("infiniband_port_stat", -1.0, lab["c"]),  # negative counter, duplicate of c
               Sample("infiniband_port_stat", 1.0, (("bad-label", "x"),)),
               Sample("gpu_temperature_celsius", float("nan"), labels_of(gpu=5))]  # into the shared family
    steps.append(snap(ib, nvml))
    ib = ib[:4] + [Sample("infiniband_port_stat", 9.0, lab["c"])] + ib[5:]  # the duplicate of c turns valid
    steps.append(snap(ib, nvml))
    steps.append(snap(ib, nvml, ib_stale=True))  # stale: its families go
    extra.clear()
    steps.append(snap(ib[:2], nvml[1:]))  # series and families go away
    steps.append(snap(ib, nvml))
    enc = BlockEncoder("dgx01")
    ref = Encoder("dgx01")
    for i, st in enumerate(steps):
        for om in (False, True):
            assert enc.render(st, c, om) == ref.encode(families(st, c), om), f"step {i}, openmetrics={om}"
