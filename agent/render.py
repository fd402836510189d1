"""Exposition bytes built at most once per snapshot change, off the event loop, and cached.

No collection ever happens on the request path: a scrape gets the cached bytes of the latest
snapshot, or, for the first scrape after a change, waits for that snapshot to be rendered (in a
thread; a few milliseconds). Variants: text or OpenMetrics, plain or gzip.
"""

from __future__ import annotations

import asyncio
import enum
import gzip
from typing import Iterable

from prometheus_client.openmetrics import exposition as om_exposition

from podhealth import log
from podhealth.agent.encode import Encoder
from podhealth.agent.exposition import RenderContext, Rendered, families
from podhealth.snapshot import Snapshot

_log = log.get("podhealth.agent.render")


class Format(enum.Enum):
    TEXT = "text"
    OPENMETRICS = "openmetrics"

    @property
    def content_type(self) -> str:
        if self is Format.OPENMETRICS:
            return str(om_exposition.CONTENT_TYPE_LATEST)
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


def render(snapshot: Snapshot, ctx: RenderContext, variants: Iterable[Variant],
           encoder: Encoder | None = None) -> dict[Variant, bytes]:
    """Pure: the exposition of `snapshot` in each requested variant."""
    return _encode(families(snapshot, ctx), encoder or Encoder(ctx.node), variants)


def _encode(fams: list[Rendered], encoder: Encoder, variants: Iterable[Variant]) -> dict[Variant, bytes]:
    plain: dict[Format, bytes] = {}
    out: dict[Variant, bytes] = {}
    for fmt, gz in variants:
        if fmt not in plain:
            plain[fmt] = encoder.encode(fams, fmt is Format.OPENMETRICS)
        # Level 1: loopback and LAN scrapes gain little from tighter compression; CPU matters more.
        out[(fmt, gz)] = gzip.compress(plain[fmt], compresslevel=1, mtime=0) if gz else plain[fmt]
    return out


class ExpositionCache:
    """Bytes per (snapshot version, variant), built at most once per snapshot change.

    Rendering happens in a thread, for the variants scrapers have asked for: in the background
    once a burst of collector updates is over (`prerender`, called by the agent when no
    collection is in flight), or when a scrape asks for a version not rendered yet; concurrent
    scrapes share one render. Rendering on every single update would render several times per
    cycle, since collectors finish at different moments.
    """

    def __init__(self, ctx: RenderContext, snapshot: Snapshot) -> None:
        self.ctx = ctx
        self.encoder = Encoder(ctx.node)
        self._snapshot = snapshot
        self._version = 0
        self._cache: dict[Variant, tuple[int, bytes]] = {}
        self._fams: tuple[int, list[Rendered]] | None = None
        self._lock = asyncio.Lock()
        self._wanted: set[Variant] = set()
        self._pre: asyncio.Task[None] | None = None
        self.renders = 0

    def update(self, snapshot: Snapshot) -> None:
        """Called on the loop after each snapshot change (or a metric source's): the next scrape renders it."""
        self._snapshot = snapshot
        self._version += 1

    def prerender(self) -> None:
        """Render the variants scrapers have asked for now, in the background (call when a burst of
        updates is over, e.g. no collection in flight), so the next scrape finds its bytes ready."""
        if self._pre is None or self._pre.done():
            self._pre = asyncio.get_running_loop().create_task(self._prerender(), name="prerender-metrics")

    async def _prerender(self) -> None:
        for variant in list(self._wanted):
            try:
                await self.get(variant)
            except Exception:  # noqa: BLE001 - already logged; a scrape will retry
                return

    async def get(self, variant: Variant) -> bytes:
        self._wanted.add(variant)
        hit = self._cache.get(variant)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        async with self._lock:
            hit = self._cache.get(variant)
            version, snapshot = self._version, self._snapshot
            if hit is not None and hit[0] == version:
                return hit[1]
            known = self._fams[1] if self._fams is not None and self._fams[0] == version else None
            try:
                fams, out = await asyncio.to_thread(self._render, snapshot, known, variant)
            except Exception:  # noqa: BLE001 - serve the last good bytes rather than fail the scrape
                _log.exception("rendering /metrics failed")
                if hit is None:
                    raise
                return hit[1]
            self.renders += 1
            self._fams = (version, fams)
            self._cache[variant] = (version, out)
            return out

    def _render(self, snapshot: Snapshot, fams: list[Rendered] | None, variant: Variant) -> tuple[list[Rendered], bytes]:
        if fams is None:
            fams = families(snapshot, self.ctx)
        return fams, _encode(fams, self.encoder, [variant])[variant]

    async def current(self, variant: Variant = (Format.TEXT, False)) -> bytes:
        return await self.get(variant)

    async def close(self) -> None:
        if self._pre is not None:
            self._pre.cancel()
            await asyncio.gather(self._pre, return_exceptions=True)
