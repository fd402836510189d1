"""What the agent does with its snapshot besides /metrics: verdicts and the sinks config asks for.

`install(agent)` (before `agent.start()`) installs the checks engine as the agent's judge
(/health, check_status, the handover endpoint; its transitions go to every sink) and adds the sinks `build_sinks` makes from config (agent/sink.py):
- the publisher (verdict transitions, node reports and XID/SXid events pushed to the
  aggregator, spooled on disk while it is away) and the heartbeat (the node's report every
  interval, as a small lease while nothing changed), when `publish` names an aggregator;
- the InfluxDB v2 export (each collector's fresh samples, once per collection), when
  `exporters.influxdb.enabled`;
- the re-reading of the node's TLS files (SIGHUP, or when they change): the pushes' context when
  `tls` names a CA or certificate, the agent's own HTTPS listener when `tls.serve`.
Each sink gets only what it needs: its config section, the node name, and a function that
reads the node report or the metric specs. The agent starts, feeds and stops them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from podhealth import log
from podhealth.agent import health
from podhealth.agent.sink import Sink
from podhealth.config import Config
from podhealth.tls import ClientTls, Reloadable, ServerTls, Watch
from podhealth.vocab import MetricSpec, NodeReport

if TYPE_CHECKING:
    from podhealth.agent.agent import Agent

_log = log.get("podhealth.agent.wiring")

ReportFn = Callable[[], NodeReport | None]
SpecsFn = Callable[[], Mapping[str, MetricSpec]]


def build_sinks(cfg: Config, node: str, *, report: ReportFn, specs: SpecsFn,
                spool_dir: Path | None = None, tls: ClientTls | None = None,
                server_tls: ServerTls | None = None) -> list[Sink]:
    """The sinks `cfg` asks for. `report()`: the node report now, None before the first
    judgement; `specs()`: every collector's metric specs by name; `spool_dir` overrides
    publish.spool_dir (the simulator keeps its node's spool beside its tree); `server_tls`: the
    agent's HTTPS listener (tls.serve), re-read by the same watch as the pushes' context."""
    sinks: list[Sink] = []
    reload: list[Reloadable] = [server_tls] if server_tls is not None else []
    if cfg.publish.urls():
        from podhealth.agent.heartbeat import Heartbeat
        from podhealth.agent.publisher import Publisher
        from podhealth.agent.sequence import Sequencer

        pcfg = dataclasses.replace(cfg.publish, spool_dir=spool_dir) if spool_dir is not None else cfg.publish
        seq = Sequencer(cfg.paths.procfs_root)  # shared: heartbeats and spooled records in one order
        tls = tls or client_tls(cfg)
        ctx = tls.context if tls is not None else None
        # A reload renews their sessions: kept connections would go on with the old certificate.
        reloads = (lambda t=tls: t.reloads) if tls is not None else None
        sinks.append(Publisher(pcfg, node, sequencer=seq, report=report, tls=ctx, tls_reloads=reloads))
        sinks.append(Heartbeat(pcfg, sequencer=seq, report=report, tls=ctx, tls_reloads=reloads, node=node))
        if tls is not None:
            reload.append(tls)
        _log.info("pushing verdicts and events", aggregator=",".join(cfg.publish.urls()), spool=str(pcfg.spool_dir))
    if cfg.exporters.influxdb.enabled:
        from podhealth.extras import MissingExtra, require

        try:
            require("influx")
        except MissingExtra as e:
            # An exporter that cannot load is no reason to stop monitoring the node: say it, go on.
            _log.error("InfluxDB export is off", error=str(e))
            return sinks + ([TlsReload(Watch(reload))] if reload else [])
        from podhealth.agent.export_influx import InfluxExporter

        sinks.append(InfluxExporter(cfg.exporters.influxdb, node, specs=specs))
        _log.info("exporting to InfluxDB", url=cfg.exporters.influxdb.url, bucket=cfg.exporters.influxdb.bucket)
    if reload:  # one watch: SIGHUP has one handler
        sinks.append(TlsReload(Watch(reload)))
    return sinks


def failslow_sink(cfg: Config, node: str, seam: Mapping[str, Any], tls: ClientTls | None = None) -> Sink | None:
    """The fail-slow sink when probes are on or job windows can be sent (an aggregator URL)."""
    if not (cfg.failslow.enabled or (cfg.publish.urls() and cfg.failslow.job_windows)):
        return None
    from podhealth.agent.failslow import FailslowSink, probe_from

    from podhealth.checks import profiles

    probe = probe_from(seam["probe"]) if "probe" in seam else None
    limit = float(profiles.of_config(cfg).thresholds.get("gpu_temp_fail_c", 90.0))
    tls = tls or client_tls(cfg)
    return FailslowSink(cfg.failslow, cfg.publish, node, cfg.node.profile, probe=probe, temp_limit_c=limit,
                        tls=tls.context if tls is not None else None)


def client_tls(cfg: Config) -> ClientTls | None:
    """The node's TLS to the aggregator, when its config names a CA or a client certificate."""
    return ClientTls(cfg.tls) if (cfg.tls.ca or cfg.tls.cert) else None


class TlsReload(Sink):
    """Re-reads the node's TLS files on SIGHUP or change while the agent runs (core/tls.py)."""

    name = "tls"

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    async def start(self) -> None:
        self.watch.start()

    async def stop(self) -> None:
        await self.watch.stop()


def install(agent: "Agent", spool_dir: Path | None = None) -> health.Health:
    from podhealth.checks.handover.active import active_tests

    h = health.install(agent, active_tests=lambda: active_tests(agent.cfg))

    def specs() -> dict[str, MetricSpec]:
        out: dict[str, MetricSpec] = {}
        for by_name in agent.specs.values():
            out.update(by_name)
        return out

    tls = client_tls(agent.cfg)  # one context for every push, re-read by the one TlsReload sink
    for sink in build_sinks(agent.cfg, agent.node, report=agent.report, specs=specs, spool_dir=spool_dir, tls=tls,
                            server_tls=agent.tls):
        agent.add_sink(sink)
    fs = failslow_sink(agent.cfg, agent.node, agent.seams.get("failslow", {}), tls=tls)
    if fs is not None:
        agent.add_sink(fs)
    return h
