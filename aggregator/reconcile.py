"""Keeping the store honest: restart recovery of the journal, reconcile with the fencers, opt-outs.

At start (and when a replica takes the lead) the journal's pending actions are finished first
(`recover`: each re-reads the fencers before it acts, so nothing is done twice), then the store
is compared with what every fencer lists as fenced (`reconcile`); the same comparison runs every
reconcile_interval, and backend opt-outs that were lifted are noticed (`refresh_opt_outs`).
Fencer calls go through the action runner, the one place that retries.
"""

from __future__ import annotations

from typing import Callable

from podhealth import log as plog

from podhealth.aggregator.actions import ActionRunner, Pending, slug
from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.overrides import drain_event_op
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import FenceReason, FenceState, Fencer, Transient

log = plog.get("podhealth.aggregator")


def reason_from_text(text: str, node: str) -> FenceReason:
    """Rebuild a FenceReason from a stored `podhealth: check entity action [id]` line."""
    parts = text.removeprefix("podhealth:").strip().split()
    if len(parts) >= 4 and parts[-1].startswith("[") and parts[-1].endswith("]"):
        return FenceReason(check=parts[0], entity=parts[1], action=parts[2], id=parts[-1][1:-1])
    return FenceReason(check="reconcile", entity="node", action="DRAIN", id=slug(node))


