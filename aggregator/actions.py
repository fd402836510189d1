"""The action runner: journal first, then carry out fences, releases, handovers and ladder steps.

Restart safety: every action is recorded as pending in the store BEFORE any fencer is called,
and marked done after; a pending action is finished at start by re-reading the fencers first
(aggregator/reconcile.py), so a fence that already happened is only marked done, never made twice.

This is the ONLY place that tries a fencer call again: each fencer makes one attempt per call
with its own timeout (fencing/fence.py), `call()` repeats a call that raised up to
`retries.attempts` times with doubling backoff, and an action that still fails is left pending
and tried again after `delay()` (the same policy, counted in the action's attempts).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import aiohttp

from podhealth import agentclient, httpclient, log as plog
from podhealth.backoff import Backoff
from podhealth.httpclient import Reply

from podhealth.config_aggregator import AggregatorConfig, RetryConfig
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.model import LADDER_STEPS, FenceMode, Planned
from podhealth.aggregator.overrides import drain_event_op
from podhealth.aggregator.policy import gpu_index
from podhealth.aggregator.context import Context
from podhealth.aggregator.state import Checkpoint, Memory
from podhealth.aggregator.store import ActionRow, ActionStart, Op, StaleEpoch, Store, StoreError, db_errors
from podhealth.aggregator.writer import Writer
from podhealth.fencing.build import build_fencers
from podhealth.fencing.fence import (
    BatchFencer, FenceOutcome, FenceReason, FenceState, Fencer, Job, JobSource, LeaseExpired, NodeNames,
    Refused, Remediator, SeenFencer, Transient, parse_reason, render_reason, repair_reason,
)

T = TypeVar("T")
log = plog.get("podhealth.aggregator")
FAILED_FENCE_COOLDOWN = 600.0  # a fence that failed for good is not planned again for this long
# A reset/reboot whose agent or scheduler keeps not answering fails (a failed attempt on the
# ladder) after this many postponements, instead of holding its node's rung forever.
STEP_POSTPONEMENTS = 10
MAX_CONCURRENT_ACTIONS = 32


class NotLeader(Exception):
    """This replica stopped leading: it leaves the action pending in the journal for the next leader."""


class OperatorError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Pending:
    """A recorded, unfinished fence/release/handover."""

    id: int
    node: str
    kind: str
    who: str
    why: str
    reason: FenceReason | None = None
    rule: str = ""
    dry_run: bool = False
    attempts: int = 0
    next_attempt: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, row: ActionRow) -> "Pending":
        return cls(id=row.id, node=row.node, kind=row.kind, who=row.who, why=row.why, reason=row.reason,
                   rule=row.rule, dry_run=row.dry_run, attempts=row.attempts, next_attempt=row.next_attempt)


def delay(r: RetryConfig, n: int) -> float:
    """The one backoff (core/backoff.py) under `retries:`: `retries.backoff` doubled `n` times, at
    most `retries.max_backoff`. Between the calls of one round n = 0, 1, ...; before a pending
    action's next round n = its attempts."""
    return Backoff(r.backoff, r.max_backoff).delay(n)


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


