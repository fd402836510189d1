"""Exposition bytes built once per snapshot change, off the event loop, and served from a cache.

A scrape never renders in the common case: the scheduler's updates mark the cache dirty, a
debounced background task renders every variant that has been asked for (text or OpenMetrics,
plain or gzip) in a thread, and requests get the newest finished bytes. Only the first request
for a new variant renders on demand. Changes that land together (collectors sharing an interval)
coalesce into one render, which keeps the agent's CPU per cycle low.
"""

from __future__ import annotations

import asyncio
import enum
import gzip
from typing import Iterable

from prometheus_client import exposition as text_exposition
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import exposition as om_exposition

from podhealth import log
from podhealth.agent.exposition import RenderContext, SnapshotCollector
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


class _Families:
    """A registry-shaped wrapper so prometheus-client renders families built once for all variants."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterable[Metric]:
        return self._families


def render(snapshot: Snapshot, ctx: RenderContext, variants: Iterable[Variant]) -> dict[Variant, bytes]:
    """Pure: the exposition of `snapshot` in each requested variant."""
    fams = _Families(list(SnapshotCollector(snapshot, ctx).collect()))
    plain: dict[Format, bytes] = {}
    out: dict[Variant, bytes] = {}
    for fmt, gz in variants:
        if fmt not in plain:
            gen = om_exposition.generate_latest if fmt is Format.OPENMETRICS else text_exposition.generate_latest
            plain[fmt] = gen(fams)  # type: ignore[arg-type]
        # Level 1: loopback and LAN scrapes gain little from tighter compression; CPU matters more.
        out[(fmt, gz)] = gzip.compress(plain[fmt], compresslevel=1, mtime=0) if gz else plain[fmt]
    return out


class ExpositionCache:
    def __init__(self, ctx: RenderContext, snapshot: Snapshot, debounce: float = 0.05) -> None:
        self.ctx = ctx
        self.debounce = debounce
        self._snapshot = snapshot
        self._version = 0
        self._cache: dict[Variant, tuple[int, bytes]] = {}
        self._wanted: set[Variant] = {(Format.TEXT, False)}
        self._task: asyncio.Task[None] | None = None
        self.renders = 0

    def update(self, snapshot: Snapshot, version: int) -> None:
        """Called on the loop after each snapshot change: schedule a (coalesced) background render."""
        self._snapshot, self._version = snapshot, version
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._render_loop(), name="render-metrics")

    async def _render_loop(self) -> None:
        while True:
            await asyncio.sleep(self.debounce)
            version, snapshot, wanted = self._version, self._snapshot, sorted(self._wanted, key=str)
            try:
                out = await asyncio.to_thread(render, snapshot, self.ctx, wanted)
            except Exception:  # noqa: BLE001 - keep serving the last good bytes
                _log.exception("rendering /metrics failed")
                return
            self.renders += 1
            for variant, data in out.items():
                self._cache[variant] = (version, data)
            if self._version == version:
                return

    async def get(self, variant: Variant) -> bytes:
        hit = self._cache.get(variant)
        if hit is not None:
            return hit[1]
        self._wanted.add(variant)
        version, snapshot = self._version, self._snapshot
        out = await asyncio.to_thread(render, snapshot, self.ctx, [variant])
        hit = self._cache.get(variant)
        if hit is None or hit[0] < version:
            self._cache[variant] = (version, out[variant])
        return self._cache[variant][1]

    async def current(self, variant: Variant = (Format.TEXT, False)) -> bytes:
        """The bytes for the latest snapshot, waiting for a pending render (tests and benchmarks)."""
        while self._task is not None and not self._task.done():
            await asyncio.shield(self._task)
        hit = self._cache.get(variant)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        out = await asyncio.to_thread(render, self._snapshot, self.ctx, [variant])
        return out[variant]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
