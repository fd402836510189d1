"""`--compat dcgm-exporter`: render the GPU series again under dcgm-exporter's DCGM_FI_* names.

The mapping itself (names, units, labels) is collectors/compat_dcgm.py, a pure function of
samples and events; this module only turns its output into a metric source for /metrics.

dcgm-exporter declares some fields as counters without a `_total` suffix: they are rendered as
counters under their exact names (agent/metrics/exposition.names_of; in OpenMetrics, which wants
`_total` on counters, as `unknown`). dcgm-exporter's label names (UUID, modelName, Hostname) are
camelCase, which `promtool check metrics` flags: that is the price of compatibility and only
applies in this mode. The host label's name is a setting (exporters.dcgm_exporter.hostname_label):
the released dcgm-exporter's `Hostname` by default, `hostname` as its main branch has renamed it.
The XID series' err_msg is NVIDIA's XID catalog text (checks/data/xid_catalog.yaml).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Callable, Iterable, Mapping

from podhealth.agent.metrics.family import Family, MetricSource
from podhealth.collectors import compat_dcgm
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample

MODES = ("dcgm-exporter",)


def _spec(name: str) -> MetricSpec:
    return compat_dcgm.METRICS.get(name) or MetricSpec(name, "gauge", name)


@lru_cache(maxsize=1)
def _xid_texts() -> Mapping[int, str]:
    from podhealth.checks.passive import xid

    cat = xid.load_catalog()
    return {code: (info.description or info.mnemonic) for code, info in cat.xids.items()}


# GPU UUID -> {pod, namespace, container}: who uses each GPU now (issue 17 brings the source).
# Called in the render thread: it must return an immutable mapping the owner replaces whole.
JobLabels = Callable[[], Mapping[str, Mapping[str, str]]]


def dcgm_exporter_families(snapshot: Snapshot, host: str, jobs: JobLabels | None = None,
                           hostname_label: str = compat_dcgm.HOSTNAME_LABEL) -> list[Family]:
    kmsg = snapshot.collectors.get("kmsg")
    # Without a kernel-log collector there is no XID knowledge: leave DCGM_FI_DEV_XID_ERRORS out
    # rather than claim "0 = no XID".
    events = snapshot.events if kmsg is not None and kmsg.enabled else None
    by_name: dict[str, list[Sample]] = {}
    for s in compat_dcgm.to_dcgm(snapshot.samples(), host, events, jobs() if jobs is not None else None,
                                 hostname_label=hostname_label, xid_texts=_xid_texts()):
        by_name.setdefault(s.name, []).append(s)
    return [Family(_spec(name), tuple(samples), prefixed=False) for name, samples in by_name.items()]


def source(mode: str, host: str, jobs: JobLabels | None = None,
           hostname_label: str = compat_dcgm.HOSTNAME_LABEL) -> MetricSource:
    if mode not in MODES:
        raise ValueError(f"unknown compat mode {mode!r} (known: {', '.join(MODES)})")

    def families(snapshot: Snapshot) -> Iterable[Family]:
        return dcgm_exporter_families(snapshot, host, jobs, hostname_label)
    return families
