"""Push samples to an InfluxDB v2 write endpoint (InfluxDB 2.x, or VictoriaMetrics' /api/v2/write).

Collection never waits on the network: `offer()` appends to a bounded in-memory buffer (oldest
points dropped and counted when the endpoint is away for long) and a background task drains it
in batches through influxdb-client's synchronous write API, run in a thread with a timeout, with
exponential backoff between failed attempts.

Line protocol shape: measurement `podhealth_<group>` (the sample name's first word, e.g. `gpu`),
field `<rest of the name>`, tags = the sample's labels plus `node`. So `gpu_temperature_celsius`
becomes measurement `podhealth_gpu`, field `temperature_celsius` — which VictoriaMetrics exposes
again as `podhealth_gpu_temperature_celsius`, the same name Prometheus sees.

Lines are written by influxdb-client's own `Point` (its escaping: a newline in a tag value is
`\\n`, never a second line; a backslash is left as it is), and only in the writer thread: the
event loop just queues the samples, so a large snapshot costs it no formatting. The client is
the `podhealth[influx]` extra (core/extras.py): import this module only after `require("influx")`.

As the agent's sink (agent/sink.py) it takes each collector's samples once per successful
collection, from the snapshots the agent hands it, with the metric specs `specs()` reads.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, NamedTuple

import structlog
from influxdb_client import Point
from influxdb_client.domain.write_precision import WritePrecision

from podhealth.agent.sink import Sink
from podhealth.backoff import Backoff
from podhealth.config import InfluxConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import MetricSpec, Sample
from podhealth.worker import call_with_timeout

log = structlog.get_logger("influxdb")
RETRY = Backoff(1.0, 60.0)  # between failed writes: 1 s doubled up to a minute (core/backoff.py)


def to_point(s: Sample, node: str, ts_ns: int, kind: str = "gauge") -> Point | None:
    """The sample as a Point, or None for info series (their labels are not numbers)."""
    if kind == "info":
        return None
    group, _, field = s.name.partition("_")
    if not field:
        group, field = "agent", s.name
    if kind == "counter":
        field += "_total"
    p = Point(f"podhealth_{group}")
    for k, v in s.labels + (("node", node),):
        if v != "":  # line protocol has no empty tag values
            p.tag(k, v)
    return p.field(field, float(s.value)).time(ts_ns, WritePrecision.NS)


def to_line(s: Sample, node: str, ts_ns: int, kind: str = "gauge") -> str | None:
    """One line of line protocol, or None (an info series; NaN and infinities have no line)."""
    p = to_point(s, node, ts_ns, kind)
    return (p.to_line_protocol() or None) if p is not None else None


class Pending(NamedTuple):
    """A sample waiting in the buffer; made into a line only when it is written."""

    sample: Sample
    ts_ns: int
    kind: str


@dataclass
class InfluxStats:
    written: int = 0
    dropped: int = 0
    failures: int = 0
    last_error: str = ""


class InfluxExporter(Sink):
    name = "influxdb"

    def __init__(self, cfg: InfluxConfig, node: str, write_timeout: float = 10.0,
                 specs: Callable[[], Mapping[str, MetricSpec]] = dict) -> None:
        """`specs()`: every collector's metric specs by name (their kinds: counters get `_total`,
        info series are skipped), read when new samples arrive."""
        self.cfg = cfg
        self.node = node
        self._specs = specs
        self._seen: dict[str, CollectorState] = {}
        self.write_timeout = write_timeout
        self.buffer: collections.deque[Pending] = collections.deque()
        self.stats = InfluxStats()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._client = None

    async def on_snapshot(self, snap: Snapshot) -> None:
        specs: Mapping[str, MetricSpec] | None = None
        for name, st in snap.collectors.items():
            prev = self._seen.get(name)
            if prev is st:
                continue
            self._seen[name] = st
            # Only a new successful collection is new data; staleness flips carry no samples.
            if st.samples and st.last_success and (prev is None or prev.last_success != st.last_success):
                specs = specs if specs is not None else self._specs()
                self.offer(st.samples, specs, st.last_success)

    def offer(self, samples: Iterable[Sample], specs: Mapping[str, MetricSpec], ts: float | None = None) -> None:
        ts_ns = int((ts or time.time()) * 1e9)
        for s in samples:
            spec = specs.get(s.name)
            kind = spec.kind if spec else "gauge"
            if kind == "info":
                continue
            if len(self.buffer) >= self.cfg.buffer_points:
                self.buffer.popleft()
                self.stats.dropped += 1
            self.buffer.append(Pending(s, ts_ns, kind))
        if len(self.buffer) >= self.cfg.batch_size:
            self._wake.set()

    def _write_api(self):  # type: ignore[no-untyped-def]
        from influxdb_client import InfluxDBClient
        from influxdb_client.client.write_api import SYNCHRONOUS

        if self._client is None:
            self._client = InfluxDBClient(url=self.cfg.url, token=self.cfg.token or "unused", org=self.cfg.org,
                                          timeout=int(self.write_timeout * 1000))
        return self._client.write_api(write_options=SYNCHRONOUS)

    def line(self, p: Pending) -> str | None:
        return to_line(p.sample, self.node, p.ts_ns, p.kind)

    def _write(self, batch: list[Pending]) -> None:
        """In the writer thread: format and send one batch."""
        lines = [ln for ln in map(self.line, batch) if ln is not None]
        if lines:
            self._write_api().write(bucket=self.cfg.bucket, org=self.cfg.org, record="\n".join(lines))

    async def flush_once(self) -> bool:
        """Write one batch; True when the buffer was empty or the batch went through."""
        if not self.buffer:
            return True
        batch = [self.buffer[i] for i in range(min(self.cfg.batch_size, len(self.buffer)))]
        try:
            await call_with_timeout("influx-write", lambda: self._write(batch), self.write_timeout + 1)
        except Exception as e:  # noqa: BLE001 - endpoint away, 4xx/5xx: keep the points, back off
            self.stats.failures += 1
            if str(e) != self.stats.last_error:
                log.warning("influx write failed", error=str(e)[:200], buffered=len(self.buffer))
            self.stats.last_error = str(e)
            return False
        for _ in batch:
            self.buffer.popleft()
        self.stats.written += len(batch)
        if self.stats.last_error:
            log.info("influx writes recovered", buffered=len(self.buffer))
            self.stats.last_error = ""
        return True

    async def run(self) -> None:
        failures = 0
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.cfg.flush_interval)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            while self.buffer:
                if await self.flush_once():
                    failures = 0
                    continue
                await asyncio.sleep(RETRY.delay(failures))
                failures += 1
                break

    async def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self.run(), name="influx-exporter")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for _ in range(3):  # a last best-effort flush, bounded
            if not self.buffer or not await self.flush_once():
                break
        if self._client is not None:
            self._client.close()
