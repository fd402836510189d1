"""Samples kept from one collection to the next, so an unchanged value is the same object.

A collector that builds its Samples afresh every cycle pays, per sample, a sort of its labels
and a frozen dataclass's construction, and hands the exposition a new object it must format
again. Most readings (error counters, link states, clocks) hold the same value cycle after
cycle: kept here by series, such a reading is handed on as the very Sample it was last time
(the exposition reuses its line: agent/metrics/blocks.py), and a changed one reuses its sorted
labels. Entries not seen in a collection are dropped when it is committed.
"""

from __future__ import annotations

import operator
from typing import Callable, Hashable, Sequence

from podhealth.vocab import Labels, Sample

_VALUE = operator.attrgetter("value")


class SampleCache:
    """The Samples of the last collection by series key (whatever names the series uniquely
    within the collector); commit() at the end of each collection."""

    def __init__(self) -> None:
        self._prev: dict[Hashable, tuple[Sample, ...]] = {}
        self._next: dict[Hashable, tuple[Sample, ...]] = {}

    def one(self, key: Hashable, name: str, value: float, labels: Callable[[], Labels]) -> Sample:
        """The Sample of one series (its labels built by `labels()` only when the series is new)."""
        prev = self._prev.get(key)
        if prev is None:
            out = Sample(name, float(value), labels())
        else:
            p = prev[0]
            out = p if p.value == value else Sample(name, float(value), p.labels)
        self._next[key] = (out,)
        return out

    def samples(self, key: Hashable, names: tuple[str, ...], values: tuple[float, ...],
                labels: Callable[[], Labels]) -> tuple[Sample, ...]:
        """One Sample per (name, value), all with the same labels (built by `labels()` when new)."""
        prev = self._prev.get(key)
        if prev is not None and len(prev) == len(values):
            if tuple(map(_VALUE, prev)) == values:
                out = prev
            else:
                lab = prev[0].labels
                out = tuple(p if p.value == v else Sample(n, v, lab) for p, n, v in zip(prev, names, values))
        else:
            lab = labels()
            out = tuple(Sample(n, v, lab) for n, v in zip(names, values))
        self._next[key] = out
        return out

    def row(self, key: Hashable, name: str, values: tuple[float, ...],
            labels: Callable[[], Sequence[Labels]]) -> tuple[Sample, ...]:
        """One Sample of `name` per value, each with its own labels (`labels()`, when new)."""
        prev = self._prev.get(key)
        if prev is not None and len(prev) == len(values):
            if tuple(map(_VALUE, prev)) == values:
                out = prev
            else:
                out = tuple(p if p.value == v else Sample(name, v, p.labels) for p, v in zip(prev, values))
        else:
            out = tuple(Sample(name, v, lab) for v, lab in zip(values, labels()))
        self._next[key] = out
        return out

    def commit(self) -> None:
        self._prev, self._next = self._next, {}
