"""The action runner: from decide()'s plan to actions, journal first (journal.py), each carried out
by its kind's executor (one file per kind), one at a time per node and MAX_CONCURRENT_ACTIONS at
once. An executor returns what happened (outcome.py) and the journal's end applies it; the runner
starts what follows (the jobs and evidence of a fence, the release after a passed handover). It
owns the planned ladder rung and what an operator's request waits for."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Sequence

import aiohttp

from podhealth import log as plog

from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.actions import evacuate, fence, handover, jobs, ladder, release
from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Journal, Marked, NotLeader, Pending, await_action
from podhealth.aggregator.actions.outcome import DONE, FAILED, RETRY, Outcome, retry
from podhealth.aggregator.actions.tasks import Tasks, beside
from podhealth.aggregator.lifecycle import Kind, Outcome as FenceMove, settle
from podhealth.aggregator.context import Context
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.model import LADDER_STEPS, FenceMode, Planned
from podhealth.aggregator.state import Checkpoint, Memory
from podhealth.aggregator.store import ActionStart, Op, Store
from podhealth.aggregator.writer import Writer
from podhealth.fencing.fence import (
    BatchFencer, FenceReason, Fencer, Refused, Transient, parse_reason, render_reason, repair_reason,
)

log = plog.get("podhealth.aggregator")
FAILED_FENCE_COOLDOWN = 600.0  # a fence that failed for good is not planned again for this long
# A reset/reboot whose agent or scheduler keeps not answering fails (a failed attempt on the
# ladder) after this many postponements, instead of holding its node's rung forever.
STEP_POSTPONEMENTS = 10
MAX_CONCURRENT_ACTIONS = 32

# kind -> its executor: those of MARKED take a Marked (the reason they write into the mark)
MARKED: dict[str, Callable[[Marked, Ctx], Awaitable[Outcome]]] = {"fence": fence.run, "reset_gpu": ladder.reset,
                                                                    "reboot": ladder.reboot, "repair": ladder.repair}
PLAIN: dict[str, Callable[[Pending, Ctx], Awaitable[Outcome]]] = {"release": release.run, "handover": handover.run,
                                                                  "evacuate": evacuate.run}
# kind -> what a refusal (Refused: the backend will say the same again) means for it; else failed
REFUSED: dict[str, Callable[[Pending, str], Outcome]] = {
    "fence": fence.refused, "release": release.refused, "reset_gpu": ladder.refused, "reboot": ladder.refused,
    "evacuate": evacuate.refused}


def slug(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_.")[:16] or "operator"


class ActionRunner:
    """Records and carries out actions: one at a time per node, MAX_CONCURRENT_ACTIONS at once."""

    def __init__(self, cfg: AggregatorConfig, fencers: Sequence[Fencer], context: Callable[[], Context], writer: Writer,
                 metrics: Metrics, session: aiohttp.ClientSession, *, clock: Callable[[], float],
                 mono: Callable[[], float], acting: Callable[[], bool], epoch: Callable[[], int | None],
                 depose: Callable[[str], Awaitable[None]] | None, poke: Callable[[], None],
                 evidence: Callable[[str, int], Awaitable[object]]) -> None:
        """`acting`/`epoch`/`depose`: the replica's lead (depose None: a single aggregator, no
        epochs); `poke` wakes the decide loop; `evidence` fetches a fenced node's bundle."""
        self.cfg = cfg
        self.fencers = list(fencers)
        self._context = context  # the current one: a takeover builds a new one (aggregator/context.py)
        self.writer = writer
        self.metrics = metrics
        self.mono = mono
        self.epoch = epoch
        self.evidence = evidence
        self.journal = journal = Journal(cfg, context, writer, metrics, clock=clock, acting=acting, epoch=epoch,
                                         depose=depose, poke=poke)
        self.ctx = Ctx(cfg, self.fencers, journal.call, metrics, session, context, clock=clock, acting=acting,
                       epoch=epoch)
        self._fence_failed: dict[str, float] = {}  # node -> when its fence failed for good (monotonic)
        self.tasks = Tasks()
        self.spawn, self.cancel_all = self.tasks.spawn, self.tasks.cancel_all
        self._locks: dict[str, asyncio.Lock] = {}
        self._sem = asyncio.Semaphore(MAX_CONCURRENT_ACTIONS)
        # What reconcile and the service use of the journal (the one retrier among them) and of
        # the executors' context.
        self.commit, self.commit_journal, self.finish = journal.commit, journal.commit_journal, journal.finish
        self.call, self.target, self.read_all = journal.call, self.ctx.target, self.ctx.read_all
        self.await_action = await_action  # what an operator's request answers

    @property
    def pending(self) -> dict[int, Pending]:
        return self.journal.pending

    @property
    def mem(self) -> Memory:  # the current takeover's mirror (read through the context, never kept)
        return self._context().mem

    async def begin(self, node: str, kind: str, who: str, why: str, now: float, reason: FenceReason | None,
                    rule: str, extra: list[Op], undo: Checkpoint | None = None) -> Pending:
        """Record the action as pending (durably) and only then carry it out. A fence whose node and
        a slot are free reads its fencers beside the journal's write (a read changes nothing), locked."""
        start = ActionStart(node, kind, who, why, now, reason, rule, self.cfg.dry_run, tuple(extra))
        lock = self.lock(node)
        if kind != "fence" or reason is None or lock.locked() or self._sem.locked():
            [p] = await self.journal.begin([start], undo)
            await self.execute(p)
            return p
        async with lock, self._sem:  # both free: taken without yielding, so no one slips in between
            [p], read = await beside(self.journal.begin([start], undo), self.ctx.read_all(node))
            await self._execute_held(p, read)
        return p

    # ---- from a decision to actions ------------------------------------------------------------

    def act(self, actions: Sequence[Planned], now: float, undo: Checkpoint | None) -> None:
        """Start what decide() planned: notes at once, every fence of the decision in one
        transaction and one batch for the fencers, the rest each on its own."""
        fences: list[ActionStart] = []
        for a in actions:
            start = self._dispatch(a, now, undo)
            if start is not None:
                fences.append(start)
        if len(fences) == 1:
            f = fences[0]
            self.spawn(self.begin(f.node, f.kind, f.who, f.why, now, f.reason, f.rule, list(f.extra), undo))
        elif fences:
            self.spawn(self.begin_fences(fences, undo))

    def _dispatch(self, a: Planned, now: float, undo: Checkpoint | None = None) -> ActionStart | None:
        """Carry out a notify or a handover; a fence comes back to be recorded with the others
        of this decision (one transaction, one batch for the fencers)."""
        mem = self.mem
        if a.kind == "notify":
            assert a.condition is not None
            c = mem.conditions.get(a.condition)
            ops = mem.mark_notified(a.condition)
            if c is not None:
                log.warning("node condition", node=a.node, check=c.check, entity=c.entity, status=c.status.value,
                            action=c.action.value, summary=c.summary)
                ops.append(Store.op_audit(now, a.node, "podhealth", "notify", a.why))
            self.metrics.actions.labels("notify", "done").inc()
            self.writer.write_nowait(ops)
            return None
        if a.kind == "fence":
            assert a.reason is not None
            failed = self._fence_failed.get(a.node)
            if failed is not None and self.mono() - failed < FAILED_FENCE_COOLDOWN:
                return None  # it failed for good a moment ago: do not fill the audit log with retries
            mem.recent_fences.append(self.mono())
            extra = settle(mem, a.node, FenceMove(Kind.FENCE_BEGIN, reason=render_reason(a.reason)), now)
            return ActionStart(a.node, "fence", "policy", a.why, now, a.reason, a.rule, self.cfg.dry_run, tuple(extra))
        if a.kind == "handover":
            self.spawn(self.begin(a.node, "handover", "policy", a.why, now, None, "",
                                  mem.set_node(a.node, handover="running", handover_at=now), undo))
        if a.kind in LADDER_STEPS or a.kind == "repair":
            self._ladder_step(a, now, undo)
        if a.kind == "evacuate" and a.node not in self.journal.evacuating and not any(
                p.node == a.node and p.kind == "evacuate" for p in self.pending.values()):  # one recovered at start
            self.journal.evacuating.add(a.node)  # until it is finished: decide() plans it again meanwhile
            self.spawn(self.begin(a.node, "evacuate", "policy", a.why, now, None, "force" if a.force else "", [],
                                  undo))
        return None

    def _ladder_step(self, a: Planned, now: float, undo: Checkpoint | None) -> None:
        """Record and start a rung: a reset or reboot (the node is `acting` until it is carried
        out), or REPAIR (held for an operator, with the distinct reason, never retried)."""
        mem = self.mem
        rec = mem.nodes[a.node]
        ops: list[Op] = []
        if a.failed_verify:  # the attempt being verified ran out of time: a failed attempt
            ops.append(Store.op_ladder_outcome(
                a.node, "failed", now, f"the node did not pass the handover suite within {self.cfg.ladder.verify_within:g} s"))
            mem.ladder_failed(a.node, now)
        reason = parse_reason(rec.fence_reason) or FenceReason("ladder", "node", "REBOOT", slug(a.node))
        if a.kind == "repair":
            reason = repair_reason(reason)
            why = f"REPAIR: {a.why}"
            ops += settle(mem, a.node, FenceMove(Kind.REPAIR, reason=render_reason(reason), why=why), now)
            self.metrics.repairs.inc()
            log.error("node handed to repair: no more automatic remediation", node=a.node, why=a.why)
        else:
            mem.recent_steps.append(self.mono())
            ops += mem.set_node(a.node, ladder="acting", ladder_at=now)
        self.spawn(self.begin(a.node, a.kind, "policy", a.why, now, reason, a.entity, ops, undo))

    # ---- executing actions -------------------------------------------------------------------

    def lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    async def execute(self, p: Pending) -> None:
        async with self.lock(p.node), self._sem:
            await self._execute_held(p)

    async def _execute_held(self, p: Pending, read: "asyncio.Future[fence.States] | None" = None) -> None:
        """Carry out `p` under its node's lock and a slot; `read`: a fence's fencer states, already
        asked (fence.run awaits it first: cancelling this cancels it)."""
        try:
            o = await self._run(p, read)
            if o.state == RETRY and p.kind in LADDER_STEPS and p.attempts + 1 >= STEP_POSTPONEMENTS:
                o = Outcome(FAILED, f"{o.result} (gave up after {p.attempts + 1} tries)", o.audit, step="failed")
            await self.journal.end(p, o)
            await self._after(p, o)
        except NotLeader as e:
            log.warning("action left pending for the leader", id=p.id, node=p.node, kind=p.kind, why=str(e))
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a bug must not lose the pending record
            log.exception("action failed unexpectedly", id=p.id, node=p.node)
            await self.journal.postpone(p, f"{type(e).__name__}: {e}")

    async def _run(self, p: Pending, read: "asyncio.Future[fence.States] | None" = None) -> Outcome:
        """The executor's outcome; a fencer's Transient is tried again later, a Refused is what a
        refusal means for the kind (REFUSED)."""
        try:
            if read is not None and isinstance(p, Marked) and p.kind == "fence":
                return await fence.run(p, self.ctx, read)
            if isinstance(p, Marked) and p.kind in MARKED:
                return await MARKED[p.kind](p, self.ctx)
            if p.kind in PLAIN:
                return await PLAIN[p.kind](p, self.ctx)
            raise Refused(f"no reason recorded for this {p.kind}" if p.kind in MARKED else f"unknown kind {p.kind}")
        except Transient as e:
            return retry(str(e))
        except Refused as e:
            return REFUSED[p.kind](p, str(e)) if p.kind in REFUSED else Outcome(FAILED, str(e))

    async def _after(self, p: Pending, o: Outcome) -> None:
        """What follows an action's end, each its own task or action."""
        if o.cooldown:
            self._fence_failed[p.node] = self.mono()
        if isinstance(p, Marked) and p.kind == "fence" and o.state == DONE:
            if self.cfg.jobs.enabled:
                self.spawn(self._note_jobs(p))
            if self.cfg.bundles.enabled and not self.cfg.dry_run:  # RMA evidence, beside the fence, never in its way
                self.spawn(self.evidence(p.node, p.id))
        rec = self.mem.nodes.get(p.node)
        if p.kind == "handover" and o.handover == "passed" and rec is not None and rec.fence is FenceMode.FENCED:
            await self.release_after_handover(p.node, self.journal.clock())

    async def _note_jobs(self, p: Marked) -> None:
        o = await jobs.note(p.node, p.reason, self.ctx)
        if o is not None:
            await self.journal.note(p.node, o)

    def due(self, now: float) -> list[Pending]:
        """Pending actions whose next round is due and whose node is free."""
        return self.journal.due(now, lambda node: self.lock(node).locked())

    async def release_after_handover(self, node: str, now: float) -> None:
        extra = settle(self.mem, node, FenceMove(Kind.RELEASE_BEGIN), now)
        # Not awaited under this node's lock (we hold it): run as its own task.
        self.spawn(self.begin(node, "release", "podhealth", "handover suite passed", now, None, "", extra))

    # ---- fencing many nodes at once ------------------------------------------------------------

    async def begin_fences(self, starts: list[ActionStart], undo: Checkpoint | None = None) -> list[Pending]:
        """Record every fence as pending (one transaction) and only then carry them out together."""
        ps = await self.journal.begin(starts, undo)
        await self._execute_many(ps)
        return ps

    async def _execute_many(self, ps: list[Pending]) -> None:
        """Fence `ps` with one read and one fence call per fencer when every fencer can batch
        (BatchFencer); whatever the batch cannot settle goes the single-node way (execute)."""
        mine: list[Marked] = []
        single: list[Pending] = []
        for p in ps:
            lock = self.lock(p.node)
            if lock.locked() or not isinstance(p, Marked) or not all(isinstance(f, BatchFencer) for f in self.fencers):
                single.append(p)  # someone is working on this node (a retry, an operator): after them
            else:
                await lock.acquire()  # free: taken without yielding, so no one slips in between
                mine.append(p)
        try:
            if mine:
                async with self._sem:
                    ended, left = await fence.run_batch(mine, self.ctx)
                    single += left
                    byid = {p.id: p for p in mine}
                    await asyncio.gather(*(self.journal.end(byid[pid], o) for pid, o in ended.items()))
                    for pid, o in ended.items():
                        await self._after(byid[pid], o)
        except asyncio.CancelledError:
            raise
        except NotLeader as e:
            log.warning("fences left pending for the leader", nodes=len(mine), why=str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug must not lose the pending records
            log.exception("batch of fences failed unexpectedly", nodes=len(mine))
            for p in mine:
                if not p.done.is_set() and not p.next_attempt:
                    await self.journal.postpone(p, f"{type(e).__name__}: {e}")
        finally:
            for p in mine:
                self.lock(p.node).release()
        for p in single:
            if p.id in self.pending and not p.done.is_set():
                self.spawn(self.execute(p))


__all__ = ["FAILED_FENCE_COOLDOWN", "MAX_CONCURRENT_ACTIONS", "STEP_POSTPONEMENTS", "ActionRunner", "slug"]
