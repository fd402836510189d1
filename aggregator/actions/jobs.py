"""The jobs a fence hurts: listed after a fence is done, for the audit log and the node page."""

from __future__ import annotations

from podhealth import log as plog

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.outcome import DONE, Outcome
from podhealth.aggregator.policy import gpu_index
from podhealth.aggregator.store import Store
from podhealth.fencing.fence import FenceReason, Refused, Transient, render_reason

log = plog.get("podhealth.aggregator")


async def note(node: str, reason: FenceReason, ctx: Ctx) -> Outcome | None:
    """Which jobs the fence hurts: the jobs/pods on the node, and those on the failing GPU
    (best effort: None when a backend cannot say, which is logged)."""
    try:
        found = await ctx.list_jobs(node)
    except (Transient, Refused) as e:
        log.warning("cannot list the jobs on a fenced node", node=node, error=str(e))
        return None
    jobs = [j for _, js in found for j in js]
    gpu = gpu_index(reason.entity)
    hit = [j for j in jobs if gpu is not None and gpu in j.gpus]
    text = (f"on {reason.entity}: {', '.join(j.label() for j in hit)}; " if hit else "") + \
        f"on the node: {', '.join(j.label() for j in jobs) or 'none'}"
    ops = [Store.op_audit(ctx.clock(), node, "podhealth", "jobs at the fence", f"{reason.check} {reason.entity}",
                          (), text)]
    for f, _ in found:  # the backend's own record where it has one (Kubernetes: an Event on the Node)
        announce = getattr(f, "announce_jobs", None)
        if announce is not None and jobs:
            said = await announce(ctx.target(f, node), f"{render_reason(reason)}: {text}")
            ops.append(Store.op_audit(ctx.clock(), node, "podhealth", f"jobs event via {f.name}",
                                      reason.check, (), said or "recorded", not said))
    return Outcome(DONE, text, tuple(ops), jobs=tuple(j.to_json() for j in jobs))


__all__ = ["note"]
