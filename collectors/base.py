"""What a collector is: a name, its metrics, and a blocking `collect()` returning typed samples.

Collectors never build Prometheus objects and never interpret values (what an XID or a counter
means belongs to checks/). `collect()` is blocking by design: the agent's scheduler runs it off
the event loop with a timeout, so a hung source makes only its own collector stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Mapping, Protocol

from podhealth.vocab import Event, MetricSpec, Sample


@dataclass(frozen=True, slots=True)
class Collection:
    """One collection's output. `errors` are per-entity problems that did not fail the collector."""

    samples: tuple[Sample, ...]
    events: tuple[Event, ...] = ()
    errors: tuple[str, ...] = ()


class Collector(Protocol):
    name: ClassVar[str]
    metrics: ClassVar[Mapping[str, MetricSpec]]

    def collect(self) -> Collection: ...

    def close(self) -> None: ...


class CollectorDisabled(Exception):
    """Raised by a factory when its source is absent (no DCGM bindings, no HCA): the reason is exported."""


def specs(*items: MetricSpec) -> Mapping[str, MetricSpec]:
    return {m.name: m for m in items}
