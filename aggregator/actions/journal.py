"""The action journal: every action is recorded as pending in the store BEFORE any fencer is
called, and ended after (`end`: the executor's Outcome, applied to the node by apply.py in the
same commit); and the one retrier.

Restart safety: a pending action is finished at start by re-reading the fencers first
(aggregator/reconcile.py), so a fence that already happened is only marked done, never made twice.

This is the ONLY place that tries a fencer call again: each fencer makes one attempt per call
with its own timeout (fencing/fence.py), `call()` repeats a call that raised up to
`retries.attempts` times with doubling backoff, and an action that still fails is left pending
and tried again after `delay()` (the same policy, counted in the action's attempts).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, TypeVar

from podhealth import log as plog
from podhealth.backoff import Backoff

from podhealth.config_aggregator import AggregatorConfig, RetryConfig
from podhealth.aggregator.actions.apply import apply
from podhealth.aggregator.actions.outcome import RETRY, Outcome
from podhealth.aggregator.context import Context
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.state import Checkpoint, Memory
from podhealth.aggregator.store import ActionRow, ActionStart, Op, StaleEpoch, Store, StoreError, db_errors
from podhealth.aggregator.writer import Writer
from podhealth.fencing.fence import FenceError, FenceReason, Fencer, LeaseExpired, Refused, Transient

T = TypeVar("T")
log = plog.get("podhealth.aggregator")

# The kinds whose pending record carries the reason podhealth writes into its mark (Marked).
MARKED_KINDS = frozenset({"fence", "reset_gpu", "reboot", "repair"})


class NotLeader(Exception):
    """This replica stopped leading: it leaves the action pending in the journal for the next leader."""


class OperatorError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(eq=False)
class Pending:
    """A recorded, unfinished action with no mark of its own: release, handover, evacuate."""

    id: int
    node: str
    kind: str
    who: str
    why: str
    rule: str = ""
    dry_run: bool = False
    attempts: int = 0
    next_attempt: float = 0.0
    done: asyncio.Event = field(default_factory=asyncio.Event)
    result: dict[str, Any] = field(default_factory=dict)
    reason: FenceReason | None = field(default=None, init=False)  # none: Marked carries one

    @classmethod
    def of(cls, row: ActionRow) -> "Pending":
        """An action the journal holds pending (at start or takeover)."""
        return _typed(row.reason, id=row.id, node=row.node, kind=row.kind, who=row.who, why=row.why, rule=row.rule,
                      dry_run=row.dry_run, attempts=row.attempts, next_attempt=row.next_attempt)


@dataclass(eq=False)
class Marked(Pending):
    """A fence or a ladder step (reset_gpu, reboot, repair): the reason it writes into the mark."""

    reason: FenceReason = field(kw_only=True)


def _typed(reason: FenceReason | None, **fields: Any) -> Pending:
    # A marked kind without its reason (an edited database) stays a Pending: the runner ends it
    # failed instead of guessing a mark.
    if fields["kind"] in MARKED_KINDS and reason is not None:
        return Marked(reason=reason, **fields)
    return Pending(**fields)


def pending_of(a: ActionStart, aid: int) -> Pending:
    """The in-memory record of an action just written as pending."""
    return _typed(a.reason, id=aid, node=a.node, kind=a.kind, who=a.who, why=a.why, rule=a.rule, dry_run=a.dry_run)


async def await_action(t: "asyncio.Task[Any]", wait: float) -> dict[str, Any]:
    """What an operator's request answers: the result, or that it is still pending."""
    try:
        p: Pending = await asyncio.wait_for(asyncio.shield(t), wait)
    except asyncio.TimeoutError:
        return {"state": "pending", "result": "still running; see the node's history"}
    if p.done.is_set():
        return p.result
    return {"id": p.id, "node": p.node, "kind": p.kind, "state": "pending", "result": "will be retried"}


def delay(r: RetryConfig, n: int) -> float:
    """The one backoff (core/backoff.py) under `retries:`: `retries.backoff` doubled `n` times, at
    most `retries.max_backoff`. Between the calls of one round n = 0, 1, ...; before a pending
    action's next round n = its attempts."""
    return Backoff(r.backoff, r.max_backoff).delay(n)


