#!/usr/bin/env python3
"""The peer for aggregator_scale.py: aiohttp on the aggregator's event loop, doing nothing.

    python bench/aiohttp_floor.py PORT

POST /v1/reports reads the body and answers what the aggregator answers to an unchanged
report or a lease it takes (digest included); GET /healthz says ok. Same aiohttp, same loop choice (podhealth.aioloop, so
PODHEALTH_EVENT_LOOP applies), no access log, the same loop-lag probe: what is left of the aggregator's CPU per report
above this server's is podhealth's own work (auth, parsing, state, metrics).
"""

from __future__ import annotations

import asyncio
import sys

from aiohttp import web

from podhealth import aioloop, looplag

ANSWER = b'{"applied":0,"duplicate":0,"stale":0,"unchanged":1,"digest":"0123456789abcdef"}'
HEADERS = {"Content-Type": "application/json; charset=utf-8"}


async def report(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=ANSWER, headers=HEADERS)


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def main(port: int) -> None:
    app = web.Application()
    app.router.add_post("/v1/reports", report)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    # The aggregator's loop-lag probe, so the peer pays its (small) cost too.
    probe = asyncio.create_task(looplag.probe(lambda late, busy: None))
    try:
        await asyncio.Event().wait()
    finally:
        probe.cancel()
        await runner.cleanup()


if __name__ == "__main__":
    aioloop.run(main(int(sys.argv[1])))
