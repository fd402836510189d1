"""A running agent's view of its node, read from its /metrics: the Snapshot `podhealth profile`
observes when given `--url` or `--node` instead of collecting here.

The agent's self-metrics say which collectors are stale, disabled or failing; their series are
then absent from /metrics, and the snapshot marks those collectors stale so nothing is read as
"none there".
"""

from __future__ import annotations

import time

from podhealth import httpclient
from podhealth.checks.profiles.capture import samples_by_collector
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Sample, labels_of

PREFIX = "podhealth_"
MAX_BYTES = 32 * 1024 * 1024  # a DGX agent's /metrics is ~1 MB


class SourceError(Exception):
    """The agent could not be asked (unreachable, refused, not an agent): one line, exit 2."""


def fetch_metrics(url: str, timeout: float) -> str:
    target = url.rstrip("/") + "/metrics"
    try:
        r = httpclient.exchange("GET", target, deadline_s=timeout, max_bytes=MAX_BYTES)
    except httpclient.ExchangeError as e:
        raise SourceError(f"cannot reach the agent at {target}: {e}") from None
    if r.status != 200:
        raise SourceError(f"{target} answered HTTP {r.status}")
    return r.body.decode("utf-8", "replace")


def snapshot_from_metrics(text: str, now: float | None = None) -> tuple[Snapshot, str]:
    """(snapshot, node name) from Prometheus text; SourceError when it is not a podhealth agent's."""
    from prometheus_client.parser import text_string_to_metric_families

    now = time.time() if now is None else now
    samples: list[Sample] = []
    health: dict[str, dict[str, float]] = {}
    node = ""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise SourceError(f"not Prometheus text: {e}") from None
    for fam in families:
        for s in fam.samples:
            if not s.name.startswith(PREFIX) or s.name.endswith("_created"):
                continue
            name = s.name.removeprefix(PREFIX)
            if fam.type == "counter":
                name = name.removesuffix("_total")
            labels = {k: v for k, v in s.labels.items() if k != "node"}
            node = node or s.labels.get("node", "")
            if name.startswith("collector_") and "collector" in labels:
                health.setdefault(labels["collector"], {})[name] = s.value
                continue
            samples.append(Sample(name, float(s.value), labels_of(**labels)))
    if not health:
        raise SourceError("no podhealth collector series: is this a podhealth agent's /metrics?")
    by = samples_by_collector(samples)
    states = {}
    for c, h in health.items():
        enabled = h.get("collector_enabled", 1.0) >= 1
        good = enabled and h.get("collector_stale", 0.0) < 1 and h.get("collector_success", 1.0) >= 1
        states[c] = CollectorState(c, enabled=enabled, samples=tuple(by.get(c, ())), stale=not good,
                                   last_success=now if good else None, last_attempt=now)
    return Snapshot(now, states), node
