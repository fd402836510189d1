"""The fleet's versions: which nodes run which driver, VBIOS, HCA firmware, OFED and kernel.

Pure: the drift readings the store picks out of each node's latest report (Store.drift_readings)
in, the view out. `GET /api/v1/fleet/versions`, the UI's versions section and
`podhealth fleet versions` all show this one view.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Iterable, Mapping, Sequence

# checks/passive/drift.py FIELDS, in the order an operator reads them; the aggregator does not import
# the checks layer, and a field a newer agent adds is shown after these.
FIELDS = ("driver", "vbios", "hca_fw", "ofed", "kernel")
LABELS = {"driver": "driver", "vbios": "VBIOS", "hca_fw": "HCA firmware", "ofed": "OFED", "kernel": "kernel"}


def fleet_versions(readings: Iterable[tuple[str, str, str]], nodes: Iterable[str]) -> dict[str, Any]:
    """{field: {version: [nodes]}} plus `counts` ({field: {version: n}}, most common first) and
    `not_reported` (known nodes whose report carries no drift results: older agents, or none yet).

    A node whose GPUs (or HCAs) run different versions appears under each; one whose version
    could not be read appears under none of that field's versions."""
    by: dict[str, dict[str, set[str]]] = {}
    boards: dict[str, dict[str, set[str]]] = {}  # hca_fw: board -> version -> nodes
    reporting: set[str] = set()
    for node, field, observed in readings:
        reporting.add(node)
        bucket = by.setdefault(field, {})
        for token in (v.strip() for v in observed.split(",")):
            board, _, version = token.rpartition("=")  # "BOARD=VERSION" (hca_fw), else a version
            if version:
                bucket.setdefault(version, set()).add(node)
                if board:
                    boards.setdefault(board, {}).setdefault(version, set()).add(node)
    order = [f for f in FIELDS] + sorted(set(by) - set(FIELDS))
    out: dict[str, Any] = {}
    counts: dict[str, dict[str, int]] = {}
    for field in order:
        versions = by.get(field, {})
        ranked = sorted(versions.items(), key=lambda kv: (-len(kv[1]), kv[0]))
        out[field] = {v: sorted(ns) for v, ns in ranked}
        counts[field] = {v: len(ns) for v, ns in ranked}
    out["counts"] = counts
    # {board: {version: [nodes]}}, boards by name, versions most common first ("?" = board not read)
    out["hca_fw_boards"] = {b: {v: sorted(ns) for v, ns in sorted(vs.items(), key=lambda kv: (-len(kv[1]), kv[0]))}
                            for b, vs in sorted(boards.items())}
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
        by_board = view.get("hca_fw_boards") or {} if field == "hca_fw" else {}
        if by_board:  # one line per board: a node carries compute and storage boards at once
            for board, per in by_board.items():
                out.append(f"{LABELS[field]} (board {board}): " + _said(per, name_few))
            continue
        out.append(f"{LABELS.get(field, field)}: " + _said({v: view[field][v] for v in counts}, name_few))
    return out


def _said(nodes: Mapping[str, Sequence[str]], name_few: int) -> str:
    """ "2 nodes run Y, 1 node runs X (dgx07)": versions most common first."""
    parts = []
    for i, (v, ns) in enumerate(nodes.items()):
        n = len(ns)
        part = f"{n} node{'s' if n != 1 else ''} run{'s' if n == 1 else ''} {v}"
        if i and n <= name_few:
            part += f" ({', '.join(ns)})"
        parts.append(part)
    return ", ".join(parts)


Reading = tuple[str, str, str]  # (node, field, versions as the drift result's evidence says)
# A report written this recently may not be committed yet (ingest stamps the node, then the writer
# commits): its readings are read again next time rather than kept under the new stamp.
SETTLE_S = 5.0


class Readings:
    """Each node's drift readings, re-read from the store only for nodes whose stored report
    changed since (their `stored_at` stamp). Reading every report costs seconds at 10,000 nodes
    (~18 KB each, bench in the README); a refresh then reads only the reports stored since."""

    def __init__(self) -> None:
        self._by_node: dict[str, tuple[float, tuple[Reading, ...]]] = {}
        self._lock = threading.Lock()  # views are built in worker threads, maybe two at once

    def view(self, stamps: Mapping[str, float], read: Callable[[Sequence[str]], Iterable[Reading]],
             now: float) -> dict[str, Any]:
        """The fleet view. `stamps`: node -> when its stored report was last written;
        `read(nodes)`: the drift readings of those nodes' stored reports."""
        with self._lock:
            for gone in set(self._by_node) - set(stamps):
                del self._by_node[gone]
            todo = [n for n, st in stamps.items() if n not in self._by_node or self._by_node[n][0] != st]
            fresh: dict[str, list[Reading]] = {n: [] for n in todo}
            for row in (read(todo) if todo else ()):
                if row[0] in fresh:
                    fresh[row[0]].append(row)
            for n, rs in fresh.items():
                if now - stamps[n] >= SETTLE_S:
                    self._by_node[n] = (stamps[n], tuple(rs))
                else:
                    self._by_node.pop(n, None)
            readings: list[Reading] = []
            for n in stamps:
                readings.extend(fresh[n] if n in fresh else self._by_node[n][1])
        return fleet_versions(readings, stamps)
