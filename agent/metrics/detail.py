"""Detail levels: which of a collector's samples /metrics exports (`basic` thins, `full` keeps all).

An export decision, never a collection decision: the collectors, the checks engine, the compat
names and the InfluxDB writer all see every sample; only the Prometheus exposition (both
exposition.families() and the agent's block renderer) passes each collector state through
`ExportFilter.state()`. What `basic` keeps of each family is data (checks/data/export_detail.yaml);
which level applies is config (collectors.<name>.detail and .families).

A filtered state is memoised by the identity of the state it came from: the store replaces a
collector's state only when that collector ran, so the block renderer keeps reusing its cached
groups and blocks for the others, and a kept sample stays the same object it was.
"""

from __future__ import annotations

import operator
import threading
from dataclasses import dataclass, replace
from importlib import resources
from typing import Any, Iterable, Literal, Mapping, Sequence

from podhealth import yamldata
from podhealth.snapshot import CollectorState
from podhealth.vocab import Labels, MetricSpec, Sample

Keep = Literal["all", "changed", "none"]


@dataclass(frozen=True, slots=True)
class SumRule:
    name: str
    help: str
    by: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Rule:
    """What `basic` exports of one family (see the header of export_detail.yaml)."""

    keep: Keep = "all"
    normal: float = 0.0
    label: str = ""
    values: frozenset[str] = frozenset()
    never: frozenset[str] = frozenset()  # label values not exported at basic, whatever `keep` says
    other: str = ""
    drop_normal: bool = False  # after folding: series equal to `normal` are not exported
    sum: SumRule | None = None


def _rule(collector: str, family: str, raw: Any) -> Rule:
    where = f"export_detail.yaml: {collector}.{family}"
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected a mapping")
    unknown = set(raw) - {"keep", "normal", "label", "values", "never", "other", "drop_normal", "sum"}
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
    keep = raw.get("keep", "all")
    if keep not in ("all", "changed", "none"):
        raise ValueError(f"{where}.keep: expected all, changed or none, got {keep!r}")
    values, never = raw.get("values", []), raw.get("never", [])
    if (values or never or raw.get("other")) and not raw.get("label"):
        raise ValueError(f"{where}: values/never/other need a label")
    s = raw.get("sum")
    total = None
    if s is not None:
        if not isinstance(s, dict) or not {"name", "help", "by"} <= set(s):
            raise ValueError(f"{where}.sum: expected name, help and by")
        total = SumRule(str(s["name"]), str(s["help"]), tuple(str(b) for b in s["by"]))
    return Rule(keep, float(raw.get("normal", 0.0)), str(raw.get("label", "")),
                frozenset(str(v) for v in values), frozenset(str(v) for v in never), str(raw.get("other", "")), bool(raw.get("drop_normal", False)),
                total)


def load_rules(text: str | None = None) -> dict[str, dict[str, Rule]]:
    """collector -> family (sample name) -> Rule, from export_detail.yaml (or `text`)."""
    if text is None:
        text = resources.files("podhealth.checks.data").joinpath("export_detail.yaml").read_text(encoding="utf-8")
    doc = yamldata.load(text) or {}
    if not isinstance(doc, dict):
        raise ValueError("export_detail.yaml: expected a mapping of collectors")
    return {str(c): {str(f): _rule(c, f, r) for f, r in (fams or {}).items()} for c, fams in doc.items()}


def _without(labels: Labels, drop: str, value: str) -> Labels:
    return tuple(sorted((*((k, v) for k, v in labels if k != drop), (drop, value))))


def _project(labels: Labels, by: Sequence[str]) -> Labels:
    return tuple((k, v) for k, v in labels if k in by)


def apply(rule: Rule, samples: Sequence[Sample]) -> list[Sample]:
    """The samples of one family that `basic` exports, in their order (folded ones at the end)."""
    out: list[Sample] = []
    folded: dict[Labels, float] = {}
    for s in samples:
        if rule.label and s.label(rule.label) in rule.values:
            out.append(s)
        elif rule.label and s.label(rule.label) in rule.never:
            continue
        elif rule.keep == "all" or (rule.keep == "changed" and s.value != rule.normal):
            out.append(s)
        elif rule.other:
            key = _without(s.labels, rule.label, rule.other)
            folded[key] = folded.get(key, 0.0) + s.value
    name = samples[0].name if samples else ""
    out.extend(Sample(name, v, labels) for labels, v in folded.items())
    if rule.drop_normal:
        out = [s for s in out if s.value != rule.normal]
    return out


