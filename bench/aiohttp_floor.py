#!/usr/bin/env python3
"""The peer for aggregator_scale.py: aiohttp on the aggregator's event loop, doing nothing.

    python bench/aiohttp_floor.py PORT [CERT KEY]

POST /v1/reports reads the body and answers what the aggregator answers to an unchanged
report or a lease it takes (digest included); GET /healthz says ok. Same aiohttp, same loop choice (podhealth.aioloop, so
PODHEALTH_EVENT_LOOP applies), no access log, the same loop-lag probe: what is left of the aggregator's CPU per report
above this server's is podhealth's own work (auth, parsing, state, metrics). With CERT and KEY it serves HTTPS
(bench/tls_reconnect.py: what a handshake per heartbeat costs a server).
"""

from __future__ import annotations

import asyncio
import ssl
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


async def main(port: int, tls: ssl.SSLContext | None = None) -> None:
    app = web.Application()
    app.router.add_post("/v1/reports", report)
    app.router.add_get("/healthz", healthz)
    runner = web.AppRunner(app, access_log=None, handle_signals=True)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=tls).start()
    # The aggregator's loop-lag probe, so the peer pays its (small) cost too.
    probe = asyncio.create_task(looplag.probe(lambda late, busy: None))
    try:
        await asyncio.Event().wait()
    finally:
        probe.cancel()
        await runner.cleanup()


def server_tls(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


if __name__ == "__main__":
    aioloop.run(main(int(sys.argv[1]), server_tls(sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else None))
