"""A metric family to render alongside the snapshot: how checks and compat names reach /metrics.

Sources speak the project vocabulary (MetricSpec + Sample), never prometheus-client objects, so
the checks engine can add `check_status`/`node_health` without knowing how exposition works.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample


@dataclass(frozen=True, slots=True)
class Family:
    """Samples of one metric. Names follow docs/metrics.md: no `podhealth_` prefix, no `_total`."""

    spec: MetricSpec
    samples: tuple[Sample, ...]
    prefixed: bool = True  # False: the spec's name is used as is (dcgm-exporter compatibility)


# Called in the render thread with the snapshot being rendered; must only read immutable state
# (e.g. an attribute the owner replaces whole on the event loop).
MetricSource = Callable[[Snapshot], Iterable[Family]]
