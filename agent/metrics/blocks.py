"""The agent's renderer: exposition bytes assembled from per-family blocks kept between renders.

The tests' reference renderer (tests/oracles/exposition.py) renders a snapshot from nothing. Between two renders,
though, most of it did not change: a collector that did not run kept its CollectorState (the
store replaces only the one that ran), and collectors hand on the same Sample object for a value
that did not change (collectors/infiniband.py, collectors/nfs.py). So each family's text block is
kept with the Sample objects it was made from:
- a collector whose state is the same object as last time is not even regrouped;
- a family whose samples are all the same objects as last time reuses its block as is;
- a family whose series are the same as last time, in the same order (the usual case: only
  values moved), reuses the lines of the Samples that did not change and, for those that did,
  the validated `name{labels} ` prefix at the same position: only their values are formatted;
- anything else (series came or went) is validated and formatted from the start, with the
  line prefixes still cached by label set.
The rules (validation, merging of families that share a name, header text) are exposition's and
encode's; the output is byte-identical to the reference's, which the tests check over changing
snapshots.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from itertools import compress, count
from types import MappingProxyType
from typing import Callable, Mapping, Sequence

from podhealth.agent.metrics.encode import cache_bound, format_value, header, line_prefix
from podhealth.agent.metrics.exposition import (
    RenderContext, checked, checked_number, collector_groups, labels_ok, names_of, source_groups,
)
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Labels, MetricSpec, Sample

# (family name, sample name, type, help, unit)
_Head = tuple[str, str, str, str, str]
_Pick = Callable[[Sequence[Sample]], Sequence[Sample]]
_LABELS = operator.attrgetter("labels")
_NAME = operator.attrgetter("name")
_NO_SPECS: Mapping[str, MetricSpec] = MappingProxyType({})


def _picker(positions: list[int]) -> _Pick:
    if len(positions) == 1:
        i = positions[0]
        return lambda seq: (seq[i],)
    return operator.itemgetter(*positions)  # type: ignore[return-value]


@dataclass(slots=True)
class _Grouping:
    """A collector state's samples split by metric name, and the positions each group takes, so
    the next state, which almost always lists the same names in the same order, is split by
    picking positions instead of by a dict lookup per sample."""

    state: CollectorState
    specs: Mapping[str, MetricSpec]
    names: list[str]
    picks: list[_Pick]
    groups: list[tuple[MetricSpec, Sequence[Sample]]]

    @classmethod
    def of(cls, cname: str, st: CollectorState, specs: Mapping[str, MetricSpec],
           prev: "_Grouping | None") -> "_Grouping":
        names = list(map(_NAME, st.samples))
        if prev is not None and prev.specs is specs and names == prev.names:
            picked = [(spec, pick(st.samples)) for (spec, _), pick in zip(prev.groups, prev.picks)]
            return cls(st, specs, names, prev.picks, picked)
        groups: list[tuple[MetricSpec, Sequence[Sample]]] = list(collector_groups(cname, st.samples, specs))
        positions: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            lst = positions.get(n)
            if lst is None:
                lst = positions[n] = []
            lst.append(i)
        # collector_groups orders the groups by first appearance, as this dict is ordered
        return cls(st, specs, names, [_picker(p) for p in positions.values()], groups)


@dataclass(slots=True)
class _Block:
    """One family's text and, per sample position, what it was made from."""

    head: _Head
    samples: Sequence[Sample]
    labels: list[Labels]
    prefixes: list[str | None]  # `name{labels} `; None: an invalid label name drops the sample
    lines: list[bytes | None]  # None: the sample is dropped
    unique: bool  # no two valid label sets are equal (else the last value of each wins)
    body: bytes  # the series lines, node label included


