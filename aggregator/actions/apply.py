"""An executor's Outcome made the node's state, at the journal's end of its action: the fence
lifecycle's moves through lifecycle.settle (the one writer of fence, hold and evacuated), a flap
hold where a new fence completes too many cycles, and the handover and ladder fields beside them.
The returned Ops are committed with the action's end, in one transaction."""

from __future__ import annotations

from podhealth import log as plog

from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.actions.outcome import Outcome
from podhealth.aggregator.lifecycle import IllegalMove, Kind, Outcome as FenceMove, settle
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op, Store

log = plog.get("podhealth.aggregator")


def _span(seconds: float) -> str:
    """3600 -> "1h", 90 -> "90s": a window as an operator reads it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def flap_hold(mem: Memory, cfg: AggregatorConfig, node: str, now: float) -> FenceMove | None:
    """A node fenced again after flap_hold.cycles fence/release cycles within the window
    stays fenced for an operator: whatever ends its fences (a passed handover, someone
    resuming it in Slurm) and makes it fail again, another release would only start the
    next cycle. Every earlier fence in the window was ended, or this one would not be new.
    Counts this fence as a cycle (memory only: the journal's fences are the record)."""
    rec = mem.nodes[node]
    fh = cfg.flap_hold
    # No upper bound: after the wall clock stepped back, recent fences still count.
    rec.cycles[:] = [t for t in rec.cycles if now - fh.window < t]
    earlier = len(rec.cycles)
    rec.cycles.append(now)
    if rec.hold or earlier < fh.cycles:
        return None
    why = f"flapping: fenced/released {earlier} times in {_span(fh.window)}; release by operator"
    return FenceMove(Kind.HOLD, why=why)


def apply(mem: Memory, cfg: AggregatorConfig, metrics: Metrics, aid: int, node: str, o: Outcome, now: float
          ) -> list[Op]:
    """The node's side of ending action `aid` with `o`: changes `mem`, returns the store's Ops."""
    rec = mem.nodes.get(node)
    if rec is None:  # forgotten meanwhile: only the journal's record ends
        return []
    ops: list[Op] = []
    moves, after = list(o.moves), []
    if any(m.kind is Kind.FENCE_DONE for m in moves):
        hold = flap_hold(mem, cfg, node, now)
        if hold is not None:
            log.warning("node held fenced for an operator", node=node, reason=hold.why)
            metrics.flap_holds.inc()
            moves.append(hold)
            after.append(Store.op_audit(now, node, "podhealth", "hold", hold.why))
    for m in moves:
        try:
            ops += settle(mem, node, m, now)
        except IllegalMove as e:  # the node moved on meanwhile (reconcile, an operator): the action still ends
            log.warning("action outcome not applied to the node", id=aid, node=node, move=m.kind.value, why=str(e))
    ops += after
    if o.handover:
        ops += mem.set_node(node, handover=o.handover, handover_at=now)
        if rec.ladder == "verifying":  # the suite after a reset/reboot decides that attempt
            ops.append(Store.op_ladder_outcome(node, o.handover, now, o.step_note))
            ops += mem.set_node(node, ladder="", ladder_at=now)
            if o.handover != "passed":
                mem.ladder_failed(node, now)
    if o.step == "verifying":  # carried out: verified by the handover suite within ladder.verify_within
        ops.append(Store.op_action_outcome(aid, "verifying", now))
        ops += mem.set_node(node, ladder="verifying", ladder_at=now, handover="", handover_at=0.0)
    elif o.step == "failed":  # a failed attempt: the next rung, or REPAIR
        mem.ladder_failed(node, now)
        ops += mem.set_node(node, ladder="", ladder_at=now)
    if o.jobs is not None:
        rec.jobs = o.jobs
    if o.evacuated_jobs is not None:
        rec.evacuated_jobs = o.evacuated_jobs  # the node page must not claim jobs moved off when none ran
    return ops


__all__ = ["apply", "flap_hold"]
