"""The agent's sinks (agent/sink.py): one protocol, fed in order, each bounded so that a sink
that raises or hangs stops neither the agent, its /metrics, nor the other sinks; the publisher,
the heartbeat and the InfluxDB export are built from config as sinks (agent/wiring.py)."""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import aiohttp
import pytest
from aiohttp import web

from podhealth.agent.agent import Agent
from podhealth.agent.export_influx import InfluxExporter
from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.metrics.family import Family
from podhealth.agent.publisher import Publisher
from podhealth.agent.sink import Sink, Sinks, bounded
from podhealth.agent.wiring import build_sinks
from podhealth.collectors.base import Collection
from podhealth.config import loads
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Event, MetricSpec, NodeReport, Sample, Status
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)


async def until(pred: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def snap(i: float) -> Snapshot:
    from types import MappingProxyType
    return Snapshot(time=i, collectors=MappingProxyType({}))


def xid(i: int) -> Event:
    return Event(kind="xid", code=79, time=1000.0 + i, text=f"NVRM: Xid (PCI:0000:18:00): 79, pid={i}", id=f"ev{i}")


def fail(check: str = "gpu_xid") -> CheckResult:
    return CheckResult(check, Status.FAIL, entity="gpu0", summary="XID 79")


class Recorder(Sink):
    """A sink that notes what it got, in order; `gate` (when set) holds its snapshot deliveries."""

    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.got: list[tuple[str, Any]] = []
        self.gate: asyncio.Event | None = None
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def on_snapshot(self, s: Snapshot) -> None:
        self.got.append(("snapshot", s))
        if self.gate is not None:
            await self.gate.wait()

    async def on_events(self, events: tuple[Event, ...]) -> None:
        self.got.append(("events", tuple(e.id for e in events)))

    async def on_transition(self, old: CheckResult | None, new: CheckResult, at: float) -> None:
        self.got.append(("transition", (new.check, new.status, at)))

    def of(self, kind: str) -> list[Any]:
        return [v for k, v in self.got if k == kind]


class Raises(Sink):
    name = "raises"

    async def on_snapshot(self, s: Snapshot) -> None:
        raise RuntimeError("broken sink")

    def families(self, s: Snapshot) -> Iterable[Family]:
        raise RuntimeError("broken families")


class Hangs(Sink):
    """on_snapshot and stop never return on their own."""

    name = "hangs"

    def __init__(self) -> None:
        self.calls = 0

    async def on_snapshot(self, s: Snapshot) -> None:
        self.calls += 1
        await asyncio.Event().wait()

    async def stop(self) -> None:
        await asyncio.Event().wait()


class FailsToStart(Recorder):
    async def start(self) -> None:
        raise OSError(13, "Permission denied: /var/lib/podhealth/spool")


async def test_a_sink_gets_snapshots_events_and_transitions_in_order() -> None:
    sinks = Sinks()
    a, b = Recorder("a"), Recorder("b")
    sinks.add(a)
    sinks.add(b)
    with pytest.raises(ValueError, match="already installed"):
        sinks.add(Recorder("a"))
    s1, s2 = snap(1), snap(2)
    sinks.events((xid(0),))  # before start: kept and delivered once the sink has started
    await sinks.start()
    assert a.started and b.started
    sinks.snapshot(s1)
    sinks.transition(None, fail(), 5.0)
    sinks.events((xid(1), xid(2)))
    sinks.snapshot(s2)
    sinks.transition(fail(), CheckResult("gpu_xid", Status.OK, entity="gpu0"), 6.0)
    await until(lambda: len(a.got) == 6 and len(b.got) == 6, "every delivery")
    want = [("events", ("ev0",)), ("snapshot", s1), ("transition", ("gpu_xid", Status.FAIL, 5.0)),
            ("events", ("ev1", "ev2")), ("snapshot", s2), ("transition", ("gpu_xid", Status.OK, 6.0))]
    assert a.got == want and b.got == want
    with pytest.raises(RuntimeError):
        sinks.add(Recorder("late"))
    await sinks.stop()
    assert a.stopped and b.stopped
    sinks.snapshot(snap(3))  # after stop: nothing more is delivered or queued
    assert len(a.got) == 6
    assert sinks.errors == {}


async def test_a_sink_behind_gets_the_newest_snapshot_and_every_event() -> None:
    sinks = Sinks(max_pending=3)
    slow = Recorder("slow")
    slow.gate = asyncio.Event()
    sinks.add(slow)
    await sinks.start()
    sinks.snapshot(snap(1))
    await until(lambda: slow.of("snapshot"), "the first snapshot to be in delivery")
    # Held: snapshots in a row merge into the newest; events keep their place.
    sinks.snapshot(snap(2))
    sinks.events((xid(1),))
    sinks.snapshot(snap(3))
    sinks.snapshot(snap(4))
    assert len(sinks._lanes[0].queue) == 3
    sinks.events((xid(2),))  # over max_pending: the oldest waiting delivery (snap 2) is dropped
    assert sinks.errors[("slow", "dropped")] == 1
    slow.gate.set()
    await until(lambda: len(slow.got) == 4, "the held deliveries")
    assert [s.time for s in slow.of("snapshot")] == [1, 4] and slow.of("events") == [("ev1",), ("ev2",)]
    await sinks.stop()


async def test_bounded_does_not_wait_for_a_call_that_ignores_cancellation() -> None:
    release = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await release.wait()  # swallows the cancellation until released

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        await bounded(stubborn(), 0.1)
    assert time.monotonic() - t0 < 5
    release.set()
    assert await bounded(asyncio.sleep(0, result=7), 1) == 7


class Host:
    name = "host"
    metrics = {"host_load1": MetricSpec("host_load1", "gauge", "load")}

    def __init__(self) -> None:
        self.n = 0

    def collect(self) -> Collection:
        self.n += 1
        return Collection(samples=(Sample.of("host_load1", float(self.n)),), events=(xid(self.n),))


async def metrics_text(url: str) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
            assert r.status == 200
            return await r.text()


def value(text: str, prefix: str) -> float:
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    assert len(lines) == 1, (prefix, lines)
    return float(lines[0].rsplit(" ", 1)[1])


async def test_a_raising_or_hanging_sink_stops_neither_the_agent_nor_the_others() -> None:
    cfg = loads("listen: {address: 127.0.0.1, port: 0}\ncollectors: {host: {interval: 0.1, timeout: 1}}\n")
    agent = Agent(cfg, node="dgx01", factories={"host": lambda c: Host()})
    agent.sinks.hook_timeout, agent.sinks.stop_timeout = 0.2, 0.5
    good, hangs, broken_start = Recorder("good"), Hangs(), FailsToStart("nostart")
    for s in (Raises(), hangs, good, broken_start):
        agent.add_sink(s)
    await agent.start()
    try:
        with pytest.raises(RuntimeError):
            agent.add_sink(Recorder("late"))
        # The hanging sink times out again and again; the good one keeps getting every change.
        await until(lambda: hangs.calls >= 3 and len(good.of("snapshot")) >= 5, "deliveries past the hung sink")
        loads_seen = [s.collectors["host"].samples[0].value for s in good.of("snapshot")]
        assert loads_seen == sorted(loads_seen)
        # Events in the order the collector saw them, each once, before the snapshot holding them.
        ids = [i for evs in good.of("events") for i in evs]
        assert ids == [f"ev{n}" for n in range(1, len(ids) + 1)]
        first_snap = next(i for i, (k, _) in enumerate(good.got) if k == "snapshot")
        assert good.got[first_snap - 1][0] == "events"
        agent.sinks.transition(None, fail(), 9.0)  # as the checks engine does (wiring.install)
        await until(lambda: good.of("transition"), "the transition")
        text = await metrics_text(agent.url)
        assert value(text, 'podhealth_sink_errors_total{node="dgx01",reason="error",sink="raises"}') >= 2
        assert value(text, 'podhealth_sink_errors_total{node="dgx01",reason="timeout",sink="hangs"}') >= 2
        assert value(text, 'podhealth_sink_errors_total{node="dgx01",reason="error",sink="nostart"}') == 1
        assert 'sink="good"' not in text  # a series appears with the sink's first failure
        assert value(text, 'podhealth_collector_success{collector="host",node="dgx01"}') == 1
        assert not broken_start.got  # a sink that did not start gets nothing
    finally:
        t0 = time.monotonic()
        await agent.stop()
    assert time.monotonic() - t0 < 5, "a sink whose stop hangs held up the agent's stop"
    assert good.stopped
    assert agent.sinks.errors[("hangs", "timeout")] >= 3  # its stop timed out too


class Aggregator:
    """A stand-in aggregator: records event batches and heartbeats, answers full reports with a digest."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.beats: list[dict[str, Any]] = []

    async def events(self, request: web.Request) -> web.Response:
        self.records.extend((await request.json())["events"])
        return web.json_response({"applied": 1})

    async def reports(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.beats.append(body)
        return web.json_response({"digest": "d1"} if "results" in body else {})


def config_with(url: str, influx: bool, tmp_path: Path) -> Any:
    text = (f"publish: {{aggregator_url: '{url}', spool_dir: '{tmp_path / 'spool'}', report_interval: 0.1, "
            "timeout: 2}\n")
    if influx:
        text += "exporters:\n  influxdb: {enabled: true, url: 'http://127.0.0.1:9', bucket: b}\n"
    return loads(text)


async def test_publisher_heartbeat_and_influx_are_built_as_sinks_from_config(tmp_path: Path) -> None:
    assert build_sinks(loads(""), "dgx01", report=lambda: None, specs=dict) == []
    agg = Aggregator()
    app = web.Application()
    app.router.add_post("/v1/events", agg.events)
    app.router.add_post("/v1/reports", agg.reports)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    judged: list[NodeReport] = []
    asked = [0]

    def report() -> NodeReport | None:
        asked[0] += 1
        return judged[-1] if judged else None

    specs = {"gpu_energy_joules": MetricSpec("gpu_energy_joules", "counter", "energy")}
    built = build_sinks(config_with(f"http://127.0.0.1:{port}", True, tmp_path), "dgx01", report=report,
                        specs=lambda: specs)
    assert [s.name for s in built] == ["publisher", "heartbeat", "influxdb"]
    pub, beat, influx = built
    assert isinstance(pub, Publisher) and isinstance(beat, Heartbeat) and isinstance(influx, InfluxExporter)
    assert pub.cfg.spool_dir == tmp_path / "spool" and pub.sequencer is beat.sequencer
    sinks = Sinks()
    for s in (pub, beat):
        sinks.add(s)
    await sinks.start()
    try:
        # No heartbeat before the first judgement, then one every report_interval.
        await until(lambda: asked[0] >= 2, "the heartbeat to ask for the report")
        assert agg.beats == []
        judged.append(NodeReport("dgx01", "0", "dgx-h100", (fail(),), (), 100.0))
        await until(lambda: len(agg.beats) >= 2, "heartbeats")
        assert "results" in agg.beats[0] and agg.beats[1]["digest"] == "d1"  # then a lease
        # A transition is spooled and sent, and one full report follows the burst.
        sinks.transition(None, fail(), 100.0)
        sinks.events((xid(1),))
        await until(lambda: [r["type"] for r in agg.records] == ["transition", "event", "report"], "the records")
        fams = {f.spec.name: f for f in sinks.families(snap(0))}
        heartbeats = {s.label("result"): s.value for s in fams["publish_heartbeats"].samples}
        assert heartbeats["full"] == 1 and heartbeats["lease"] >= 1
        records = {s.label("state"): s.value for s in fams["publish_records"].samples}
        assert records["published"] == 3
        assert fams["publish_connected"].samples[0].value == 1
        assert fams["sink_errors"].samples == ()  # no failures: no series
    finally:
        await sinks.stop()
        await runner.cleanup()

    # The InfluxDB export takes each collector's samples once per successful collection.
    st = CollectorState(name="nvml", enabled=True, samples=(Sample.of("gpu_energy_joules", 5, gpu=0),),
                        last_success=50.0)

    def with_state(state: CollectorState) -> Snapshot:
        from types import MappingProxyType
        return Snapshot(time=state.last_success or 0, collectors=MappingProxyType({"nvml": state}))

    await influx.on_snapshot(with_state(st))
    await influx.on_snapshot(with_state(st))
    import dataclasses
    await influx.on_snapshot(with_state(dataclasses.replace(st, stale=True)))  # no new collection
    assert len(influx.buffer) == 1 and influx.buffer[0].kind == "counter"
    await influx.on_snapshot(with_state(dataclasses.replace(st, last_success=51.0)))
    assert len(influx.buffer) == 2
    assert (influx.line(influx.buffer[0]) or "").startswith("podhealth_gpu,gpu=0,node=dgx01 energy_joules_total=5")


def test_influx_sink_is_left_out_when_its_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = loads("exporters:\n  influxdb: {enabled: true, url: 'http://127.0.0.1:9', bucket: b}\n")
    assert [s.name for s in build_sinks(cfg, "dgx01", report=lambda: None, specs=dict)] == ["influxdb"]
    monkeypatch.setitem(sys.modules, "influxdb_client", None)  # its import fails as if not installed
    assert build_sinks(cfg, "dgx01", report=lambda: None, specs=dict) == []