class BlockEncoder:
    """Renders snapshots of one agent (one node label); not thread-safe: one render at a time."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._groups: dict[str, _Grouping] = {}
        self._blocks: dict[tuple[str, str], _Block] = {}
        self._prefix: dict[tuple[str, Labels], str] = {}
        self._headers: dict[tuple[_Head, bool], bytes] = {}

    def render(self, snapshot: Snapshot, ctx: RenderContext, openmetrics: bool) -> bytes:
        merged: dict[str, tuple[_Head, list[tuple[str, Sequence[Sample]]]]] = {}
        groups: dict[str, _Grouping] = {}
        for cname, st in snapshot.collectors.items():
            st = ctx.exported(cname, st)
            if not st.samples:
                continue
            g = self._groups.get(cname)
            if g is None or g.state is not st:
                g = _Grouping.of(cname, st, ctx.specs.get(cname, _NO_SPECS), g)
            groups[cname] = g
            for spec, samples in g.groups:
                self._merge(merged, cname, spec, samples, True)
        self._groups = groups
        for origin, spec, fsamples, prefixed in source_groups(snapshot, ctx):
            self._merge(merged, origin, spec, fsamples, prefixed)

        # Label churn (e.g. ever-new reason texts) must not grow memory: the line prefixes are kept
        # for a few times the series rendered now, so the cache follows what is exported, not
        # everything ever exported (issue 32 §6); a clear costs one render building them again.
        rendered = sum(len(ss) for _, parts in merged.values() for _, ss in parts)
        if len(self._prefix) > cache_bound(rendered):
            self._prefix.clear()
        blocks: dict[tuple[str, str], _Block] = {}
        out: list[bytes] = []
        for name, (head, parts) in merged.items():
            if len(parts) == 1:
                key, samples = (parts[0][0], name), parts[0][1]
            else:
                # Several origins share the name: one family, validated under the first's type.
                key, samples = ("", name), [s for _, ss in parts for s in ss]
            block = self._block(key, head, samples)
            blocks[key] = block
            if block.body:
                out.append(self._header(head, openmetrics))
                out.append(block.body)
        self._blocks = blocks  # families that went away take their blocks with them
        if openmetrics:
            out.append(b"# EOF\n")
        return b"".join(out)

    @staticmethod
    def _merge(merged: dict[str, tuple[_Head, list[tuple[str, Sequence[Sample]]]]], origin: str,
               spec: MetricSpec, samples: Sequence[Sample], prefixed: bool) -> None:
        if not checked.name_ok(spec.name):
            checked.warn_once(f"{origin}:{spec.name}", "invalid metric name skipped", origin=origin, metric=spec.name)
            return
        name, sample, typ, unit = names_of(spec, prefixed)
        entry = merged.get(name)
        if entry is None:
            merged[name] = ((name, sample, typ, spec.help or spec.name, unit), [(origin, samples)])
        else:
            entry[1].append((origin, samples))

    def _header(self, head: _Head, openmetrics: bool) -> bytes:
        key = (head, openmetrics)
        h = self._headers.get(key)
        if h is None:
            if len(self._headers) > cache_bound(len(self._blocks)):
                self._headers.clear()
            h = self._headers[key] = header(*head, openmetrics).encode("utf-8")
        return h

    def _block(self, key: tuple[str, str], head: _Head, samples: Sequence[Sample]) -> _Block:
        prev = self._blocks.get(key)
        if prev is None or prev.head != head:
            return self._fresh_block(head, samples)
        if len(prev.samples) == len(samples) and all(map(operator.is_, prev.samples, samples)):
            return prev
        labels = list(map(_LABELS, samples))
        if not prev.unique or labels != prev.labels:  # list == compares each pair by identity first
            return self._fresh_block(head, samples, labels)
        name, typ = head[0], head[2]
        lines = list(prev.lines)
        prefixes = prev.prefixes
        # Only the positions whose Sample is a new object (found without a Python-level loop).
        for i in compress(count(), map(operator.is_not, samples, prev.samples)):
            prefix = prefixes[i]
            value = None if prefix is None else checked_number(samples[i].value, typ, name)
            lines[i] = None if value is None else (prefix + format_value(value) + "\n").encode("utf-8")
        return _Block(head, samples, labels, prefixes, lines, True, b"".join(filter(None, lines)))

    def _fresh_block(self, head: _Head, samples: Sequence[Sample], labels: list[Labels] | None = None) -> _Block:
        name, sname, typ = head[0], head[1], head[2]
        labels = labels if labels is not None else list(map(_LABELS, samples))
        prefixes: list[str | None] = []
        lines: list[bytes | None] = []
        for s in samples:
            prefix = self._prefix_of(sname, s.labels, name)
            prefixes.append(prefix)
            value = None if prefix is None else checked_number(s.value, typ, name)
            lines.append(None if value is None else (prefix + format_value(value) + "\n").encode("utf-8"))
        valid = [lab for lab, p in zip(labels, prefixes) if p is not None]
        unique = len(set(valid)) == len(valid)
        if unique:
            body = b"".join(filter(None, lines))
        else:
            by_labels: dict[Labels, bytes] = {}  # the last value wins, at the first one's place
            for lab, line in zip(labels, lines):
                if line is not None:
                    by_labels[lab] = line
            body = b"".join(by_labels.values())
        return _Block(head, samples, labels, prefixes, lines, unique, body)

    def _prefix_of(self, sname: str, labels: Labels, origin: str) -> str | None:
        key = (sname, labels)
        prefix = self._prefix.get(key)
        if prefix is None:
            if not labels_ok(labels, origin):
                return None
            prefix = self._prefix[key] = line_prefix(sname, labels, self.node)
        return prefix