def slug(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_.")[:16] or "operator"


def _span(seconds: float) -> str:
    """3600 -> "1h", 90 -> "90s": a window as an operator reads it."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _retrieve(t: "asyncio.Task[Any]") -> None:
    """An unrecorded action was logged where it happened (and an operator gets its 503); any
    other failure is logged here, once, instead of by asyncio at exit."""
    if t.cancelled():
        return
    e = t.exception()
    if e is not None and not isinstance(e, OperatorError):
        log.error("action task failed", error=f"{type(e).__name__}: {e}")


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
        self.session = session
        self.clock = clock
        self.mono = mono
        self.acting = acting
        self.epoch = epoch
        self.depose = depose
        self.poke = poke
        self.evidence = evidence
        self.pending: dict[int, Pending] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.evacuating: set[str] = set()  # nodes with an evacuate action in flight
        self._locks: dict[str, asyncio.Lock] = {}
        self._sem = asyncio.Semaphore(MAX_CONCURRENT_ACTIONS)
        self._fence_failed: dict[str, float] = {}
        self._job_readers: list[Any] | None = None

    # ---- the journal ---------------------------------------------------------------------------

    async def commit(self, ops: Sequence[Op]) -> None:
        await self.writer.write(ops)

    async def commit_journal(self, aid: int, ops: Sequence[Op]) -> None:
        """Action `aid`'s progress or end: on PostgreSQL only under this replica's epoch (a deposed
        leader's late write is refused, StaleEpoch, and it stops leading), which the action then
        carries (the leader that carried it out)."""
        if self.depose is None:
            await self.writer.write(ops)
            return
        epoch = self.epoch()
        if epoch is None or not self.acting():
            raise NotLeader("not leading: the journal write is left to the leader")
        ops = [*ops, Store.op_action_epoch(aid, epoch)]
        try:
            await self.writer.write(ops, epoch=epoch)
        except StaleEpoch as e:
            asyncio.ensure_future(self.depose(str(e)))
            raise NotLeader(str(e)) from None

    @property
    def mem(self) -> Memory:
        """The current takeover's mirror (read through the context, never kept)."""
        return self._context().mem

    def spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self.tasks.add(t)
        t.add_done_callback(self.tasks.discard)
        t.add_done_callback(_retrieve)
        return t

    async def cancel_all(self) -> None:
        """Stop every action in flight; what was recorded stays pending in the journal."""
        tasks = list(self.tasks)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def begin(self, node: str, kind: str, who: str, why: str, now: float, reason: FenceReason | None,
                    rule: str, extra: list[Op], undo: Checkpoint | None = None) -> Pending:
        """Record the action as pending (durably) and only then carry it out."""
        try:
            if not self.acting():
                raise NotLeader(f"not leading: {kind} {node} not recorded")
            epoch = self.epoch()
            aid = await self.writer.call(lambda s: s.begin_action(node, kind, who, why, now, reason, rule,
                                                                  self.cfg.dry_run, extra, epoch))
        except (*db_errors(), StoreError, NotLeader) as e:
            raise self._unrecorded([node], kind, e, undo) from None
        p = Pending(id=aid, node=node, kind=kind, who=who, why=why, reason=reason, rule=rule, dry_run=self.cfg.dry_run)
        self.pending[aid] = p
        log.info("action recorded", id=aid, node=node, kind=kind, who=who, why=why)
        await self.execute(p)
        return p

    def _unrecorded(self, nodes: list[str], kind: str, e: Exception, undo: Checkpoint | None) -> OperatorError:
        """An action whose pending record could not be written: nothing is done, memory goes back."""
        if undo is not None:
            self.mem.rollback(undo, nodes)
        self.metrics.actions.labels(kind, "unrecorded").inc()
        if isinstance(e, StaleEpoch) and self.depose is not None:
            asyncio.ensure_future(self.depose(str(e)))
        if isinstance(e, (StaleEpoch, NotLeader)):
            log.warning("action not recorded: this replica does not lead", nodes=nodes[:20], kind=kind, why=str(e))
            return OperatorError(503, f"this aggregator does not lead ({e}); nothing was done")
        log.error("action not recorded: the state store cannot write; nothing done", nodes=nodes[:20],
                  count=len(nodes), kind=kind, error=str(e))
        return OperatorError(503, f"the state store cannot write ({e}); nothing was done")

    async def await_action(self, t: "asyncio.Task[Any]", wait: float) -> dict[str, Any]:
        """What an operator's request answers: the result, or that it is still pending."""
        try:
            p: Pending = await asyncio.wait_for(asyncio.shield(t), wait)
        except asyncio.TimeoutError:
            return {"state": "pending", "result": "still running; see the node's history"}
        if p.done.is_set():
            return p.result
        return {"id": p.id, "node": p.node, "kind": p.kind, "state": "pending", "result": "will be retried"}

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
            extra = mem.set_node(a.node, fence=FenceMode.FENCING, fence_reason=render_reason(a.reason), hold=False,
                                 hold_reason="")
            return ActionStart(a.node, "fence", "policy", a.why, now, a.reason, a.rule, self.cfg.dry_run, tuple(extra))
        if a.kind == "handover":
            self.spawn(self.begin(a.node, "handover", "policy", a.why, now, None, "",
                                  mem.set_node(a.node, handover="running", handover_at=now), undo))
        if a.kind in LADDER_STEPS or a.kind == "repair":
            self._ladder_step(a, now, undo)
        if a.kind == "evacuate" and a.node not in self.evacuating and not any(
                p.node == a.node and p.kind == "evacuate" for p in self.pending.values()):  # one recovered at start
            self.evacuating.add(a.node)  # until it is finished: decide() plans it again meanwhile
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
            ops += mem.set_node(a.node, ladder="repair", ladder_at=now, hold=True, hold_reason=why,
                                fence_reason=render_reason(reason))
            self.metrics.repairs.inc()
            log.error("node handed to repair: no more automatic remediation", node=a.node, why=a.why)
        else:
            mem.recent_steps.append(self.mono())
            ops += mem.set_node(a.node, ladder="acting", ladder_at=now)
        self.spawn(self.begin(a.node, a.kind, "policy", a.why, now, reason, a.entity, ops, undo))

    # ---- executing actions, and the one retry policy -------------------------------------------

    def lock(self, node: str) -> asyncio.Lock:
        return self._locks.setdefault(node, asyncio.Lock())

    def target(self, fencer: Fencer, node: str) -> str:
        """The node's name in this fencer's backend (slurm_name, k8s_name, else the node's own)."""
        rec = self.mem.nodes.get(node)
        if rec is None:
            return fencer.target(NodeNames(node))
        return fencer.target(NodeNames(node, slurm=rec.slurm_name, kubernetes=rec.k8s_name))

    async def call(self, fencer: Fencer, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One call of `fencer` under the retry policy: up to `retries.attempts` calls, `delay()`
        apart, each given 2 x the fencer's own timeout. A failure the backend will repeat (Refused,
        ValueError: a name it refuses) is not tried again; anything else that is still failing
        after the last call is Transient."""
        r = self.cfg.retries
        for attempt in range(r.attempts):
            if not self.acting():  # a replica that stopped leading touches no fencer
                raise NotLeader(f"not leading: {what} not done")
            try:
                return await asyncio.wait_for(fn(), timeout=fencer.timeout * 2)
            except asyncio.CancelledError:
                raise
            except LeaseExpired as e:
                if not self.acting():  # the lease ran out on the way: the next leader finishes it
                    raise NotLeader(str(e)) from None
                err = e  # cut at a deadline a renewal has since moved on: tried again under the new one
            except ValueError as e:  # Refused, or the fencer's own validation (a node name it refuses)
                raise Refused(f"{what}: {e}") from None
            except Exception as e:  # noqa: BLE001 - any other fencer failure is tried again, then left pending
                err = e
            if attempt + 1 < r.attempts:
                await asyncio.sleep(delay(r, attempt))
        raise Transient(f"{what}: {type(err).__name__}: {err}")

    async def execute(self, p: Pending) -> None:
        async with self.lock(p.node), self._sem:
            try:
                run = {"fence": self._do_fence, "release": self._do_release, "handover": self._do_handover,
                       "reset_gpu": self._do_reset, "reboot": self._do_reboot, "repair": self._do_repair,
                       "evacuate": self._do_evacuate}.get(p.kind)
                if run is not None:
                    await run(p)
            except Transient as e:
                if p.kind in LADDER_STEPS and p.attempts + 1 >= STEP_POSTPONEMENTS:
                    await self._step_failed(p, f"{e} (gave up after {p.attempts + 1} tries)")
                else:
                    await self.postpone(p, str(e))
            except NotLeader as e:
                log.warning("action left pending for the leader", id=p.id, node=p.node, kind=p.kind, why=str(e))
            except Refused as e:
                ops: list[Op] = []
                if p.kind == "fence":
                    self._fence_failed[p.node] = self.mono()
                    ops = self.mem.set_node(p.node, fence=FenceMode.NONE, fence_reason="")
                elif p.kind == "release":
                    ops = self.mem.set_node(p.node, fence=FenceMode.FENCED)
                elif p.kind in LADDER_STEPS:
                    await self._step_failed(p, str(e))
                    return
                elif p.kind == "evacuate":  # not planned again for this fence: the audit log says why
                    self.mem.set_evacuated(p.node, "failed")
                await self.finish(p, "failed", str(e), ops)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a bug must not lose the pending record
                log.exception("action failed unexpectedly", id=p.id, node=p.node)
                await self.postpone(p, f"{type(e).__name__}: {e}")

    def due(self, now: float) -> list[Pending]:
        """Pending actions whose next round is due and whose node is free."""
        out = []
        for p in list(self.pending.values()):
            # A retry time further off than the longest backoff means the wall clock
            # stepped back since it was set: due now, not in an hour.
            due = p.next_attempt <= now or p.next_attempt - now > self.cfg.retries.max_backoff
            if p.next_attempt and due and not self.lock(p.node).locked():
                out.append(p)
        return out

    async def postpone(self, p: Pending, error: str) -> None:
        now = self.clock()
        p.attempts += 1
        p.next_attempt = now + delay(self.cfg.retries, p.attempts)
        log.warning("action still pending", id=p.id, node=p.node, kind=p.kind, error=error, attempts=p.attempts)
        self.metrics.actions.labels(p.kind, "retry").inc()
        await self.commit_journal(p.id, [Store.op_action_attempt(p.id, now, p.attempts, p.next_attempt, error),
                                         Store.op_audit(now, p.node, p.who, f"{p.kind} attempt failed", p.why, (),
                                                        error, False, p.id)])

    async def finish(self, p: Pending, state: str, result: str, ops: list[Op]) -> None:
        now = self.clock()
        await self.commit_journal(p.id, ops + [Store.op_action_finish(p.id, state, now, result),
                                               Store.op_audit(now, p.node, p.who, f"{p.kind} {state}", p.why, (),
                                                              result, state != "failed", p.id)])
        self.pending.pop(p.id, None)
        if p.kind == "evacuate":
            self.evacuating.discard(p.node)
        p.result = {"id": p.id, "node": p.node, "kind": p.kind, "state": state, "result": result}
        p.done.set()
        self.metrics.actions.labels(p.kind, state).inc()
        log.info("action finished", id=p.id, node=p.node, kind=p.kind, state=state, result=result)
        self.poke()

    def _audit_outcome(self, p: Pending, fencer: Fencer, what: str, o: FenceOutcome) -> Op:
        return Store.op_audit(self.clock(), p.node, p.who, f"{what} via {fencer.name}", p.why, o.command,
                              o.output if o.ok else (o.error or o.output), o.ok, p.id)

    def marked(self, reason: FenceReason) -> FenceReason:
        """The reason a fencer writes into its mark: with this leader's epoch, so that a mark a
        deposed leader leaves late is told apart (aggregator/lifecycle.py)."""
        return dataclasses.replace(reason, epoch=self.epoch() or 0)

    async def read_all(self, node: str) -> list[tuple[Fencer, FenceState]]:
        out = []
        for f in self.fencers:
            target = self.target(f, node)
            st = await self.call(f, f"{f.name} read {target}", lambda f=f, t=target: f.read(t))  # type: ignore[misc]
            out.append((f, st))
        return out

    # ---- fence ---------------------------------------------------------------------------------

    def _fence_plan(self, p: Pending, states: list[tuple[Fencer, FenceState]]
                    ) -> tuple[str, str, list[Op]] | list[tuple[Fencer, FenceState]]:
        """What to do with a fence once every fencer has been read: either finish it now
        (state, result, ops: unknown node, someone else's fence, an opt-out) or fence it on
        these fencers (the ones that know the node)."""
        mem = self.mem
        present = [(f, st) for f, st in states if st.exists]
        if not present:
            self._fence_failed[p.node] = self.mono()
            return "failed", "node is unknown to every fencer", mem.set_node(p.node, fence=FenceMode.NONE,
                                                                            fence_reason="")
        foreign = [(f, st) for f, st in present if st.fenced and not st.ours]
        if foreign:
            f, st = foreign[0]
            return ("skipped", f"already fenced by someone else in {f.name}: {st.reason}",
                    mem.set_node(p.node, fence=FenceMode.EXTERNAL, fence_reason=st.reason)
                    + [drain_event_op(p.node, f.name, st.reason, self.clock())])
        if any(st.opted_out for _, st in present):
            who = ", ".join(f.name for f, st in present if st.opted_out)
            return ("skipped", f"opted out in {who}",
                    mem.set_node(p.node, fence=FenceMode.NONE, fence_reason="", opted_out=True))
        return present

    def _already_fenced(self, p: Pending, f: Fencer, st: FenceState) -> Op:
        return Store.op_audit(self.clock(), p.node, p.who, f"fence via {f.name}", p.why, (),
                              f"already fenced: {st.reason}", True, p.id)

    async def _fenced(self, p: Pending, ops: list[Op], changed: bool) -> None:
        mem = self.mem
        assert p.reason is not None
        now = self.clock()
        if changed:
            self.metrics.fences.labels(p.reason.check, p.reason.action).inc()
        mem.set_evacuated(p.node, "")  # a new fence: its jobs have not been looked at yet
        await self.finish(p, "done", "fenced" if changed else "was already fenced",
                          ops + mem.set_node(p.node, fence=FenceMode.FENCED, fenced_at=now, opted_out=False,
                                             handover="", handover_at=0.0) + self._flap_hold(p.node, now))
        if self.cfg.jobs.enabled:
            self.spawn(self._note_jobs(p.node, p.reason))
        if self.cfg.bundles.enabled and not self.cfg.dry_run:  # RMA evidence, beside the fence, never in its way
            self.spawn(self.evidence(p.node, p.id))

    def _flap_hold(self, node: str, now: float) -> list[Op]:
        """A node fenced again after flap_hold.cycles fence/release cycles within the window
        stays fenced for an operator: whatever ends its fences (a passed handover, someone
        resuming it in Slurm) and makes it fail again, another release would only start the
        next cycle. Every earlier fence in the window was ended, or this one would not be new."""
        mem = self.mem
        rec = mem.nodes[node]
        fh = self.cfg.flap_hold
        # No upper bound: after the wall clock stepped back, recent fences still count.
        rec.cycles[:] = [t for t in rec.cycles if now - fh.window < t]
        earlier = len(rec.cycles)
        rec.cycles.append(now)
        if rec.hold or earlier < fh.cycles:
            return []
        why = f"flapping: fenced/released {earlier} times in {_span(fh.window)}; release by operator"
        log.warning("node held fenced for an operator", node=node, reason=why)
        self.metrics.flap_holds.inc()
        return mem.set_node(node, hold=True, hold_reason=why) + [Store.op_audit(now, node, "podhealth", "hold", why)]

    async def _do_fence(self, p: Pending) -> None:
        assert p.reason is not None
        plan = self._fence_plan(p, await self.read_all(p.node))
        if isinstance(plan, tuple):
            await self.finish(p, *plan)
            return
        ops: list[Op] = []
        changed = False
        for f, st in plan:
            if st.fenced and st.ours:
                ops.append(self._already_fenced(p, f, st))
                continue
            target = self.target(f, p.node)
            o = await self.call(f, f"{f.name} fence {target}", _fence_from(f, target, self.marked(p.reason), st))
            ops.append(self._audit_outcome(p, f, "fence", o))
            if not o.ok:
                await self.commit(ops)
                raise Transient(f"{f.name} fence {target}: {o.error or o.output}")
            changed = changed or o.changed
        await self._fenced(p, ops, changed)

    # ---- fencing many nodes at once ------------------------------------------------------------

    async def begin_fences(self, starts: list[ActionStart], undo: Checkpoint | None = None) -> list[Pending]:
        """Record every fence as pending (one transaction) and only then carry them out together."""
        try:
            if not self.acting():
                raise NotLeader(f"not leading: {len(starts)} fences not recorded")
            epoch = self.epoch()
            ids = await self.writer.call(lambda s: s.begin_actions(starts, epoch))
        except (*db_errors(), StoreError, NotLeader) as e:
            raise self._unrecorded([a.node for a in starts], "fence", e, undo) from None
        ps = [Pending(id=aid, node=a.node, kind=a.kind, who=a.who, why=a.why, reason=a.reason, rule=a.rule,
                      dry_run=a.dry_run) for aid, a in zip(ids, starts)]
        for p in ps:
            self.pending[p.id] = p
        log.info("actions recorded", ids=ids, nodes=len(ps), kind="fence", who=starts[0].who)
        await self._execute_many(ps)
        return ps

    async def _execute_many(self, ps: list[Pending]) -> None:
        """Fence `ps` with one read and one fence call per fencer when every fencer can batch
        (BatchFencer); whatever the batch cannot settle goes the single-node way (execute)."""
        mine: list[Pending] = []
        single: list[Pending] = []
        for p in ps:
            lock = self.lock(p.node)
            if lock.locked() or not all(isinstance(f, BatchFencer) for f in self.fencers):
                single.append(p)  # someone is working on this node (a retry, an operator): after them
            else:
                await lock.acquire()  # free: taken without yielding, so no one slips in between
                mine.append(p)
        try:
            if mine:
                async with self._sem:
                    single += await self._fence_batch(mine)
        except asyncio.CancelledError:
            raise
        except NotLeader as e:
            log.warning("fences left pending for the leader", nodes=len(mine), why=str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug must not lose the pending records
            log.exception("batch of fences failed unexpectedly", nodes=len(mine))
            for p in mine:
                if not p.done.is_set() and not p.next_attempt:
                    await self.postpone(p, f"{type(e).__name__}: {e}")
        finally:
            for p in mine:
                self.lock(p.node).release()
        for p in single:
            if p.id in self.pending and not p.done.is_set():
                self.spawn(self.execute(p))

    async def _fence_batch(self, ps: list[Pending]) -> list[Pending]:
        """The batched _do_fence; returns the actions left for the single-node path."""
        states: dict[int, list[tuple[Fencer, FenceState]]] = {p.id: [] for p in ps}
        left: dict[int, Pending] = {}
        try:
            for f in self.fencers:
                assert isinstance(f, BatchFencer)
                targets = {p.id: self.target(f, p.node) for p in ps if p.id not in left}
                names = sorted(set(targets.values()))
                got = await self.call(f, f"{f.name} read {len(names)} nodes",
                                      lambda f=f, names=names: f.read_many(names))  # type: ignore[misc]
                for p in ps:
                    st = got.get(targets[p.id]) if p.id in targets else None
                    if st is None:
                        left[p.id] = p
                    else:
                        states[p.id].append((f, st))
        except (Transient, Refused):
            return ps  # each one then tries (and retries, and postpones) on its own, as always
        todo: dict[int, tuple[Pending, list[tuple[Fencer, FenceState]]]] = {}
        done: list[Awaitable[None]] = []
        for p in ps:
            if p.id in left:
                continue
            plan = self._fence_plan(p, states[p.id])
            if isinstance(plan, tuple):
                done.append(self.finish(p, *plan))
            else:
                todo[p.id] = (p, plan)
        await asyncio.gather(*done)
        ops: dict[int, list[Op]] = {pid: [] for pid in todo}
        changed: dict[int, bool] = dict.fromkeys(todo, False)
        failed: list[tuple[Pending, str]] = []
        for f in self.fencers:
            assert isinstance(f, BatchFencer)
            items: dict[int, str] = {}
            for pid, (p, plan) in todo.items():
                st = next((st for ff, st in plan if ff is f), None)
                if st is None:
                    continue  # this fencer does not know the node
                if st.fenced and st.ours:
                    ops[pid].append(self._already_fenced(p, f, st))
                else:
                    items[pid] = self.target(f, p.node)
            if not items:
                continue
            req = [(t, self.marked(r)) for pid, t in items.items() if (r := todo[pid][0].reason) is not None]
            try:
                outcomes = await self.call(f, f"{f.name} fence {len(req)} nodes",
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
                ops[pid].append(self._audit_outcome(p, f, "fence", o))
                if not o.ok:
                    del todo[pid]
                    failed.append((p, f"{f.name} fence {target}: {o.error or o.output}"))
                else:
                    changed[pid] = changed[pid] or o.changed
        if failed:
            await self.commit([op for p, _ in failed for op in ops.get(p.id, [])])
            await asyncio.gather(*(self.postpone(p, error) for p, error in failed))
        await asyncio.gather(*(self._fenced(p, ops[pid], changed[pid]) for pid, (p, _) in todo.items()))
        return list(left.values())

    # ---- release and handover ------------------------------------------------------------------

    async def _do_release(self, p: Pending) -> None:
        mem = self.mem
        states = await self.read_all(p.node)
        ops: list[Op] = []
        foreign = ""
        for f, st in states:
            if not (st.exists and st.fenced):
                continue
            if not st.ours:
                foreign = f"{f.name}: {st.reason}"
                ops.append(Store.op_audit(self.clock(), p.node, p.who, f"release via {f.name}", p.why, (),
                                          f"left alone, fenced by someone else: {st.reason}", True, p.id))
                continue
            target = self.target(f, p.node)
            o = await self.call(f, f"{f.name} release {target}", lambda f=f, t=target: f.release(t))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "release", o))
            if not o.ok:
                await self.commit(ops)
                raise Transient(f"{f.name} release {target}: {o.error or o.output}")
        mode = FenceMode.EXTERNAL if foreign else FenceMode.NONE
        if p.who.startswith("operator:"):
            mem.nodes[p.node].cycles.clear()  # an operator looked at it: the flap count starts afresh
        await self.finish(p, "done", "released" + (f" (still fenced by someone else in {foreign})" if foreign else ""),
                          ops + mem.set_node(p.node, fence=mode, fence_reason=foreign, hold=False, hold_reason="",
                                             handover="", handover_at=0.0, ladder="", ladder_at=0.0))
        mem.set_evacuated(p.node, "")

    async def _ask_agent(self, node: str, url: str, payload: dict[str, Any], deadline_s: float) -> Reply:
        """POST `payload` to the node's agent, signed with its agent key; the answer only once
        its proof checks out (core/agentclient.py). No bearer credential crosses the wire. Asked
        only while this replica's lease holds, checked immediately before (the agent acts on it)."""
        if not self.acting():
            raise NotLeader(f"not leading: POST {url} not started")
        return await agentclient.ask_async(self.session, url, node, self.cfg.auth.agent_token_for(node), "POST",
                                           deadline_s=deadline_s, body=json.dumps(payload).encode(),
                                           headers={"Content-Type": "application/json"})

    async def _do_handover(self, p: Pending) -> None:
        mem = self.mem
        rec = mem.nodes[p.node]
        url = rec.agent_url.rstrip("/") + "/v1/handover"
        passed, detail = False, ""
        try:
            reply = await self._ask_agent(p.node, url, {"reason": p.why}, self.cfg.handover_timeout)
            body = reply.body.decode(errors="replace")
            detail = f"HTTP {reply.status}: {body[:2000]}"
            if reply.status == 200:
                with contextlib.suppress(ValueError):
                    data = json.loads(body)
                    # The agent's suite passes on OK, and on WARN with exit code 0 ("PASS (with
                    # warnings)", checks/handover/report.py); FAIL and UNKNOWN (undecided) never release.
                    passed = isinstance(data, dict) and (
                        data.get("status") == "OK" or (data.get("status") == "WARN" and data.get("exit_code") == 0))
                    if isinstance(data, dict) and isinstance(data.get("summary"), str):
                        # the report's own line (FAILs first, then WARNs, then the UNKNOWN count),
                        # the same as `podhealth check` prints, not 2 KB of its JSON
                        detail = f"HTTP {reply.status}: {data['summary'][:1000]}"
        except agentclient.Unproven as e:  # an impostor's "OK" releases nothing
            detail = f"answer not proven: {e}"
        except httpclient.ExchangeError as e:
            detail = f"unreachable: {e.kind}: {e}"
        now = self.clock()
        state = "passed" if passed else "failed"
        ladder: list[Op] = []
        if rec.ladder == "verifying":  # the suite after a reset/reboot decides that attempt
            ladder = [Store.op_ladder_outcome(p.node, state, now, f"the handover suite failed ({detail[:300]})" if not passed else "")
                      ] + mem.set_node(p.node, ladder="", ladder_at=now)
            if not passed:
                mem.ladder_failed(p.node, now)
        await self.finish(p, "done" if passed else "failed", f"handover {state}: {detail}",
                          [Store.op_audit(now, p.node, p.who, "handover suite", p.why, ("POST", url), detail, passed,
                                          p.id)]
                          + mem.set_node(p.node, handover=state, handover_at=now) + ladder)
        if passed and rec.fence is FenceMode.FENCED:
            await self.release_after_handover(p.node, now)

    async def release_after_handover(self, node: str, now: float) -> None:
        extra = self.mem.set_node(node, fence=FenceMode.RELEASING)
        # Not awaited under this node's lock (we hold it): run as its own task.
        self.spawn(self.begin(node, "release", "podhealth", "handover suite passed", now, None, "", extra))

    # ---- the remediation ladder: reset, reboot, repair ------------------------------------------

    async def _step_failed(self, p: Pending, error: str) -> None:
        """A reset/reboot that could not be carried out: a failed attempt (the next rung, or REPAIR)."""
        now = self.clock()
        self.mem.ladder_failed(p.node, now)
        await self.finish(p, "failed", error, self.mem.set_node(p.node, ladder="", ladder_at=now))

    async def _step_done(self, p: Pending, result: str, ops: list[Op]) -> None:
        """Carried out: the node is verified by the handover suite within ladder.verify_within."""
        now = self.clock()
        await self.finish(p, "done", result, ops + [Store.op_action_outcome(p.id, "verifying", now)]
                          + self.mem.set_node(p.node, ladder="verifying", ladder_at=now, handover="",
                                              handover_at=0.0))

    async def _do_reset(self, p: Pending) -> None:
        """Ask the node's agent to reset one GPU (POST /v1/gpu-reset, the agent token). The agent
        refuses (409) while processes use the GPU: that is "later", not a failed attempt."""
        rec = self.mem.nodes[p.node]
        gpu = gpu_index(p.rule or (p.reason.entity if p.reason else ""))
        if not rec.agent_url or gpu is None:
            raise Refused("no agent_url to ask for the reset" if gpu is not None
                          else f"no single GPU to reset in {p.rule!r}")
        url = rec.agent_url.rstrip("/") + "/v1/gpu-reset"
        if self.cfg.dry_run:  # a dry run touches nothing, not even through the agent
            await self._step_done(p, f"would reset GPU {gpu} (dry run)", [Store.op_audit(
                self.clock(), p.node, p.who, "gpu reset via agent (dry run)", p.why, ("POST", url, f"gpu={gpu}"),
                "would reset (dry run)")])
            return
        try:
            reply = await self._ask_agent(p.node, url, {"gpu": gpu, "reason": p.why}, self.cfg.ladder.reset_timeout)
            body, status = reply.body.decode(errors="replace")[:2000], reply.status
        except agentclient.Unproven as e:  # whatever answered is not the node's agent: try later
            raise Transient(f"POST {url}: answer not proven: {e}") from None
        except httpclient.ExchangeError as e:
            raise Transient(f"POST {url}: {e.kind}: {e}") from None
        audit = Store.op_audit(self.clock(), p.node, p.who, "gpu reset via agent", p.why, ("POST", url, f"gpu={gpu}"),
                               f"HTTP {status}: {body}", status == 200, p.id)
        if status == 200:
            await self._step_done(p, f"GPU {gpu} reset: {body}", [audit])
            return
        await self.commit([audit])
        if status in (409, 503):  # processes use the GPU / the agent cannot tell yet: try later
            raise Transient(f"agent: HTTP {status}: {body}")
        raise Refused(f"agent: HTTP {status}: {body}")

    async def _do_reboot(self, p: Pending) -> None:
        """Reboot through each scheduler that knows the node (Slurm's RebootProgram, the Kubernetes
        reboot annotation); the node stays fenced until the handover suite passes."""
        assert p.reason is not None
        ops: list[Op] = []
        asked = 0
        for f, st in await self.read_all(p.node):
            if not isinstance(f, Remediator) or not st.exists:
                continue
            target = self.target(f, p.node)
            reason = self.marked(p.reason)
            o = await self.call(f, f"{f.name} reboot {target}", lambda f=f, t=target: f.reboot(t, reason))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "reboot", o))
            if not o.ok:
                await self.commit(ops)
                raise Refused(f"{f.name} reboot {target}: {o.error or o.output}")
            asked += 1
        if not asked:
            await self.commit(ops)
            raise Refused("no fencer that knows the node can reboot it")
        await self._step_done(p, f"reboot requested from {asked} scheduler(s)", ops)

    async def _do_repair(self, p: Pending) -> None:
        """Put the REPAIR reason on podhealth's fence in every backend (best effort: the hold and
        the repair queue are in the store either way)."""
        assert p.reason is not None
        ops: list[Op] = []
        for f, st in await self.read_all(p.node):
            if not isinstance(f, Remediator) or not (st.exists and st.fenced and st.ours):
                continue
            target = self.target(f, p.node)
            reason = self.marked(p.reason)
            o = await self.call(f, f"{f.name} remark {target}", lambda f=f, t=target: f.remark(t, reason))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "repair reason", o))
        await self.finish(p, "done", f"handed to repair: {render_reason(p.reason)}", ops)

    # ---- jobs on a fenced node ---------------------------------------------------------------

    def _job_sources(self) -> list[Any]:
        """The backends that list and move jobs. In dry run the real Slurm/Kubernetes fencers are
        built for reading only (jobs()), so a dry run says which jobs each action would touch."""
        if self._job_readers is None:
            fencers = self.fencers
            if self.cfg.dry_run:
                try:
                    fencers = build_fencers(dataclasses.replace(self.cfg, dry_run=False))
                except Exception as e:  # noqa: BLE001 - a dry run must not fail for a backend it cannot reach
                    log.warning("dry run: cannot build the fencers to list jobs", error=str(e))
                    fencers = []
            self._job_readers = [f for f in fencers if isinstance(f, JobSource)]
        return self._job_readers

    async def _list_jobs(self, node: str) -> list[tuple[Any, list[Job]]]:
        out = []
        for f in self._job_sources():
            target = self.target(f, node)
            jobs = await self.call(f, f"{f.name} jobs {target}", lambda f=f, t=target: f.jobs(t))  # type: ignore[misc]
            out.append((f, jobs))
        return out

    async def _note_jobs(self, node: str, reason: FenceReason) -> None:
        """Which jobs the fence hurts: the jobs/pods on the node, and those on the failing GPU,
        into the audit log and the node page (best effort: a backend that cannot say is logged)."""
        try:
            found = await self._list_jobs(node)
        except (Transient, Refused) as e:
            log.warning("cannot list the jobs on a fenced node", node=node, error=str(e))
            return
        jobs = [j for _, js in found for j in js]
        gpu = gpu_index(reason.entity)
        hit = [j for j in jobs if gpu is not None and gpu in j.gpus]
        text = (f"on {reason.entity}: {', '.join(j.label() for j in hit)}; " if hit else "") + \
            f"on the node: {', '.join(j.label() for j in jobs) or 'none'}"
        rec = self.mem.nodes.get(node)
        if rec is not None:
            rec.jobs = tuple(j.to_json() for j in jobs)
        ops = [Store.op_audit(self.clock(), node, "podhealth", "jobs at the fence", f"{reason.check} {reason.entity}",
                              (), text)]
        for f, _ in found:  # the backend's own record where it has one (Kubernetes: an Event on the Node)
            announce = getattr(f, "announce_jobs", None)
            if announce is not None and jobs:
                note = await announce(self.target(f, node), f"{render_reason(reason)}: {text}")
                ops.append(Store.op_audit(self.clock(), node, "podhealth", f"jobs event via {f.name}",
                                          reason.check, (), note or "recorded", not note))
        await self.commit(ops)

    async def _do_evacuate(self, p: Pending) -> None:
        """Move the jobs off a node podhealth fenced (policy._evacuations): requeue (force) or the
        polite way. A Kubernetes eviction a PodDisruptionBudget refuses (429) is tried again later."""
        force = p.rule == "force"
        ops: list[Op] = []
        touched: list[Job] = []
        for f, jobs in await self._list_jobs(p.node):
            touched += jobs
            target = self.target(f, p.node)
            if self.cfg.dry_run:
                verb = "would requeue/evict" if force else "would leave to finish (Kubernetes: evict)"
                ops.append(Store.op_audit(self.clock(), p.node, p.who, f"evacuate via {f.name} (dry run)", p.why,
                                          (), f"{verb}: {', '.join(j.label() for j in jobs) or 'no jobs'}"))
                continue
            o = await self.call(f, f"{f.name} evacuate {target}",
                                lambda f=f, t=target, js=jobs: f.evacuate(t, js, force))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "evacuate", o))
            if not o.ok:
                await self.commit(ops)
                if "429" in o.error or "disruption budget" in o.error.lower():
                    raise Transient(f"{f.name}: {o.error}")
                raise Refused(f"{f.name} evacuate {target}: {o.error or o.output}")
        rec = self.mem.nodes.get(p.node)
        if rec is not None:
            rec.jobs = tuple(j.to_json() for j in touched)
            rec.evacuated_jobs = len(touched)  # the node page must not claim jobs moved off when none ran
        await self.finish(p, "done", f"{'forced' if force else 'polite'}: "
                          f"{', '.join(j.label() for j in touched) or 'no jobs'}",
                          ops)
        self.mem.set_evacuated(p.node, "forced" if force else "polite")

