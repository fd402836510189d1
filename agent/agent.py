"""The node agent: builds the collectors, schedules them, serves the snapshot, talks to systemd.

What else it does comes in through two seams, both before `start()`:
- `agent.add_plugin(plugin)`: a part of the agent on its event loop (agent/plugin.py): it sees
  each burst's snapshot (once, when the burst is over: the judge judges a cycle's data once) and
  the new kernel-log events, and may serve routes and add metric families. The judge
  (agent/health.py) is the one added by `add_judge()`: its verdict transitions go to the sinks
  and its node report is `agent.report()`.
- `agent.add_sink(sink)`: somewhere the agent sends what it sees (agent/sink.py: the aggregator
  publisher, the heartbeat, the InfluxDB export). Sinks start when the agent serves and stop
  first; each is fed snapshots, events and the judge's transitions through its own bounded
  queue, so a slow or broken sink holds up nothing else. The plugins see a snapshot or events
  before the sinks do.

A collector whose factory raises (CollectorDisabled with a reason, or anything else), does not
return in time, or is disabled in config is reported disabled with the reason; the agent keeps
running with the others (dcgm-exporter's exit-because-one-source-failed is the anti-pattern).
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from aiohttp import web

from podhealth import __version__, log
from podhealth.agent.metrics.family import Family, MetricSource
from podhealth.agent.metrics.detail import ExportFilter, unknown_families
from podhealth.agent.metrics.render import ExpositionCache, RenderContext
from podhealth.agent.scheduler import Scheduler
from podhealth.agent.sdnotify import Notifier, watchdog, watchdog_interval
from podhealth.agent.nodeauth import NodeAuth
from podhealth.agent.plugin import AgentView, Plugin
from podhealth.agent.server import AGENT_KEY, build_app
from podhealth.agent.sink import Sink, Sinks
from podhealth.agent.store import SnapshotCallback, SnapshotStore
from podhealth.checks import profiles
from podhealth.collectors.base import Collector
from podhealth.collectors.runtime import (
    Factory, all_factories, build, collector_config, factory_timeout, registry_factories,
)
from podhealth.config import Config
from podhealth.hostnames import node_name_problem
from podhealth.fdlimit import soft_limit
from podhealth.httpguard import ConnLimits, GuardedSite, fd_share
from podhealth.logrepeat import Repeats, loop_exception_handler
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.tls import ServerTls
from podhealth.vocab import MetricSpec, NodeReport, Sample

if TYPE_CHECKING:
    from podhealth.agent.health import Health

__all__ = ["AGENT_KEY", "Agent", "Family", "MetricSource", "registry_factories"]

_log = log.get("podhealth.agent")

# The longest the plugins and sinks wait for a burst of snapshot changes to end (agent/plugin.py).
HOOK_MAX_DELAY = 0.5
# HTTP: Prometheus, the aggregator and an operator need a handful of connections; a flood of idle
# or slow ones must never take the descriptors the collectors read through (httpguard.py).
HTTP_IDLE_TIMEOUT = 30.0
HTTP_MAX_CONNECTIONS = 256
HTTP_SPEC = MetricSpec("http_connections_refused", "counter",
                       "Connections refused because max connections were open, or the client's share of them "
                       "(idle and slow ones time out).")


def default_node_name() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


class Agent:
    def __init__(self, cfg: Config, *, node: str | None = None,
                 factories: Mapping[str, Factory] | None = None,
                 seams: Mapping[str, Mapping[str, Any]] | None = None,
                 notifier: Notifier | None = None, version: str = __version__,
                 factory_timeout: float | None = None, stale_after: float = 3.0) -> None:
        self.cfg = cfg
        self.node = node or cfg.node.name or default_node_name()
        if node_name_problem(self.node):
            raise ValueError(f"invalid node name: {node_name_problem(self.node)}")
        self.version = version
        self.factories = dict(factories if factories is not None else all_factories(cfg))  # + site checks
        if factories is None:
            for name in profiles.collectors_not_here(cfg):
                self.factories.pop(name, None)
        self.seams = profiles.collector_seams(cfg, seams)  # the profile facts collectors need (NVLink links)
        self.notifier = notifier if notifier is not None else Notifier()
        self.factory_timeout = factory_timeout
        self.store = SnapshotStore(keep_events=cfg.collectors.kmsg.keep_events)
        self.scheduler = Scheduler(self.store, stale_after=stale_after)
        self.collectors: dict[str, Collector] = {}
        self.specs: dict[str, Mapping[str, MetricSpec]] = {}
        self.exposition = ExpositionCache(
            RenderContext(self.node, version, cfg.node.profile, {}), self.store.snapshot)
        self.started_monotonic = time.monotonic()
        self.port = 0
        self.plugins: list[Plugin] = []
        self.judge: "Health | None" = None  # add_judge()
        self._runner: web.AppRunner | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._status = ""
        self._started = False
        self._on_snapshot: list[SnapshotCallback] = []  # at start: the plugins', then the agent's own
        self._hooks_pending = False
        self._hooks_timer: asyncio.TimerHandle | None = None
        self.http_refused = 0
        self.http_limits: ConnLimits | None = None  # None: HTTP_MAX_CONNECTIONS / HTTP_IDLE_TIMEOUT
        self._repeats = Repeats(_log)
        self.sinks = Sinks()
        # Signed requests to the protected routes, proven answers (core/nodeproof.py).
        self.nodeauth = NodeAuth(self.node, cfg.auth.token)
        # HTTPS on the listener with the node's certificate (tls.serve), each handshake served the
        # newest files (core/tls.py); wiring.install re-reads them on SIGHUP or change.
        self.tls: ServerTls | None = ServerTls(cfg.tls.server()) if cfg.tls.serve else None

    # ---- plug-ins ---------------------------------------------------------------------------

    @property
    def snapshot(self) -> Snapshot:
        return self.store.snapshot

    def view(self) -> AgentView:
        """What a plugin may use of this agent (agent/plugin.py)."""
        return AgentView(self.cfg, self.node, self.version, self.seams, self.nodeauth,
                         snapshot=lambda: self.store.snapshot, store_version=lambda: self.store.version,
                         collectors=lambda: self.collectors.keys(), collect_now=self.scheduler.collect_now,
                         invalidate=self.invalidate)

    def add_plugin(self, plugin: Plugin) -> None:
        if self._started:
            raise RuntimeError("add_plugin() must be called before start()")
        self.plugins.append(plugin)

    def add_judge(self, judge: "Health") -> None:
        """The judge (agent/health.py): a plugin whose verdict transitions go to the sinks and whose
        node report the sinks read (`report()`)."""
        if self.judge is not None:
            raise RuntimeError("the agent has a judge already")
        self.add_plugin(judge)
        self.judge = judge
        judge.on_transition.append(self.sinks.transition)

    def report(self) -> NodeReport | None:
        """The judge's node report now; None before its first judgement (or without a judge)."""
        judge = self.judge
        return judge.report() if judge is not None and judge.evaluated_at else None

    def add_sink(self, sink: Sink) -> None:
        if self._started:
            raise RuntimeError("add_sink() must be called before start()")
        self.sinks.add(sink)

    def invalidate(self) -> None:
        """Re-render /metrics for the current snapshot (a metric source's data changed)."""
        self.exposition.update(self.store.snapshot)
        if self._started:
            try:
                asyncio.get_running_loop().call_soon(self._prerender_if_idle)
            except RuntimeError:
                pass  # called off the loop: the next scrape renders it

    @property
    def url(self) -> str:
        host = self.cfg.listen.address
        host = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
        return f"{self.cfg.tls.scheme}://{host}:{self.port}"

    # ---- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self.started_monotonic = time.monotonic()
        self._started = True
        await self._build_collectors()
        detail = self._export_filter()
        specs = {name: detail.specs(name, s) for name, s in self.specs.items()}
        sources: list[MetricSource] = [self._http_families, *(p.families for p in self.plugins), self.sinks.families]
        self.exposition.ctx = RenderContext(
            self.node, self.version, self.cfg.node.profile, specs, tuple(sources), detail)
        self.store.on_snapshot.insert(0, self._changed)
        # The plugins first (the judge schedules its judgement), in the order they were added.
        self._on_snapshot = [*(p.on_snapshot for p in self.plugins), self._update_status, self.sinks.snapshot]
        # New kernel-log events: to the plugins (the judge's fast path), then the sinks.
        self.store.on_events.extend([*(p.on_events for p in self.plugins), self.sinks.events])
        self.invalidate()
        self.scheduler.start()
        # The loop's own error reports (a failed accept() when fds run out) once per kind a minute.
        asyncio.get_running_loop().set_exception_handler(loop_exception_handler(self._repeats))
        app = build_app(self, [r for p in self.plugins for r in p.routes()])
        limits = self.http_limits or ConnLimits(min(HTTP_MAX_CONNECTIONS, fd_share(soft_limit(), 1 / 8)),
                                                HTTP_IDLE_TIMEOUT)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, **limits.runner_kwargs())
        await self._runner.setup()
        site = GuardedSite(self._runner, self.cfg.listen.address, self.cfg.listen.port, limits, self._refused,
                           ssl_context=self.tls.context if self.tls is not None else None)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        _log.info("agent listening", url=f"{self.url}/metrics", node=self.node,
                  collectors=sorted(self.collectors),
                  disabled={n: s.disabled_reason for n, s in self.store.snapshot.collectors.items() if not s.enabled})
        self._status = self._summary(self.store.snapshot)
        self.notifier.ready(self._status)
        interval = watchdog_interval()
        if interval is not None and self.notifier.enabled:
            self._watchdog = asyncio.get_running_loop().create_task(watchdog(self.notifier, interval), name="watchdog")
        await self.sinks.start()

    def _export_filter(self) -> ExportFilter:
        """Each collector's detail level and family switches (config) over export_detail.yaml."""
        ccs = {name: collector_config(self.cfg, name) for name in self.factories}
        flt = ExportFilter({n: cc.detail for n, cc in ccs.items()},
                           {n: cc.families for n, cc in ccs.items() if cc.families})
        for bad in unknown_families(flt, self.specs):
            # Not fatal: a typo in an export switch must not stop GPU monitoring.
            _log.warning("config collectors.<name>.families names no metric of that collector; ignored",
                         key=f"collectors.{bad.replace('.', '.families.', 1)}")
        return flt

    def _refused(self, open_now: int, client: str | None) -> None:
        self.http_refused += 1
        if client is None:
            self._repeats.emit("warning", "http refused", "HTTP connection refused: too many open",
                               open=open_now, refused_total=self.http_refused)
        else:
            self._repeats.emit("warning", "http refused client", "HTTP connection refused: the client holds its share",
                               client=client, open=open_now, refused_total=self.http_refused)

    def _http_families(self, snap: Snapshot) -> Iterable[Family]:
        yield Family(HTTP_SPEC, (Sample.of("http_connections_refused", float(self.http_refused)),))

    async def stop(self) -> None:
        # The watchdog pings end before STOPPING=1: systemd times a stopping unit by
        # TimeoutStopSec, and a ping sent while the sinks drain came after STOPPING=1 at random.
        if self._watchdog is not None:
            self._watchdog.cancel()
            await asyncio.gather(self._watchdog, return_exceptions=True)
        self.notifier.stopping()
        await self.sinks.stop()  # while collectors and HTTP still run: the publisher drains its spool
        if self._hooks_timer is not None:
            self._hooks_timer.cancel()
            self._hooks_timer = None
        if self._runner is not None:
            await self._runner.cleanup()
        await self.scheduler.stop()
        await self.exposition.close()
        self.notifier.close()

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    async def _build_collectors(self) -> None:
        names = list(self.factories)
        results = await asyncio.gather(*(self._build_one(n) for n in names))
        for name, (collector, reason) in zip(names, results):
            cc = collector_config(self.cfg, name)
            if collector is None:
                self.store.put(CollectorState(name=name, enabled=False, disabled_reason=reason))
                continue
            self.collectors[name] = collector
            self.specs[name] = dict(getattr(collector, "metrics", {}) or {})
            self.scheduler.add(name, collector, cc.interval, cc.timeout, getattr(cc, "watched_interval", None))

    async def _build_one(self, name: str) -> tuple[Collector | None, str]:
        cc = collector_config(self.cfg, name)
        if not cc.enabled:
            _log.info("collector disabled in config", collector=name)
            return None, "disabled in config"
        timeout = self.factory_timeout if self.factory_timeout is not None else factory_timeout(cc)
        return await build(name, self.factories[name], self.cfg, self.seams.get(name, {}), timeout)

    def _changed(self, snap: Snapshot) -> None:
        self.exposition.update(snap)
        loop = asyncio.get_running_loop()
        if not self._hooks_pending:
            self._hooks_pending = True
            self._hooks_timer = loop.call_later(HOOK_MAX_DELAY, self._run_hooks)
        # The callback may run before the finishing collection's slot is cleared: defer the idle check.
        loop.call_soon(self._after_change)

    def _after_change(self) -> None:
        if self.scheduler.idle():
            self._run_hooks()
            self.exposition.prerender()

    def _prerender_if_idle(self) -> None:
        if self.scheduler.idle():
            self.exposition.prerender()

    def _run_hooks(self) -> None:
        """Hand the latest snapshot to the plugins and the sinks (once per burst of changes)."""
        if self._hooks_timer is not None:
            self._hooks_timer.cancel()
            self._hooks_timer = None
        if not self._hooks_pending:
            return
        self._hooks_pending = False
        self.store.call_each(self._on_snapshot, self.store.snapshot)
    # ---- systemd STATUS= ----------------------------------------------------------------------

    @staticmethod
    def _summary(snap: Snapshot) -> str:
        states = list(snap.collectors.values())
        ok = sum(1 for s in states if s.enabled and not s.stale)
        stale = sorted(s.name for s in states if s.enabled and s.stale)
        disabled = sum(1 for s in states if not s.enabled)
        text = f"{ok} collectors fresh, {disabled} disabled"
        return text + (f", stale: {','.join(stale)}" if stale else "")

    def _update_status(self, snap: Snapshot) -> None:
        text = self._summary(snap)
        if text != self._status and self._runner is not None:
            self._status = text
            self.notifier.status(text)
