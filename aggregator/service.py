"""The aggregator's lifecycle and wiring: open the store, build the parts, run the loops.

The parts, each its own module (none imports this one):
- actions/     ActionRunner: journal first, then fences/releases/handovers/ladder steps; the one retrier
- reconcile.py Reconciler: restart recovery of the journal, reconcile with the fencers, opt-outs
- liveness.py  Liveness: agent pull, silence -> UNKNOWN -> unreachable
- views.py     the JSON the API and the UI show
This module opens everything before anything uses it (`await Aggregator.open(cfg)`), runs the
decide loop (decide() is pure: aggregator/policy.py), housekeeping and, on PostgreSQL, the
leadership of replicas, and takes operators' commands.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import gc
import json
import math
import secrets
import time
from typing import Any, Callable, Sequence

import aiohttp

from podhealth import log as plog

from podhealth.aggregator import bundles, overrides, views
from podhealth.aggregator.context import Context
from podhealth.aggregator.actions import ActionRunner, NotLeader, OperatorError, Pending, slug
from podhealth.fencing.build import build_fencers
from podhealth.config_aggregator import AggregatorConfig
from podhealth.config_tls import AgentTlsConfig
from podhealth.fencing.fence import FenceReason, Fencer, render_reason
from podhealth.aggregator.gcwatch import Freezer
from podhealth.aggregator.lifecycle import Kind, Outcome, settle
from podhealth.aggregator.liveness import Liveness
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.model import LADDER_STEPS, BreakerState, Decision, FenceMode, FleetState, Silence
from podhealth.aggregator.policy import Policy, decide
from podhealth.aggregator.dbclock import DbClock
from podhealth.aggregator.quota import NodeQuota
from podhealth.tls import ClientTls, ServerTls, Watch
from podhealth.aggregator.leader import Leadership
from podhealth.aggregator.lease import FileLease, LeaseInfo, PgLease, holder_name
from podhealth.aggregator.reconcile import Reconciler
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import (
    ActionRow, Loaded, Op, Store, StoreError, db_errors, is_postgres_url, sqlite_path,
)
from podhealth.aggregator.writer import Writer
from podhealth.looplag import probe
from podhealth.worker import offload

__all__ = ["Aggregator", "NotLeader", "OperatorError", "Pending", "build_fencers"]

log = plog.get("podhealth.aggregator")
RECONCILE_INTERVAL = 60.0
HOUSEKEEPING_INTERVAL = 5.0
MIN_DECIDE_GAP = 0.05
SYNC_INTERVAL = 1.0  # seconds between the leader's reads of the other replicas' ingest
SYNC_MARGIN = 15.0
QUOTA_SYNC_S = 600.0  # seconds between re-reads of each node's stored event bytes (retention frees room)
FORGET_EVERY = 600.0  # seconds between forget scans (forget_learned_after is days)


def load_memory(cfg: AggregatorConfig, loaded: Loaded, cycles: list[tuple[str, float, str, str]], now: float,
                mono: Callable[[], float]) -> Memory:
    """The in-memory mirror from what the store holds (at start, and at a takeover)."""
    mem = Memory.from_loaded(loaded)
    mem.max_skew = cfg.max_clock_skew
    mem.report_refresh = cfg.report_refresh
    # The rate limit's recent fences, stored as wall times, move onto the monotonic clock.
    m0 = mono()
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


async def _open_sqlite(cfg: AggregatorConfig, url: str, now: float) -> tuple[Store, Loaded, FileLease, LeaseInfo]:
    """Take the store's lease, open (migrate) and load it. Any failure (another aggregator
    holds it; corrupt, locked or read-only) is one StoreError line, and nothing is left held."""
    db = sqlite_path(url)
    lease = FileLease(db)
    store: Store | None = None
    try:
        await offload(db.parent.mkdir, parents=True, exist_ok=True)
        # The lock before the open: a second aggregator must not even migrate the schema.
        await offload(lease.lock, now)
        store = opened = await offload(Store, db)
        # The epoch is a write: a read-only or locked file says so now, not at the first report.
        info = await offload(lease.acquire, opened, now)
        loaded = await offload(opened.load, now, cfg.event_retention)
    except BaseException as e:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        lease.release()
        if isinstance(e, StoreError):
            raise
        if isinstance(e, (*db_errors(), OSError)):
            raise StoreError(f"{db}: {getattr(e, 'strerror', None) or e}") from None
        raise
    log.info("store lease taken", db=str(db), epoch=info.epoch, holder=info.holder)
    return opened, loaded, lease, info


async def _open_replica(cfg: AggregatorConfig, url: str, now: float) -> tuple[Store, Loaded]:
    """A replica on PostgreSQL: open (migrate) and load; leadership is taken by its loop."""
    store: Store | None = None
    try:
        store = opened = await offload(Store, url)
        loaded = await offload(opened.load, now, cfg.event_retention)
    except BaseException as e:
        if store is not None:
            with contextlib.suppress(Exception):
                store.close()
        if isinstance(e, StoreError):
            raise
        if isinstance(e, db_errors()):
            raise StoreError(f"{store.where if store is not None else url}: {e}") from None
        raise
    return opened, loaded


async def _db_clock(url: str, fallback: Callable[[], float], mono: Callable[[], float]) -> DbClock:
    """A replica's clock, anchored on one reading of the database's clock (the wall clock only
    if the database cannot be read now: the open that follows then says why)."""
    clock = DbClock(fallback, mono)
    conn: Any = None
    try:
        from podhealth.aggregator import pgstore  # absent without the extra: the store's open says so
        conn = await offload(pgstore.connect, url)
        sent = mono()
        row = await offload(lambda: conn.execute("SELECT EXTRACT(EPOCH FROM clock_timestamp())").fetchone())
        clock.sample(float(row[0]), sent, mono())
    except Exception as e:  # noqa: BLE001 - the store's open reports the database's problem
        log.warning("cannot read the database's clock yet; the lease calls will", error=str(e))
    finally:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
    return clock


class Aggregator:
    """Built by `open()`: everything it holds exists from the start, nothing is Optional."""

    def __init__(self, cfg: AggregatorConfig, fencers: Sequence[Fencer], store: Store, writer: Writer, mem: Memory,
                 silences: dict[tuple[str, str], Silence], session: aiohttp.ClientSession, lease: FileLease,
                 lease_info: LeaseInfo | None, loaded_pending: Sequence[ActionRow], *, clock: Callable[[], float],
                 mono: Callable[[], float], started_at: float) -> None:
        """Use `await Aggregator.open(cfg)`; `lease_info` None: a PostgreSQL replica, which leads
        (and gets its epoch) only once its Leadership loop wins the lease."""
        self.cfg = cfg
        self.clock = clock  # wall time: what is stored and shown
        # Intervals (the decide and pull loops, the rate limit, cool-downs) are measured on a
        # monotonic clock, so an NTP step back of the wall clock cannot stall or unthrottle them.
        self.mono = mono
        self.policy = Policy.from_config(cfg)
        self.fencers = list(fencers)
        self.metrics = Metrics()
        self.store = store
        # What one node may push (rate, stored bytes): server.py asks before applying.
        self.quota = NodeQuota(cfg.node_ingest, mono)
        # HTTPS on the listener (serve.py), its files re-read on SIGHUP or change (core/tls.py).
        self.tls: ServerTls | None = ServerTls(cfg.tls) if cfg.tls.enabled else None
        self.tls_watch = Watch([self.tls] if self.tls is not None else [])
        self.writer = writer
        self.session = session
        self.lease = lease
        self.lease_info = lease_info
        self.started_at = started_at
        # operators' silences, (node, check) -> Silence: an input of decide() (aggregator/overrides.py)
        self.silences = silences
        self._loaded_pending = list(loaded_pending)
        # PostgreSQL replicas: which one acts (None on SQLite, where the file lease is exclusive)
        self.leadership: Leadership | None = None
        if lease_info is None:
            # A token of its own: two replicas may share a host, a port in config, even a pid (containers)
            holder = f"{holder_name()} port {cfg.listen.port} #{secrets.token_hex(3)}"
            self.leadership = Leadership(PgLease(cfg.store_url(), holder, cfg.store.lease), self._elected,
                                         self._deposed, mono, clock if isinstance(clock, DbClock) else None)
        else:
            self.metrics.lease_epoch.set(lease_info.epoch)
        self.last_decision = Decision()
        self.last_decision_at = 0.0
        self.wake = asyncio.Event()
        self.urgent = asyncio.Event()  # a new actionable FAIL: the decide loop's gap ends at once
        self._actionable_seen = mem.actionable
        self._notified = mem.actionable  # a follower's count when its last NOTIFY went out
        self.sync_wake = asyncio.Event()  # the leader's read-back: now, not at the next interval
        self.listener: Any = None  # the leader's pgnotify.Listener while it leads (tests look)
        self.housekeeping_interval = HOUSEKEEPING_INTERVAL
        self.freezer = Freezer(cfg.gc_freeze, self.metrics.observe_gc)
        self.metrics.gc_frozen.set_function(gc.get_freeze_count)
        self._last_forget = float("-inf")
        self.housekeeping_passes = 0  # finished passes (tests wait for one)
        self.reconcile_interval = RECONCILE_INTERVAL
        self._tasks: list[asyncio.Task[Any]] = []
        self._acting_tasks: list[asyncio.Task[Any]] = []
        self._running = False
        self._stopped = False
        self._mem = mem
        self._context = self._context_of(mem)
        self.evidence = bundles.Evidence(cfg, session, writer)
        self.actions = ActionRunner(
            cfg, self.fencers, self.context, writer, self.metrics, session, clock=clock, mono=mono, acting=self.acting,
            epoch=self.epoch, depose=self.leadership.depose if self.leadership is not None else None,
            poke=self.poke, evidence=lambda node, fence_id: bundles.fetch(self.evidence, self.context(), node, fence_id))
        self.reconciler = Reconciler(cfg, self.actions, clock)
        self.liveness = Liveness(cfg, self.context, self.metrics, session, self.commit, self.poke, clock=clock, mono=mono)
        self.metrics.add_fleet(lambda: self.mem, cfg.caps.max_fenced, lambda: len(self.pending),
                               lambda: views.held(self.last_decision))
        self.metrics.leader.set_function(lambda: 1.0 if self.acting() else 0.0)
        for f in self.fencers:
            if hasattr(f, "guard"):  # the real backends: no external call after the lease deadline
                f.guard = self.lease_left
        self.metrics.lease_age.set_function(
            lambda: self.mono() - self.leadership.last_look if self.leadership is not None else 0.0)

    @classmethod
    async def open(cls, cfg: AggregatorConfig, fencers: Sequence[Fencer] | None = None,
                   clock: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic
                   ) -> "Aggregator":
        """Open (and on SQLite lease) the store, load it into memory, start its writer and record
        the configured nodes: an aggregator ready to serve. Raises StoreError (nothing held then).
        `start()` then recovers the journal, reconciles and runs the loops."""
        fs = list(fencers) if fencers is not None else build_fencers(cfg)
        url = cfg.store_url()
        lease_info: LeaseInfo | None = None
        if is_postgres_url(url):
            # Replicas keep the database's time, not their own (aggregator/dbclock.py): read it
            # once before anything is loaded or stored; the lease calls keep it fresh.
            clock = await _db_clock(url, clock, mono)
            store, loaded = await _open_replica(cfg, url, clock())
            lease = FileLease(cfg.db)  # never locked: PostgreSQL replicas share the store
        else:
            store, loaded, lease, lease_info = await _open_sqlite(cfg, url, clock())
        now = clock()
        writer: Writer | None = None
        try:
            cycles = await offload(store.recent_cycles, now - cfg.flap_hold.window)  # writer not yet running
            mem = load_memory(cfg, loaded, cycles, now, mono)
            writer = Writer(store)
            writer.start()
            ops: list[Op] = []
            for n in cfg.nodes:
                ops += mem.configure_node(n.name, n.agent_url, n.slurm_name, n.k8s_name, n.partition, now)
            await writer.write(ops + fleet_sample_ops(cfg, mem, now))  # the fleet chart starts at the start
            silences = {(s.node, s.check): s for s in loaded.silences}
            # Agents asked over https:// (agent_url) are verified against tls.ca (else the system's
            # store) by the node name (core/agentclient.py); the aggregator's own certificate is
            # presented to an agent that asks for a client certificate (its tls.client_certs).
            agent_tls = ClientTls(AgentTlsConfig(ca=cfg.tls.ca, cert=cfg.tls.cert, key=cfg.tls.key)) \
                if cfg.tls.ca else None
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=agent_tls.context)) \
                if agent_tls is not None else aiohttp.ClientSession()
            try:
                agg = cls(cfg, fs, store, writer, mem, silences, session, lease, lease_info, loaded.pending,
                          clock=clock, mono=mono, started_at=now)
                if agent_tls is not None:  # re-read with the listener's files (one SIGHUP handler)
                    agg.tls_watch.items.append(agent_tls)
                return agg
            except BaseException:
                await session.close()
                raise
        except BaseException:
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.stop()
            with contextlib.suppress(Exception):
                store.close()
            lease.release()
            raise

    # ---- shared state ----------------------------------------------------------------------------

    @property
    def mem(self) -> Memory:
        return self._mem

    @mem.setter
    def mem(self, mem: Memory) -> None:
        """A takeover loads a new mirror and builds a new Context on it: every part that asks
        `context()` works on it from now on."""
        self._mem = mem
        self._context = self._context_of(mem)
        self._actionable_seen = self._notified = mem.actionable  # counts of the new mirror
        self.freezer.frozen_at_nodes = 0  # a large load: the next housekeeping pass freezes it

    def context(self) -> Context:
        """What the operator commands, bundles, the action runner and liveness need of the leader."""
        return self._context

    def _context_of(self, mem: Memory) -> Context:
        # The clock is read through self: a test (and DbClock's owner) may replace `clock` later.
        return Context(mem=mem, commit=self.commit, require_leader=self.require_leader, clock=lambda: self.clock(),
                       poke=self.poke, silences=self.silences, release=self.operator_release)

    @property
    def pending(self) -> dict[int, Pending]:
        return self.actions.pending

    @property
    def _action_tasks(self) -> set[asyncio.Task[Any]]:
        return self.actions.tasks

    @property
    def reconcile_report(self) -> list[str]:
        return self.reconciler.report

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        await self.sync_quota()
        self.tls_watch.start()
        fencer_names = ", ".join(f.name for f in self.fencers)
        log.info("aggregator starting", db=self.store.where, nodes=len(self.mem.nodes), fencers=fencer_names,
                 dry_run=self.cfg.dry_run, pending=len(self._loaded_pending), replica=self.leadership is not None)
        pending, self._loaded_pending = self._loaded_pending, []
        self.freezer.install()
        lag = asyncio.create_task(probe(self.metrics.observe_lag), name="loop-lag")
        if self.leadership is None:
            await self._start_acting(pending)
            self._tasks = [lag, asyncio.create_task(self._housekeeping_loop(), name="housekeeping")]
        else:
            # A replica: ingest and serve now; decide and act only once it leads.
            lead = self.leadership
            self._tasks = [lag, asyncio.create_task(self._housekeeping_loop(), name="housekeeping"),
                           asyncio.create_task(lead.run(lambda: self._running), name="leadership")]

    async def _start_acting(self, pending: Sequence[ActionRow]) -> None:
        """Finish or roll back the journal's pending actions, reconcile with the fencers, then
        decide and act: at start (SQLite), or when this replica takes the lead (PostgreSQL)."""
        await self.reconciler.recover([Pending.of(r) for r in pending])
        await self.reconciler.orphan_steps({r.node for r in pending})
        await self.reconcile(initial=True)
        self._acting_tasks = [asyncio.create_task(self._decide_loop(), name="decide"),
                              asyncio.create_task(self.liveness.pull_loop(lambda: self._running), name="pull")]
        if self.leadership is not None:
            self._acting_tasks.append(asyncio.create_task(self._sync_loop(), name="sync"))
            self._acting_tasks.append(asyncio.create_task(self._listen(), name="listen"))

    async def _listen(self) -> None:
        """The leader's LISTEN for followers' FAILs (aggregator/pgnotify.py): wakes the sync."""
        from podhealth.aggregator.pgnotify import Listener  # PostgreSQL replicas only (the extra)

        self.listener = Listener(self.cfg.store_url(), self.sync_wake.set, self.cfg.retries)
        await self.listener.run(lambda: self._running and self.acting())

    async def _sync_loop(self) -> None:
        """The leader takes in what the other replicas ingested (they write it to the shared
        store; only the leader decides): every node row written since its last read by commit
        order (the previous read's snapshot: a commit that lands late is read when it lands),
        and by time a window that reaches back SYNC_MARGIN on the replicas' one clock (the
        database's, aggregator/dbclock.py)."""
        cursor, snapshot = self.clock() - SYNC_MARGIN, ""
        while self._running:
            # the interval, or at once when a follower committed a FAIL (its NOTIFY, pgnotify.py)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.sync_wake.wait(), SYNC_INTERVAL)
            self.sync_wake.clear()
            mem = self.mem
            started = self.clock()
            try:
                # the time window, and (PostgreSQL) every row whose commit the last read did not see
                rows, conds, snapshot = await offload(self.store.observed_after, cursor, snapshot)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - the next round tries again; the lease decides who acts
                log.warning("cannot read the other replicas' ingest", error=str(e))
                continue
            if self.mem is mem and mem.adopt(rows, conds):
                self.poke()
            cursor = started - SYNC_MARGIN

    def acting(self) -> bool:
        """May this process decide and act now? Always on SQLite; on PostgreSQL while it leads."""
        return self.leadership is None or self.leadership.acting()

    def lease_left(self) -> float:
        """Seconds this process may still act, on the monotonic clock (inf on SQLite: the file
        lease is held for the life of the process); <= 0 once a replica stopped leading."""
        if self.leadership is None:
            return math.inf
        return self.leadership.valid_until - self.mono()

    def epoch(self) -> int | None:
        """The fencing token journal writes carry (None while a replica does not lead)."""
        return self.lease_info.epoch if self.lease_info is not None else None

    async def _elected(self, info: LeaseInfo) -> None:
        """This replica leads: reload the mirror from the store (the other replicas' ingest, the
        previous leader's journal), then finish its pending actions and start deciding."""
        self.lease_info = info
        self.metrics.lease_epoch.set(info.epoch)
        now = self.clock()
        window = self.cfg.flap_hold.window
        # Through the writer: after every write this replica queued before, in order.
        loaded, cycles = await self.writer.call(
            lambda s: (s.load(now, self.cfg.event_retention), s.recent_cycles(now - window)))
        self.mem = load_memory(self.cfg, loaded, cycles, now, self.mono)
        self.silences.clear()
        self.silences.update({(s.node, s.check): s for s in loaded.silences})
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
        tasks = list(self._acting_tasks)
        self._acting_tasks = []
        for t in tasks:
            t.cancel()
        await asyncio.gather(self.actions.cancel_all(), *tasks, return_exceptions=True)
        self.pending.clear()
        self.lease_info = None

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._running = False
        tasks = [*self._tasks, *self._acting_tasks]
        for t in tasks:
            t.cancel()
        await asyncio.gather(self.actions.cancel_all(), *tasks, return_exceptions=True)
        self._tasks, self._acting_tasks = [], []
        if self.leadership is not None:
            await self.leadership.release()
        await self.tls_watch.stop()
        self.writer.write_nowait(self.mem.flush_seen())
        self.freezer.uninstall()
        await self.writer.stop()
        await self.session.close()
        self.store.close()
        self.lease.release()

    def poke(self) -> None:
        """Something changed: run the policy soon (at once for a new actionable FAIL)."""
        self.wake.set()
        if self.mem.actionable != self._actionable_seen:
            self.urgent.set()

    async def commit(self, ops: Sequence[Op]) -> None:
        if self.leadership is not None and self.mem.actionable != self._notified and not self.acting():
            # A follower's new actionable FAIL: its commit wakes the leader's read-back
            # (NOTIFY, delivered on commit). Ingest applies to memory and commits with no
            # await between, so the commit that first sees the count is the FAIL's own.
            from podhealth.aggregator.pgnotify import NOTIFY_OP

            self._notified = self.mem.actionable
            ops = [*ops, NOTIFY_OP]
        await self.writer.write(ops)

    async def commit_journal(self, aid: int, ops: Sequence[Op]) -> None:
        await self.actions.commit_journal(aid, ops)

    # ---- the decide loop -----------------------------------------------------------------------

    async def _decide_loop(self) -> None:
        seen, last = -1, float("-inf")
        while self._running:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self.cfg.decide_interval)
            self.wake.clear()
            # Run when something changed, and on the interval (minimum durations, healthy_for).
            if self.mem.version == seen and self.mono() - last < self.cfg.decide_interval:
                continue
            seen, last = self.mem.version, self.mono()
            self.urgent.clear()
            self._actionable_seen = self.mem.actionable
            try:
                self.run_decide()
            except Exception:  # noqa: BLE001 - the loop must outlive one bad run; it is logged
                log.exception("decide failed")
            # Coalesce bursts of ingest into one run, except a FAIL the policy may fence on: it
            # ends the gap at once (poke() sets `urgent`), so a fence waits for no window.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.urgent.wait(), MIN_DECIDE_GAP)

    def run_decide(self) -> Decision:
        mem = self.mem
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
        # Memory marks a node `fencing` before the store records the action: if that record
        # cannot be written, the node goes back to how it was (never `fencing` with no action).
        undo = mem.checkpoint(*(a.node for a in d.actions if a.kind in ("fence", "handover", "repair", *LADDER_STEPS)))
        self.actions.act(d.actions, now, undo)
        return d

    def fleet_now(self, now: float) -> FleetState:
        """The fleet for decide(), its recent fences moved from the monotonic clock onto `now`."""
        m = self.mono()
        return dataclasses.replace(self.mem.fleet(), recent_fences=tuple(now - (m - t) for t in self.mem.recent_fences),
                                   recent_remediations=tuple(now - (m - t) for t in self.mem.recent_steps),
                                   silenced=overrides.active(self.silences, now))

    # ---- housekeeping ----------------------------------------------------------------------------

    async def reconcile(self, initial: bool = False) -> list[str]:
        return await self.reconciler.reconcile(initial)

    def silence_ops(self, now: float) -> list[Op]:
        return self.liveness.silence_ops(now, self.started_at)

    async def sync_quota(self) -> None:
        """Each node's stored event bytes from the store (retention and other replicas change them)."""
        try:
            stored = await offload(self.store.event_bytes_by_node, self.clock() - self.cfg.event_retention)
        except Exception as e:  # noqa: BLE001 - the store's own errors are logged by its writer; keep the counts
            log.warning("stored bytes per node not read: the caps keep their counts", error=str(e))
            return
        self.quota.sync(stored)

    def forget_ops(self, now: float) -> list[Op]:
        self._last_forget = self.mono()
        return self.liveness.forget_ops(now, busy={p.node for p in self.pending.values()})

    async def _housekeeping_loop(self) -> None:
        last_reconcile = self.mono()
        last_prune = float("-inf")
        last_sample = self.mono()  # open() took the first sample
        last_quota = self.mono()
        # ... and one more whenever the counts change (a fence, a release, the first reports after a
        # start): sampled only on the period, a start before the agents reported showed the whole
        # fleet UNKNOWN for history_interval, and the fences and releases in it never appeared.
        # Counted only when memory changed (mem.version), so a quiet fleet costs nothing per pass.
        sampled_counts, seen_version = self.mem.counts(), self.mem.version
        while self._running:
            await asyncio.sleep(self.housekeeping_interval)
            mem, writer = self.mem, self.writer
            now = self.clock()
            visited = mem.heard.visited
            try:
                if self.mono() - last_quota > QUOTA_SYNC_S:  # every replica: they all ingest
                    last_quota = self.mono()
                    await self.sync_quota()
                writer.write_nowait(mem.flush_seen())
                self.freezer.after_load(len(mem.nodes))
                self.freezer.drain()
                if not self.acting() or not self._acting_tasks:
                    # a follower only ingests: the rest is the leader's, once its takeover has
                    # loaded the shared state (a follower's own memory is not the fleet's)
                    continue
                ops: list[Op] = self.silence_ops(now) + overrides.expire_ops(self.silences, now)
                if self.mono() - self._last_forget >= FORGET_EVERY:
                    ops += self.forget_ops(now)
                if self.mono() - last_prune > 3600:
                    ops += mem.prune_ids(now - self.cfg.event_retention)
                    last_prune = self.mono()
                # One walk of the fleet per pass at most, and none when memory did not change: at
                # 100,000 nodes each counts() held the loop 30-90 ms, and a pass took three.
                counts: dict[str, int] | None = None
                if mem.version != seen_version:
                    seen_version, counts = mem.version, mem.counts()
                if (counts is not None and counts != sampled_counts) or \
                        self.mono() - last_sample >= self.cfg.ui.history_interval:
                    counts = mem.counts() if counts is None else counts
                    writer.write_nowait(fleet_sample_ops(self.cfg, mem, now, counts))
                    last_sample, sampled_counts = self.mono(), counts
                if ops:
                    writer.write_nowait(ops)
                    self.poke()
                for p in self.actions.due(now):
                    self.actions.spawn(self.actions.execute(p))
                if self.mono() - last_reconcile >= self.reconcile_interval:
                    last_reconcile = self.mono()
                    await self.reconcile()
                    await self.reconciler.refresh_opt_outs()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - keep the loop alive; the failure is logged
                log.exception("housekeeping failed")
            finally:
                self.count_visits(mem, visited)

    def count_visits(self, mem: Memory, before: int) -> None:
        """Export how many nodes the pass that started at `before` visits looked at."""
        n = mem.heard.visited - before
        self.metrics.housekeeping_visits.inc(n)
        self.metrics.housekeeping_last.set(n)
        self.housekeeping_passes += 1

    # ---- operator actions ------------------------------------------------------------------------

    def require_leader(self) -> None:
        if not self.acting() or not self._acting_tasks:  # not leading, or its takeover is not done
            lead = self.leadership.lease.seen.get("holder", "unknown") if self.leadership else "unknown"
            raise OperatorError(503, f"this aggregator is a follower; ask the leader ({lead})")

    async def operator_fence(self, node: str, reason: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self.require_leader()
        mem = self.mem
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
        fr = FenceReason(check="operator", entity="node", action="DRAIN", id=slug(who))
        undo = mem.checkpoint(node)
        mem.recent_fences.append(self.mono())
        extra = settle(mem, node, Outcome(Kind.OPERATOR_FENCE, reason=render_reason(fr)), now)
        t = self.actions.spawn(self.actions.begin(node, "fence", f"operator:{who}", reason, now, fr, "operator",
                                                  extra, undo))
        return await self.actions.await_action(t, wait)

    async def operator_release(self, node: str, reason: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self.require_leader()
        mem = self.mem
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
        undo = mem.checkpoint(node)
        extra = settle(mem, node, Outcome(Kind.OPERATOR_RELEASE), now)  # only later failures fence again
        t = self.actions.spawn(self.actions.begin(node, "release", f"operator:{who}", reason, now, None, "operator",
                                                  extra, undo))
        return await self.actions.await_action(t, wait)

    async def operator_handover(self, node: str, who: str, wait: float = 30.0) -> dict[str, Any]:
        self.require_leader()
        mem = self.mem
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
        t = self.actions.spawn(self.actions.begin(node, "handover", f"operator:{who}", "operator asked", now, None,
                                                  "", extra, undo))
        return await self.actions.await_action(t, wait)

    async def reset_order(self, node: str, who: str, reason: str) -> dict[str, Any]:
        """Forget the order of a node's records (a forged or runaway seq left its real reports
        stale): its next record starts afresh. Audited."""
        mem = self.mem
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
        self.require_leader()
        mem = self.mem
        now = self.clock()
        was = mem.breaker
        ops = mem.set_breaker(BreakerState(tripped=False, tripped_at=0.0, reset_at=now))
        ops.append(Store.op_audit(now, "*", f"operator:{who}", "breaker reset", reason or "operator reset",
                                  (), f"was tripped: {was.tripped} ({was.reason})"))
        await self.commit(ops)
        log.warning("circuit breaker reset; observations before now must be seen again", who=who)
        self.poke()
        return {"tripped": False, "reset_at": now, "was_tripped": was.tripped, "was_reason": was.reason}

    # ---- views for the API (aggregator/views.py) ---------------------------------------------------

    def fleet_json(self) -> dict[str, Any]:
        return views.fleet_json(self.mem, self.cfg, self.clock(), self.mono(), len(self.pending),
                                [f.name for f in self.fencers], self.replica_json(), self.last_decision,
                                self.last_decision_at)

    def replica_json(self) -> dict[str, Any]:
        return views.replica_json(self.lease_info, self.leadership, self.mono())

    def node_json(self, name: str) -> dict[str, Any] | None:
        return views.node_json(self.mem, name, self.pending.values(), self.last_decision, self.silences,
                               self.clock())

    def repairs_json(self) -> list[dict[str, Any]]:
        return views.repairs_json(self.mem, self.store)


def fleet_sample_ops(cfg: AggregatorConfig, mem: Memory, now: float, counts: dict[str, int] | None = None) -> list[Op]:
    """One row of the fleet chart (node counts by state now: `counts` when the caller has just
    taken them) and the pruning that keeps the table bounded: ui.history_retention /
    ui.history_interval rows at most."""
    return [Store.op_fleet_sample(now, mem.counts() if counts is None else counts),
            Store.op_prune_fleet_samples(now - cfg.ui.history_retention)]