def _detail(e: BaseException) -> dict[str, Any]:
    """What a fencer's own Transient/Refused says of its call (command, output, its own words),
    kept when `call()` names the call in front of it: the caller audits it as the fencer said it."""
    if not isinstance(e, FenceError):
        return {}
    return {"command": e.command, "output": e.output, "error": e.error}


class Journal:
    """The pending actions and their records in the store: begin, postpone, end; the retrier."""

    def __init__(self, cfg: AggregatorConfig, context: Callable[[], Context], writer: Writer, metrics: Metrics, *,
                 clock: Callable[[], float], acting: Callable[[], bool], epoch: Callable[[], int | None],
                 depose: Callable[[str], Awaitable[None]] | None, poke: Callable[[], None]) -> None:
        self.cfg = cfg
        self._context = context
        self.writer = writer
        self.metrics = metrics
        self.clock = clock
        self.acting = acting
        self.epoch = epoch
        self.depose = depose
        self.poke = poke
        self.pending: dict[int, Pending] = {}
        self.evacuating: set[str] = set()  # nodes with an evacuate action in flight

    @property
    def mem(self) -> Memory:
        """The current takeover's mirror (read through the context, never kept)."""
        return self._context().mem

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

    async def begin(self, starts: list[ActionStart], undo: Checkpoint | None) -> list[Pending]:
        """Record the actions as pending, durably and in one transaction; raises OperatorError
        (nothing recorded, memory back at `undo`) when this replica cannot."""
        kind = starts[0].kind
        try:
            if not self.acting():
                what = f"{kind} {starts[0].node}" if len(starts) == 1 else f"{len(starts)} {kind}s"
                raise NotLeader(f"not leading: {what} not recorded")
            epoch = self.epoch()
            ids = await self.writer.call(lambda s: s.begin_actions(starts, epoch))
        except (*db_errors(), StoreError, NotLeader) as e:
            raise self._unrecorded([a.node for a in starts], kind, e, undo) from None
        ps = [pending_of(a, aid) for aid, a in zip(ids, starts)]
        for p in ps:
            self.pending[p.id] = p
        if len(ps) == 1:
            p = ps[0]
            log.info("action recorded", id=p.id, node=p.node, kind=p.kind, who=p.who, why=p.why)
        else:
            log.info("actions recorded", ids=ids, nodes=len(ps), kind=kind, who=starts[0].who)
        return ps

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
                raise Refused(f"{what}: {e}", **_detail(e)) from None
            except Exception as e:  # noqa: BLE001 - any other fencer failure is tried again, then left pending
                err = e
            if attempt + 1 < r.attempts:
                await asyncio.sleep(delay(r, attempt))
        raise Transient(f"{what}: {type(err).__name__}: {err}", **_detail(err))

    def due(self, now: float, busy: Callable[[str], bool]) -> list[Pending]:
        """Pending actions whose next round is due and whose node is not `busy`."""
        out = []
        for p in list(self.pending.values()):
            # A retry time further off than the longest backoff means the wall clock
            # stepped back since it was set: due now, not in an hour.
            due = p.next_attempt <= now or p.next_attempt - now > self.cfg.retries.max_backoff
            if p.next_attempt and due and not busy(p.node):
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

    async def end(self, p: Pending, o: Outcome) -> None:
        """What an executor returned: RETRY leaves the action pending for its next round (the
        executor's lines written now); anything else ends it, with the node's state (apply.py)
        in the same commit."""
        if o.state == RETRY:
            if o.audit:
                await self.commit(o.audit)
            await self.postpone(p, o.result)
            return
        ops = apply(self.mem, self.cfg, self.metrics, p.id, p.node, o, self.clock())
        await self.finish(p, o.state, o.result, [*o.audit, *ops])

    async def note(self, node: str, o: Outcome) -> None:
        """Something learnt beside an action (the jobs a fence hurts): its lines and the node page."""
        await self.commit([*o.audit, *apply(self.mem, self.cfg, self.metrics, 0, node, o, self.clock())])

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


__all__ = ["Journal", "Marked", "NotLeader", "OperatorError", "Pending", "await_action", "delay", "pending_of"]
