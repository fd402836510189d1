"""Release: remove podhealth's fence from every backend that shows it; someone else's fence is
left alone (the node is then recorded as fenced externally)."""

from __future__ import annotations

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.actions.outcome import DONE, FAILED, Outcome, retry
from podhealth.aggregator.lifecycle import Kind, Outcome as FenceMove
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import Refused, Transient


def refused(p: Pending, error: str) -> Outcome:
    """A release the backend refuses: the node stays fenced."""
    return Outcome(FAILED, error, moves=(FenceMove(Kind.RELEASE_FAILED),))


async def run(p: Pending, ctx: Ctx) -> Outcome:
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
            o = await ctx.call(f, f"{f.name} release {target}", lambda f=f, t=target: f.release(t))  # type: ignore[misc]
        except (Transient, Refused) as e:  # refused or not: the release is tried again later
            return retry(ctx.not_done(p, f, "release", target, e, ops), ops)
        ops.append(ctx.audit_outcome(p, f, "release", o))
    result = "released" + (f" (still fenced by someone else in {foreign})" if foreign else "")
    # operator: someone looked at the node, so its flap count starts afresh
    done = FenceMove(Kind.RELEASE_DONE, reason=foreign, operator=p.who.startswith("operator:"))
    return Outcome(DONE, result, tuple(ops), (done,))


__all__ = ["refused", "run"]
