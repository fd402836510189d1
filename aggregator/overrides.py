"""Operator overrides: silence a check on a node for a while, mark a node healthy, and an
operator's own drain recorded as an event.

- A silence keeps (node, check) from counting toward a fence (decide() gets the silenced pairs
  as an input, FleetState.silenced, and notes them) until it expires by the aggregator's clock;
  the verdicts are still stored, shown and exported. Setting, lifting and expiry are audited.
- Mark healthy: the operator vouches for the node. Its ladder and hold are cleared, what is open
  now fences no more (released_at), and podhealth's fence, if any, is released. Audited.
- A drain whose reason is not podhealth's (a human's `scontrol update state=drain`) is recorded
  as an `operator_drain` event in the node's history; the fencers never resume it.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Mapping

from podhealth import log as plog

from podhealth.aggregator.context import Context
from podhealth.aggregator.lifecycle import Kind, Outcome, settle
from podhealth.aggregator.model import FenceMode, Silence
from podhealth.aggregator.store import Op, Store

log = plog.get("podhealth.aggregator.overrides")
MAX_SILENCE = 30 * 86400.0  # a silence is a pause, not an opt-out (that is `opt_out`)
MIN_SILENCE = 60.0
_CHECK = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


class OverrideError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def parse_duration(value: object) -> float:
    """Seconds from a number or "90s", "30m", "2h", "1d"; OverrideError (400) otherwise."""
    if isinstance(value, bool):
        raise OverrideError(400, "duration must be seconds or a text like 2h")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION.match(value)):
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    else:
        raise OverrideError(400, f"duration must be seconds or a text like 90m, 2h, 1d; got {value!r}")
    if not MIN_SILENCE <= seconds <= MAX_SILENCE:
        raise OverrideError(400, f"duration must be between {MIN_SILENCE:g}s and {MAX_SILENCE / 86400:g} days")
    return seconds


def active(silences: Mapping[tuple[str, str], Silence], now: float) -> frozenset[tuple[str, str]]:
    """The (node, check) pairs still silenced at `now`."""
    return frozenset(k for k, s in silences.items() if now < s.until)


def of_node(silences: Mapping[tuple[str, str], Silence], node: str, now: float) -> list[dict[str, object]]:
    return [s.to_json() for (n, _), s in sorted(silences.items()) if n == node and now < s.until]


async def silence(ctx: Context, node: str, check: str, duration: object, reason: str,
                  who: str) -> dict[str, Any]:
    ctx.require_leader()  # the leader's memory holds the silences decide() reads
    mem = ctx.mem
    if node not in mem.nodes:
        raise OverrideError(404, f"unknown node {node}")
    if not isinstance(check, str) or not _CHECK.match(check):
        raise OverrideError(400, "check must be a check name (e.g. xid, ib_link, nfs_mount)")
    seconds = parse_duration(duration)
    now = ctx.clock()
    s = Silence(node, check, now + seconds, reason, who, now)
    was = ctx.silences.get((node, check))
    await ctx.commit([Store.op_silence(s), Store.op_audit(
        now, node, f"operator:{who}", "silence", reason, (),
        f"{check} silenced for {seconds:g}s" + (f" (replaces one until {was.until:.0f})" if was else ""))])
    ctx.silences[(node, check)] = s
    log.warning("check silenced on a node: it does not count toward fencing", node=node, check=check,
                seconds=seconds, who=who, reason=reason)
    ctx.poke()
    return s.to_json()


async def unsilence(ctx: Context, node: str, check: str, reason: str, who: str) -> dict[str, Any]:
    ctx.require_leader()
    s = ctx.silences.get((node, check))
    if s is None:
        raise OverrideError(404, f"{check} is not silenced on {node}")
    now = ctx.clock()
    await ctx.commit([Store.op_unsilence(node, check),
                      Store.op_audit(now, node, f"operator:{who}", "unsilence", reason or "lifted", (),
                                     f"{check} counts again")])
    ctx.silences.pop((node, check), None)
    ctx.poke()
    return {"node": node, "check": check, "state": "lifted"}


def expire_ops(silences: dict[tuple[str, str], Silence], now: float) -> list[Op]:
    """Housekeeping: silences past their end are dropped, each with an audit line."""
    ops: list[Op] = []
    for key, s in list(silences.items()):
        if s.until <= now:
            del silences[key]
            ops += [Store.op_unsilence(s.node, s.check),
                    Store.op_audit(now, s.node, "podhealth", "silence expired", s.reason, (),
                                   f"{s.check} counts again (silenced by {s.who})")]
    return ops


async def mark_healthy(ctx: Context, node: str, reason: str, who: str) -> dict[str, Any]:
    """The operator vouches for the node: no more ladder, no hold, nothing open now fences it
    again, and podhealth's own fence is released (someone else's drain is theirs to lift)."""
    ctx.require_leader()
    mem = ctx.mem
    rec = mem.nodes.get(node)
    if rec is None:
        raise OverrideError(404, f"unknown node {node}")
    if rec.fence is FenceMode.EXTERNAL:
        raise OverrideError(409, f"{node} is drained by someone else ({rec.fence_reason}); podhealth never "
                                 "resumes another's drain")
    if rec.fence in (FenceMode.FENCING, FenceMode.RELEASING) or rec.ladder == "acting":
        raise OverrideError(409, f"{node} has an action in flight; try again")
    now = ctx.clock()
    was = {"fence": rec.fence.value, "ladder": rec.ladder, "hold": rec.hold, "hold_reason": rec.hold_reason}
    ops = settle(mem, node, Outcome(Kind.MARK_HEALTHY), now)
    ops.append(Store.op_audit(now, node, f"operator:{who}", "marked healthy", reason, (), json.dumps(was)))
    await ctx.commit(ops)
    log.warning("node marked healthy by an operator: the ladder is skipped", node=node, who=who, was=was)
    out: dict[str, Any] = {"node": node, "state": "done", "result": "marked healthy", "was": was}
    if rec.fence is FenceMode.FENCED:
        released = dict(await ctx.release(node, reason, who))
        out["release"] = released
        out["state"] = released.get("state", "pending")
    ctx.poke()
    return out


def drain_event_op(node: str, fencer: str, reason: str, now: float) -> Op:
    """An operator's own drain, as an event in the node's history (the UI's events table)."""
    body = {"node": node, "event": {"kind": "operator_drain", "code": "", "device": fencer,
                                    "text": f"drained by someone else in {fencer}: {reason}; podhealth leaves it alone"}}
    return Store.op_event(f"drain-{uuid.uuid4().hex}", node, "operator_drain", now, now, json.dumps(body))
