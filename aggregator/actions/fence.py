"""Fence: one node (`run`), or every fence of one decision with one read and one fence call per
fencer (`run_batch`, when every fencer can batch: BatchFencer). Each returns what happened
(Outcome); the journal's end makes it the node's state (FENCE_DONE, a flap hold, ...)."""

from __future__ import annotations

from typing import Awaitable, Callable

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Marked, Pending
from podhealth.aggregator.actions.outcome import DONE, FAILED, SKIPPED, Outcome, retry
from podhealth.aggregator.lifecycle import Kind, Outcome as FenceMove
from podhealth.aggregator.overrides import drain_event_op
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import (
    BatchFencer, FenceError, FenceOutcome, FenceReason, FenceState, Fencer, Refused, SeenFencer, Transient,
)


States = list[tuple[Fencer, FenceState]]  # each fencer's state of one node (Ctx.read_all)


def _fence_from(f: Fencer, target: str, reason: FenceReason, seen: FenceState
                ) -> Callable[[], Awaitable[FenceOutcome]]:
    """The fence call for `call()`: its first try fences from the state the runner has just read
    (SeenFencer: no second read of the node); a retry, after a backoff in which someone may have
    fenced the node, reads again (fence())."""
    first = [seen] if isinstance(f, SeenFencer) else []

    def attempt() -> Awaitable[FenceOutcome]:
        if first:
            assert isinstance(f, SeenFencer)
            return f.fence_seen(target, reason, first.pop())
        return f.fence(target, reason)
    return attempt


def refused(p: Pending, error: str) -> Outcome:
    """A fence the backend refuses: failed for good (not planned again for a while), the node free."""
    return Outcome(FAILED, error, moves=(FenceMove(Kind.FENCE_FAILED),), cooldown=True)


def _plan(p: Pending, states: list[tuple[Fencer, FenceState]], ctx: Ctx
          ) -> Outcome | list[tuple[Fencer, FenceState]]:
    """What to do with a fence once every fencer has been read: either end it now (unknown
    node, someone else's fence, an opt-out) or fence it on these fencers (those that know it)."""
    present = [(f, st) for f, st in states if st.exists]
    if not present:
        return refused(p, "node is unknown to every fencer")
    foreign = [(f, st) for f, st in present if st.fenced and not st.ours]
    if foreign:
        f, st = foreign[0]
        return Outcome(SKIPPED, f"already fenced by someone else in {f.name}: {st.reason}",
                       (drain_event_op(p.node, f.name, st.reason, ctx.clock()),),
                       (FenceMove(Kind.FENCE_FOREIGN, reason=st.reason),))
    if any(st.opted_out for _, st in present):
        who = ", ".join(f.name for f, st in present if st.opted_out)
        return Outcome(SKIPPED, f"opted out in {who}", moves=(FenceMove(Kind.FENCE_OPTED_OUT),))
    return present


def _already_fenced(p: Pending, f: Fencer, st: FenceState, ctx: Ctx) -> Op:
    return Store.op_audit(ctx.clock(), p.node, p.who, f"fence via {f.name}", p.why, (),
                          f"already fenced: {st.reason}", True, p.id)


def _fenced(p: Marked, ops: list[Op], changed: bool, ctx: Ctx) -> Outcome:
    if changed:
        ctx.metrics.fences.labels(p.reason.check, p.reason.action).inc()
    return Outcome(DONE, "fenced" if changed else "was already fenced", tuple(ops), (FenceMove(Kind.FENCE_DONE),),
                   changed=changed)


async def run(p: Marked, ctx: Ctx, read: Awaitable[States] | None = None) -> Outcome:
    """Fence one node; `read`: its fencers' states when the runner asked them beside the journal's write."""
    plan = _plan(p, await (read if read is not None else ctx.read_all(p.node)), ctx)
    if isinstance(plan, Outcome):
        return plan
    ops: list[Op] = []
    changed = False
    for f, st in plan:
        if st.fenced and st.ours:
            ops.append(_already_fenced(p, f, st, ctx))
            continue
        target = ctx.target(f, p.node)
        try:
            o = await ctx.call(f, f"{f.name} fence {target}", _fence_from(f, target, ctx.marked(p.reason), st))
        except (Transient, Refused) as e:  # refused or not: the fence is tried again later
            return retry(ctx.not_done(p, f, "fence", target, e, ops), ops)
        ops.append(ctx.audit_outcome(p, f, "fence", o))
        changed = changed or o.changed
    return _fenced(p, ops, changed, ctx)


async def run_batch(ps: list[Marked], ctx: Ctx) -> tuple[dict[int, Outcome], list[Marked]]:
    """The batched `run`: the outcome of each action it settled (by id), and the actions left
    for the single-node path."""
    states: dict[int, list[tuple[Fencer, FenceState]]] = {p.id: [] for p in ps}
    left: dict[int, Marked] = {}
    try:
        for f in ctx.fencers:
            assert isinstance(f, BatchFencer)
            targets = {p.id: ctx.target(f, p.node) for p in ps if p.id not in left}
            names = sorted(set(targets.values()))
            got = await ctx.call(f, f"{f.name} read {len(names)} nodes",
                                         lambda f=f, names=names: f.read_many(names))  # type: ignore[misc]
            for p in ps:
                st = got.get(targets[p.id]) if p.id in targets else None
                if st is None:
                    left[p.id] = p
                else:
                    states[p.id].append((f, st))
    except (Transient, Refused):
        return {}, ps  # each one then tries (and retries, and postpones) on its own, as always
    todo: dict[int, tuple[Marked, list[tuple[Fencer, FenceState]]]] = {}
    out: dict[int, Outcome] = {}
    for p in ps:
        if p.id in left:
            continue
        plan = _plan(p, states[p.id], ctx)
        if isinstance(plan, Outcome):
            out[p.id] = plan
        else:
            todo[p.id] = (p, plan)
    ops: dict[int, list[Op]] = {pid: [] for pid in todo}
    changed: dict[int, bool] = dict.fromkeys(todo, False)
    for f in ctx.fencers:
        assert isinstance(f, BatchFencer)
        items: dict[int, str] = {}
        for pid, (p, plan) in todo.items():
            st = next((st for ff, st in plan if ff is f), None)
            if st is None:
                continue  # this fencer does not know the node
            if st.fenced and st.ours:
                ops[pid].append(_already_fenced(p, f, st, ctx))
            else:
                items[pid] = ctx.target(f, p.node)
        if not items:
            continue
        req = [(t, ctx.marked(todo[pid][0].reason)) for pid, t in items.items()]
        try:
            outcomes = await ctx.call(f, f"{f.name} fence {len(req)} nodes",
                                              lambda f=f, req=req: f.fence_many(req))  # type: ignore[misc]
        except (Transient, Refused) as e:
            for pid in items:
                todo.pop(pid)
                out[pid] = retry(str(e), ops[pid])
            continue
        for pid, target in items.items():
            p = todo[pid][0]
            o = outcomes.get(target)
            if o is None:
                left[pid] = todo.pop(pid)[0]
                continue
            ops[pid].append(ctx.audit_outcome(p, f, "fence", o))
            if isinstance(o, FenceError):
                del todo[pid]
                out[pid] = retry(f"{f.name} fence {target}: {o.error or o.output}", ops[pid])
            else:
                changed[pid] = changed[pid] or o.changed
    for pid, (p, _) in todo.items():
        out[pid] = _fenced(p, ops[pid], changed[pid], ctx)
    return out, list(left.values())


__all__ = ["States", "refused", "run", "run_batch"]
