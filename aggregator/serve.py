"""Run the aggregator until SIGTERM/SIGINT (the body of `podhealth aggregator`)."""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from podhealth import aioloop
from podhealth import log as plog
from podhealth.aggregator.config import AggregatorConfig
from podhealth.aggregator.server import make_app
from podhealth.aggregator.service import Aggregator
from podhealth.aggregator.store import StoreError

log = plog.get("podhealth.aggregator")


async def serve(cfg: AggregatorConfig) -> int:
    agg = Aggregator(cfg)
    app = make_app(agg)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    try:
        await runner.setup()  # runs cleanup_ctx: opens the store, recovers, reconciles
    except StoreError as e:
        log.error("cannot open the state store", error=str(e))
        return 2
    site = web.TCPSite(runner, cfg.listen.address, cfg.listen.port, reuse_address=True)
    try:
        await site.start()
    except OSError as e:
        log.error("cannot listen", address=cfg.listen.address, port=cfg.listen.port, error=str(e))
        await runner.cleanup()
        return 2
    log.info("aggregator listening", addresses=[f"{a[0]}:{a[1]}" for a in runner.addresses], dry_run=cfg.dry_run,
             fencers=[f.name for f in agg.fencers], event_loop=aioloop.running_loop_name())
    if not cfg.auth.configured():
        log.warning("ingest is unauthenticated (loopback only, nothing fences): set aggregator.auth.cluster_secret")
    if cfg.auth.cluster_token_for_agents:
        log.warning("UNSAFE: cluster_token_for_agents lets any holder of cluster_token report for every node")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("aggregator stopping")
    await runner.cleanup()
    return 0
