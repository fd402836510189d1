"""The aggregator's web UI: a fleet page, a node page, their static assets, and a live feed.

The pages are static files that read the JSON API (/api/v1/*). Two read-only views live here
because the API has no equivalent: the tile list (every node with its open problems as
check/entity/status, which /api/v1/nodes flattens to check names) at GET /ui/api/fleet, and a
Server-Sent Events stream of changes to it at GET /ui/events (a full snapshot on connect, then
only the tiles that changed). The browser falls back to polling /ui/api/fleet when the stream
cannot be opened. Two more feed the charts and links: GET /ui/api/fleet-history (node counts by
state, sampled into the store by the housekeeping loop) and GET /ui/api/links?node=NAME (the
node's Grafana dashboards when aggregator.ui.grafana_url is set).

Security: assets come from the package (no CDN, works offline) and are served with a strict
Content-Security-Policy (default-src 'self'; no inline script or style), so data rendered with
textContent cannot turn into code. Mutations stay where they are (/api/v1/..., admin bearer
token in an Authorization header, which a cross-site form can never carry); on top of that
every mutating route is wrapped in webguard.same_site_only, which refuses a request whose Origin (or
Sec-Fetch-Site) says it comes from another site.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.resources
import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from aiohttp import web

from podhealth.aggregator import federation, grafana
from podhealth.hostnames import node_name_problem
from podhealth.webguard import Handler
from podhealth.worker import offload

if TYPE_CHECKING:
    from podhealth.aggregator.service import Aggregator

STATIC_PACKAGE = "podhealth.aggregator.static"
CONTENT_TYPES: Mapping[str, str] = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS: Mapping[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
TICK = 0.5  # how often a stream looks for changes: a fault shows within about a second
KEEPALIVE = 15.0  # a comment line this often keeps proxies from closing an idle stream
SUMMARY_EVERY = 1.0  # fleet counters that change without a state change (rate limit, pending)
MAX_STREAMS = 200  # each open stream holds a diff of the fleet; refuse more than this many
RETRY_MS = 2000  # EventSource reconnect delay the server asks for


@dataclass(frozen=True, slots=True)
class Tile:
    """One node as the fleet grid needs it."""

    name: str
    state: str
    status: str
    partition: str
    fence_reason: str
    problems: tuple[tuple[str, str, str], ...]  # (check, entity, status) of each open condition

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "state": self.state, "status": self.status, "partition": self.partition,
                "fence_reason": self.fence_reason, "problems": [list(p) for p in self.problems]}


def summary_of(agg: "Aggregator") -> dict[str, Any]:
    """The fleet header: fleet_json() less what changes every call (time, the decision notes)."""
    out = agg.fleet_json()
    out.pop("time", None)
    notes = out.pop("last_decision", {}).get("notes", [])
    held: dict[str, int] = {}
    for n in notes:
        held[n["kind"]] = held.get(n["kind"], 0) + 1
    out["notes"] = held
    return out


class Feed:
    """Tiles and the fleet summary, rebuilt at most once per change and shared by every stream."""

    def __init__(self, agg: "Aggregator", clock: Callable[[], float] = time.monotonic) -> None:
        self.agg = agg
        self.clock = clock
        self.closing = asyncio.Event()
        self.streams = 0
        self.generation = 0  # bumped whenever tiles or summary changed
        self._version = -1
        self._tiles: dict[str, Tile] = {}
        self._summary: dict[str, Any] = {}
        self._summary_at = float("-inf")

    def current(self) -> tuple[int, Mapping[str, Tile], Mapping[str, Any]]:
        mem = self.agg.mem
        if mem is None:
            return self.generation, {}, {}
        now = self.clock()
        changed = False
        if mem.version != self._version:
            self._version = mem.version
            tiles = {}
            for name, rec in mem.nodes.items():
                problems = tuple((c.check, c.entity, c.status.value) for c in mem.conditions_of(name))
                tiles[name] = Tile(name, rec.state, rec.status.value, rec.partition, rec.fence_reason, problems)
            if tiles != self._tiles:
                self._tiles, changed = tiles, True
        if changed or now - self._summary_at >= SUMMARY_EVERY:
            summary = summary_of(self.agg)
            self._summary_at = now
            if summary != self._summary:
                self._summary, changed = summary, True
        if changed:
            self.generation += 1
        return self.generation, self._tiles, self._summary


FEED = web.AppKey("ui_feed", Feed)


@dataclass(frozen=True, slots=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


def load_assets() -> dict[str, Asset]:
    """Every .html/.js/.css file shipped in the static package, read once at start."""
    out: dict[str, Asset] = {}
    for entry in importlib.resources.files(STATIC_PACKAGE).iterdir():
        name = entry.name
        suffix = name[name.rfind("."):] if "." in name else ""
        if suffix in CONTENT_TYPES and entry.is_file():
            body = entry.read_bytes()
            out[name] = Asset(body, CONTENT_TYPES[suffix], '"' + hashlib.sha256(body).hexdigest()[:20] + '"')
    return out


ASSETS = web.AppKey("ui_assets", dict[str, Asset])
FEDERATION = web.AppKey("ui_federation", federation.Federation)
DASHBOARDS = web.AppKey("ui_dashboards", tuple[grafana.Dashboard, ...])


def _asset_response(request: web.Request, name: str) -> web.Response:
    asset = request.app[ASSETS].get(name)
    if asset is None:
        raise web.HTTPNotFound(text=f"no such asset: {name}")
    headers = {"ETag": asset.etag, "Cache-Control": "no-cache"}  # revalidate: a new version shows on reload
    if request.headers.get("If-None-Match") == asset.etag:
        return web.Response(status=304, headers=headers)
    return web.Response(body=asset.body, headers={**headers, "Content-Type": asset.content_type})


async def root(request: web.Request) -> web.Response:
    raise web.HTTPFound("/ui")


async def fleet_page(request: web.Request) -> web.Response:
    return _asset_response(request, "fleet.html")


async def failslow_page(request: web.Request) -> web.Response:
    return _asset_response(request, "failslow.html")


async def federation_page(request: web.Request) -> web.Response:
    return _asset_response(request, "federation.html")


async def federation_view(request: web.Request) -> web.Response:
    """The federated view's data: every configured aggregator set, read with its own credential
    and deadline (aggregator/federation.py); none is ever sent to the browser."""
    views = await request.app[FEDERATION].view()
    return web.json_response({"timeout": request.app[FEDERATION].timeout, "sets": [v.to_json() for v in views]},
                             headers={"Cache-Control": "no-store"})


async def node_page(request: web.Request) -> web.Response:
    problem = node_name_problem(request.match_info["name"])
    if problem:
        return web.Response(status=400, text=problem)
    return _asset_response(request, "node.html")


async def static(request: web.Request) -> web.Response:
    return _asset_response(request, request.match_info["file"])


def _node_filter(request: web.Request) -> str | None:
    only = request.query.get("node")
    if only is not None and node_name_problem(only):
        raise web.HTTPBadRequest(text=node_name_problem(only) or "")
    return only


def _select(tiles: Mapping[str, Tile], only: str | None) -> Mapping[str, Tile]:
    if only is None:
        return tiles
    t = tiles.get(only)
    return {only: t} if t is not None else {}


async def fleet_view(request: web.Request) -> web.Response:
    """The same snapshot the stream starts with, for browsers that cannot keep a stream open."""
    only = _node_filter(request)
    gen, tiles, summary = request.app[FEED].current()
    body = {"generation": gen, "summary": summary, "nodes": [t.to_json() for t in _select(tiles, only).values()]}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


HISTORY_HOURS_MAX = 24 * 7  # what ui.history_retention keeps by default


async def fleet_history(request: web.Request) -> web.Response:
    """The fleet chart's data: node counts by state, sampled by the housekeeping loop, over the
    last `hours` (default 24), plus the counts now so the chart reaches the present."""
    agg = request.app[FEED].agg
    try:
        hours = float(request.query.get("hours", "24"))
    except ValueError:
        hours = -1.0
    if not 0 < hours <= HISTORY_HOURS_MAX:
        raise web.HTTPBadRequest(text=f"hours: expected a number in (0, {HISTORY_HOURS_MAX}]")
    now = agg.clock()
    samples = await offload(agg.store.fleet_history, now - hours * 3600)
    body = {"now": now, "hours": hours, "interval": agg.cfg.ui.history_interval,
            "samples": [{"time": t, "counts": c} for t, c in samples] + [{"time": now, "counts": agg.mem.counts()}]}
    return web.json_response(body, headers={"Cache-Control": "no-store"})


async def node_links(request: web.Request) -> web.Response:
    """Where else to look at a node: its Grafana dashboards (none without aggregator.ui.grafana_url)."""
    only = _node_filter(request)
    if only is None:
        raise web.HTTPBadRequest(text="node: required")
    agg = request.app[FEED].agg
    links = grafana.node_links(agg.cfg.ui.grafana_url, only, request.app[DASHBOARDS])
    return web.json_response({"node": only, "grafana": links})


def _sse(event: str, data: object) -> bytes:
    # json.dumps never emits a raw newline, so one data: line carries the whole payload.
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


async def events(request: web.Request) -> web.StreamResponse:
    """SSE: `snapshot` on connect, then `delta` {summary?, upsert, remove} whenever something changed."""
    feed = request.app[FEED]
    only = _node_filter(request)
    if feed.streams >= MAX_STREAMS:
        return web.Response(status=503, text="too many open streams; poll /ui/api/fleet",
                            headers={"Retry-After": "10"})
    resp = web.StreamResponse(headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream",
                                       "Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    feed.streams += 1
    try:
        await resp.prepare(request)
        gen, tiles, summary = feed.current()
        sent = _select(tiles, only)
        sent_summary = summary
        await resp.write(f"retry: {RETRY_MS}\n".encode() + _sse(
            "snapshot", {"generation": gen, "summary": summary, "nodes": [t.to_json() for t in sent.values()]}))
        last_write = time.monotonic()
        while not feed.closing.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(feed.closing.wait(), TICK)
            g, tiles, summary = feed.current()
            if g != gen:
                gen = g
                now_tiles = _select(tiles, only)
                upsert = [t.to_json() for n, t in now_tiles.items() if sent.get(n) != t]
                remove = [n for n in sent if n not in now_tiles]
                delta: dict[str, Any] = {"generation": gen, "upsert": upsert, "remove": remove}
                if summary != sent_summary:
                    delta["summary"] = summary
                sent, sent_summary = now_tiles, summary
                if upsert or remove or "summary" in delta:
                    await resp.write(_sse("delta", delta))
                    last_write = time.monotonic()
                    continue
            if time.monotonic() - last_write >= KEEPALIVE:
                await resp.write(b": keepalive\n\n")
                last_write = time.monotonic()
    except ConnectionResetError:
        pass  # the browser went away
    finally:
        feed.streams -= 1
    return resp


def with_security_headers(handler: Handler) -> Handler:
    """`handler` with the CSP and friends on its answer (unless it streams and set its own)."""
    async def page(request: web.Request) -> web.StreamResponse:
        resp = await handler(request)
        if not resp.prepared:
            for k, v in SECURITY_HEADERS.items():
                resp.headers.setdefault(k, v)
        return resp
    return page


def setup(app: web.Application, agg: "Aggregator", reads: Callable[[Handler], Handler]) -> None:
    """Add the UI's routes to the aggregator's (not yet started) app; `reads` wraps each of them
    (webguard.host_guard)."""
    app[FEED] = Feed(agg)
    app[ASSETS] = load_assets()
    app[DASHBOARDS] = grafana.node_dashboards() if agg.cfg.ui.grafana_url else ()
    fed = agg.cfg.federation
    # Tokens are read now: a missing token file is an error at start, not a tile that says so later.
    app[FEDERATION] = federation.Federation([federation.SetReader(s, s.read_token()) for s in fed.sets], fed.timeout)

    async def close_streams(app: web.Application) -> None:
        app[FEED].closing.set()  # open streams end now instead of holding up shutdown

    async def close_federation(app: web.Application) -> None:
        await app[FEDERATION].close()

    app.on_shutdown.append(close_streams)
    app.on_cleanup.append(close_federation)
    pages: tuple[tuple[str, Handler], ...] = (
        ("/", root), ("/ui", fleet_page), ("/ui/", root), ("/ui/node/{name}", node_page), ("/ui/failslow", failslow_page),
        ("/ui/static/{file}", static), ("/ui/api/fleet", fleet_view), ("/ui/api/fleet-history", fleet_history),
        ("/ui/api/links", node_links), ("/ui/federation", federation_page),
        ("/ui/api/federation", federation_view))
    for path, page in pages:
        app.router.add_get(path, reads(with_security_headers(page)))
    app.router.add_get("/ui/events", reads(events))
