"""Fence: one node (`run`), or every fence of one decision with one read and one fence call per
fencer (`run_batch`, when every fencer can batch: BatchFencer)."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

from podhealth import log as plog

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Marked, Pending
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.overrides import drain_event_op
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import (
    BatchFencer, FenceError, FenceOutcome, FenceReason, FenceState, Fencer, Refused, SeenFencer, Transient,
)

log = plog.get("podhealth.aggregator")


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


def _span(seconds: float) -> str:
    """3600 -> "1h", 90 -> "90s": a window as an operator reads it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _plan(p: Pending, states: list[tuple[Fencer, FenceState]], ctx: Ctx
          ) -> tuple[str, str, list[Op]] | list[tuple[Fencer, FenceState]]:
    """What to do with a fence once every fencer has been read: either finish it now
    (state, result, ops: unknown node, someone else's fence, an opt-out) or fence it on
    these fencers (the ones that know the node)."""
    mem = ctx.mem
    present = [(f, st) for f, st in states if st.exists]
    if not present:
        ctx.fence_failed[p.node] = ctx.mono()
        return "failed", "node is unknown to every fencer", mem.set_node(p.node, fence=FenceMode.NONE,
                                                                        fence_reason="")
    foreign = [(f, st) for f, st in present if st.fenced and not st.ours]
    if foreign:
        f, st = foreign[0]
        return ("skipped", f"already fenced by someone else in {f.name}: {st.reason}",
                mem.set_node(p.node, fence=FenceMode.EXTERNAL, fence_reason=st.reason)
                + [drain_event_op(p.node, f.name, st.reason, ctx.clock())])
    if any(st.opted_out for _, st in present):
        who = ", ".join(f.name for f, st in present if st.opted_out)
        return ("skipped", f"opted out in {who}",
                mem.set_node(p.node, fence=FenceMode.NONE, fence_reason="", opted_out=True))
    return present


def _already_fenced(p: Pending, f: Fencer, st: FenceState, ctx: Ctx) -> Op:
    return Store.op_audit(ctx.clock(), p.node, p.who, f"fence via {f.name}", p.why, (),
                          f"already fenced: {st.reason}", True, p.id)


async def _fenced(p: Marked, ops: list[Op], changed: bool, ctx: Ctx) -> None:
    mem = ctx.mem
    now = ctx.clock()
    if changed:
        ctx.metrics.fences.labels(p.reason.check, p.reason.action).inc()
    mem.set_evacuated(p.node, "")  # a new fence: its jobs have not been looked at yet
    await ctx.journal.finish(p, "done", "fenced" if changed else "was already fenced",
                             ops + mem.set_node(p.node, fence=FenceMode.FENCED, fenced_at=now, opted_out=False,
                                                handover="", handover_at=0.0) + _flap_hold(p.node, now, ctx))
    ctx.after_fence(p)


def _flap_hold(node: str, now: float, ctx: Ctx) -> list[Op]:
    """A node fenced again after flap_hold.cycles fence/release cycles within the window
    stays fenced for an operator: whatever ends its fences (a passed handover, someone
    resuming it in Slurm) and makes it fail again, another release would only start the
    next cycle. Every earlier fence in the window was ended, or this one would not be new."""
    mem = ctx.mem
    rec = mem.nodes[node]
    fh = ctx.cfg.flap_hold
    # No upper bound: after the wall clock stepped back, recent fences still count.
    rec.cycles[:] = [t for t in rec.cycles if now - fh.window < t]
    earlier = len(rec.cycles)
    rec.cycles.append(now)
    if rec.hold or earlier < fh.cycles:
        return []
    why = f"flapping: fenced/released {earlier} times in {_span(fh.window)}; release by operator"
    log.warning("node held fenced for an operator", node=node, reason=why)
    ctx.metrics.flap_holds.inc()
    return mem.set_node(node, hold=True, hold_reason=why) + [Store.op_audit(now, node, "podhealth", "hold", why)]


async def run(p: Marked, ctx: Ctx) -> None:
    plan = _plan(p, await ctx.read_all(p.node), ctx)
    if isinstance(plan, tuple):
        await ctx.journal.finish(p, *plan)
        return
    ops: list[Op] = []
    changed = False
    for f, st in plan:
        if st.fenced and st.ours:
            ops.append(_already_fenced(p, f, st, ctx))
            continue
        target = ctx.target(f, p.node)
        try:
            o = await ctx.journal.call(f, f"{f.name} fence {target}", _fence_from(f, target, ctx.marked(p.reason), st))
        except (Transient, Refused) as e:  # refused or not: the fence is tried again later
            raise Transient(await ctx.not_done(p, f, "fence", target, e, ops)) from None
        ops.append(ctx.audit_outcome(p, f, "fence", o))
        changed = changed or o.changed
    await _fenced(p, ops, changed, ctx)


async def run_batch(ps: list[Marked], ctx: Ctx) -> list[Marked]:
    """The batched `run`; returns the actions left for the single-node path."""
    states: dict[int, list[tuple[Fencer, FenceState]]] = {p.id: [] for p in ps}
    left: dict[int, Marked] = {}
    try:
        for f in ctx.fencers:
            assert isinstance(f, BatchFencer)
            targets = {p.id: ctx.target(f, p.node) for p in ps if p.id not in left}
            names = sorted(set(targets.values()))
            got = await ctx.journal.call(f, f"{f.name} read {len(names)} nodes",
                                         lambda f=f, names=names: f.read_many(names))  # type: ignore[misc]
            for p in ps:
                st = got.get(targets[p.id]) if p.id in targets else None
                if st is None:
                    left[p.id] = p
                else:
                    states[p.id].append((f, st))
    except (Transient, Refused):
        return ps  # each one then tries (and retries, and postpones) on its own, as always
    todo: dict[int, tuple[Marked, list[tuple[Fencer, FenceState]]]] = {}
    done: list[Awaitable[None]] = []
    for p in ps:
        if p.id in left:
            continue
        plan = _plan(p, states[p.id], ctx)
        if isinstance(plan, tuple):
            done.append(ctx.journal.finish(p, *plan))
        else:
            todo[p.id] = (p, plan)
    await asyncio.gather(*done)
    ops: dict[int, list[Op]] = {pid: [] for pid in todo}
    changed: dict[int, bool] = dict.fromkeys(todo, False)
    failed: list[tuple[Marked, str]] = []
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
            outcomes = await ctx.journal.call(f, f"{f.name} fence {len(req)} nodes",
                                              lambda f=f, req=req: f.fence_many(req))  # type: ignore[misc]
        except (Transient, Refused) as e:
            outcomes, error = {}, str(e)
            for pid in items:
                failed.append((todo.pop(pid)[0], error))
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
                failed.append((p, f"{f.name} fence {target}: {o.error or o.output}"))
            else:
                changed[pid] = changed[pid] or o.changed
    if failed:
        await ctx.journal.commit([op for p, _ in failed for op in ops.get(p.id, [])])
        await asyncio.gather(*(ctx.journal.postpone(p, error) for p, error in failed))
    await asyncio.gather(*(_fenced(p, ops[pid], changed[pid], ctx) for pid, (p, _) in todo.items()))
    return list(left.values())


__all__ = ["run", "run_batch"]