class Reconciler:
    def __init__(self, cfg: AggregatorConfig, actions: ActionRunner, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.actions = actions
        self.clock = clock
        self.report: list[str] = []  # the last reconcile's findings

    @property
    def mem(self) -> Memory:
        return self.actions.mem  # the leader's current mirror (a takeover replaces it)

    # ---- restart: pending actions, then reconcile ------------------------------------------------

    async def recover(self, pending: list[Pending]) -> None:
        """Finish (or end) the journal's pending actions, each through the runner."""
        mem, runner = self.mem, self.actions
        for p in pending:
            runner.pending[p.id] = p
            if p.node not in mem.nodes:
                await runner.finish(p, "failed", "node no longer known", [])
                continue
            if p.kind == "handover":
                # The agent's answer died with the previous process; ask again soon.
                await runner.finish(p, "failed", "interrupted by a restart",
                                    mem.set_node(p.node, handover="", handover_at=0.0))
                continue
            log.info("completing pending action", id=p.id, node=p.node, kind=p.kind)
            await runner.execute(p)

    async def orphan_steps(self, busy: set[str]) -> None:
        """A node left `acting` with no pending step (cannot happen through the store's
        transactions; an edited database) would hold its rung forever: it starts afresh."""
        mem = self.mem
        ops: list[Op] = []
        for rec in list(mem.nodes.values()):
            if rec.ladder == "acting" and rec.name not in busy and not any(
                    p.node == rec.name for p in self.actions.pending.values()):
                ops += mem.set_node(rec.name, ladder="", ladder_at=0.0)
        if ops:
            await self.actions.commit(ops)

    async def reconcile(self, initial: bool = False) -> list[str]:
        """Compare the store with every fencer's list of fenced nodes; report and fix.

        At start the store wins where podhealth owns the fence: our fence missing in a backend is
        made again, and our mark on a node the store says is free is removed (unless the store has
        never heard of the node: then it is adopted, since a fresh database cannot overrule the
        cluster). Fences that are not ours are only recorded (`drained`), never touched.
        """
        mem, runner = self.mem, self.actions
        lines: list[str] = []
        busy = {p.node for p in runner.pending.values()}
        listed: dict[str, list[tuple[Fencer, FenceState]]] = {}
        for f in runner.fencers:
            try:
                fenced = await runner.call(f"{f.name} list", f.list_fenced)
            except Transient as e:
                lines.append(f"{f.name}: cannot list fenced nodes ({e}); reconcile skipped for it")
                continue
            back = {runner.target(f, n): n for n in mem.nodes}
            for target, st in fenced.items():
                listed.setdefault(back.get(target, target), []).append((f, st))
        now = self.clock()
        ops: list[Op] = []
        for node, sts in sorted(listed.items()):
            if node in busy:
                continue
            ours = [(f, st) for f, st in sts if st.ours]
            foreign = [(f, st) for f, st in sts if not st.ours]
            rec = mem.nodes.get(node)
            if rec is None:
                if ours:
                    _, o = mem.ensure_node(node, now)
                    ops += o + mem.set_node(node, fence=FenceMode.FENCED, fence_reason=ours[0][1].reason, fenced_at=now)
                    lines.append(f"{node}: fenced by podhealth in {ours[0][0].name} but unknown to the store: adopted")
                elif foreign:
                    _, o = mem.ensure_node(node, now)
                    ops += o + mem.set_node(node, fence=FenceMode.EXTERNAL, fence_reason=foreign[0][1].reason)
                    ops.append(drain_event_op(node, foreign[0][0].name, foreign[0][1].reason, now))
                    lines.append(f"{node}: fenced by someone else in {foreign[0][0].name}: recorded as drained")
                mem.vouch(node)  # a fencer's backend knows it: part of the fleet the breaker counts
                continue
            mem.vouch(node)
            if foreign and not rec.fence.ours and rec.fence is not FenceMode.EXTERNAL:
                ops += mem.set_node(node, fence=FenceMode.EXTERNAL, fence_reason=foreign[0][1].reason)
                ops.append(drain_event_op(node, foreign[0][0].name, foreign[0][1].reason, now))
                lines.append(f"{node}: fenced by someone else in {foreign[0][0].name} ({foreign[0][1].reason}): "
                             "recorded as drained")
            elif foreign and rec.fence.ours and not ours:
                ops += mem.set_node(node, fence=FenceMode.EXTERNAL, fence_reason=foreign[0][1].reason, hold=False,
                                    hold_reason="")
                ops.append(drain_event_op(node, foreign[0][0].name, foreign[0][1].reason, now))
                lines.append(f"{node}: podhealth's fence was replaced by someone else's ({foreign[0][1].reason}): "
                             "now theirs")
            elif ours and rec.fence is FenceMode.NONE:
                if initial and not self.cfg.dry_run:
                    lines.append(f"{node}: fenced by podhealth in {ours[0][0].name} but free in the store: releasing")
                    runner.spawn(runner.begin(node, "release", "reconcile", "store says not fenced", now, None, "",
                                              mem.set_node(node, fence=FenceMode.RELEASING)))
                else:
                    ops += mem.set_node(node, fence=FenceMode.FENCED, fence_reason=ours[0][1].reason)
                    lines.append(f"{node}: fenced by podhealth in {ours[0][0].name}: adopted")
        # The reverse: the store says fenced (by us, or by someone) but no backend lists it.
        for node, rec in sorted(mem.nodes.items()):
            if node in listed or node in busy:
                continue
            if rec.fence is FenceMode.EXTERNAL:
                ops += mem.set_node(node, fence=FenceMode.NONE, fence_reason="")
                lines.append(f"{node}: no longer fenced by anyone: recorded as free")
            elif rec.fence is FenceMode.FENCED and runner.fencers:
                if initial:
                    reason = reason_from_text(rec.fence_reason, node)
                    lines.append(f"{node}: fenced in the store but not in any backend: fencing again")
                    runner.spawn(runner.begin(node, "fence", "reconcile", "store says fenced", now, reason, "",
                                              mem.set_node(node, fence=FenceMode.FENCING)))
                else:
                    ops += mem.set_node(node, fence=FenceMode.NONE, fence_reason="", hold=False, hold_reason="")
                    lines.append(f"{node}: podhealth's fence was removed by someone else: recorded as free")
        for line in lines:
            log.warning("reconcile", detail=line)
            ops.append(Store.op_audit(now, line.split(":", 1)[0], "reconcile", "reconcile", line))
        if ops:
            await runner.commit(ops)
        self.report = lines
        return lines

    async def refresh_opt_outs(self) -> None:
        """A backend opt-out (a label) can be lifted: look again at the nodes we remember as opted out."""
        mem = self.mem
        for rec in [r for r in mem.nodes.values() if r.opted_out]:
            try:
                states = await self.actions.read_all(rec.name)
            except Transient:
                continue
            if not any(st.opted_out for _, st in states if st.exists):
                await self.actions.commit(mem.set_node(rec.name, opted_out=False))
                log.info("backend opt-out lifted", node=rec.name)
