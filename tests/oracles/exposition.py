"""The reference /metrics renderer: a snapshot rendered from nothing, every time.

The agent renders through agent/metrics/blocks.py (`BlockEncoder`), which reuses what did not
change between snapshots. This module is the simple path it is held to, byte for byte:
`families()` validates and merges a snapshot into `Rendered` families with the same rules
(agent/metrics/exposition.py's helpers), `Encoder` writes them with the same line pieces
(agent/metrics/encode.py), and `SnapshotCollector` hands the same families to prometheus-client,
whose own encoders the tests compare with `Encoder`'s bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

from podhealth.agent.metrics.encode import cache_bound, format_value, header, line_prefix
from podhealth.agent.metrics.exposition import (
    RenderContext, checked, checked_number, collector_groups, labels_ok, names_of, source_groups,
)
from podhealth.agent.metrics.render import Format, Variant, compress
from podhealth.snapshot import Snapshot
from podhealth.vocab import Labels, MetricSpec, Sample

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric


@dataclass(frozen=True, slots=True)
class Rendered:
    """One validated family, ready for any encoder. `series` labels do not carry `node` yet."""

    name: str  # family name (OpenMetrics), e.g. podhealth_gpu_energy_joules
    sample_name: str  # e.g. podhealth_gpu_energy_joules_total
    type: str  # gauge | counter | info
    help: str
    unit: str
    series: tuple[tuple[Labels, float], ...]


def with_node(labels: Labels, node: str) -> dict[str, str]:
    d = dict(labels)
    d.setdefault("node", node)
    return d


def checked_value(s: Sample, typ: str, origin: str) -> float | None:
    """The value a sample is rendered with, or None when the sample must be dropped."""
    if not labels_ok(s.labels, origin):
        return None
    return checked_number(s.value, typ, origin)


def _series(samples: Iterable[Sample], typ: str, origin: str) -> tuple[tuple[Labels, float], ...]:
    """Validated series; the last value wins on a duplicate label set."""
    out: dict[Labels, float] = {}
    for s in samples:
        value = checked_value(s, typ, origin)
        if value is not None:
            out[s.labels] = value
    return tuple(out.items())


def _collector_groups(snapshot: Snapshot, ctx: RenderContext) -> Iterator[tuple[str, MetricSpec, Sequence[Sample], bool]]:
    for cname, st in snapshot.collectors.items():
        st = ctx.exported(cname, st)
        if not st.samples:
            continue
        for spec, samples in collector_groups(cname, st.samples, ctx.specs.get(cname, {})):
            yield cname, spec, samples, True


def families(snapshot: Snapshot, ctx: RenderContext) -> list[Rendered]:
    """Every family of the snapshot (collector samples, self-metrics, metric sources), merged by name."""
    merged: dict[str, tuple[tuple[str, str, str, str, str], list[Sample]]] = {}
    groups = list(_collector_groups(snapshot, ctx)) + list(source_groups(snapshot, ctx))
    for origin, spec, samples, prefixed in groups:
        if not checked.name_ok(spec.name):
            checked.warn_once(f"{origin}:{spec.name}", "invalid metric name skipped", origin=origin, metric=spec.name)
            continue
        name, sample, typ, unit = names_of(spec, prefixed)
        entry = merged.get(name)
        if entry is None:
            merged[name] = ((name, sample, typ, spec.help or spec.name, unit), list(samples))
        else:
            entry[1].extend(samples)
    out = []
    for (name, sample, typ, help_, unit), samples in merged.values():
        series = _series(samples, typ, name)
        if series:
            out.append(Rendered(name, sample, typ, help_, unit, series))
    return out


class Encoder:
    """Prometheus text / OpenMetrics bytes of rendered families, each series' label part cached."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._prefix: dict[tuple[str, Labels], str] = {}

    def encode(self, fams: Sequence[Rendered], openmetrics: bool) -> bytes:
        cache = self._prefix
        if len(cache) > cache_bound(sum(len(f.series) for f in fams)):
            cache.clear()
        out: list[str] = []
        for f in fams:
            out.append(header(f.name, f.sample_name, f.type, f.help, f.unit, openmetrics))
            sname = f.sample_name
            for labels, value in f.series:
                key = (sname, labels)
                prefix = cache.get(key)
                if prefix is None:
                    prefix = cache[key] = line_prefix(sname, labels, self.node)
                out.append(prefix)
                out.append(format_value(value))
                out.append("\n")
        if openmetrics:
            out.append("# EOF\n")
        return "".join(out).encode("utf-8")


def render(snapshot: Snapshot, ctx: RenderContext, variants: Iterable[Variant],
           encoder: Encoder | None = None) -> dict[Variant, bytes]:
    """The exposition of `snapshot` in each requested variant, from nothing."""
    fams = families(snapshot, ctx)
    enc = encoder or Encoder(ctx.node)
    plain: dict[Format, bytes] = {}
    out: dict[Variant, bytes] = {}
    for fmt, gz in variants:
        if fmt not in plain:
            plain[fmt] = enc.encode(fams, fmt is Format.OPENMETRICS)
        out[(fmt, gz)] = compress(plain[fmt]) if gz else plain[fmt]
    return out


class SnapshotCollector:
    """prometheus-client's custom collector protocol over one immutable snapshot."""

    def __init__(self, snapshot: Snapshot, ctx: RenderContext) -> None:
        self.snapshot = snapshot
        self.ctx = ctx

    def describe(self) -> list["Metric"]:
        return []  # registering must not trigger a collection

    def collect(self) -> Iterator["Metric"]:
        from prometheus_client.metrics_core import Metric

        for fam in families(self.snapshot, self.ctx):
            m = Metric(fam.name, fam.help, fam.type, fam.unit)
            for labels, value in fam.series:
                m.add_sample(fam.sample_name, with_node(labels, self.ctx.node), value)
            yield m
