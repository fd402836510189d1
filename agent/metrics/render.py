"""Exposition bytes built at most once per snapshot change, off the event loop, and cached.

No collection ever happens on the request path: a scrape gets the cached bytes of the latest
snapshot, or, for the first scrape after a change, waits for that snapshot to be rendered (in a
thread; a few milliseconds). Variants: text or OpenMetrics, plain or gzip. The agent renders
through agent/metrics/blocks.py, which reuses what did not change since the last render.
"""

from __future__ import annotations

import asyncio
import enum
import gzip

from podhealth import log
from podhealth.agent.metrics.blocks import BlockEncoder
from podhealth.agent.metrics.exposition import RenderContext
from podhealth.snapshot import Snapshot
from podhealth.worker import Worker

_log = log.get("podhealth.agent.metrics.render")

# prometheus-client's openmetrics.exposition.CONTENT_TYPE_LATEST (a test compares them): not
# imported, so the agent does not load prometheus-client at all.
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# A burst of snapshot changes (collectors finishing one after the other, then the verdicts they
# lead to) is rendered once, this long after its last change.
PRERENDER_DELAY = 0.05


class Format(enum.Enum):
    TEXT = "text"
    OPENMETRICS = "openmetrics"

    @property
    def content_type(self) -> str:
        if self is Format.OPENMETRICS:
            return OPENMETRICS_CONTENT_TYPE
        return "text/plain; version=0.0.4; charset=utf-8"


Variant = tuple[Format, bool]  # (format, gzip)


def negotiate(accept: str) -> Format:
    """OpenMetrics when the client lists it with a non-zero q (Prometheus does by default)."""
    for part in accept.split(","):
        media, *params = [p.strip() for p in part.split(";")]
        if media.lower() != "application/openmetrics-text":
            continue
        q = next((p.split("=", 1)[1] for p in params if p.replace(" ", "").startswith("q=")), "1")
        try:
            if float(q) > 0:
                return Format.OPENMETRICS
        except ValueError:
            continue
    return Format.TEXT


def wants_gzip(accept_encoding: str) -> bool:
    return any(p.split(";")[0].strip().lower() == "gzip" for p in accept_encoding.split(","))


def compress(body: bytes) -> bytes:
    # Level 1: loopback and LAN scrapes gain little from tighter compression; CPU matters more.
    return gzip.compress(body, compresslevel=1, mtime=0)


class ExpositionCache:
    """Bytes per (snapshot version, variant), built at most once per snapshot change.

    Rendering happens in a thread, for the variants scrapers have asked for: in the background
    once a burst of updates is over (`prerender`, called by the agent when no collection is in
    flight, debounced by PRERENDER_DELAY so that the verdicts following a collection land in the
    same render), or when a scrape asks for a version not rendered yet; concurrent scrapes share
    one render. The background render is skipped while nobody has fetched the previous one:
    with collectors faster than the scrape interval it would mostly render for nobody, and the
    next scrape renders on demand instead (a few milliseconds).
    """

    def __init__(self, ctx: RenderContext, snapshot: Snapshot) -> None:
        self.ctx = ctx
        self._blocks = BlockEncoder(ctx.node)
        self._snapshot = snapshot
        self._version = 0
        self._cache: dict[Variant, tuple[int, bytes]] = {}
        self._plain: dict[Format, tuple[int, bytes]] = {}
        self._lock = asyncio.Lock()
        self._wanted: set[Variant] = set()
        self._pre: asyncio.Task[None] | None = None
        self._worker: Worker[bytes] | None = None  # the render thread, started by the first render
        self._timer: asyncio.TimerHandle | None = None
        self._burst_started = 0.0
        self._served = True  # the last render was fetched by a scrape (or none happened yet)

    def update(self, snapshot: Snapshot) -> None:
        """Called on the loop after each snapshot change (or a metric source's): the next scrape renders it."""
        self._snapshot = snapshot
        self._version += 1

    def prerender(self) -> None:
        """Render the variants scrapers have asked for in the background, PRERENDER_DELAY after the
        last call (at most PRERENDER_DELAY x 10 after the first of a burst), so the next scrape
        finds its bytes ready."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._timer is not None:
            if now - self._burst_started > PRERENDER_DELAY * 10:
                return  # a steady stream of changes: let the pending render happen
            self._timer.cancel()
        else:
            self._burst_started = now
        self._timer = loop.call_later(PRERENDER_DELAY, self._start_prerender)

    def _start_prerender(self) -> None:
        self._timer = None
        if not self._served:
            return
        if self._pre is None or self._pre.done():
            self._pre = asyncio.get_running_loop().create_task(self._prerender(), name="prerender-metrics")

    async def _prerender(self) -> None:
        for variant in list(self._wanted):
            try:
                await self._get(variant)
            except Exception:  # noqa: BLE001 - already logged; a scrape will retry
                return
        self._served = False

    async def get(self, variant: Variant) -> bytes:
        """The bytes of the latest snapshot in this variant (what a scrape serves)."""
        self._wanted.add(variant)
        out = await self._get(variant)
        self._served = True
        return out

    async def _get(self, variant: Variant) -> bytes:
        hit = self._cache.get(variant)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        async with self._lock:
            hit = self._cache.get(variant)
            version, snapshot = self._version, self._snapshot
            if hit is not None and hit[0] == version:
                return hit[1]
            try:
                if self._worker is None:
                    self._worker = Worker("render")
                out = await self._worker.submit(lambda: self._render(snapshot, version, variant))
            except Exception:  # noqa: BLE001 - serve the last good bytes rather than fail the scrape
                _log.exception("rendering /metrics failed")
                if hit is None:
                    raise
                return hit[1]
            self._cache[variant] = (version, out)
            return out

    def _render(self, snapshot: Snapshot, version: int, variant: Variant) -> bytes:
        """In the render thread (one at a time: the caller holds the lock)."""
        fmt, gz = variant
        plain = self._plain.get(fmt)
        if plain is None or plain[0] != version:
            if self._blocks.node != self.ctx.node:
                self._blocks = BlockEncoder(self.ctx.node)
            plain = self._plain[fmt] = (version, self._blocks.render(snapshot, self.ctx, fmt is Format.OPENMETRICS))
        return compress(plain[1]) if gz else plain[1]

    async def current(self, variant: Variant = (Format.TEXT, False)) -> bytes:
        return await self.get(variant)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pre is not None:
            self._pre.cancel()
            await asyncio.gather(self._pre, return_exceptions=True)
        if self._worker is not None:
            self._worker.close()
            self._worker = None
