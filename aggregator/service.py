"""The aggregator's loops: pull agents, run decide(), carry out its actions, keep the store honest.

Restart safety: every fence/release is recorded as a pending action BEFORE any fencer is
called, and marked done after. On start, pending actions are completed by first re-reading the
fencers (a fence that already happened is only marked done, never made twice), then the store
is reconciled with what the fencers show.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import aiohttp

from podhealth import log as plog
from podhealth.vocab import Status

from podhealth.aggregator import bundles, ingest, overrides
from podhealth.config_aggregator import AggregatorConfig
from podhealth.fencing.fence import (
    BatchFencer, DryRunFencer, FenceOutcome, FenceReason, FenceState, Fencer, Job, JobSource, Remediator,
    parse_reason, render_reason, repair_reason,
)
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.model import LADDER_STEPS, BreakerState, Decision, FenceMode, FleetState, Planned, Silence
from podhealth.aggregator.policy import RATE_WINDOW, Policy, decide, gpu_index, partition_limit
from podhealth.aggregator.leader import Leadership
from podhealth.aggregator.lease import FileLease, LeaseInfo, PgLease, holder_name
from podhealth.aggregator.state import Checkpoint, Memory
from podhealth.aggregator.store import (
    ActionRow, ActionStart, Loaded, Op, StaleEpoch, Store, StoreError, db_errors, is_postgres_url, reason_to_json,
    sqlite_path,
)
from podhealth.aggregator.writer import Writer

T = TypeVar("T")
log = plog.get("podhealth.aggregator")
RECONCILE_INTERVAL = 60.0
HOUSEKEEPING_INTERVAL = 5.0
MIN_DECIDE_GAP = 0.05
SYNC_INTERVAL = 1.0  # seconds between the leader's reads of the other replicas' ingest
SYNC_MARGIN = 15.0


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


class TransientError(Exception):
    """A fencer could not answer (timeout, slurmctld down): try again later."""


class PermanentError(Exception):
    """A fencer refused the request itself (e.g. a node name it cannot accept): retrying won't help."""


FAILED_FENCE_COOLDOWN = 600.0  # a fence that failed for good is not planned again for this long
# A reset/reboot whose agent or scheduler keeps not answering fails (a failed attempt on the
# ladder) after this many postponements, instead of holding its node's rung forever.
STEP_POSTPONEMENTS = 10


def build_fencers(cfg: AggregatorConfig) -> list[Fencer]:
    """The fencers the config turns on; dry run replaces them all with the dry-run fencer."""
    if cfg.dry_run:
        return [DryRunFencer()]
    out: list[Fencer] = []
    f = cfg.fencers
    if f.slurm.enabled:
        from podhealth.fencing import slurm
        out.append(slurm.from_config(f.slurm))  # type: ignore[attr-defined]
    if f.kubernetes.enabled:
        from podhealth.extras import require

        require("kubernetes")  # MissingExtra names `pip install 'podhealth[kubernetes]'`
        from podhealth.fencing import kube
        out.append(kube.from_config(f.kubernetes))  # type: ignore[attr-defined]
    if f.file.enabled:
        from podhealth.fencing.filefence import FileFencer
        out.append(FileFencer(f.file.path, f.file.gate or None, f.file.gate_after))
    if f.dryrun.enabled or not out:
        out.append(DryRunFencer())
    return out


