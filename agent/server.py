"""The agent's HTTP endpoints: /metrics (cached exposition), /healthz (alive), / (index).

/health (the node verdict) belongs to the judge, a plugin (agent/plugin.py): the routes of the
agent's plugins are served beside these.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from aiohttp import web

from podhealth import webguard
from podhealth.agent.metrics.render import negotiate, wants_gzip

if TYPE_CHECKING:
    from podhealth.agent.agent import Agent

AGENT_KEY: "web.AppKey[Agent]" = web.AppKey("podhealth_agent")


async def metrics(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    fmt = negotiate(request.headers.get("Accept", ""))
    gz = wants_gzip(request.headers.get("Accept-Encoding", ""))
    body = await agent.exposition.get((fmt, gz))
    resp = web.Response(body=body, headers={"Content-Type": fmt.content_type})
    if gz:
        resp.headers["Content-Encoding"] = "gzip"
    resp.headers["Vary"] = "Accept, Accept-Encoding"
    return resp


async def healthz(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    return web.json_response({
        "status": "ok",
        "uptime": round(time.monotonic() - agent.started_monotonic, 3),
        "node": agent.node,
        "version": agent.version,
    })


async def index(request: web.Request) -> web.Response:
    agent = request.app[AGENT_KEY]
    paths = sorted({r.resource.canonical for r in request.app.router.routes()
                    if r.method == "GET" and r.resource is not None})
    lines = [f"podhealth agent {agent.version} on {agent.node}", ""] + paths
    return web.Response(text="\n".join(lines) + "\n")


def build_app(agent: "Agent", extra: list[web.AbstractRouteDef]) -> web.Application:
    # Every answer to a caller that sent a nonce carries its proof (agent/nodeauth.py).
    app = web.Application(middlewares=[agent.nodeauth.middleware])
    app[AGENT_KEY] = agent
    app.add_routes([web.get("/metrics", metrics), web.get("/healthz", healthz), web.get("/", index)])
    app.add_routes(extra)
    webguard.require_guarded(app)  # a mutating route (POST /v1/handover) must refuse cross-site callers
    return app
