"""`--compat dcgm-exporter`: render the GPU series again under dcgm-exporter's DCGM_FI_* names.

The mapping itself (names, units, labels) is collectors/compat_dcgm.py, a pure function of
samples and events; this module only turns its output into a metric source for /metrics.

dcgm-exporter declares some fields as counters without a `_total` suffix. prometheus-client
would append `_total` to a counter, which would break every dashboard that queries the exact
name, so they are rendered as gauges (rate() works on either). dcgm-exporter's label names
(UUID, modelName, Hostname) are camelCase, which `promtool check metrics` flags: that is the
price of compatibility and only applies in this mode.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Mapping

from podhealth.agent.metrics.family import Family, MetricSource
from podhealth.collectors import compat_dcgm
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample

MODES = ("dcgm-exporter",)


def _spec(name: str) -> MetricSpec:
    spec = compat_dcgm.METRICS.get(name) or MetricSpec(name, "gauge", name)
    return replace(spec, kind="gauge") if spec.kind == "counter" else spec


# GPU UUID -> {pod, namespace, container}: who uses each GPU now (issue 17 brings the source).
# Called in the render thread: it must return an immutable mapping the owner replaces whole.
JobLabels = Callable[[], Mapping[str, Mapping[str, str]]]


def dcgm_exporter_families(snapshot: Snapshot, host: str, jobs: JobLabels | None = None) -> list[Family]:
    kmsg = snapshot.collectors.get("kmsg")
    # Without a kernel-log collector there is no XID knowledge: leave DCGM_FI_DEV_XID_ERRORS out
    # rather than claim "0 = no XID".
    events = snapshot.events if kmsg is not None and kmsg.enabled else None
    by_name: dict[str, list[Sample]] = {}
    for s in compat_dcgm.to_dcgm(snapshot.samples(), host, events, jobs() if jobs is not None else None):
        by_name.setdefault(s.name, []).append(s)
    return [Family(_spec(name), tuple(samples), prefixed=False) for name, samples in by_name.items()]


def source(mode: str, host: str, jobs: JobLabels | None = None) -> MetricSource:
    if mode not in MODES:
        raise ValueError(f"unknown compat mode {mode!r} (known: {', '.join(MODES)})")

    def families(snapshot: Snapshot) -> Iterable[Family]:
        return dcgm_exporter_families(snapshot, host, jobs)
    return families
