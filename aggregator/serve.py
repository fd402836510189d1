"""Run the aggregator until SIGTERM/SIGINT (the body of `podhealth aggregator`)."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from podhealth import aioloop
from podhealth import log as plog
from podhealth.config_aggregator import AggregatorConfig, agent_keepalive
from podhealth.aggregator.server import make_app
from podhealth.aggregator.service import Aggregator
from podhealth.aggregator.store import StoreError
from podhealth.fdlimit import soft_limit
from podhealth.httpguard import ConnLimits, GuardedSite, fd_share
from podhealth.logrepeat import Repeats, loop_exception_handler

log = plog.get("podhealth.aggregator")
# Connections may take this share of the open-file limit; the rest stays for the store and fencers.
HTTP_FD_SHARE = 0.75


def http_limits(cfg: AggregatorConfig) -> ConnLimits:
    """`connections:`: agents keep one connection each between heartbeats (agent/heartbeat.py),
    so the cap is the fleet's size in file descriptors, and the idle timeout outlasts theirs."""
    c = cfg.connections
    return ConnLimits(c.max or fd_share(soft_limit(), HTTP_FD_SHARE), c.idle_for(cfg.heartbeat_interval))


def budget_problems(cfg: AggregatorConfig, limits: ConnLimits) -> list[tuple[str, dict[str, object]]]:
    """What an operator must hear at start about the connection budget (logged as warnings)."""
    out: list[tuple[str, dict[str, object]]] = []
    keep = agent_keepalive(cfg.heartbeat_interval)
    if limits.idle_timeout <= keep:
        out.append(("connections.idle_timeout is shorter than the agents keep their connection idle: each "
                    "heartbeat will pay a new connection (and TLS handshake)",
                    {"idle_timeout": limits.idle_timeout, "agents_keepalive": keep}))
    fds = soft_limit()
    if limits.max_connections > fds * HTTP_FD_SHARE:
        out.append(("connections.max leaves too few of the open-file limit to the store and fencers: raise "
                    "LimitNOFILE", {"max": limits.max_connections, "open_file_limit": fds}))
    return out


async def start_http(agg: Aggregator, limits: ConnLimits) -> web.AppRunner:
    """Start the opened aggregator (its cleanup_ctx) and its guarded HTTP site; raises StoreError
    or OSError (nothing left running then but `agg`, which the caller stops)."""
    cfg = agg.cfg
    runner = web.AppRunner(make_app(agg), access_log=None, handle_signals=False, **limits.runner_kwargs())
    await runner.setup()  # runs cleanup_ctx: recovers the journal, reconciles, starts the loops
    refusals = Repeats(log)

    def refused(open_now: int, client: str | None) -> None:
        agg.metrics.http_refused.inc()
        if client is None:
            refusals.emit("warning", "http refused", "HTTP connection refused: too many open", open=open_now,
                          max_connections=limits.max_connections)
        else:
            refusals.emit("warning", "http refused client", "HTTP connection refused: the client holds its share",
                          client=client, open=open_now, per_client=limits.client_cap(cfg.listen.address))
    ssl_context = agg.tls.context if agg.tls is not None else None
    site = GuardedSite(runner, cfg.listen.address, cfg.listen.port, limits, refused, reuse_address=True,
                       ssl_context=ssl_context)
    try:
        await site.start()
    except OSError:
        await runner.cleanup()
        raise
    agg.metrics.http_open.set_function(lambda: site.open)
    agg.metrics.http_max.set(limits.max_connections)
    return runner


async def serve(cfg: AggregatorConfig) -> int:
    # The loop's own error reports (a failed accept() when fds run out) once per kind a minute.
    asyncio.get_running_loop().set_exception_handler(loop_exception_handler(Repeats(log)))
    try:
        agg = await Aggregator.open(cfg)
    except StoreError as e:
        log.error("cannot open the state store", error=str(e))
        return 2
    try:
        limits = http_limits(cfg)
        for message, fields in budget_problems(cfg, limits):
            log.warning(message, **fields)  # type: ignore[arg-type]
        runner = await start_http(agg, limits)
    except StoreError as e:
        await agg.stop()
        log.error("cannot open the state store", error=str(e))
        return 2
    except OSError as e:
        await agg.stop()  # start_http's cleanup already stopped it after a started app: stop() is idempotent
        log.error("cannot listen", address=cfg.listen.address, port=cfg.listen.port, error=str(e))
        return 2
    log.info("aggregator listening", addresses=[f"{a[0]}:{a[1]}" for a in runner.addresses], dry_run=cfg.dry_run,
             tls=("off" if agg.tls is None else f"on, client certificates {cfg.tls.client_certs}"),
             fencers=[f.name for f in agg.fencers], event_loop=aioloop.running_loop_name())
    if not cfg.auth.configured():
        log.warning("ingest is unauthenticated (loopback only, nothing fences): set aggregator.auth.cluster_secret")
    pulled = [n.name for n in cfg.nodes if n.agent_url]
    if pulled and not (cfg.auth.cluster_secret or cfg.auth.agent_token):
        log.warning("nodes with an agent_url cannot be proven without aggregator.auth.cluster_secret (their agents' "
                    "answers are ignored: UNKNOWN, never released or fenced for them)", nodes=pulled[:10])
    if cfg.auth.cluster_token_for_agents:
        log.warning("UNSAFE: cluster_token_for_agents lets any holder of cluster_token report for every node")
    if cfg.auth.agent_token:
        log.warning("UNSAFE: agent_token is one token for every agent: root on any node can reset GPUs on every "
                    "other; unset it so that each agent gets its own, derived from cluster_secret")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("aggregator stopping")
    await runner.cleanup()
    return 0
