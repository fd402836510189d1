"""The agent's renderer: exposition bytes assembled from per-family blocks kept between renders.

`exposition.families()` + `Encoder` render a snapshot from nothing. Between two renders,
though, most of it did not change: a collector that did not run kept its CollectorState (the
store replaces only the one that ran), and collectors hand on the same Sample object for a value
that did not change (collectors/infiniband.py, collectors/nfs.py). So each family's text block is
kept with the Sample objects it was made from:
- a collector whose state is the same object as last time is not even regrouped;
- a family whose samples are all the same objects as last time reuses its block as is;
- otherwise each series line is looked up by its Sample object, and only new Samples are
  validated and formatted.
The rules (validation, merging of families that share a name, header text) are exposition's and
encode's; the output is byte-identical to `Encoder.encode(families(snapshot, ctx))`, which the
tests check over changing snapshots.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

from podhealth.agent.encode import MAX_CACHED_SERIES, format_value, header, line_prefix
from podhealth.agent.exposition import (
    RenderContext, checked, checked_value, collector_groups, names_of, source_groups,
)
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Labels, MetricSpec, Sample

# (family name, sample name, type, help, unit)
_Head = tuple[str, str, str, str, str]
# A Sample and its rendered line (None: the sample is dropped), keyed by id() of the Sample; the
# entry holds the Sample, so the id cannot be reused while the entry exists.
_Lines = dict[int, tuple[Sample, "bytes | None"]]


@dataclass(slots=True)
class _Block:
    head: _Head
    samples: Sequence[Sample]
    body: bytes  # the series lines, node label included
    lines: _Lines


class BlockEncoder:
    """Renders snapshots of one agent (one node label); not thread-safe: one render at a time."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._groups: dict[str, tuple[CollectorState, list[tuple[MetricSpec, list[Sample]]]]] = {}
        self._blocks: dict[tuple[str, str], _Block] = {}
        self._prefix: dict[tuple[str, Labels], str] = {}
        self._headers: dict[tuple[_Head, bool], bytes] = {}

    def render(self, snapshot: Snapshot, ctx: RenderContext, openmetrics: bool) -> bytes:
        merged: dict[str, tuple[_Head, list[tuple[str, Sequence[Sample]]]]] = {}
        groups: dict[str, tuple[CollectorState, list[tuple[MetricSpec, list[Sample]]]]] = {}
        for cname, st in snapshot.collectors.items():
            if not st.samples:
                continue
            hit = self._groups.get(cname)
            if hit is None or hit[0] is not st:
                hit = (st, collector_groups(cname, st.samples, ctx.specs.get(cname, {})))
            groups[cname] = hit
            for spec, samples in hit[1]:
                self._merge(merged, cname, spec, samples, True)
        self._groups = groups
        for origin, spec, fsamples, prefixed in source_groups(snapshot, ctx):
            self._merge(merged, origin, spec, fsamples, prefixed)

        if len(self._prefix) > MAX_CACHED_SERIES:
            self._prefix.clear()  # label churn (e.g. ever-new reason texts) must not grow memory forever
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
            if len(self._headers) > MAX_CACHED_SERIES:
                self._headers.clear()
            h = self._headers[key] = header(*head, openmetrics).encode("utf-8")
        return h

    def _block(self, key: tuple[str, str], head: _Head, samples: Sequence[Sample]) -> _Block:
        prev = self._blocks.get(key)
        if (prev is not None and prev.head == head and len(prev.samples) == len(samples)
                and all(map(operator.is_, prev.samples, samples))):
            return prev
        old: _Lines = prev.lines if prev is not None and prev.head == head else {}
        lines: _Lines = {}
        by_labels: dict[Labels, bytes] = {}  # the last value wins on a duplicate label set
        name, sname, typ = head[0], head[1], head[2]
        for s in samples:
            entry = old.get(id(s))
            if entry is None or entry[0] is not s:
                entry = (s, self._line(s, sname, typ, name))
            lines[id(s)] = entry
            if entry[1] is not None:
                by_labels[s.labels] = entry[1]
        return _Block(head, samples, b"".join(by_labels.values()), lines)

    def _line(self, s: Sample, sname: str, typ: str, origin: str) -> bytes | None:
        value = checked_value(s, typ, origin)
        if value is None:
            return None
        key = (sname, s.labels)
        prefix = self._prefix.get(key)
        if prefix is None:
            prefix = self._prefix[key] = line_prefix(sname, s.labels, self.node)
        return (prefix + format_value(value) + "\n").encode("utf-8")
