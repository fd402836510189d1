"""The fleet's versions: which nodes run which driver, VBIOS, HCA firmware, OFED and kernel.

Pure: the drift readings the store picks out of each node's latest report (Store.drift_readings)
in, the view out. `GET /api/v1/fleet/versions`, the UI's versions section and
`podhealth fleet versions` all show this one view.
"""

from __future__ import annotations

from typing import Any, Iterable

# checks/drift.py FIELDS, in the order an operator reads them; the aggregator does not import
# the checks layer, and a field a newer agent adds is shown after these.
FIELDS = ("driver", "vbios", "hca_fw", "ofed", "kernel")
LABELS = {"driver": "driver", "vbios": "VBIOS", "hca_fw": "HCA firmware", "ofed": "OFED", "kernel": "kernel"}


def fleet_versions(readings: Iterable[tuple[str, str, str]], nodes: Iterable[str]) -> dict[str, Any]:
    """{field: {version: [nodes]}} plus `counts` ({field: {version: n}}, most common first) and
    `not_reported` (known nodes whose report carries no drift results: older agents, or none yet).

    A node whose GPUs (or HCAs) run different versions appears under each; one whose version
    could not be read appears under none of that field's versions."""
    by: dict[str, dict[str, set[str]]] = {}
    reporting: set[str] = set()
    for node, field, observed in readings:
        reporting.add(node)
        bucket = by.setdefault(field, {})
        for version in (v.strip() for v in observed.split(",")):
            if version:
                bucket.setdefault(version, set()).add(node)
    order = [f for f in FIELDS] + sorted(set(by) - set(FIELDS))
    out: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {}
    for field in order:
        versions = by.get(field, {})
        ranked = sorted(versions.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        out[field] = {v: sorted(ns) for v, ns in ranked}
        counts[field] = {v: len(ns) for v, ns in ranked}
    out["counts"] = counts
    out["reporting"] = len(reporting)
    out["not_reported"] = sorted(set(nodes) - reporting)
    return out


def lines(view: dict[str, Any], name_few: int = 0) -> list[str]:
    """One sentence per field, the way an operator says it: "HCA firmware: 125 nodes run Y, 3 nodes
    run X". Versions other than the most common one that at most `name_few` nodes run name them:
    the odd ones out are what an operator looks for."""
    out = []
    for field, counts in view["counts"].items():
        if not counts:
            continue
        parts = []
        for i, (v, n) in enumerate(counts.items()):
            part = f"{n} node{'s' if n != 1 else ''} run{'s' if n == 1 else ''} {v}"
            if i and n <= name_few:
                part += f" ({', '.join(view[field][v])})"
            parts.append(part)
        out.append(f"{LABELS.get(field, field)}: " + ", ".join(parts))
    return out