def summed(rule: SumRule, samples: Iterable[Sample]) -> list[Sample]:
    totals: dict[Labels, float] = {}
    for s in samples:
        key = _project(s.labels, rule.by)
        totals[key] = totals.get(key, 0.0) + s.value
    return [Sample(rule.name, v, labels) for labels, v in totals.items()]


class ExportFilter:
    """Per collector: a level, per-family overrides, and the rules; thread-safe memoisation."""

    def __init__(self, levels: Mapping[str, str], families: Mapping[str, Mapping[str, str]],
                 rules: Mapping[str, Mapping[str, Rule]] | None = None) -> None:
        self.rules = rules if rules is not None else load_rules()
        self.levels = dict(levels)
        self.families = {c: dict(f) for c, f in families.items()}
        self._memo: dict[str, tuple[CollectorState, CollectorState]] = {}
        self._lock = threading.Lock()
        # (collector, family) -> (level, the samples, what they gave): a family whose samples are
        # the same objects as last time (collectors hand on unchanged readings as they were) gives
        # the same samples, summed and folded ones included, without thinning it again. A pure
        # function's memo: a race between two renders only computes it twice.
        self._families: dict[tuple[str, str], tuple[str, list[Sample], list[Sample]]] = {}

    def level(self, collector: str, family: str) -> str:
        return self.families.get(collector, {}).get(family) or self.levels.get(collector, "basic")

    def specs(self, collector: str, specs: Mapping[str, MetricSpec]) -> dict[str, MetricSpec]:
        """The collector's specs plus those of the derived (summed) families."""
        out = dict(specs)
        for family, rule in self.rules.get(collector, {}).items():
            src = specs.get(family)
            if rule.sum is not None and src is not None and self.level(collector, family) != "none":
                out[rule.sum.name] = MetricSpec(rule.sum.name, src.kind, rule.sum.help, src.unit)
        return out

    def passthrough(self, collector: str) -> bool:
        """Nothing to filter: full level, no rules and no family switched off."""
        fams = self.families.get(collector, {})
        rules = self.rules.get(collector, {})
        if "none" in fams.values() or any(r.sum for r in rules.values()):
            return False
        if not rules:
            return True
        # A family switched back to basic under a full collector still needs its rule.
        return self.levels.get(collector, "basic") == "full" and all(v == "full" for v in fams.values())

    def state(self, collector: str, st: CollectorState) -> CollectorState:
        """`st` with only the samples to export (the same object when nothing changes)."""
        if not st.samples or self.passthrough(collector):
            return st
        with self._lock:
            hit = self._memo.get(collector)
            if hit is not None and hit[0] is st:
                return hit[1]
        out = replace(st, samples=tuple(self.samples(collector, st.samples)))
        with self._lock:
            self._memo[collector] = (st, out)
        return out

    def samples(self, collector: str, samples: Sequence[Sample]) -> list[Sample]:
        rules = self.rules.get(collector, {})
        by_name: dict[str, list[Sample]] = {}
        for s in samples:
            by_name.setdefault(s.name, []).append(s)
        out: list[Sample] = []
        for name, group in by_name.items():
            level = self.level(collector, name)
            if level == "none":
                continue
            rule = rules.get(name)
            if rule is None:
                out.extend(group)
                continue
            out.extend(self._family(collector, name, level, rule, group))
        return out

    def _family(self, collector: str, name: str, level: str, rule: Rule, group: list[Sample]) -> list[Sample]:
        key = (collector, name)
        hit = self._families.get(key)
        if hit is not None and hit[0] == level and len(hit[1]) == len(group) and all(map(operator.is_, hit[1], group)):
            return hit[2]
        made = list(group) if level == "full" else apply(rule, group)
        if rule.sum is not None:
            made.extend(summed(rule.sum, group))
        self._families[key] = (level, group, made)
        return made


def unknown_families(flt: ExportFilter, specs: Mapping[str, Mapping[str, MetricSpec]]) -> list[str]:
    """`collector.family` switches in the config that name no metric of that collector."""
    bad = []
    for collector, fams in flt.families.items():
        known = specs.get(collector)
        if known is None:
            continue  # a disabled collector: nothing to check against
        bad += [f"{collector}.{f}" for f in fams if f not in known]
    return sorted(bad)
