"""What the agent does with its snapshot besides /metrics: verdicts, aggregator push, InfluxDB.

`install(agent)` (before `agent.start()`) installs the checks engine (/health, check_status,
the handover endpoint) and, when configured, the publisher (verdict transitions, node reports and
XID/SXid events pushed to the aggregator, spooled on disk while it is away), the heartbeat (the
node's report every interval, as a small lease while nothing changed) and the InfluxDB v2
exporter (each collector's fresh samples, once per collection).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from podhealth import log
from podhealth.agent import health
from podhealth.agent.metrics.family import Family
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Event, MetricSpec, Sample

if TYPE_CHECKING:
    from podhealth.agent.agent import Agent
    from podhealth.agent.export_influx import InfluxExporter
    from podhealth.agent.heartbeat import Heartbeat
    from podhealth.agent.publisher import Publisher

_log = log.get("podhealth.agent.wiring")
REPORT_DEBOUNCE_S = 0.5

PUBLISH_SPECS = {m.name: m for m in (
    MetricSpec("publish_heartbeats", "counter",
               "Heartbeats to the aggregator by result: full (a full report taken), lease (a lease taken),\n"
               "conflict (a lease refused, the full report sent at once), failed (not delivered)."),
    MetricSpec("publish_records", "counter",
               "Spooled records (transitions, events, reports) by state: published, delivered, summarised\n"
               "(folded into a summary when the spool was full), rejected (refused as malformed; kept)."),
    MetricSpec("publish_spool_bytes", "gauge", "Bytes in the spool waiting for the aggregator.", "bytes"),
    MetricSpec("publish_connected", "gauge",
               "1 when records get through: the last delivery to the aggregator succeeded and the spool can be written."),
    MetricSpec("publish_spool_errors", "counter",
               "Spool faults by reason: an errno name (ENOSPC, EIO, EDQUOT: a write or read failed; records wait\n"
               "in memory, bounded, and are retried) or corrupt (a spooled line that could not be read back; logged)."),
)}


class Extras:
    def __init__(self, agent: "Agent", h: health.Health) -> None:
        self.agent = agent
        self.health = h
        self.publisher: "Publisher | None" = None
        self.heartbeat: "Heartbeat | None" = None
        self.influx: "InfluxExporter | None" = None
        self._seen: dict[str, CollectorState] = {}
        self._report_timer: asyncio.TimerHandle | None = None
        self._heartbeat_task: asyncio.Task[None] | None = None

    # ---- publisher ------------------------------------------------------------------------------

    def _on_transition(self, old: CheckResult | None, new: CheckResult, at: float) -> None:
        assert self.publisher is not None
        self.publisher.publish_transition(old, new, at)
        self._report_soon()

    def _report_soon(self) -> None:
        """One full report after a burst of transitions, so the aggregator's view is whole
        (spooled with them, so it arrives after them, and never lost)."""
        if self._report_timer is None:
            loop = asyncio.get_running_loop()
            self._report_timer = loop.call_later(REPORT_DEBOUNCE_S, self._push_report)

    def _push_report(self) -> None:
        self._report_timer = None
        if self.publisher is not None and self.health.evaluated_at:
            self.publisher.publish_report(self.health.report())

    async def _heartbeat(self, interval: float) -> None:
        assert self.heartbeat is not None
        while True:
            await asyncio.sleep(interval)
            if not self.health.evaluated_at:
                continue
            try:
                await self.heartbeat.send(self.health.report())
            except Exception as e:  # noqa: BLE001 - a bug here must not end the heartbeats for good
                _log.error("heartbeat failed", error=repr(e))

    def _families(self, snap: Snapshot) -> Iterable[Family]:
        """The push path's own health, so an alert can tell a node that stopped reporting from one
        whose aggregator is away (counters are ints the loop replaces: safe to read here)."""
        pub, beat = self.publisher, self.heartbeat
        assert pub is not None and beat is not None
        b, p = beat.stats, pub.stats
        yield Family(PUBLISH_SPECS["publish_heartbeats"], tuple(
            Sample.of("publish_heartbeats", float(v), result=k)
            for k, v in (("full", b.full), ("lease", b.leases), ("conflict", b.conflicts), ("failed", b.failures))))
        yield Family(PUBLISH_SPECS["publish_records"], tuple(
            Sample.of("publish_records", float(v), state=k)
            for k, v in (("published", p.published), ("delivered", p.delivered), ("summarised", p.summarised),
                         ("rejected", p.rejected))))
        yield Family(PUBLISH_SPECS["publish_spool_bytes"], (Sample.of("publish_spool_bytes", float(p.spool_bytes)),))
        yield Family(PUBLISH_SPECS["publish_connected"], (Sample.of("publish_connected", float(pub.connected)),))
        yield Family(PUBLISH_SPECS["publish_spool_errors"], tuple(
            Sample.of("publish_spool_errors", float(v), reason=k) for k, v in sorted(p.spool_errors.items())))

    def _on_events(self, events: tuple[Event, ...]) -> None:
        assert self.publisher is not None
        for e in events:
            self.publisher.publish_event(e)

    # ---- influx ---------------------------------------------------------------------------------

    def _specs(self) -> dict[str, MetricSpec]:
        out: dict[str, MetricSpec] = {}
        for specs in self.agent.specs.values():
            out.update(specs)
        return out

    def _on_snapshot_influx(self, snap: Snapshot) -> None:
        assert self.influx is not None
        specs = None
        for name, st in snap.collectors.items():
            if self._seen.get(name) is st:
                continue
            prev = self._seen.get(name)
            self._seen[name] = st
            # Only a new successful collection is new data; staleness flips carry no samples.
            if st.samples and st.last_success and (prev is None or prev.last_success != st.last_success):
                specs = specs or self._specs()
                self.influx.offer(st.samples, specs, st.last_success)

    # ---- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.publisher is not None:
            await self.publisher.start()
        if self.heartbeat is not None:
            await self.heartbeat.start()
            self._heartbeat_task = asyncio.get_running_loop().create_task(
                self._heartbeat(self.agent.cfg.publish.report_interval), name="report-heartbeat")
        if self.influx is not None:
            self.influx.start()

    async def stop(self) -> None:
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.gather(self._heartbeat_task, return_exceptions=True)
        if self._report_timer is not None:
            self._report_timer.cancel()
        if self.heartbeat is not None:
            await self.heartbeat.stop()
        if self.publisher is not None:
            await self.publisher.stop()
        if self.influx is not None:
            await self.influx.stop()


def install(agent: "Agent", spool_dir: Path | None = None) -> Extras:
    from podhealth.checks.handover.active import active_tests

    h = health.install(agent, active_tests=lambda: active_tests(agent.cfg))
    x = Extras(agent, h)
    cfg = agent.cfg
    if cfg.publish.urls():
        from podhealth.agent.heartbeat import Heartbeat
        from podhealth.agent.publisher import Publisher

        from podhealth.agent.sequence import Sequencer

        pcfg = dataclasses.replace(cfg.publish, spool_dir=spool_dir) if spool_dir is not None else cfg.publish
        seq = Sequencer(cfg.paths.procfs_root)
        x.publisher = Publisher(pcfg, agent.node, sequencer=seq)
        x.heartbeat = Heartbeat(pcfg, sequencer=seq)
        h.on_transition.append(x._on_transition)
        agent.on_events.append(x._on_events)
        agent.add_metric_source(x._families)
        _log.info("pushing verdicts and events", aggregator=",".join(cfg.publish.urls()), spool=str(pcfg.spool_dir))
    if cfg.exporters.influxdb.enabled:
        from podhealth.extras import MissingExtra, require

        try:
            require("influx")
        except MissingExtra as e:
            # An exporter that cannot load is no reason to stop monitoring the node: say it, go on.
            _log.error("InfluxDB export is off", error=str(e))
            return x
        from podhealth.agent.export_influx import InfluxExporter

        x.influx = InfluxExporter(cfg.exporters.influxdb, agent.node)
        agent.on_snapshot.append(x._on_snapshot_influx)
        _log.info("exporting to InfluxDB", url=cfg.exporters.influxdb.url, bucket=cfg.exporters.influxdb.bucket)
    return x
