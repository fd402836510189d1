"""What a passive check sees: the snapshot indexed by metric name, the profile, counter history.

Checks are pure functions of a Context; the Evaluator builds one per evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, TypeVar, cast

from podhealth.checks.passive.ib_links import LinkTracker
from podhealth.checks.profiles import Profile
from podhealth.checks.passive.rates import RateTracker
from podhealth.config_policy import PolicyConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Event, Labels, Sample

T = TypeVar("T")


def gpu_entity(s: Sample) -> str:
    """GPUs are named by index (what operators say) with the UUID in evidence."""
    return f"gpu{s.label('gpu')}"


@dataclass
class Context:
    snapshot: Snapshot
    profile: Profile
    now: float
    rates: RateTracker
    events: tuple[Event, ...] = ()
    required_units: tuple[str, ...] = ()
    required_mounts: tuple[str, ...] = ()
    window: float = 300.0
    # IB link history (the agent's Evaluator); None in a one-shot check, which has no history
    ib_links: LinkTracker | None = None
    # the site's per-code XID/SXid decisions (checks.policy); the rules apply them
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    # the snapshot's samples by metric name, when the caller keeps them (SampleIndex); else made here
    index: Mapping[str, list[Sample]] | None = None
    _by_name: Mapping[str, list[Sample]] = field(default_factory=dict)
    # What several checks derive from the same snapshot and profile (the IB ports' views and
    # roles), made once: key -> (the profile it was made under, the value)
    _derived: dict[str, tuple[Profile, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.index is not None:
            self._by_name = self.index
            return
        idx: dict[str, list[Sample]] = defaultdict(list)
        for s in self.snapshot.samples():
            idx[s.name].append(s)
        self._by_name = idx

    def derived(self, key: str, make: Callable[[], T]) -> T:
        """`make()` once per snapshot judged and profile (the engine swaps the profile to tell
        what a site threshold changed): for a pure function of the two that more than one check
        needs; callers must not modify what it gives."""
        hit = self._derived.get(key)
        if hit is not None and hit[0] is self.profile:
            return cast(T, hit[1])
        value = make()
        self._derived[key] = (self.profile, value)
        return value

    def samples(self, name: str) -> list[Sample]:
        return list(self._by_name.get(name, ()))

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the one sample of `name` whose labels include `labels`, else None."""
        for s in self._by_name.get(name, ()):
            if all(s.label(k) == v for k, v in labels.items()):
                return s.value
        return None

    def per_gpu(self, name: str, **labels: str) -> dict[str, Sample]:
        out: dict[str, Sample] = {}
        for s in self._by_name.get(name, ()):
            if all(s.label(k) == v for k, v in labels.items()):
                out[s.label("gpu")] = s
        return out

    def stale(self, *collectors: str) -> list[str]:
        return [c for c in collectors if self.snapshot.stale(c)]

    def rate_per_hour(self, s: Sample) -> float | None:
        return self.rates.rate(_key(s), self.now, per=3600.0)

    def increase(self, s: Sample) -> float | None:
        return self.rates.increase(_key(s), self.now)

    def reset_within_window(self, s: Sample) -> bool:
        """Whether the counter went back (was reset) within the rate window."""
        t = self.rates.reset_at(_key(s))
        return t is not None and self.now - t <= self.window


class SampleIndex:
    """A snapshot's samples by metric name, as Context makes them, kept per collector state: the
    store replaces only the state of a collector that ran, so an evaluation re-indexes those and
    takes the others' (~2,700 samples on a DGX, every 5 s) as they were. The lists it gives are
    shared between evaluations: read them, never modify them (Context.samples hands out copies)."""

    def __init__(self) -> None:
        self._per: dict[str, tuple[CollectorState, dict[str, list[Sample]]]] = {}

    def of(self, snap: Snapshot) -> dict[str, list[Sample]]:
        out: dict[str, list[Sample]] = {}
        per: dict[str, tuple[CollectorState, dict[str, list[Sample]]]] = {}
        for cname, st in snap.collectors.items():
            hit = self._per.get(cname)
            if hit is None or hit[0] is not st:
                idx: dict[str, list[Sample]] = {}
                for s in st.samples:
                    lst = idx.get(s.name)
                    if lst is None:
                        lst = idx[s.name] = []
                    lst.append(s)
                hit = (st, idx)
            per[cname] = hit
            for name, lst in hit[1].items():
                have = out.get(name)
                out[name] = lst if have is None else have + lst  # a new list: kept ones stay as they are
        self._per = per  # collectors gone from the snapshot are dropped
        return out


def _key(s: Sample) -> tuple[str, Labels]:
    return (s.name, s.labels)


def observe_counters(rates: RateTracker, samples: Iterable[Sample], now: float, names: frozenset[str]) -> None:
    rates.observe_many((((s.name, s.labels), s.value) for s in samples if s.name in names), now)
