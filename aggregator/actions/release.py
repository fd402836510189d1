"""Release: remove podhealth's fence from every backend that shows it; someone else's fence is
left alone (the node is then recorded as fenced externally)."""

from __future__ import annotations

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import Refused, Transient


async def run(p: Pending, ctx: Ctx) -> None:
    mem = ctx.mem
    states = await ctx.read_all(p.node)
    ops: list[Op] = []
    foreign = ""
    for f, st in states:
        if not (st.exists and st.fenced):
            continue
        if not st.ours:
            foreign = f"{f.name}: {st.reason}"
            ops.append(Store.op_audit(ctx.clock(), p.node, p.who, f"release via {f.name}", p.why, (),
                                      f"left alone, fenced by someone else: {st.reason}", True, p.id))
            continue
        target = ctx.target(f, p.node)
        try:
            o = await ctx.journal.call(f, f"{f.name} release {target}", lambda f=f, t=target: f.release(t))  # type: ignore[misc]
        except (Transient, Refused) as e:  # refused or not: the release is tried again later
            raise Transient(await ctx.not_done(p, f, "release", target, e, ops)) from None
        ops.append(ctx.audit_outcome(p, f, "release", o))
    mode = FenceMode.EXTERNAL if foreign else FenceMode.NONE
    if p.who.startswith("operator:"):
        mem.nodes[p.node].cycles.clear()  # an operator looked at it: the flap count starts afresh
    await ctx.journal.finish(p, "done", "released" + (f" (still fenced by someone else in {foreign})" if foreign else ""),
                             ops + mem.set_node(p.node, fence=mode, fence_reason=foreign, hold=False, hold_reason="",
                                                handover="", handover_at=0.0, ladder="", ladder_at=0.0))
    mem.set_evacuated(p.node, "")


__all__ = ["run"]
