"""Evacuate: move the jobs off a node podhealth fenced (policy._evacuations), by requeue (force)
or the polite way. A Kubernetes eviction a PodDisruptionBudget refuses (429) is tried again later."""

from __future__ import annotations

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.actions.outcome import DONE, FAILED, Outcome, retry
from podhealth.aggregator.lifecycle import Kind, Outcome as FenceMove
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import Job, Refused, Transient


def refused(p: Pending, error: str, audit: tuple[Op, ...] = ()) -> Outcome:
    """Not planned again for this fence: the audit log says why."""
    return Outcome(FAILED, error, audit, (FenceMove(Kind.EVACUATED, jobs="failed"),))


async def run(p: Pending, ctx: Ctx) -> Outcome:
    force = p.rule == "force"
    ops: list[Op] = []
    touched: list[Job] = []
    for f, jobs in await ctx.list_jobs(p.node):
        touched += jobs
        target = ctx.target(f, p.node)
        if ctx.cfg.dry_run:
            verb = "would requeue/evict" if force else "would leave to finish (Kubernetes: evict)"
            ops.append(Store.op_audit(ctx.clock(), p.node, p.who, f"evacuate via {f.name} (dry run)", p.why,
                                      (), f"{verb}: {', '.join(j.label() for j in jobs) or 'no jobs'}"))
            continue
        try:
            o = await ctx.call(f, f"{f.name} evacuate {target}",
                               lambda f=f, t=target, js=jobs: f.evacuate(t, js, force))  # type: ignore[misc]
        except (Transient, Refused) as e:
            why = ctx.not_done(p, f, "evacuate", target, e, ops)
            if "429" in e.error or "disruption budget" in e.error.lower():
                return retry(f"{f.name}: {e.error}", ops)
            return refused(p, why, tuple(ops))
        ops.append(ctx.audit_outcome(p, f, "evacuate", o))
    how = "forced" if force else "polite"
    return Outcome(DONE, f"{how}: {', '.join(j.label() for j in touched) or 'no jobs'}", tuple(ops),
                   (FenceMove(Kind.EVACUATED, jobs=how),), jobs=tuple(j.to_json() for j in touched),
                   evacuated_jobs=len(touched))


__all__ = ["refused", "run"]
