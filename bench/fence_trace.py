"""When each stage of a fence happened, from the logs (bench/fault_to_fence.py's measurement and --trace).

The DRAIN's time is Slurm's own: slurmctld logs `update_node: node X reason set to: ...` (info
level, LogTimeFormat's default iso8601_ms: `[2026-12-08T00:59:07.343]`, local time) while it
applies the update, so podhealth's fence and the peer's direct `scontrol update` are timed by the
same clock at the same point, without the 0-50 ms a poll of `scontrol show node` adds to one and
not the other. The stamp is cut to the millisecond: each figure is up to 1 ms early, both alike.

--trace runs the agents and the aggregator at debug level and splits each fence by the times
they log: the agent's `kmsg read` (collectors/kmsg.py), `check transition` and `records posted`
(agent/publisher.py), the aggregator's `fail committed` (aggregator/server.py), `action recorded` and `action finished`
(the action runner) and `scontrol ran` (fencing/slurm.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

_UPDATE = re.compile(r"^\[(?P<t>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] update_node: node (?P<node>\S+) "
                     r"reason set to: (?P<reason>.*)$")
EARLY = 0.002  # a stamp cut to the millisecond may read up to 1 ms before the moment it marks


def slurm_updates(log: Path, offset: int = 0) -> list[tuple[float, str, str]]:
    """(wall time, node, reason) of every reason slurmctld set, in log order, from byte `offset`."""
    out: list[tuple[float, str, str]] = []
    try:
        with open(log, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        m = _UPDATE.match(line)
        if m is not None:  # local time, as slurmctld writes it (naive: this process's zone)
            out.append((datetime.strptime(m["t"], "%Y-%m-%dT%H:%M:%S.%f").timestamp(), m["node"], m["reason"]))
    return out


def drain_applied(log: Path, node: str, after: float, reason_prefix: str, offset: int = 0) -> float | None:
    """When slurmctld set a reason starting with `reason_prefix` on `node`, first at or after
    `after` (reading the log from byte `offset`: a wait reads only what is new)."""
    for t, n, reason in slurm_updates(log, offset):
        if n == node and t >= after - EARLY and reason.startswith(reason_prefix):
            return t
    return None


def _json_lines(log: Path) -> Iterator[dict[str, Any]]:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                yield json.loads(line)
            except ValueError:
                continue


def _stamp(d: dict[str, Any]) -> float:
    return datetime.fromisoformat(str(d["timestamp"]).replace("Z", "+00:00")).timestamp()


# The stages of one fence, in path order: (name, start key, end key) over the Stages' times.
STAGES = (
    ("kmsg line -> read with its XID (kmsg collect)", "line", "read"),
    ("read -> agent's xid FAIL (judgement)", "read", "fail"),
    ("agent FAIL -> POST starts (spool)", "fail", "post"),
    ("POST starts -> ingest begins", "post", "ingest"),
    ("ingest -> FAIL committed", "ingest", "committed"),
    ("committed -> action recorded (decide, journal)", "committed", "recorded"),
    ("recorded -> scontrol show starts", "recorded", "show"),
    ("scontrol show node (runner's read)", "show", "show_end"),
    ("show ends -> scontrol update starts", "show_end", "update"),
    ("scontrol update starts -> applied", "update", "applied"),
    ("applied -> scontrol update exits", "applied", "update_end"),
)


@dataclass
class Stages:
    """One fence's stage times (wall clock; None where a log did not say)."""

    times: dict[str, float | None]

    def span(self, start: str, end: str) -> float | None:
        a, b = self.times.get(start), self.times.get(end)
        return None if a is None or b is None else b - a


def trace(agent_log: Path, agg_log: Path, slurm_log: Path, node: str, gpu: str, t0: float, offset: int) -> Stages:
    """The stage times of the fence of `node` that began with the kernel line at `t0`."""
    times: dict[str, float | None] = {k: None for _, a, b in STAGES for k in (a, b)}
    times["line"] = t0
    reads = 0
    for d in _json_lines(agent_log):
        if times["read"] is None and d.get("event") == "kmsg read" and float(d.get("read_at", 0)) >= t0 - 0.01:
            reads += 1  # collections after the line: the first that carried an XID is the one
            if int(d.get("xids", 0)) > 0:
                times["read"] = float(d["read_at"])
                times["reads"] = float(reads)
        elif times["fail"] is None and d.get("event") == "check transition" and d.get("check") == "xid" \
                and d.get("entity") == gpu and d.get("new") == "FAIL" and _stamp(d) >= t0 - 0.01:
            times["fail"] = _stamp(d)
        elif times["fail"] is not None and times["post"] is None and d.get("event") == "records posted" \
                and float(d.get("posted", 0)) >= times["fail"] - 0.01:
            times["post"] = float(d["posted"])
    for d in _json_lines(agg_log):
        ev = d.get("event")
        if ev == "fail committed" and d.get("node") == node and times["ingest"] is None \
                and float(d.get("started", 0)) >= t0:
            began = float(d["started"])
            times["ingest"], times["committed"] = began, began + float(d.get("took_ms", 0)) / 1e3
        elif ev == "action recorded" and d.get("node") == node and d.get("kind") == "fence" \
                and times["recorded"] is None and _stamp(d) >= t0:
            times["recorded"] = _stamp(d)
        elif ev == "scontrol ran" and times["recorded"] is not None and float(d.get("started", 0)) >= t0:
            argv, start = str(d.get("argv", "")), float(d["started"])
            end = start + float(d.get("took_ms", 0)) / 1e3
            if argv.startswith("show node -o") and argv.endswith(node) and times["show"] is None:
                times["show"], times["show_end"] = start, end
            elif argv.startswith(f"update NodeName={node} State=DRAIN") and times["update"] is None:
                times["update"], times["update_end"] = start, end
    times["applied"] = drain_applied(slurm_log, node, t0, "podhealth:", offset)
    return Stages(times)
