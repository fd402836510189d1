"""The rules that turn a snapshot into metric families: names, types, validation, grouping.

Names: `podhealth_` + the sample name; counters get `_total` on their samples (prometheus-client
convention: the OpenMetrics family name has no suffix); info metrics keep their `_info` sample
name. Every series gets the constant `node` label. Help text and type come from each
collector's MetricSpec. A sample with a bad name or label is dropped (and logged once) instead of
breaking the whole scrape: dcgm-exporter's one-error-means-HTTP-500 registry is the
counter-example.

The agent renders through agent/metrics/blocks.py, which applies these rules family by family
and reuses what did not change. The tests hold it, byte for byte, to a render from nothing
(tests/oracles/exposition.py) that applies the same rules and is itself compared with
prometheus-client's encoders.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

from podhealth import log
from podhealth.agent.metrics.family import Family, MetricSource
from podhealth.agent.metrics.selfmetrics import self_families
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Labels, MetricSpec, Sample

if TYPE_CHECKING:
    from podhealth.agent.metrics.detail import ExportFilter

__all__ = ["PREFIX", "Family", "MetricSource", "RenderContext"]

PREFIX = "podhealth_"

_log = log.get("podhealth.agent.metrics.exposition")

_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True, slots=True)
class RenderContext:
    node: str
    version: str
    profile: str
    specs: Mapping[str, Mapping[str, MetricSpec]]  # collector -> sample name -> spec
    sources: tuple[MetricSource, ...] = ()
    # What each collector exports (agent/metrics/detail.py); None: everything. Applied here, after the
    # checks engine has read the snapshot: detail is an export decision, not a collection one.
    detail: "ExportFilter | None" = None

    def exported(self, cname: str, st: CollectorState) -> CollectorState:
        return st if self.detail is None else self.detail.state(cname, st)


MAX_CHECKED_LABELS = 50_000  # ~15x a DGX node's label sets at `detail: full`


class _Checked:
    """Validation results cached by name, so a render of thousands of samples checks each name once."""

    def __init__(self) -> None:
        self.names: dict[str, bool] = {}
        self.labels: dict[Labels, str | None] = {}  # label set -> first invalid label name
        self.warned: set[str] = set()

    def name_ok(self, name: str) -> bool:
        ok = self.names.get(name)
        if ok is None:
            ok = self.names[name] = bool(_NAME.match(name)) and not name.startswith("__")
        return ok

    def bad_label(self, labels: Labels) -> str | None:
        try:
            return self.labels[labels]
        except KeyError:
            pass
        bad = next((k for k, _ in labels if not _LABEL.match(k) or k.startswith("__")), None)
        if len(self.labels) > MAX_CHECKED_LABELS:  # label sets churn (e.g. a reason text): keep the cache bounded
            self.labels.clear()
        self.labels[labels] = bad
        return bad

    def warn_once(self, key: str, msg: str, **kw: object) -> None:
        if key not in self.warned:
            self.warned.add(key)
            _log.warning(msg, **kw)


checked = _Checked()


def names_of(spec: MetricSpec, prefixed: bool) -> tuple[str, str, str, str]:
    """(family name, sample name, type, unit) for a spec."""
    base = PREFIX + spec.name if prefixed else spec.name
    if spec.kind == "counter" and not prefixed:
        # another exporter's name, verbatim (dcgm-exporter's counters carry no `_total`): a
        # counter in the text format, as that exporter serves it (encode.header: OpenMetrics)
        sample, typ = base, "counter"
    elif spec.kind == "counter":
        base = base.removesuffix("_total")
        sample, typ = base + "_total", "counter"
    elif spec.kind == "info":
        base = base.removesuffix("_info")
        sample, typ = base + "_info", "info"
    else:
        sample, typ = base, "gauge"
    # OpenMetrics requires the family name to end with its unit; otherwise leave the unit out.
    unit = spec.unit if spec.unit and base.endswith("_" + spec.unit) else ""
    return base, sample, typ, unit


def labels_ok(labels: Labels, origin: str) -> bool:
    """Whether every label name is valid (a sample with an invalid one is dropped, and logged once)."""
    bad = checked.bad_label(labels)
    if bad is not None:
        checked.warn_once(f"{origin}:{bad}", "invalid label name dropped a sample", metric=origin, label=bad)
        return False
    return True


def checked_number(value: object, typ: str, origin: str) -> float | None:
    """The value a sample is rendered with, or None when it must be dropped (labels aside)."""
    if typ == "info":
        return 1.0
    if type(value) is float:
        v = value
    else:
        try:
            v = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
    if typ == "counter" and (v < 0 or math.isnan(v)):
        # A negative counter breaks rate(): a collector bug, not data.
        checked.warn_once(f"{origin}:neg", "negative counter dropped", metric=origin)
        return None
    return v


def collector_groups(cname: str, samples: Iterable[Sample],
                     specs: Mapping[str, MetricSpec]) -> list[tuple[MetricSpec, list[Sample]]]:
    """One collector's samples by metric name, in order of first appearance, with their specs."""
    by_name: dict[str, list[Sample]] = {}
    for s in samples:
        lst = by_name.get(s.name)
        if lst is None:
            lst = by_name[s.name] = []
        lst.append(s)
    out = []
    for name, group in by_name.items():
        spec = specs.get(name)
        if spec is None:
            checked.warn_once(f"{cname}:{name}:nospec", "sample without a MetricSpec rendered as gauge",
                               collector=cname, metric=name)
            spec = MetricSpec(name, "gauge", f"{name} (undocumented, from collector {cname})")
        out.append((spec, group))
    return out


def source_groups(snapshot: Snapshot, ctx: RenderContext) -> Iterator[tuple[str, MetricSpec, Sequence[Sample], bool]]:
    for fam in self_families(snapshot, ctx.version, ctx.profile):
        yield "self", fam.spec, fam.samples, True
    for source in ctx.sources:
        origin = getattr(source, "__qualname__", "source")
        try:
            extra = list(source(snapshot))
        except Exception:  # noqa: BLE001 - a broken metric source drops only its own families
            _log.exception("metric source failed", source=origin)
            continue
        for fam in extra:
            yield origin, fam.spec, fam.samples, fam.prefixed
