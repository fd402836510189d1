"""Snapshot -> Prometheus exposition, through a prometheus-client custom collector.

Names: `podhealth_` + the sample name; prometheus-client adds `_total` to counters; info metrics
keep their `_info` name. Every series gets the constant `node` label. Help text and type come
from each collector's MetricSpec. One collector producing a bad name or label is skipped (and
logged once) instead of breaking the whole scrape: dcgm-exporter's single-error-means-HTTP-500
registry is the counter-example.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

from prometheus_client.metrics_core import Metric

from podhealth import log
from podhealth.agent.family import Family, MetricSource
from podhealth.agent.selfmetrics import self_families
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample

PREFIX = "podhealth_"

_log = log.get("podhealth.agent.exposition")

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class RenderContext:
    node: str
    version: str
    profile: str
    specs: Mapping[str, Mapping[str, MetricSpec]]  # collector -> sample name -> spec
    sources: tuple[MetricSource, ...] = ()


class _Checked:
    """Validation results cached by name, so a scrape of thousands of samples checks each name once."""

    def __init__(self) -> None:
        self.names: dict[str, bool] = {}
        self.labels: dict[str, bool] = {}
        self.warned: set[str] = set()

    def name_ok(self, name: str) -> bool:
        ok = self.names.get(name)
        if ok is None:
            ok = self.names[name] = bool(_NAME.match(name)) and not name.startswith("__")
        return ok

    def label_ok(self, label: str) -> bool:
        ok = self.labels.get(label)
        if ok is None:
            ok = self.labels[label] = bool(_LABEL.match(label)) and not label.startswith("__")
        return ok

    def warn_once(self, key: str, msg: str, **kw: object) -> None:
        if key not in self.warned:
            self.warned.add(key)
            _log.warning(msg, **kw)


_checked = _Checked()


def _family_name(spec: MetricSpec, prefixed: bool) -> tuple[str, str, str]:
    """(family name, sample name, prometheus type) for a spec."""
    base = PREFIX + spec.name if prefixed else spec.name
    if spec.kind == "counter":
        base = base.removesuffix("_total")
        return base, base + "_total", "counter"
    if spec.kind == "info":
        base = base.removesuffix("_info")
        return base, base + "_info", "info"
    return base, base, "gauge"


def _metric(spec: MetricSpec, prefixed: bool) -> tuple[Metric, str]:
    fam, sample_name, typ = _family_name(spec, prefixed)
    unit = spec.unit if spec.unit and fam.endswith("_" + spec.unit) else ""
    return Metric(fam, spec.help or spec.name, typ, unit), sample_name


def _add_samples(metric: Metric, sample_name: str, samples: Iterable[Sample], node: str,
                 info: bool, origin: str) -> int:
    """Add samples (last value wins on duplicate label sets); returns how many were rejected."""
    seen: dict[tuple[tuple[str, str], ...], int] = {}
    rejected = 0
    for s in samples:
        bad = next((k for k, _ in s.labels if not _checked.label_ok(k)), None)
        if bad is not None:
            rejected += 1
            _checked.warn_once(f"{origin}:{s.name}:{bad}", "invalid label name dropped a sample",
                               origin=origin, metric=s.name, label=bad)
            continue
        labels = dict(s.labels)
        labels.setdefault("node", node)
        value = 1.0 if info else s.value
        if not isinstance(value, float):
            try:
                value = float(value)
            except (TypeError, ValueError):
                rejected += 1
                continue
        if metric.type == "counter" and (value < 0 or math.isnan(value)):
            # A negative counter breaks rate(); it is a collector bug, not data.
            rejected += 1
            _checked.warn_once(f"{origin}:{s.name}:neg", "negative counter dropped", origin=origin, metric=s.name)
            continue
        key = tuple(sorted(labels.items()))
        if key in seen:
            metric.samples[seen[key]] = metric.samples[seen[key]]._replace(value=value)
            continue
        seen[key] = len(metric.samples)
        metric.add_sample(sample_name, labels, value)
    return rejected


def _families(groups: Iterable[tuple[str, MetricSpec, Sequence[Sample], bool]], node: str) -> Iterator[Metric]:
    """Merge (origin, spec, samples, prefixed) groups by metric name into prometheus-client families."""
    by_name: dict[str, tuple[Metric, str, list[Sample]]] = {}
    order: list[str] = []
    for origin, spec, samples, prefixed in groups:
        if not _checked.name_ok(spec.name):
            _checked.warn_once(f"{origin}:{spec.name}", "invalid metric name skipped", origin=origin, metric=spec.name)
            continue
        key = (PREFIX if prefixed else "") + spec.name
        if key not in by_name:
            metric, sample_name = _metric(spec, prefixed)
            by_name[key] = (metric, sample_name, [])
            order.append(key)
        by_name[key][2].extend(samples)
    for key in order:
        metric, sample_name, samples = by_name[key]
        _add_samples(metric, sample_name, samples, node, metric.type == "info", key)
        if metric.samples:
            yield metric


def _collector_groups(snapshot: Snapshot, ctx: RenderContext) -> Iterator[tuple[str, MetricSpec, Sequence[Sample], bool]]:
    for cname, st in snapshot.collectors.items():
        if not st.samples:
            continue
        specs = ctx.specs.get(cname, {})
        by_name: dict[str, list[Sample]] = {}
        for s in st.samples:
            by_name.setdefault(s.name, []).append(s)
        for name, samples in by_name.items():
            spec = specs.get(name)
            if spec is None:
                _checked.warn_once(f"{cname}:{name}:nospec", "sample without a MetricSpec rendered as gauge",
                                   collector=cname, metric=name)
                spec = MetricSpec(name, "gauge", f"{name} (undocumented, from collector {cname})")
            yield cname, spec, samples, True


class SnapshotCollector:
    """A prometheus-client custom collector over one immutable snapshot."""

    def __init__(self, snapshot: Snapshot, ctx: RenderContext) -> None:
        self.snapshot = snapshot
        self.ctx = ctx

    def describe(self) -> list[Metric]:
        return []  # no describe-time collection: the registry must not call collect() on register

    def collect(self) -> Iterator[Metric]:
        groups = list(_collector_groups(self.snapshot, self.ctx))
        for fam in self_families(self.snapshot, self.ctx.version, self.ctx.profile):
            groups.append(("self", fam.spec, fam.samples, True))
        for source in self.ctx.sources:
            try:
                extra = list(source(self.snapshot))
            except Exception:  # noqa: BLE001 - a broken metric source drops only its own families
                _log.exception("metric source failed", source=getattr(source, "__qualname__", repr(source)))
                continue
            for fam in extra:
                groups.append((getattr(source, "__qualname__", "source"), fam.spec, fam.samples, fam.prefixed))
        yield from _families(groups, self.ctx.node)
