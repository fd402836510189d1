"""The JSON the API and the UI show: pure functions of the aggregator's state, no I/O but the
store's ladder history for the repair queue."""

from __future__ import annotations

from typing import Any, Collection, Mapping

from podhealth.aggregator import overrides
from podhealth.aggregator.actions import Pending
from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.leader import Leadership
from podhealth.aggregator.lease import LeaseInfo
from podhealth.aggregator.model import Decision, FenceMode, Silence
from podhealth.aggregator.policy import RATE_WINDOW, partition_limit
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Store, reason_to_json

# What a note of decide() says about a node it holds back (the podhealth_aggregator_held gauge).
HELD_KINDS = ("breaker_holding", "cap_reached", "partition_cap_reached", "rate_limited", "opted_out",
              "fenced_by_other", "waiting_min_duration", "held_since_reset")


def held(d: Decision) -> dict[str, int]:
    out: dict[str, int] = {}
    for n in d.notes:
        if n.node and n.kind in HELD_KINDS:
            out[n.kind] = out.get(n.kind, 0) + 1
    return out


def fleet_json(mem: Memory, cfg: AggregatorConfig, now: float, mono_now: float, pending: int,
               fencers: Collection[str], replica: dict[str, Any], last: Decision, last_at: float) -> dict[str, Any]:
    """The fleet: counts, the breaker, budgets and limits, who leads, the last decision's notes."""
    partitions: dict[str, dict[str, int]] = {}
    for rec in mem.nodes.values():
        p = partitions.setdefault(rec.partition, {"nodes": 0, "fenced": 0})
        p["nodes"] += 1
        if rec.fence is not FenceMode.NONE:
            p["fenced"] += 1
    for p in partitions.values():
        p["limit"] = partition_limit(p["nodes"], cfg.caps.max_percent_per_partition)
    b = mem.breaker
    return {
        "time": now,
        "nodes": len(mem.nodes),
        "counts": mem.counts(),
        "breaker": {"tripped": b.tripped, "tripped_at": b.tripped_at, "reset_at": b.reset_at, "reason": b.reason},
        "fence_budget": {"used": sum(1 for r in mem.nodes.values() if r.fence.ours),
                         "limit": cfg.caps.max_fenced},
        "rate_limit": {"used": sum(1 for t in mem.recent_fences if mono_now - RATE_WINDOW < t),
                       "limit": cfg.rate_limit.fences_per_minute},
        "partitions": partitions,
        "replica": replica,
        "pending_actions": pending,
        "dry_run": cfg.dry_run,
        "manual_release": cfg.manual_release,
        "fencers": list(fencers),
        "last_decision": {"time": last_at,
                          "notes": [{"kind": n.kind, "node": n.node, "detail": n.detail}
                                    for n in last.notes[:200]]},
    }


def replica_json(info: LeaseInfo | None, lead: Leadership | None, mono_now: float) -> dict[str, Any]:
    """Who leads: this process alone (SQLite), or which replica of those on PostgreSQL, since
    when, and how old this replica's view of the lease is."""
    if lead is None:
        return {"role": "single", "epoch": info.epoch if info else 0, "holder": info.holder if info else "",
                "leader": info.holder if info else "", "since": info.since if info else 0.0}
    seen = lead.lease.seen
    return {"role": "leader" if lead.acting() else "follower", "epoch": int(seen.get("epoch", 0) or 0),
            "holder": lead.lease.holder, "leader": str(seen.get("holder", "")),
            "since": float(seen.get("since", 0) or 0), "expires": float(seen.get("expires", 0) or 0),
            "renewed_ago": round(mono_now - lead.last_renewal, 3) if lead.info is not None else None,
            "lease": lead.duration, "error": lead.error}


def node_json(mem: Memory, name: str, pending: Collection[Pending], last: Decision,
              silences: Mapping[tuple[str, str], Silence], now: float) -> dict[str, Any] | None:
    """One node: its record, open conditions, pending actions, decide()'s notes, silences."""
    rec = mem.nodes.get(name)
    if rec is None:
        return None
    out = rec.to_json()
    out["conditions"] = [c.to_json() for c in mem.conditions_of(name)]
    out["pending_actions"] = [{"id": p.id, "kind": p.kind, "who": p.who, "why": p.why, "attempts": p.attempts,
                               "reason": reason_to_json(p.reason)}
                              for p in pending if p.node == name]
    out["notes"] = [{"kind": n.kind, "detail": n.detail} for n in last.notes if n.node == name]
    out["silences"] = overrides.of_node(silences, name, now)
    return out


def repairs_json(mem: Memory, store: Store) -> list[dict[str, Any]]:
    """The repair queue: nodes the ladder handed to a human, oldest first."""
    out = []
    for rec in sorted((r for r in mem.nodes.values() if r.ladder == "repair"), key=lambda r: (r.ladder_at, r.name)):
        out.append({"node": rec.name, "since": rec.ladder_at, "reason": rec.fence_reason,
                    "hold_reason": rec.hold_reason, "partition": rec.partition,
                    "attempts": store.ladder_attempts(rec.name)})
    return out
