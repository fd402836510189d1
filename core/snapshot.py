"""The agent's snapshot: each collector's latest result and health, plus recent events.

The scheduler replaces one CollectorState at a time; /metrics renders a Snapshot; checks read one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping

from podhealth.vocab import Event, ProgramReport, Sample


@dataclass(frozen=True, slots=True)
class CollectorState:
    name: str
    enabled: bool = True
    disabled_reason: str = ""
    samples: tuple[Sample, ...] = ()
    errors: tuple[str, ...] = ()
    last_success: float | None = None  # wall-clock time of the last successful collection
    last_attempt: float | None = None
    last_duration: float = 0.0
    stale: bool = True  # no successful collection yet, or the last one is too old / still hanging
    runs: int = 0
    failures: int = 0
    overruns: int = 0
    reports: tuple[ProgramReport, ...] = ()  # a site check's program run (collectors/site.py); else empty


@dataclass(frozen=True, slots=True)
class Snapshot:
    time: float
    collectors: Mapping[str, CollectorState] = field(default_factory=dict)
    events: tuple[Event, ...] = ()

    def samples(self, name: str | None = None) -> Iterator[Sample]:
        for st in self.collectors.values():
            for s in st.samples:
                if name is None or s.name == name:
                    yield s

    def stale(self, collector: str) -> bool:
        """True when the collector's data cannot be trusted (stale, disabled, never ran, or its
        last run failed). A failed run leaves no samples: judging the empty set would turn
        "could not read" (EMFILE, ENOMEM, no NVML) into "nothing there" (0 of 8 ports present)."""
        st = self.collectors.get(collector)
        return st is None or st.stale or not st.enabled or st.last_success != st.last_attempt
