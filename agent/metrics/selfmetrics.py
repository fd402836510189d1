"""The agent's own metrics (docs/metrics.md, "agent self-metrics"), derived from the snapshot.

They are rendered for every collector whatever its data does, so an alert can tell a stale or
failing source ("bad") from a healthy one that simply has no entities ("absent").
"""

from __future__ import annotations

from typing import Mapping

from podhealth.agent.metrics.family import Family
from podhealth.agent.scheduler import succeeded
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample, labels_of

SPECS: Mapping[str, MetricSpec] = {m.name: m for m in (
    MetricSpec("collector_enabled", "gauge", "1 when the collector runs, 0 when disabled (see collector_disabled_info)."),
    MetricSpec("collector_disabled_info", "info", "Why a collector is disabled (label reason)."),
    MetricSpec("collector_success", "gauge", "1 when the collector's last run succeeded."),
    MetricSpec("collector_duration_seconds", "gauge", "Duration of the collector's last run.", "seconds"),
    MetricSpec("collector_last_success_timestamp_seconds", "gauge",
               "Unix time of the collector's last successful run.", "seconds"),
    MetricSpec("collector_stale", "gauge",
               "1 when the collector's data is stale (hung, timed out, or too old); its series are then absent."),
    MetricSpec("collector_overruns", "counter",
               "Runs skipped because the collector's previous run was still in flight."),
    MetricSpec("build_info", "info", "podhealth agent version and hardware profile."),
)}

MAX_REASON_CHARS = 200


def self_families(snapshot: Snapshot, version: str, profile: str) -> list[Family]:
    enabled: list[Sample] = []
    disabled: list[Sample] = []
    success: list[Sample] = []
    duration: list[Sample] = []
    last: list[Sample] = []
    stale: list[Sample] = []
    overruns: list[Sample] = []
    for name in sorted(snapshot.collectors):
        st = snapshot.collectors[name]
        lab = labels_of(collector=name)
        enabled.append(Sample("collector_enabled", 1.0 if st.enabled else 0.0, lab))
        if not st.enabled:
            reason = " ".join(st.disabled_reason.split())[:MAX_REASON_CHARS] or "unknown"
            disabled.append(Sample("collector_disabled_info", 1.0, labels_of(collector=name, reason=reason)))
            continue
        stale.append(Sample("collector_stale", 1.0 if st.stale else 0.0, lab))
        overruns.append(Sample("collector_overruns", float(st.overruns), lab))
        if st.last_attempt is not None:
            success.append(Sample("collector_success", 1.0 if succeeded(st) else 0.0, lab))
            duration.append(Sample("collector_duration_seconds", st.last_duration, lab))
        if st.last_success is not None:
            last.append(Sample("collector_last_success_timestamp_seconds", st.last_success, lab))
    build = [Sample("build_info", 1.0, labels_of(version=version, profile=profile))]
    out = [
        ("collector_enabled", enabled), ("collector_disabled_info", disabled),
        ("collector_success", success), ("collector_duration_seconds", duration),
        ("collector_last_success_timestamp_seconds", last), ("collector_stale", stale),
        ("collector_overruns", overruns), ("build_info", build),
    ]
    return [Family(SPECS[n], tuple(s)) for n, s in out if s]