class Aggregator:
    def __init__(self, cfg: AggregatorConfig, fencers: Sequence[Fencer] | None = None,
                 clock: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self.cfg = cfg
        self.clock = clock  # wall time: what is stored and shown
        # Intervals (the decide and pull loops, the rate limit, cool-downs) are measured on a
        # monotonic clock, so an NTP step back of the wall clock cannot stall or unthrottle them.
        self.mono = mono
        self.policy = Policy.from_config(cfg)
        self.fencers: list[Fencer] = list(fencers) if fencers is not None else build_fencers(cfg)
        self.metrics = Metrics()
        self.store: Store | None = None
        self.lease: FileLease = FileLease(cfg.db)
        self.lease_info: LeaseInfo | None = None
        # PostgreSQL replicas: which one acts (None on SQLite, where the file lease is exclusive)
        self.leadership: Leadership | None = None
        self._acting_tasks: list[asyncio.Task[Any]] = []
        self.writer: Writer | None = None
        self.mem: Memory | None = None
        self.pending: dict[int, Pending] = {}
        self.last_decision = Decision()
        self.last_decision_at = 0.0
        self.wake = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._action_tasks: set[asyncio.Task[Any]] = set()
        self._node_locks: dict[str, asyncio.Lock] = {}
        self._session: aiohttp.ClientSession | None = None
        self._running = False
        self._sem = asyncio.Semaphore(32)
        self._fence_failed: dict[str, float] = {}
        self.reconcile_report: list[str] = []
        self._evacuating: set[str] = set()  # nodes with an evacuate action in flight
        # operators' silences, (node, check) -> Silence: an input of decide() (aggregator/overrides.py)
        self.silences: dict[tuple[str, str], Silence] = {}
        self._job_readers: list[Any] | None = None
        self.housekeeping_interval = HOUSEKEEPING_INTERVAL
        self.started_at = 0.0
        self.reconcile_interval = RECONCILE_INTERVAL
        self.metrics.add_fleet(lambda: self.mem, cfg.caps.max_fenced, lambda: len(self.pending), self._held)
        self.metrics.leader.set_function(lambda: 1.0 if self.mem is not None and self.acting() else 0.0)
        self.metrics.lease_age.set_function(
            lambda: self.mono() - self.leadership.last_look if self.leadership is not None else 0.0)

    # ---- lifecycle -------------------------------------------------------------------------------

    def _memory(self, loaded: Loaded, cycles: list[tuple[str, float, str, str]], now: float) -> Memory:
        """The in-memory mirror from what the store holds (at start, and at a takeover)."""
        mem = Memory.from_loaded(loaded)
        mem.max_skew = self.cfg.max_clock_skew
        self.silences = {(s.node, s.check): s for s in loaded.silences}
        # The rate limit's recent fences, stored as wall times, move onto the monotonic clock.
        m0 = self.mono()
        mem.recent_fences = collections.deque((m0 - max(0.0, now - t) for t in sorted(loaded.recent_fences)),
                                              maxlen=mem.recent_fences.maxlen)
        mem.recent_steps = collections.deque((m0 - max(0.0, now - t) for t in sorted(loaded.recent_steps)),
                                             maxlen=mem.recent_steps.maxlen)
        for node, at, kind, who in cycles:
            rec = mem.nodes.get(node)
            if rec is not None:
                if kind == "release":
                    rec.cycles.clear()  # an operator's release starts the count afresh
                else:
                    rec.cycles.append(at)
        return mem

    async def start(self) -> None:
        now = self.clock()
        self.started_at = now
        store, loaded = await self._open_store(now)
        cycles = await asyncio.to_thread(store.recent_cycles, now - self.cfg.flap_hold.window)  # writer not yet running
        self.mem = self._memory(loaded, cycles, now)
        self.writer = Writer(store)
        self.writer.start()
        ops: list[Op] = []
        for n in self.cfg.nodes:
            ops += self.mem.configure_node(n.name, n.agent_url, n.slurm_name, n.k8s_name, n.partition, now)
        await self.writer.write(ops + self.fleet_sample_ops(now))  # the fleet chart starts at the start
        self._session = aiohttp.ClientSession()
        self._running = True
        fencer_names = ", ".join(f.name for f in self.fencers)
        log.info("aggregator starting", db=store.where, nodes=len(self.mem.nodes), fencers=fencer_names,
                 dry_run=self.cfg.dry_run, pending=len(loaded.pending), replica=self.leadership is not None)
        if self.leadership is None:
            await self._start_acting(loaded.pending)
            self._tasks = [asyncio.create_task(self._housekeeping_loop(), name="housekeeping")]
        else:
            # A replica: ingest and serve now; decide and act only once it leads.
            lead = self.leadership
            self._tasks = [asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
                           asyncio.create_task(lead.run(lambda: self._running), name="leadership")]

    async def _start_acting(self, pending: Sequence[ActionRow]) -> None:
        """Finish or roll back the journal's pending actions, reconcile with the fencers, then
        decide and act: at start (SQLite), or when this replica takes the lead (PostgreSQL)."""
        await self._recover([Pending.of(r) for r in pending])
        await self._orphan_steps({r.node for r in pending})
        await self.reconcile(initial=True)
        self._acting_tasks = [asyncio.create_task(self._decide_loop(), name="decide"),
                              asyncio.create_task(self._pull_loop(), name="pull")]
        if self.leadership is not None:
            self._acting_tasks.append(asyncio.create_task(self._sync_loop(), name="sync"))

    async def _sync_loop(self) -> None:
        """The leader takes in what the other replicas ingested (they write it to the shared
        store; only the leader decides). The window reaches back SYNC_MARGIN so a replica's
        slow commit or a few seconds of clock difference between replicas lose nothing."""
        cursor = self.clock() - SYNC_MARGIN
        while self._running:
            await asyncio.sleep(SYNC_INTERVAL)
            store = self.store
            mem: Memory | None = self.mem
            assert store is not None and mem is not None
            started = self.clock()
            try:
                rows, conds = await asyncio.to_thread(store.observed_since, cursor)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again; the lease decides who acts
                log.warning("cannot read the other replicas' ingest", error=str(e))
                continue
            if self.mem is mem and mem is not None and mem.adopt(rows, conds):
                self.poke()
            cursor = started - SYNC_MARGIN

    def acting(self) -> bool:
        """May this process decide and act now? Always on SQLite; on PostgreSQL while it leads."""
        return self.leadership is None or self.leadership.acting()

    def epoch(self) -> int | None:
        """The fencing token journal writes carry (None before any lease: tests without start())."""
        return self.lease_info.epoch if self.lease_info is not None else None

    async def _elected(self, info: LeaseInfo) -> None:
        """This replica leads: reload the mirror from the store (the other replicas' ingest, the
        previous leader's journal), then finish its pending actions and start deciding."""
        assert self.writer is not None
        self.lease_info = info
        self.metrics.lease_epoch.set(info.epoch)
        now = self.clock()
        window = self.cfg.flap_hold.window
        # Through the writer: after every write this replica queued before, in order.
        loaded, cycles = await self.writer.call(
            lambda s: (s.load(now, self.cfg.event_retention), s.recent_cycles(now - window)))
        self.mem = self._memory(loaded, cycles, now)
        self.pending.clear()
        log.info("taking over", epoch=info.epoch, pending=len(loaded.pending), nodes=len(self.mem.nodes))
        try:
            await self._start_acting(loaded.pending)
        except NotLeader as e:
            # Lost the lead while taking over: stop; the next takeover (this replica's or
            # another's) starts again from the journal.
            if self.leadership is not None:
                await self.leadership.depose(f"lost the lead during the takeover ({e})")

    async def _deposed(self, why: str) -> None:
        """Stop deciding and acting at once; what is in flight stays pending in the journal."""
        tasks = [*self._acting_tasks, *self._action_tasks]
        self._acting_tasks = []
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.pending.clear()
        self.lease_info = None

    async def stop(self) -> None:
        self._running = False
        for t in [*self._tasks, *self._acting_tasks]:
            t.cancel()
        for t in list(self._action_tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, *self._acting_tasks, *self._action_tasks, return_exceptions=True)
        self._tasks, self._acting_tasks = [], []
        if self.leadership is not None:
            await self.leadership.release()
        if self.mem is not None and self.writer is not None:
            self.writer.write_nowait(self.mem.flush_seen())
        if self.writer is not None:
            await self.writer.stop()
        if self._session is not None:
            await self._session.close()
        if self.store is not None:
            self.store.close()
        self.lease.release()

    async def _open_store(self, now: float) -> tuple[Store, Loaded]:
        """Take the store's lease, open (migrate) and load it. Any failure (another aggregator
        holds it; corrupt, locked or read-only) is one StoreError line, and nothing is left held."""
        url = self.cfg.store_url()
        if is_postgres_url(url):
            return await self._open_replica(url, now)
        db = sqlite_path(url)
        self.lease = FileLease(db)
        try:
            await asyncio.to_thread(db.parent.mkdir, parents=True, exist_ok=True)
            # The lock before the open: a second aggregator must not even migrate the schema.
            await asyncio.to_thread(self.lease.lock, now)
            self.store = store = await asyncio.to_thread(Store, db)
            # The epoch is a write: a read-only or locked file says so now, not at the first report.
            self.lease_info = info = await asyncio.to_thread(self.lease.acquire, store, now)
            loaded = await asyncio.to_thread(store.load, now, self.cfg.event_retention)
        except BaseException as e:
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.close()
                self.store = None
            self.lease.release()
            if isinstance(e, StoreError):
                raise
            if isinstance(e, (*db_errors(), OSError)):
                raise StoreError(f"{db}: {getattr(e, 'strerror', None) or e}") from None
            raise
        self.metrics.lease_epoch.set(info.epoch)
        log.info("store lease taken", db=str(db), epoch=info.epoch, holder=info.holder)
        return store, loaded

    async def _open_replica(self, url: str, now: float) -> tuple[Store, Loaded]:
        """A replica on PostgreSQL: open (migrate) and load; leadership is taken by the loop."""
        try:
            self.store = store = await asyncio.to_thread(Store, url)
            loaded = await asyncio.to_thread(store.load, now, self.cfg.event_retention)
        except BaseException as e:
            if self.store is not None:
                with contextlib.suppress(Exception):
                    self.store.close()
                self.store = None
            if isinstance(e, StoreError):
                raise
            if isinstance(e, db_errors()):
                raise StoreError(f"{store.where if self.store else url}: {e}") from None
            raise
        # A token of its own: two replicas may share a host, a port in config, even a pid (containers)
        holder = f"{holder_name()} port {self.cfg.listen.port} #{secrets.token_hex(3)}"
        self.leadership = Leadership(PgLease(url, holder, self.cfg.store.lease), self._elected, self._deposed,
                                     self.mono)
        return store, loaded

    def _held(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for n in self.last_decision.notes:
            if n.node and n.kind in ("breaker_holding", "cap_reached", "partition_cap_reached", "rate_limited",
                                     "opted_out", "fenced_by_other", "waiting_min_duration", "held_since_reset"):
                out[n.kind] = out.get(n.kind, 0) + 1
        return out

    def poke(self) -> None:
        """Something changed: run the policy soon."""
        self.wake.set()

    async def commit(self, ops: Sequence[Op]) -> None:
        assert self.writer is not None
        await self.writer.write(ops)

    async def commit_journal(self, aid: int, ops: Sequence[Op]) -> None:
        """Action `aid`'s progress or end: on PostgreSQL only under this replica's epoch (a deposed
        leader's late write is refused, StaleEpoch, and it stops leading), which the action then
        carries (the leader that carried it out)."""
        assert self.writer is not None
        if self.leadership is None:
            await self.writer.write(ops)
            return
        epoch = self.epoch()
        if epoch is None or not self.acting():
            raise NotLeader("not leading: the journal write is left to the leader")
        ops = [*ops, Store.op_action_epoch(aid, epoch)]
        try:
            await self.writer.write(ops, epoch=epoch)
        except StaleEpoch as e:
            asyncio.ensure_future(self.leadership.depose(str(e)))
            raise NotLeader(str(e)) from None

    # ---- the decide loop -----------------------------------------------------------------------

    async def _decide_loop(self) -> None:
        seen, last = -1, float("-inf")
        while self._running:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.cfg.decide_interval)
            self.wake.clear()
            assert self.mem is not None
            # Run when something changed, and on the interval (minimum durations, healthy_for).
            if self.mem.version == seen and self.mono() - last < self.cfg.decide_interval:
                continue
            seen, last = self.mem.version, self.mono()
            try:
                self.run_decide()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad run; it is logged
                log.exception("decide failed")
            await asyncio.sleep(MIN_DECIDE_GAP)  # coalesce bursts of ingest into one run

    def run_decide(self) -> Decision:
        mem = self.mem
        assert mem is not None and self.writer is not None
        now = self.clock()
        d = decide(mem.open_conditions(), self.fleet_now(now), now, self.policy)
        self.metrics.decisions.inc()
        self.last_decision, self.last_decision_at = d, now
        if d.breaker != mem.breaker:
            tripped = d.breaker.tripped and not mem.breaker.tripped
            ops = mem.set_breaker(d.breaker)
            if tripped:
                self.metrics.breaker_trips.inc()
                log.error("circuit breaker tripped: fencing stopped", reason=d.breaker.reason)
                ops.append(Store.op_audit(now, "*", "podhealth", "breaker tripped", d.breaker.reason))
            self.writer.write_nowait(ops)
        fences: list[ActionStart] = []
        # Memory marks a node `fencing` before the store records the action: if that record
        # cannot be written, the node goes back to how it was (never `fencing` with no action).
        undo = mem.checkpoint(*(a.node for a in d.actions if a.kind in ("fence", "handover", "repair", *LADDER_STEPS)))
        for a in d.actions:
            start = self._dispatch(a, now, undo)
            if start is not None:
                fences.append(start)
        if len(fences) == 1:
            f = fences[0]
            self._spawn(self._begin(f.node, f.kind, f.who, f.why, now, f.reason, f.rule, list(f.extra), undo))
        elif fences:
            self._spawn(self._begin_fences(fences, undo))
        return d

    def fleet_now(self, now: float) -> FleetState:
        """The fleet for decide(), its recent fences moved from the monotonic clock onto `now`."""
        assert self.mem is not None
        m = self.mono()
        return dataclasses.replace(self.mem.fleet(), recent_fences=tuple(now - (m - t) for t in self.mem.recent_fences),
                                   recent_remediations=tuple(now - (m - t) for t in self.mem.recent_steps),
                                   silenced=overrides.active(self.silences, now))

    def _dispatch(self, a: Planned, now: float, undo: Checkpoint | None = None) -> ActionStart | None:
        """Carry out a notify or a handover; a fence comes back to be recorded with the others
        of this decision (one transaction, one batch for the fencers)."""
        mem = self.mem
        assert mem is not None and self.writer is not None
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
            self._spawn(self._begin(a.node, "handover", "policy", a.why, now, None, "",
                                    mem.set_node(a.node, handover="running", handover_at=now), undo))
        if a.kind in LADDER_STEPS or a.kind == "repair":
            self._ladder_step(a, now, undo)
        if a.kind == "evacuate" and a.node not in self._evacuating and not any(
                p.node == a.node and p.kind == "evacuate" for p in self.pending.values()):  # one recovered at start
            self._evacuating.add(a.node)  # until it is finished: decide() plans it again meanwhile
            self._spawn(self._begin(a.node, "evacuate", "policy", a.why, now, None, "force" if a.force else "", [],
                                    undo))
        return None

    def _ladder_step(self, a: Planned, now: float, undo: Checkpoint | None) -> None:
        """Record and start a rung: a reset or reboot (the node is `acting` until it is carried
        out), or REPAIR (held for an operator, with the distinct reason, never retried)."""
        mem = self.mem
        assert mem is not None
        rec = mem.nodes[a.node]
        ops: list[Op] = []
        if a.failed_verify:  # the attempt being verified ran out of time: a failed attempt
            ops.append(Store.op_ladder_outcome(a.node, "failed", now))
            mem.ladder_failed(a.node, now)
        reason = parse_reason(rec.fence_reason) or FenceReason("ladder", "node", "REBOOT", _slug(a.node))
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
        self._spawn(self._begin(a.node, a.kind, "policy", a.why, now, reason, a.entity, ops, undo))

    def _spawn(self, coro: Awaitable[Any]) -> asyncio.Task[Any]:
        t = asyncio.ensure_future(coro)
        self._action_tasks.add(t)
        t.add_done_callback(self._action_tasks.discard)
        t.add_done_callback(_retrieve)
        return t

    async def _begin(self, node: str, kind: str, who: str, why: str, now: float, reason: FenceReason | None,
                     rule: str, extra: list[Op], undo: Checkpoint | None = None) -> Pending:
        """Record the action as pending (durably) and only then carry it out."""
        assert self.writer is not None
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
        await self._execute(p)
        return p

    # ---- executing actions ---------------------------------------------------------------------

    def _lock(self, node: str) -> asyncio.Lock:
        return self._node_locks.setdefault(node, asyncio.Lock())

    def _target(self, fencer: Fencer, node: str) -> str:
        rec = self.mem.nodes.get(node) if self.mem else None
        if rec is None:
            return node
        if fencer.name == "slurm":
            return rec.slurm_name or node
        if fencer.name in ("kubernetes", "kube", "k8s"):
            return rec.k8s_name or node
        return node

    async def _call(self, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One fencer call under the retry policy: transient failures are retried with backoff."""
        r = self.cfg.retries
        delay = r.backoff
        for attempt in range(r.attempts):
            if not self.acting():  # a replica that stopped leading touches no fencer
                raise NotLeader(f"not leading: {what} not done")
            try:
                return await asyncio.wait_for(fn(), timeout=max(self.cfg.fencers.slurm.timeout,
                                                                 self.cfg.fencers.kubernetes.timeout) * 2)
            except asyncio.CancelledError:
                raise
            except ValueError as e:  # the fencer's own validation (a node name it refuses)
                raise PermanentError(f"{what}: {e}") from None
            except Exception as e:  # noqa: BLE001 - any fencer failure is retried, then left pending
                err = e
            if attempt + 1 < r.attempts:
                await asyncio.sleep(delay)
                delay = min(delay * 2, r.max_backoff)
        raise TransientError(f"{what}: {type(err).__name__}: {err}")

    async def _execute(self, p: Pending) -> None:
        async with self._lock(p.node), self._sem:
            try:
                run = {"fence": self._do_fence, "release": self._do_release, "handover": self._do_handover,
                       "reset_gpu": self._do_reset, "reboot": self._do_reboot, "repair": self._do_repair,
                       "evacuate": self._do_evacuate}.get(p.kind)
                if run is not None:
                    await run(p)
            except TransientError as e:
                if p.kind in LADDER_STEPS and p.attempts + 1 >= STEP_POSTPONEMENTS:
                    await self._step_failed(p, f"{e} (gave up after {p.attempts + 1} tries)")
                else:
                    await self._postpone(p, str(e))
            except NotLeader as e:
                log.warning("action left pending for the leader", id=p.id, node=p.node, kind=p.kind, why=str(e))
            except PermanentError as e:
                assert self.mem is not None
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
                await self._finish(p, "failed", str(e), ops)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a bug must not lose the pending record
                log.exception("action failed unexpectedly", id=p.id, node=p.node)
                await self._postpone(p, f"{type(e).__name__}: {e}")

    async def _postpone(self, p: Pending, error: str) -> None:
        now = self.clock()
        p.attempts += 1
        p.next_attempt = now + min(self.cfg.retries.max_backoff, self.cfg.retries.backoff * (2 ** min(p.attempts, 16)))
        log.warning("action still pending", id=p.id, node=p.node, kind=p.kind, error=error, attempts=p.attempts)
        self.metrics.actions.labels(p.kind, "retry").inc()
        await self.commit_journal(p.id, [Store.op_action_attempt(p.id, now, p.attempts, p.next_attempt, error),
                                   Store.op_audit(now, p.node, p.who, f"{p.kind} attempt failed", p.why, (), error,
                                                  False, p.id)])

    async def _finish(self, p: Pending, state: str, result: str, ops: list[Op]) -> None:
        now = self.clock()
        await self.commit_journal(p.id, ops + [Store.op_action_finish(p.id, state, now, result),
                                         Store.op_audit(now, p.node, p.who, f"{p.kind} {state}", p.why, (), result,
                                                        state != "failed", p.id)])
        self.pending.pop(p.id, None)
        if p.kind == "evacuate":
            self._evacuating.discard(p.node)
        p.result = {"id": p.id, "node": p.node, "kind": p.kind, "state": state, "result": result}
        p.done.set()
        self.metrics.actions.labels(p.kind, state).inc()
        log.info("action finished", id=p.id, node=p.node, kind=p.kind, state=state, result=result)
        self.poke()

    def _audit_outcome(self, p: Pending, fencer: Fencer, what: str, o: FenceOutcome) -> Op:
        return Store.op_audit(self.clock(), p.node, p.who, f"{what} via {fencer.name}", p.why, o.command,
                              o.output if o.ok else (o.error or o.output), o.ok, p.id)

    async def _read_all(self, node: str) -> list[tuple[Fencer, FenceState]]:
        out = []
        for f in self.fencers:
            target = self._target(f, node)
            st = await self._call(f"{f.name} read {target}", lambda f=f, t=target: f.read(t))  # type: ignore[misc]
            out.append((f, st))
        return out

    def _fence_plan(self, p: Pending, states: list[tuple[Fencer, FenceState]]
                    ) -> tuple[str, str, list[Op]] | list[tuple[Fencer, FenceState]]:
        """What to do with a fence once every fencer has been read: either finish it now
        (state, result, ops: unknown node, someone else's fence, an opt-out) or fence it on
        these fencers (the ones that know the node)."""
        mem = self.mem
        assert mem is not None
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
                    + [overrides.drain_event_op(self, p.node, f.name, st.reason, self.clock())])
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
        assert mem is not None and p.reason is not None
        now = self.clock()
        if changed:
            self.metrics.fences.labels(p.reason.check, p.reason.action).inc()
        mem.set_evacuated(p.node, "")  # a new fence: its jobs have not been looked at yet
        await self._finish(p, "done", "fenced" if changed else "was already fenced",
                           ops + mem.set_node(p.node, fence=FenceMode.FENCED, fenced_at=now, opted_out=False,
                                              handover="", handover_at=0.0) + self._flap_hold(p.node, now))
        if self.cfg.jobs.enabled:
            self._spawn(self._note_jobs(p.node, p.reason))
        if self.cfg.bundles.enabled and not self.cfg.dry_run:  # RMA evidence, beside the fence, never in its way
            self._spawn(bundles.fetch(self, p.node, p.id))

    def _flap_hold(self, node: str, now: float) -> list[Op]:
        """A node fenced again after flap_hold.cycles fence/release cycles within the window
        stays fenced for an operator: whatever ends its fences (a passed handover, someone
        resuming it in Slurm) and makes it fail again, another release would only start the
        next cycle. Every earlier fence in the window was ended, or this one would not be new."""
        mem = self.mem
        assert mem is not None
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
        plan = self._fence_plan(p, await self._read_all(p.node))
        if isinstance(plan, tuple):
            await self._finish(p, *plan)
            return
        ops: list[Op] = []
        changed = False
        for f, st in plan:
            if st.fenced and st.ours:
                ops.append(self._already_fenced(p, f, st))
                continue
            target = self._target(f, p.node)
            reason = p.reason
            o = await self._call(f"{f.name} fence {target}", lambda f=f, t=target: f.fence(t, reason))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "fence", o))
            if not o.ok:
                await self.commit(ops)
                raise TransientError(f"{f.name} fence {target}: {o.error or o.output}")
            changed = changed or o.changed
        await self._fenced(p, ops, changed)

    # ---- fencing many nodes at once ------------------------------------------------------------

    def _unrecorded(self, nodes: list[str], kind: str, e: Exception, undo: Checkpoint | None) -> OperatorError:
        """An action whose pending record could not be written: nothing is done, memory goes back."""
        assert self.mem is not None
        if undo is not None:
            self.mem.rollback(undo, nodes)
        self.metrics.actions.labels(kind, "unrecorded").inc()
        if isinstance(e, StaleEpoch) and self.leadership is not None:
            asyncio.ensure_future(self.leadership.depose(str(e)))
        if isinstance(e, (StaleEpoch, NotLeader)):
            log.warning("action not recorded: this replica does not lead", nodes=nodes[:20], kind=kind, why=str(e))
            return OperatorError(503, f"this aggregator does not lead ({e}); nothing was done")
        log.error("action not recorded: the state store cannot write; nothing done", nodes=nodes[:20],
                  count=len(nodes), kind=kind, error=str(e))
        return OperatorError(503, f"the state store cannot write ({e}); nothing was done")

    async def _begin_fences(self, starts: list[ActionStart], undo: Checkpoint | None = None) -> list[Pending]:
        """Record every fence as pending (one transaction) and only then carry them out together."""
        assert self.writer is not None
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
        (BatchFencer); whatever the batch cannot settle goes the single-node way (_execute)."""
        mine: list[Pending] = []
        single: list[Pending] = []
        for p in ps:
            lock = self._lock(p.node)
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
                    await self._postpone(p, f"{type(e).__name__}: {e}")
        finally:
            for p in mine:
                self._lock(p.node).release()
        for p in single:
            if p.id in self.pending and not p.done.is_set():
                self._spawn(self._execute(p))

    async def _fence_batch(self, ps: list[Pending]) -> list[Pending]:
        """The batched _do_fence; returns the actions left for the single-node path."""
        mem = self.mem
        assert mem is not None
        states: dict[int, list[tuple[Fencer, FenceState]]] = {p.id: [] for p in ps}
        left: dict[int, Pending] = {}
        try:
            for f in self.fencers:
                assert isinstance(f, BatchFencer)
                targets = {p.id: self._target(f, p.node) for p in ps if p.id not in left}
                names = sorted(set(targets.values()))
                got = await self._call(f"{f.name} read {len(names)} nodes",
                                       lambda f=f, names=names: f.read_many(names))  # type: ignore[misc]
                for p in ps:
                    st = got.get(targets[p.id]) if p.id in targets else None
                    if st is None:
                        left[p.id] = p
                    else:
                        states[p.id].append((f, st))
        except (TransientError, PermanentError):
            return ps  # each one then tries (and retries, and postpones) on its own, as always
        todo: dict[int, tuple[Pending, list[tuple[Fencer, FenceState]]]] = {}
        done: list[Awaitable[None]] = []
        for p in ps:
            if p.id in left:
                continue
            plan = self._fence_plan(p, states[p.id])
            if isinstance(plan, tuple):
                done.append(self._finish(p, *plan))
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
                    items[pid] = self._target(f, p.node)
            if not items:
                continue
            req = [(t, todo[pid][0].reason) for pid, t in items.items()]
            try:
                outcomes = await self._call(f"{f.name} fence {len(req)} nodes",
                                            lambda f=f, req=req: f.fence_many(req))  # type: ignore[misc]
            except (TransientError, PermanentError) as e:
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
            await asyncio.gather(*(self._postpone(p, error) for p, error in failed))
        await asyncio.gather(*(self._fenced(p, ops[pid], changed[pid]) for pid, (p, _) in todo.items()))
        return list(left.values())

    async def _do_release(self, p: Pending) -> None:
        mem = self.mem
        assert mem is not None
        states = await self._read_all(p.node)
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
            target = self._target(f, p.node)
            o = await self._call(f"{f.name} release {target}", lambda f=f, t=target: f.release(t))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "release", o))
            if not o.ok:
                await self.commit(ops)
                raise TransientError(f"{f.name} release {target}: {o.error or o.output}")
        mode = FenceMode.EXTERNAL if foreign else FenceMode.NONE
        if p.who.startswith("operator:"):
            mem.nodes[p.node].cycles.clear()  # an operator looked at it: the flap count starts afresh
        await self._finish(p, "done", "released" + (f" (still fenced by someone else in {foreign})" if foreign else ""),
                           ops + mem.set_node(p.node, fence=mode, fence_reason=foreign, hold=False, hold_reason="",
                                              handover="", handover_at=0.0, ladder="", ladder_at=0.0))
        mem.set_evacuated(p.node, "")

    async def _do_handover(self, p: Pending) -> None:
        mem = self.mem
        assert mem is not None and self._session is not None
        rec = mem.nodes[p.node]
        url = rec.agent_url.rstrip("/") + "/v1/handover"
        headers = {"Authorization": f"Bearer {self.cfg.auth.agent_token}"} if self.cfg.auth.agent_token else {}
        passed, detail = False, ""
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.handover_timeout)
            async with self._session.post(url, headers=headers, json={"reason": p.why}, timeout=timeout) as resp:
                body = await resp.text()
                detail = f"HTTP {resp.status}: {body[:2000]}"
                if resp.status == 200:
                    with contextlib.suppress(ValueError):
                        data = json.loads(body)
                        # The agent's suite passes on OK, and on WARN with exit code 0 ("PASS (with
                        # warnings)", checks/handover/report.py); FAIL and UNKNOWN (undecided) never release.
                        passed = isinstance(data, dict) and (
                            data.get("status") == "OK" or (data.get("status") == "WARN" and data.get("exit_code") == 0))
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            detail = f"unreachable: {type(e).__name__}: {e}"
        now = self.clock()
        state = "passed" if passed else "failed"
        ladder: list[Op] = []
        if rec.ladder == "verifying":  # the suite after a reset/reboot decides that attempt
            ladder = [Store.op_ladder_outcome(p.node, state, now)] + mem.set_node(p.node, ladder="", ladder_at=now)
            if not passed:
                mem.ladder_failed(p.node, now)
        await self._finish(p, "done" if passed else "failed", f"handover {state}: {detail}",
                           [Store.op_audit(now, p.node, p.who, "handover suite", p.why, ("POST", url), detail, passed,
                                           p.id)]
                           + mem.set_node(p.node, handover=state, handover_at=now) + ladder)
        if passed and rec.fence is FenceMode.FENCED:
            await self._release_after_handover(p.node, now)

    async def _release_after_handover(self, node: str, now: float) -> None:
        assert self.mem is not None
        extra = self.mem.set_node(node, fence=FenceMode.RELEASING)
        # Not awaited under this node's lock (we hold it): run as its own task.
        self._spawn(self._begin(node, "release", "podhealth", "handover suite passed", now, None, "", extra))

    # ---- the remediation ladder: reset, reboot, repair ------------------------------------------

    async def _step_failed(self, p: Pending, error: str) -> None:
        """A reset/reboot that could not be carried out: a failed attempt (the next rung, or REPAIR)."""
        mem = self.mem
        assert mem is not None
        now = self.clock()
        mem.ladder_failed(p.node, now)
        await self._finish(p, "failed", error, mem.set_node(p.node, ladder="", ladder_at=now))

    async def _step_done(self, p: Pending, result: str, ops: list[Op]) -> None:
        """Carried out: the node is verified by the handover suite within ladder.verify_within."""
        mem = self.mem
        assert mem is not None
        now = self.clock()
        await self._finish(p, "done", result, ops + [Store.op_action_outcome(p.id, "verifying", now)]
                           + mem.set_node(p.node, ladder="verifying", ladder_at=now, handover="", handover_at=0.0))

    async def _do_reset(self, p: Pending) -> None:
        """Ask the node's agent to reset one GPU (POST /v1/gpu-reset, the agent token). The agent
        refuses (409) while processes use the GPU: that is "later", not a failed attempt."""
        mem = self.mem
        assert mem is not None and self._session is not None
        rec = mem.nodes[p.node]
        gpu = gpu_index(p.rule or (p.reason.entity if p.reason else ""))
        if not rec.agent_url or gpu is None:
            raise PermanentError("no agent_url to ask for the reset" if gpu is not None
                                 else f"no single GPU to reset in {p.rule!r}")
        url = rec.agent_url.rstrip("/") + "/v1/gpu-reset"
        if self.cfg.dry_run:  # a dry run touches nothing, not even through the agent
            await self._step_done(p, f"would reset GPU {gpu} (dry run)", [Store.op_audit(
                self.clock(), p.node, p.who, "gpu reset via agent (dry run)", p.why, ("POST", url, f"gpu={gpu}"),
                "would reset (dry run)")])
            return
        headers = {"Authorization": f"Bearer {self.cfg.auth.agent_token}"} if self.cfg.auth.agent_token else {}
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.ladder.reset_timeout)
            async with self._session.post(url, headers=headers, json={"gpu": gpu, "reason": p.why},
                                          timeout=timeout) as resp:
                body, status = (await resp.text())[:2000], resp.status
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            raise TransientError(f"POST {url}: {type(e).__name__}: {e}") from None
        audit = Store.op_audit(self.clock(), p.node, p.who, "gpu reset via agent", p.why, ("POST", url, f"gpu={gpu}"),
                               f"HTTP {status}: {body}", status == 200, p.id)
        if status == 200:
            await self._step_done(p, f"GPU {gpu} reset: {body}", [audit])
            return
        await self.commit([audit])
        if status in (409, 503):  # processes use the GPU / the agent cannot tell yet: try later
            raise TransientError(f"agent: HTTP {status}: {body}")
        raise PermanentError(f"agent: HTTP {status}: {body}")

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
            target = self._target(f, node)
            jobs = await self._call(f"{f.name} jobs {target}", lambda f=f, t=target: f.jobs(t))  # type: ignore[misc]
            out.append((f, jobs))
        return out

    async def _note_jobs(self, node: str, reason: FenceReason) -> None:
        """Which jobs the fence hurts: the jobs/pods on the node, and those on the failing GPU,
        into the audit log and the node page (best effort: a backend that cannot say is logged)."""
        mem = self.mem
        assert mem is not None
        try:
            found = await self._list_jobs(node)
        except (TransientError, PermanentError) as e:
            log.warning("cannot list the jobs on a fenced node", node=node, error=str(e))
            return
        jobs = [j for _, js in found for j in js]
        gpu = gpu_index(reason.entity)
        hit = [j for j in jobs if gpu is not None and gpu in j.gpus]
        text = (f"on {reason.entity}: {', '.join(j.label() for j in hit)}; " if hit else "") + \
            f"on the node: {', '.join(j.label() for j in jobs) or 'none'}"
        rec = mem.nodes.get(node)
        if rec is not None:
            rec.jobs = tuple(j.to_json() for j in jobs)
        ops = [Store.op_audit(self.clock(), node, "podhealth", "jobs at the fence", f"{reason.check} {reason.entity}",
                              (), text)]
        for f, _ in found:  # the backend's own record where it has one (Kubernetes: an Event on the Node)
            announce = getattr(f, "announce_jobs", None)
            if announce is not None and jobs:
                note = await announce(self._target(f, node), f"{render_reason(reason)}: {text}")
                ops.append(Store.op_audit(self.clock(), node, "podhealth", f"jobs event via {f.name}",
                                          reason.check, (), note or "recorded", not note))
        await self.commit(ops)

    async def _do_evacuate(self, p: Pending) -> None:
        """Move the jobs off a node podhealth fenced (policy._evacuations): requeue (force) or the
        polite way. A Kubernetes eviction a PodDisruptionBudget refuses (429) is tried again later."""
        mem = self.mem
        assert mem is not None
        force = p.rule == "force"
        ops: list[Op] = []
        touched: list[Job] = []
        for f, jobs in await self._list_jobs(p.node):
            touched += jobs
            target = self._target(f, p.node)
            if self.cfg.dry_run:
                verb = "would requeue/evict" if force else "would leave to finish (Kubernetes: evict)"
                ops.append(Store.op_audit(self.clock(), p.node, p.who, f"evacuate via {f.name} (dry run)", p.why,
                                          (), f"{verb}: {', '.join(j.label() for j in jobs) or 'no jobs'}"))
                continue
            o = await self._call(f"{f.name} evacuate {target}",
                                 lambda f=f, t=target, js=jobs: f.evacuate(t, js, force))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "evacuate", o))
            if not o.ok:
                await self.commit(ops)
                if "429" in o.error or "disruption budget" in o.error.lower():
                    raise TransientError(f"{f.name}: {o.error}")
                raise PermanentError(f"{f.name} evacuate {target}: {o.error or o.output}")
        rec = mem.nodes.get(p.node)
        if rec is not None:
            rec.jobs = tuple(j.to_json() for j in touched)
        await self._finish(p, "done", f"{'forced' if force else 'polite'}: "
                           f"{', '.join(j.label() for j in touched) or 'no jobs'}",
                           ops)
        mem.set_evacuated(p.node, "forced" if force else "polite")

    def _remediators(self) -> list[Fencer]:
        return [f for f in self.fencers if isinstance(f, Remediator)]

    async def _do_reboot(self, p: Pending) -> None:
        """Reboot through each scheduler that knows the node (Slurm's RebootProgram, the Kubernetes
        reboot annotation); the node stays fenced until the handover suite passes."""
        assert p.reason is not None
        ops: list[Op] = []
        asked = 0
        for f, st in await self._read_all(p.node):
            if not isinstance(f, Remediator) or not st.exists:
                continue
            target = self._target(f, p.node)
            reason = p.reason
            o = await self._call(f"{f.name} reboot {target}", lambda f=f, t=target: f.reboot(t, reason))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "reboot", o))
            if not o.ok:
                await self.commit(ops)
                raise PermanentError(f"{f.name} reboot {target}: {o.error or o.output}")
            asked += 1
        if not asked:
            await self.commit(ops)
            raise PermanentError("no fencer that knows the node can reboot it")
        await self._step_done(p, f"reboot requested from {asked} scheduler(s)", ops)

    async def _do_repair(self, p: Pending) -> None:
        """Put the REPAIR reason on podhealth's fence in every backend (best effort: the hold and
        the repair queue are in the store either way)."""
        assert p.reason is not None
        ops: list[Op] = []
        for f, st in await self._read_all(p.node):
            if not isinstance(f, Remediator) or not (st.exists and st.fenced and st.ours):
                continue
            target = self._target(f, p.node)
            reason = p.reason
            o = await self._call(f"{f.name} remark {target}", lambda f=f, t=target: f.remark(t, reason))  # type: ignore[misc]
            ops.append(self._audit_outcome(p, f, "repair reason", o))
        await self._finish(p, "done", f"handed to repair: {render_reason(p.reason)}", ops)

    async def _orphan_steps(self, busy: set[str]) -> None:
        """A node left `acting` with no pending step (cannot happen through the store's
        transactions; an edited database) would hold its rung forever: it starts afresh."""
        mem = self.mem
        assert mem is not None
        ops: list[Op] = []
        for rec in list(mem.nodes.values()):
            if rec.ladder == "acting" and rec.name not in busy and not any(p.node == rec.name for p in self.pending.values()):
                ops += mem.set_node(rec.name, ladder="", ladder_at=0.0)
        if ops:
            await self.commit(ops)

    def repairs_json(self) -> list[dict[str, Any]]:
        """The repair queue: nodes the ladder handed to a human, oldest first."""
        mem = self.mem
        assert mem is not None and self.store is not None
        out = []
        for rec in sorted((r for r in mem.nodes.values() if r.ladder == "repair"), key=lambda r: (r.ladder_at, r.name)):
            out.append({"node": rec.name, "since": rec.ladder_at, "reason": rec.fence_reason,
                        "hold_reason": rec.hold_reason, "partition": rec.partition,
                        "attempts": self.store.ladder_attempts(rec.name)})
        return out

    # ---- restart: pending actions, then reconcile ------------------------------------------------

    async def _recover(self, pending: list[Pending]) -> None:
        mem = self.mem
        assert mem is not None
        for p in pending:
            self.pending[p.id] = p
            if p.node not in mem.nodes:
                await self._finish(p, "failed", "node no longer known", [])
                continue
            if p.kind == "handover":
                # The agent's answer died with the previous process; ask again soon.
                await self._finish(p, "failed", "interrupted by a restart",
                                   mem.set_node(p.node, handover="", handover_at=0.0))
                continue
            log.info("completing pending action", id=p.id, node=p.node, kind=p.kind)
            await self._execute(p)

    async def reconcile(self, initial: bool = False) -> list[str]:
        """Compare the store with every fencer's list of fenced nodes; report and fix.

        At start the store wins where podhealth owns the fence: our fence missing in a backend is
        made again, and our mark on a node the store says is free is removed (unless the store has
        never heard of the node: then it is adopted, since a fresh database cannot overrule the
        cluster). Fences that are not ours are only recorded (`drained`), never touched.
        """
        mem = self.mem
        assert mem is not None
        lines: list[str] = []
        busy = {p.node for p in self.pending.values()}
        listed: dict[str, list[tuple[Fencer, FenceState]]] = {}
        for f in self.fencers:
            try:
                fenced = await self._call(f"{f.name} list", f.list_fenced)
            except TransientError as e:
                lines.append(f"{f.name}: cannot list fenced nodes ({e}); reconcile skipped for it")
                continue
            back = {self._target(f, n): n for n in mem.nodes}
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
                    ops.append(overrides.drain_event_op(self, node, foreign[0][0].name, foreign[0][1].reason, now))
                    lines.append(f"{node}: fenced by someone else in {foreign[0][0].name}: recorded as drained")
                mem.vouch(node)  # a fencer's backend knows it: part of the fleet the breaker counts
                continue
            mem.vouch(node)
            if foreign and not rec.fence.ours and rec.fence is not FenceMode.EXTERNAL:
                ops += mem.set_node(node, fence=FenceMode.EXTERNAL, fence_reason=foreign[0][1].reason)
                ops.append(overrides.drain_event_op(self, node, foreign[0][0].name, foreign[0][1].reason, now))
                lines.append(f"{node}: fenced by someone else in {foreign[0][0].name} ({foreign[0][1].reason}): "
                             "recorded as drained")
            elif foreign and rec.fence.ours and not ours:
                ops += mem.set_node(node, fence=FenceMode.EXTERNAL, fence_reason=foreign[0][1].reason, hold=False,
                                    hold_reason="")
                ops.append(overrides.drain_event_op(self, node, foreign[0][0].name, foreign[0][1].reason, now))
                lines.append(f"{node}: podhealth's fence was replaced by someone else's ({foreign[0][1].reason}): "
                             "now theirs")
            elif ours and rec.fence is FenceMode.NONE:
                if initial and not self.cfg.dry_run:
                    lines.append(f"{node}: fenced by podhealth in {ours[0][0].name} but free in the store: releasing")
                    self._spawn(self._begin(node, "release", "reconcile", "store says not fenced", now, None, "",
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
            elif rec.fence is FenceMode.FENCED and self.fencers:
                if initial:
                    reason = _reason_from_text(rec.fence_reason, node)
                    lines.append(f"{node}: fenced in the store but not in any backend: fencing again")
                    self._spawn(self._begin(node, "fence", "reconcile", "store says fenced", now, reason, "",
                                            mem.set_node(node, fence=FenceMode.FENCING)))
                else:
                    ops += mem.set_node(node, fence=FenceMode.NONE, fence_reason="", hold=False, hold_reason="")
                    lines.append(f"{node}: podhealth's fence was removed by someone else: recorded as free")
        for line in lines:
            log.warning("reconcile", detail=line)
            ops.append(Store.op_audit(now, line.split(":", 1)[0], "reconcile", "reconcile", line))
        if ops:
            await self.commit(ops)
        self.reconcile_report = lines
        return lines

    async def _refresh_opt_outs(self) -> None:
        """A backend opt-out (a label) can be lifted: look again at the nodes we remember as opted out."""
        mem = self.mem
        assert mem is not None
        for rec in [r for r in mem.nodes.values() if r.opted_out]:
            try:
                states = await self._read_all(rec.name)
            except TransientError:
                continue
            if not any(st.opted_out for _, st in states if st.exists):
                await self.commit(mem.set_node(rec.name, opted_out=False))
                log.info("backend opt-out lifted", node=rec.name)

    # ---- pulling agents --------------------------------------------------------------------------

    async def _pull_loop(self) -> None:
        sem = asyncio.Semaphore(self.cfg.pull_concurrency)
        while self._running:
            started = self.mono()
            mem = self.mem
            assert mem is not None
            targets = [r.name for r in mem.nodes.values() if r.agent_url]
            if targets:
                await asyncio.gather(*(self._pull_one(n, sem) for n in targets), return_exceptions=True)
            await asyncio.sleep(max(0.05, self.cfg.pull_interval - (self.mono() - started)))

    async def _pull_one(self, node: str, sem: asyncio.Semaphore) -> None:
        mem = self.mem
        assert mem is not None and self._session is not None
        rec = mem.nodes.get(node)
        if rec is None or not rec.agent_url:
            return
        url = rec.agent_url.rstrip("/") + "/health"
        headers = {"Authorization": f"Bearer {self.cfg.auth.agent_token}"} if self.cfg.auth.agent_token else {}
        async with sem:
            try:
                timeout = aiohttp.ClientTimeout(total=self.cfg.pull_timeout)
                async with self._session.get(url, headers=headers, timeout=timeout) as resp:
                    raw = await resp.read()
                    status = resp.status
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                self.metrics.pulls.labels("unreachable").inc()
                now = self.clock()
                await self.commit(mem.mark_unreachable(node, now, self.cfg.unreachable_after,
                                                       f"GET /health: {type(e).__name__} {e}"))
                self.poke()
                return
        now = self.clock()
        try:
            if status not in (200, 503):
                raise ingest.BadRequest(f"HTTP {status}")
            # The configured name wins over what the agent calls itself.
            rep = ingest.read_report(raw, node=node)
        except ingest.BadRequest as e:
            self.metrics.pulls.labels("bad").inc()
            await self.commit(mem.mark_unreachable(node, now, self.cfg.unreachable_after, f"bad /health: {e}"))
            return
        self.metrics.pulls.labels("ok").inc()
        _, ops = ingest.apply_report(mem, rep, now)
        if ops:
            await self.commit(ops)
            self.poke()

    # ---- housekeeping ----------------------------------------------------------------------------

    def silence_ops(self, now: float) -> list[Op]:
        """Push-only nodes go missing by silence: UNKNOWN once a node has sent nothing for 2.5
        heartbeat intervals (one late heartbeat is not news), node_unreachable after
        unreachable_after. Silence is counted from this process's start at the earliest: after
        a restart, nodes get their intervals to report before they are called missing."""
        mem = self.mem
        assert mem is not None
        silent_after = min(2.5 * self.cfg.heartbeat_interval, self.cfg.unreachable_after)
        ops: list[Op] = []
        for rec in list(mem.nodes.values()):
            if not rec.agent_url and rec.last_seen:
                heard = max(rec.last_seen, self.started_at)
                if now - heard >= silent_after:
                    ops += mem.mark_unreachable(rec.name, now, self.cfg.unreachable_after,
                                                f"silent for {now - rec.last_seen:.0f}s", since=heard)
            elif rec.agent_url and rec.unreachable_since is not None:
                ops += mem.mark_unreachable(rec.name, now, self.cfg.unreachable_after, "still unreachable")
        return ops

    def forget_ops(self, now: float) -> list[Op]:
        """Learned nodes that stopped reporting are forgotten after forget_learned_after (a node
        renamed or retired, or a name that only ever arrived once), so they stay off the UI and
        out of the fleet; one that reports again is learned again."""
        mem = self.mem
        assert mem is not None
        after = self.cfg.forget_learned_after
        if not after:
            return []
        ops: list[Op] = []
        for name in mem.forget_stale_learned(now, after, busy={p.node for p in self.pending.values()}):
            log.info("forgot a learned node that stopped reporting", node=name, after=after)
            ops += Store.ops_node_forget(name)
            ops.append(Store.op_audit(now, name, "podhealth", "forget", f"learned node silent for {after:g}s"))
        return ops

    def fleet_sample_ops(self, now: float) -> list[Op]:
        """One row of the fleet chart (node counts by state now) and the pruning that keeps the
        table bounded: ui.history_retention / ui.history_interval rows at most."""
        assert self.mem is not None
        return [Store.op_fleet_sample(now, self.mem.counts()),
                Store.op_prune_fleet_samples(now - self.cfg.ui.history_retention)]

    async def _housekeeping_loop(self) -> None:
        last_reconcile = self.mono()
        last_prune = float("-inf")
        last_sample = self.mono()  # start() took the first sample
        while self._running:
            await asyncio.sleep(self.housekeeping_interval)
            mem, writer = self.mem, self.writer
            assert mem is not None and writer is not None
            now = self.clock()
            try:
                writer.write_nowait(mem.flush_seen())
                if not self.acting() or not self._acting_tasks:
                    # a follower only ingests: the rest is the leader's, once its takeover has
                    # loaded the shared state (a follower's own memory is not the fleet's)
                    continue
                ops: list[Op] = self.silence_ops(now) + self.forget_ops(now) + overrides.expire_ops(self, now)
                if self.mono() - last_prune > 3600:
                    ops += mem.prune_ids(now - self.cfg.event_retention)
                    last_prune = self.mono()
                if self.mono() - last_sample >= self.cfg.ui.history_interval:
                    writer.write_nowait(self.fleet_sample_ops(now))
                    last_sample = self.mono()
                if ops:
                    writer.write_nowait(ops)
                    self.poke()
                for p in list(self.pending.values()):
                    # A retry time further off than the longest backoff means the wall clock
                    # stepped back since it was set: due now, not in an hour.
                    due = p.next_attempt <= now or p.next_attempt - now > self.cfg.retries.max_backoff
                    if p.next_attempt and due and not self._lock(p.node).locked():
                        self._spawn(self._execute(p))
                if self.mono() - last_reconcile >= self.reconcile_interval:
                    last_reconcile = self.mono()
                    await self.reconcile()
                    await self._refresh_opt_outs()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep the loop alive; the failure is logged
                log.exception("housekeeping failed")

    # ---- operator actions ------------------------------------------------------------------------

    def _require_leader(self) -> None:
        if not self.acting() or not self._acting_tasks:  # not leading, or its takeover is not done
            lead = self.leadership.lease.seen.get("holder", "unknown") if self.leadership else "unknown"
            raise OperatorError(503, f"this aggregator is a follower; ask the leader ({lead})")

    async def operator_fence(self, node: str, reason: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self._require_leader()
        mem = self.mem
        assert mem is not None
        rec = mem.nodes.get(node)
        if rec is None:
            raise OperatorError(404, f"unknown node {node}")
        if node in self.policy.opt_out:
            raise OperatorError(409, f"{node} is in opt_out: podhealth never fences it")
        if rec.fence.ours:
            return {"node": node, "state": "unchanged", "result": f"already {rec.fence.value} by podhealth"}
        if rec.fence is FenceMode.EXTERNAL:
            return {"node": node, "state": "unchanged", "result": f"already fenced by someone else: {rec.fence_reason}"}
        now = self.clock()
        fr = FenceReason(check="operator", entity="node", action="DRAIN", id=_slug(who))
        undo = mem.checkpoint(node)
        mem.recent_fences.append(self.mono())
        extra = mem.set_node(node, fence=FenceMode.FENCING, fence_reason=render_reason(fr), hold=True,
                             hold_reason="fenced by an operator")
        t = self._spawn(self._begin(node, "fence", f"operator:{who}", reason, now, fr, "operator", extra, undo))
        return await self._await_action(t, wait)

    async def operator_release(self, node: str, reason: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self._require_leader()
        mem = self.mem
        assert mem is not None
        rec = mem.nodes.get(node)
        if rec is None:
            raise OperatorError(404, f"unknown node {node}")
        if rec.fence is FenceMode.EXTERNAL:
            raise OperatorError(409, f"{node} is fenced by someone else ({rec.fence_reason}); "
                                "podhealth only releases its own fences")
        if rec.fence is FenceMode.NONE:
            return {"node": node, "state": "unchanged", "result": "not fenced"}
        if rec.fence is not FenceMode.FENCED:
            raise OperatorError(409, f"{node} has a {rec.fence.value} action in flight; try again")
        now = self.clock()
        # The operator has seen what is open now: only a failure that starts later fences again.
        undo = mem.checkpoint(node)
        extra = mem.set_node(node, fence=FenceMode.RELEASING, released_at=now)
        t = self._spawn(self._begin(node, "release", f"operator:{who}", reason, now, None, "operator", extra, undo))
        return await self._await_action(t, wait)

    async def operator_handover(self, node: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self._require_leader()
        mem = self.mem
        assert mem is not None
        rec = mem.nodes.get(node)
        if rec is None:
            raise OperatorError(404, f"unknown node {node}")
        if not rec.agent_url:
            raise OperatorError(409, f"{node} has no agent_url to run the handover suite on")
        if rec.handover == "running":
            raise OperatorError(409, f"a handover of {node} is already running")
        now = self.clock()
        undo = mem.checkpoint(node)
        extra = mem.set_node(node, handover="running", handover_at=now)
        t = self._spawn(self._begin(node, "handover", f"operator:{who}", "operator asked", now, None, "", extra,
                                    undo))
        return await self._await_action(t, wait)

    async def reset_order(self, node: str, who: str, reason: str) -> dict[str, Any]:
        """Forget the order of a node's records (a forged or runaway seq left its real reports
        stale): its next record starts afresh. Audited."""
        mem = self.mem
        assert mem is not None
        rec = mem.nodes.get(node)
        if rec is None:
            raise OperatorError(404, f"unknown node {node}")
        now = self.clock()
        was = {"boot_id": rec.boot_id, "seq": rec.report_seq, "retired_boots": list(rec.retired),
               "clock_ahead": rec.clock_ahead}
        ops = mem.reset_order(node)
        ops.append(Store.op_audit(now, node, f"operator:{who}", "order reset", reason or "operator reset", (),
                                  json.dumps(was)))
        await self.commit(ops)
        log.warning("node ordering reset; its next record starts afresh", node=node, who=who, was=was)
        return {"node": node, "reset_at": now, "was": was}

    async def breaker_reset(self, who: str, reason: str) -> dict[str, Any]:
        self._require_leader()
        mem = self.mem
        assert mem is not None
        now = self.clock()
        was = mem.breaker
        ops = mem.set_breaker(BreakerState(tripped=False, tripped_at=0.0, reset_at=now))
        ops.append(Store.op_audit(now, "*", f"operator:{who}", "breaker reset", reason or "operator reset",
                                  (), f"was tripped: {was.tripped} ({was.reason})"))
        await self.commit(ops)
        log.warning("circuit breaker reset; observations before now must be seen again", who=who)
        self.poke()
        return {"tripped": False, "reset_at": now, "was_tripped": was.tripped, "was_reason": was.reason}

    async def _await_action(self, t: "asyncio.Task[Any]", wait: float) -> dict[str, Any]:
        try:
            p: Pending = await asyncio.wait_for(asyncio.shield(t), wait)
        except asyncio.TimeoutError:
            return {"state": "pending", "result": "still running; see the node's history"}
        if p.done.is_set():
            return p.result
        return {"id": p.id, "node": p.node, "kind": p.kind, "state": "pending", "result": "will be retried"}

    # ---- views for the API -----------------------------------------------------------------------

    def fleet_json(self) -> dict[str, Any]:
        mem = self.mem
        assert mem is not None
        now = self.clock()
        partitions: dict[str, dict[str, int]] = {}
        for rec in mem.nodes.values():
            p = partitions.setdefault(rec.partition, {"nodes": 0, "fenced": 0})
            p["nodes"] += 1
            if rec.fence is not FenceMode.NONE:
                p["fenced"] += 1
        for p in partitions.values():
            p["limit"] = partition_limit(p["nodes"], self.cfg.caps.max_percent_per_partition)
        b = mem.breaker
        return {
            "time": now,
            "nodes": len(mem.nodes),
            "counts": mem.counts(),
            "breaker": {"tripped": b.tripped, "tripped_at": b.tripped_at, "reset_at": b.reset_at, "reason": b.reason},
            "fence_budget": {"used": sum(1 for r in mem.nodes.values() if r.fence.ours),
                             "limit": self.cfg.caps.max_fenced},
            "rate_limit": {"used": sum(1 for t in mem.recent_fences if self.mono() - RATE_WINDOW < t),
                           "limit": self.cfg.rate_limit.fences_per_minute},
            "partitions": partitions,
            "replica": self.replica_json(),
            "pending_actions": len(self.pending),
            "dry_run": self.cfg.dry_run,
            "manual_release": self.cfg.manual_release,
            "fencers": [f.name for f in self.fencers],
            "last_decision": {"time": self.last_decision_at,
                              "notes": [{"kind": n.kind, "node": n.node, "detail": n.detail}
                                        for n in self.last_decision.notes[:200]]},
        }

    def replica_json(self) -> dict[str, Any]:
        """Who leads: this process alone (SQLite), or which replica of those on PostgreSQL, since
        when, and how old this replica's view of the lease is."""
        info = self.lease_info
        lead = self.leadership
        if lead is None:
            return {"role": "single", "epoch": info.epoch if info else 0, "holder": info.holder if info else "",
                    "leader": info.holder if info else "", "since": info.since if info else 0.0}
        seen = lead.lease.seen
        return {"role": "leader" if lead.acting() else "follower", "epoch": int(seen.get("epoch", 0) or 0),
                "holder": lead.lease.holder, "leader": str(seen.get("holder", "")),
                "since": float(seen.get("since", 0) or 0), "expires": float(seen.get("expires", 0) or 0),
                "renewed_ago": round(self.mono() - lead.last_renewal, 3) if lead.info is not None else None,
                "lease": lead.duration, "error": lead.error}

    def node_json(self, name: str) -> dict[str, Any] | None:
        mem = self.mem
        assert mem is not None
        rec = mem.nodes.get(name)
        if rec is None:
            return None
        out = rec.to_json()
        out["conditions"] = [c.to_json() for c in mem.conditions_of(name)]
        out["pending_actions"] = [{"id": p.id, "kind": p.kind, "who": p.who, "why": p.why, "attempts": p.attempts,
                                   "reason": reason_to_json(p.reason)}
                                  for p in self.pending.values() if p.node == name]
        out["notes"] = [{"kind": n.kind, "detail": n.detail} for n in self.last_decision.notes if n.node == name]
        out["silences"] = overrides.of_node(self.silences, name, self.clock())
        return out

    def status_of(self, name: str) -> Status | None:
        rec = self.mem.nodes.get(name) if self.mem else None
        return rec.status if rec else None


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


def _slug(text: str) -> str:
    return "".join(ch for ch in text if ch.isalnum() or ch in "-_.")[:16] or "operator"


def _reason_from_text(text: str, node: str) -> FenceReason:
    """Rebuild a FenceReason from a stored `podhealth: check entity action [id]` line."""
    parts = text.removeprefix("podhealth:").strip().split()
    if len(parts) >= 4 and parts[-1].startswith("[") and parts[-1].endswith("]"):
        return FenceReason(check=parts[0], entity=parts[1], action=parts[2], id=parts[-1][1:-1])
    return FenceReason(check="reconcile", entity="node", action="DRAIN", id=_slug(node))
