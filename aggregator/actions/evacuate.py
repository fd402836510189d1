"""Evacuate: move the jobs off a node podhealth fenced (policy._evacuations), by requeue (force)
or the polite way. A Kubernetes eviction a PodDisruptionBudget refuses (429) is tried again later."""

from __future__ import annotations

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import Job, Refused, Transient


async def run(p: Pending, ctx: Ctx) -> None:
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
            o = await ctx.journal.call(f, f"{f.name} evacuate {target}",
                                       lambda f=f, t=target, js=jobs: f.evacuate(t, js, force))  # type: ignore[misc]
        except (Transient, Refused) as e:
            why = await ctx.not_done(p, f, "evacuate", target, e, ops)
            if "429" in e.error or "disruption budget" in e.error.lower():
                raise Transient(f"{f.name}: {e.error}") from None
            raise Refused(why) from None
        ops.append(ctx.audit_outcome(p, f, "evacuate", o))
    rec = ctx.mem.nodes.get(p.node)
    if rec is not None:
        rec.jobs = tuple(j.to_json() for j in touched)
        rec.evacuated_jobs = len(touched)  # the node page must not claim jobs moved off when none ran
    await ctx.journal.finish(p, "done", f"{'forced' if force else 'polite'}: "
                             f"{', '.join(j.label() for j in touched) or 'no jobs'}",
                             ops)
    ctx.mem.set_evacuated(p.node, "forced" if force else "polite")


__all__ = ["run"]
