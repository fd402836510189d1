"""Keeping the store honest: restart recovery of the journal, reconcile with the fencers, opt-outs.

At start (and when a replica takes the lead) the journal's pending actions are finished first
(`recover`: each re-reads the fencers before it acts, so nothing is done twice), then the store
is compared with what every fencer lists as fenced (`reconcile`); the same comparison runs every
reconcile_interval, and backend opt-outs that were lifted are noticed (`refresh_opt_outs`).
Fencer calls go through the action runner, the one place that retries.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Callable

from podhealth import log as plog

from podhealth.aggregator.actions import ActionRunner, Pending, slug
from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.overrides import drain_event_op
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op, Store
from podhealth.aggregator.lifecycle import RECONCILED, Kind, Move, Outcome, Seen, reconcile_move, settle
from podhealth.fencing.fence import FenceReason, FenceState, Fencer, Transient, parse_reason

log = plog.get("podhealth.aggregator")


def reason_from_text(text: str, node: str) -> FenceReason:
    """Rebuild a FenceReason from a stored `podhealth: check entity action [id]` line (its
    epoch is dropped: a fence made again carries the epoch of the leader that makes it)."""
    r = parse_reason(text)
    if r is not None:
        return dataclasses.replace(r, epoch=0)
    return FenceReason(check="reconcile", entity="node", action="DRAIN", id=slug(node))


CHUNK = 5000  # nodes mapped to a backend's names between two turns of the event loop
_STARTS_ACTION = (Move.UNDO_STALE, Move.RELEASE, Move.FENCE_AGAIN)  # a journaled release or fence


class Reconciler:
    def __init__(self, cfg: AggregatorConfig, actions: ActionRunner, clock: Callable[[], float]) -> None:
        self.cfg = cfg
        self.actions = actions
        self.clock = clock
        self.report: list[str] = []  # the last reconcile's findings
        self.sliced = 0  # how often targets() gave the event loop a turn (the test of its slicing)

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

    async def targets(self, fencer: Fencer) -> dict[str, str]:
        """Every node's name in `fencer`'s backend -> the node: built in slices of CHUNK nodes,
        the event loop serving requests between them (the whole map at once held it ~120 ms per
        fencer at 100,000 nodes). The names are taken first: a node learned meanwhile is known
        to the next reconcile, like one learned after the listing."""
        names, target = list(self.mem.nodes), self.actions.target
        back: dict[str, str] = {}
        for i in range(0, len(names), CHUNK):
            if i:
                await asyncio.sleep(0)
            back.update((target(fencer, n), n) for n in names[i:i + CHUNK])
        self.sliced += max(0, (len(names) - 1) // CHUNK)
        return back

    def unlisted_movable(self) -> list[str]:
        """The nodes no backend lists that reconcile_move can still move: the store says fenced
        (ours) or drained by someone else. Every other unlisted node's move is NOTHING, so the
        periodic reconcile builds no Seen for it (at 100,000 nodes that walk held the event loop
        for 100s of ms every minute)."""
        movable = (FenceMode.FENCED, FenceMode.EXTERNAL)
        return [name for name, rec in self.mem.nodes.items() if rec.fence in movable]

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
                fenced = await runner.call(f, f"{f.name} list", f.list_fenced)
            except Transient as e:
                lines.append(f"{f.name}: cannot list fenced nodes ({e}); reconcile skipped for it")
                continue
            back = await self.targets(f) if fenced else {}
            for target, st in fenced.items():
                listed.setdefault(back.get(target, target), []).append((f, st))
        now = self.clock()
        ops: list[Op] = []
        epoch = runner.epoch() or 0
        for node in sorted(set(listed).union(self.unlisted_movable())):
            if node in busy:
                continue
            sts = listed.get(node, [])
            ours = [(f, st) for f, st in sts if st.ours]
            foreign = [(f, st) for f, st in sts if not st.ours]
            rec = mem.nodes.get(node)
            seen = Seen(rec.fence if rec is not None else None, bool(ours), bool(foreign),
                        max((st.epoch for _, st in ours), default=0), epoch, initial=initial,
                        dry_run=self.cfg.dry_run, fencers=bool(runner.fencers))
            if 0 < seen.mark_epoch < epoch and seen.store is FenceMode.NONE:
                # Only then does the journal matter (a mark a deposed leader may have left late).
                seen = dataclasses.replace(seen, released_epoch=await runner.writer.call(
                    lambda st, n=node: st.released_epoch(n)))  # type: ignore[misc]
            move = reconcile_move(seen)
            if move is not Move.NOTHING:
                ops += self._carry_out(move, node, seen, ours, foreign, now, lines)
            if node in listed and node in mem.nodes:
                mem.vouch(node)  # a fencer's backend knows it: part of the fleet the breaker counts
        for line in lines:
            log.warning("reconcile", detail=line)
            ops.append(Store.op_audit(now, line.split(":", 1)[0], "reconcile", "reconcile", line))
        if ops:
            await runner.commit(ops)
        self.report = lines
        return lines

    def _carry_out(self, move: Move, node: str, seen: Seen, ours: list[tuple[Fencer, FenceState]],
                   foreign: list[tuple[Fencer, FenceState]], now: float, lines: list[str]) -> list[Op]:
        """The store's side of a reconcile move (lifecycle.reconcile_move), settled as the
        lifecycle's table says (RECONCILED); a fence or release to make is started as a journaled
        action, its record's move committed with it."""
        mem, runner = self.mem, self.actions
        ops: list[Op] = []
        if seen.store is None:  # adopted or recorded as drained: the store hears of it now
            _, o = mem.ensure_node(node, now)
            ops += o
        reason = (ours[0][1].reason if move in (Move.ADOPT, Move.ADOPT_UNKNOWN)
                  else foreign[0][1].reason if move in (Move.RECORD_EXTERNAL, Move.TAKEN_OVER) else "")
        settled = settle(mem, node, Outcome(RECONCILED[move], reason=reason), now)
        if move not in _STARTS_ACTION:
            ops += settled  # else committed with the action it starts, by the journal
        if move is Move.ADOPT_UNKNOWN:
            lines.append(f"{node}: fenced by podhealth in {ours[0][0].name} but unknown to the store: adopted")
        elif move is Move.RECORD_EXTERNAL:
            f, st = foreign[0]
            ops.append(drain_event_op(node, f.name, st.reason, now))
            lines.append(f"{node}: fenced by someone else in {f.name}" + (f" ({st.reason})" if seen.store else "")
                         + ": recorded as drained")
        elif move is Move.TAKEN_OVER:
            f, st = foreign[0]
            ops.append(drain_event_op(node, f.name, st.reason, now))
            lines.append(f"{node}: podhealth's fence was replaced by someone else's ({st.reason}): now theirs")
        elif move is Move.UNDO_STALE:
            f, st = next(((f, st) for f, st in ours if st.epoch == seen.mark_epoch), ours[0])
            why = (f"stale mark of lease epoch {seen.mark_epoch} (now {seen.epoch}) in {f.name} ({st.reason}) on a "
                   f"node the journal released under epoch {seen.released_epoch}: a deposed leader's late call; undone")
            log.error("a deposed leader's mark on a released node: undoing it, never adopting it", node=node,
                      fencer=f.name, mark_epoch=seen.mark_epoch, epoch=seen.epoch, reason=st.reason)
            runner.metrics.stale_marks.inc()
            ops.append(Store.op_audit(now, node, "reconcile", "stale mark", why, (), st.reason, False))
            lines.append(f"{node}: {why}")
            runner.spawn(runner.begin(node, "release", "reconcile", why[:200], now, None, "", settled))
        elif move is Move.RELEASE:
            lines.append(f"{node}: fenced by podhealth in {ours[0][0].name} but free in the store: releasing")
            runner.spawn(runner.begin(node, "release", "reconcile", "store says not fenced", now, None, "", settled))
        elif move is Move.ADOPT:
            lines.append(f"{node}: fenced by podhealth in {ours[0][0].name}: adopted")
        elif move is Move.RECORD_FREE:
            lines.append(f"{node}: no longer fenced by anyone: recorded as free")
        elif move is Move.FENCE_AGAIN:
            again = reason_from_text(mem.nodes[node].fence_reason, node)
            lines.append(f"{node}: fenced in the store but not in any backend: fencing again")
            runner.spawn(runner.begin(node, "fence", "reconcile", "store says fenced", now, again, "", settled))
        elif move is Move.RECORD_REMOVED:
            lines.append(f"{node}: podhealth's fence was removed by someone else: recorded as free")
        return ops

    async def refresh_opt_outs(self) -> None:
        """A backend opt-out (a label) can be lifted: look again at the nodes we remember as opted out."""
        mem = self.mem
        for rec in [r for r in mem.nodes.values() if r.opted_out]:
            try:
                states = await self.actions.read_all(rec.name)
            except Transient:
                continue
            if not any(st.opted_out for _, st in states if st.exists):
                await self.actions.commit(settle(mem, rec.name, Outcome(Kind.OPTED_IN), self.clock()))
                log.info("backend opt-out lifted", node=rec.name)
