"""Agent → aggregator delivery that survives the aggregator being away and a full disk.

Everything published goes to one of two lanes (agent/spool.py: *priority* = every verdict
transition and fatal events; *routine* = the rest), each held in memory until a flusher writes
it to that lane's disk spool (fsync'd in batches); a sender delivers (`POST /v1/events`) the
priority lane first, then the routine one, each in order, and deletes what was delivered.
Every record has an id, so a resend after a crash (delivered but cursor not yet saved) is
applied once by the aggregator.

Delivery never needs the disk: while the spool cannot be written (ENOSPC, EIO, EDQUOT) its
records wait in memory, bounded per lane by summarising that lane's oldest, and the sender
delivers them from memory as soon as the aggregator answers; the flusher keeps retrying the
disk with backoff. At stop whatever is still in memory is offered to the aggregator (bounded
by `drain`) before the process exits. Each change of state (failing, recovered) is logged
once, every failure is counted in `publish_spool_errors{reason}`, half-written files the spool
cut back or removed in `publish_spool_repaired`, and `publish_connected` is 0 while records
cannot be spooled. A line that cannot be read back (corrupt) is logged with where it was and
counted (reason="corrupt").
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Iterable

from podhealth import httpclient, log as plog
from podhealth.backoff import Backoff
from podhealth.agent.failover import PushesToReplicas, Replicas
from podhealth.agent.pushsession import PushSession
from podhealth.agent.metrics.family import Family
from podhealth.agent.sequence import Sequencer
from podhealth.agent.sink import Sink
from podhealth.agent.spool import LANES, Lane, MemoryLane, Opener, Spool, append_line, errno_reason, lane_of
from podhealth.config import PublishConfig
from podhealth.snapshot import Snapshot
from podhealth.vocab import CheckResult, Event, MetricSpec, NodeReport, Sample, Status
from podhealth.worker import offload

log = plog.get("podhealth.publisher")
BATCH_RECORDS = 500
ANSWER_MAX_BYTES = 64 * 1024  # the aggregator answers a push with a few bytes of JSON
BATCH_BYTES = 256 * 1024
# Records held in memory per lane while the spool cannot be written; beyond this the lane's oldest are summarised.
MEMORY_MAX_BYTES = 4 * 1024 * 1024
# The aggregator's 413 for one record over node_ingest.max_event_bytes (not a body too large):
# that record is set aside at once instead of the batch being halved (aggregator/server.py).
RECORD_TOO_LARGE = "max_event_bytes"
MAX_REJECTED_IDS = 10_000
# After a burst of transitions, one full report this long after the first (see _report_soon).
REPORT_DEBOUNCE_S = 0.5
# At stop, how long what is left (in memory above all: it has no other way out) may take to reach the aggregator.
STOP_DRAIN_S = 5.0

SPECS = {m.name: m for m in (
    MetricSpec("publish_records", "counter",
               "Spooled records (transitions, events, reports) by state: published, delivered, summarised\n"
               "(folded into a summary when the spool was full), rejected (refused as malformed; kept)."),
    MetricSpec("publish_spool_bytes", "gauge", "Bytes in the spool waiting for the aggregator.", "bytes"),
    MetricSpec("publish_connected", "gauge",
               "1 when records get through: the last delivery to the aggregator succeeded and the spool can be written."),
    MetricSpec("publish_spool_errors", "counter",
               "Spool faults by reason: an errno name (ENOSPC, EIO, EDQUOT: a write or read failed; records wait\n"
               "in memory, bounded, are sent from there, and the write is retried) or corrupt (a spooled line\n"
               "that could not be read back; logged)."),
    MetricSpec("publish_spool_repaired", "counter",
               "Half-written spool files cut back to their last whole record or removed (a write that failed\n"
               "on a full disk, a crash), so no torn file holds space."),
)}


@dataclass
class PublisherStats:
    published: int = 0
    delivered: int = 0
    summarised: int = 0  # records folded into summary records
    rejected: int = 0  # records the aggregator refused as malformed (kept in rejected.jsonl)
    corrupt: int = 0  # unreadable spool lines (a write cut short by a crash)
    send_failures: int = 0
    spool_bytes: int = 0
    spool_errors: dict[str, int] = field(default_factory=dict)  # by reason: ENOSPC, EIO, ..., corrupt
    spool_failing: str = ""  # why the spool cannot be written now ("" when it can)
    memory_bytes: int = 0  # records waiting in memory for the spool, both lanes
    memory_lane_bytes: dict[str, int] = field(default_factory=dict)  # by lane
    repaired: int = 0  # half-written spool files cut back or removed


class Publisher(Sink, PushesToReplicas):
    """As the agent's sink: transitions and events are spooled as they come; `report()` (the
    node report, None before the first judgement) is spooled after each burst of transitions."""

    name = "publisher"

    def __init__(self, cfg: PublishConfig, node: str, *, fsync_batch: float = 0.05,
                 max_backoff: float = 30.0, sequencer: Sequencer | None = None,
                 spool_opener: Opener | None = None,
                 report: Callable[[], NodeReport | None] | None = None,
                 tls: ssl.SSLContext | None = None, tls_reloads: Callable[[], int] | None = None) -> None:
        """`tls`: how https:// aggregators are verified, and this node's client certificate
        (core/tls.py; None: the system's trust store); `tls_reloads`: its reload count
        (agent/pushsession.py)."""
        self.cfg = cfg
        self.tls = tls
        self._tls_reloads = tls_reloads
        self._report = report
        self._report_timer: asyncio.TimerHandle | None = None
        self.node = node
        # Stamps each record with (boot_id, seq) when it is published, so the aggregator orders
        # it among heartbeats by the agent's own sequence, not by its wall clock (sequence.py).
        self.sequencer = sequencer
        self.enabled = bool(cfg.urls())
        self.replicas = Replicas(cfg.urls(), "/v1/events", node)
        self.stats = PublisherStats()
        self._spools: dict[Lane, Spool] = {}
        self._lock = asyncio.Lock()
        memory_max = max(64 * 1024, min(MEMORY_MAX_BYTES, cfg.spool_max_bytes))
        self._mem: dict[Lane, MemoryLane] = {lane: MemoryLane(memory_max) for lane in LANES}
        self._have_new = asyncio.Event()
        self._work = asyncio.Event()  # something may be waiting for the sender (on disk or in memory)
        self._fsync_batch = fsync_batch
        self._max_backoff = max_backoff
        self._tasks: list[asyncio.Task[Any]] = []
        self._push: PushSession | None = None
        self._batch_bytes = BATCH_BYTES
        self._running = False
        self._stopping = False  # stop() began: the sender takes what is in memory without the disk
        self._reachable = False  # the last delivery succeeded
        self._opener = spool_opener
        # The one backoff (core/backoff.py), jittered: a full disk is tried again from one batch
        # wait up; a failed send from 0.2 s up; both at most max_backoff.
        self._flush_backoff = Backoff(fsync_batch, max_backoff, jitter=True)
        self._flush_failures = 0
        self._send_backoff = Backoff(0.2, max_backoff, jitter=True)
        self._read_failing = False
        self._retry_after = 0.0  # seconds the aggregator's last 429 asked for
        self._rejected_ids: set[str] = set()  # records kept aside in rejected.jsonl (not sent again)
        self._urgent = False  # a priority record waits in memory: spool and send it without the batch wait

    @property
    def connected(self) -> bool:
        """What `publish_connected` exports: records get through, i.e. the last delivery
        succeeded AND new records can be spooled (a full spool disk delivers only from memory,
        and what is in memory would not survive a restart)."""
        return self._reachable and not self.stats.spool_failing

    @property
    def in_memory(self) -> int:
        """Records waiting in memory (not on disk, not delivered), those being sent included."""
        return sum(len(m.lines) + m.inflight for m in self._mem.values())

    # -- lifecycle --

    async def start(self) -> None:
        if not self.enabled:
            return
        root = Path(self.cfg.spool_dir)
        for lane in LANES:
            where = root / "priority" if lane == "priority" else root
            self._spools[lane] = await offload(Spool, where, self.cfg.spool_max_bytes, self._opener)
        await self._measure()
        if self.stats.repaired:
            log.warning("spool: half-written files from an earlier run cut back or removed",
                        files=self.stats.repaired, dir=str(root))
        self._push = PushSession(self.cfg, self.tls, self._tls_reloads)
        self._running = True
        self._work.set()  # whatever an earlier run left behind
        self._tasks = [asyncio.create_task(self._flusher(), name="publisher-flush"),
                       asyncio.create_task(self._sender(), name="publisher-send")]

    async def stop(self, drain: float = STOP_DRAIN_S) -> None:
        """Flush to disk, then offer what is left (from the disk, and from memory when the disk
        could not take it) to the aggregator for up to `drain` seconds, and stop. Records still
        in memory after that are lost, and logged as lost."""
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None
        if not self.enabled or not self._running:
            return
        await self._flush()
        self._stopping = True
        self._work.set()
        if drain > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained(), drain)
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._flush()
        if self.in_memory:
            log.error("records lost at exit: neither the spool nor the aggregator took them", records=self.in_memory,
                      error=self.stats.spool_failing)
        async with self._lock:
            for spool in self._spools.values():
                with contextlib.suppress(OSError):
                    await offload(spool.close)
        if self._push is not None:
            await self._push.close()

    async def _drained(self) -> None:
        while self.in_memory or self.stats.spool_bytes > 0:
            await asyncio.sleep(0.02)

    async def _measure(self) -> None:
        """spool_bytes and repaired from the spools (under the lock: the worker thread writes them)."""
        async with self._lock:
            sizes = [await offload(s.size) for s in self._spools.values()]
        self.stats.spool_bytes = sum(sizes)
        self.stats.repaired = sum(s.repaired for s in self._spools.values())

    # -- publishing (non-blocking: append to a lane the flusher writes) --

    def _put(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.sequencer is not None:
            self.sequencer.stamp(rec)
        lane = lane_of(rec)
        self._mem[lane].add(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
        self.stats.published += 1
        if lane == "priority":
            self._urgent = True  # it may fence: spool and send it without waiting for a burst to gather
        self._fold(lane)
        self._have_new.set()
        if self.stats.spool_failing:
            self._work.set()  # the disk cannot take it: the sender takes it from memory

    def _fold(self, lane: Lane) -> None:
        """A lane over its memory bound (the spool cannot take its records): its own oldest become
        one summary record, as the spool does with its oldest segments. A routine record never
        pushes out a priority one."""
        mem = self._mem[lane]
        folded = mem.fold()
        if folded:
            self.stats.summarised += folded
            log.warning("spool unwritable: oldest records in memory summarised", lane=lane, records=folded,
                        memory_bytes=mem.nbytes, error=self.stats.spool_failing)
        self._note_memory()

    def _note_memory(self) -> None:
        self.stats.memory_lane_bytes = {lane: m.nbytes for lane, m in self._mem.items()}
        self.stats.memory_bytes = sum(self.stats.memory_lane_bytes.values())

    def publish_event(self, ev: Event) -> None:
        self._put({"id": ev.id, "type": "event", "time": ev.time, "event": ev.to_json()})

    def publish_transition(self, old: CheckResult | None, new: CheckResult, at: float | None = None) -> None:
        """`at`: when the transition was judged (the evaluation time, as reports carry it). A turn
        to FAIL is written and sent at once, ahead of routine records (the priority lane): the
        aggregator may fence on it, and waiting for a burst to gather only delays the fence."""
        self._put({"id": uuid.uuid4().hex, "type": "transition", "time": time.time() if at is None else at,
                   "old": old.to_json() if old is not None else None, "new": new.to_json()})

    def publish_report(self, rep: NodeReport) -> None:
        self._put({"id": uuid.uuid4().hex, "type": "report", "time": rep.time, "report": rep.to_json()})

    # -- the agent's sink --

    async def on_events(self, events: tuple[Event, ...]) -> None:
        for e in events:
            self.publish_event(e)

    async def on_transition(self, old: CheckResult | None, new: CheckResult, at: float) -> None:
        self.publish_transition(old, new, at)
        self._report_soon()

    def _report_soon(self) -> None:
        """One full report after a burst of transitions, so the aggregator's view is whole
        (spooled with them, so it arrives after them, and never lost)."""
        if self._report is not None and self._report_timer is None:
            self._report_timer = asyncio.get_running_loop().call_later(REPORT_DEBOUNCE_S, self._push_report)

    def _push_report(self) -> None:
        self._report_timer = None
        rep = self._report() if self._report is not None else None
        if rep is not None:
            self.publish_report(rep)

    def families(self, snap: Snapshot) -> Iterable[Family]:
        """The push path's own health, so an alert can tell a node that stopped reporting from one
        whose aggregator is away (counters are ints the loop replaces: safe to read here)."""
        p = self.stats
        yield Family(SPECS["publish_records"], tuple(
            Sample.of("publish_records", float(v), state=k)
            for k, v in (("published", p.published), ("delivered", p.delivered), ("summarised", p.summarised),
                         ("rejected", p.rejected))))
        yield Family(SPECS["publish_spool_bytes"], (Sample.of("publish_spool_bytes", float(p.spool_bytes)),))
        yield Family(SPECS["publish_connected"], (Sample.of("publish_connected", float(self.connected)),))
        yield Family(SPECS["publish_spool_errors"], tuple(
            Sample.of("publish_spool_errors", float(v), reason=k) for k, v in sorted(p.spool_errors.items())))
        if p.repaired:  # born with the first repair: most nodes never have one (the series budget)
            yield Family(SPECS["publish_spool_repaired"], (Sample.of("publish_spool_repaired", float(p.repaired)),))

    # -- flushing to disk --

    async def _flusher(self) -> None:
        while self._running:
            if self.stats.spool_failing:
                # Retry on a backoff even when nothing new is published: the disk may have room again.
                await asyncio.sleep(self._flush_backoff.delay(self._flush_failures))
                self._flush_failures += 1
            else:
                await self._have_new.wait()
                self._have_new.clear()
                if not self._urgent:
                    await asyncio.sleep(self._fsync_batch)  # let a burst gather into one fsync
                self._urgent = False
            await self._flush()

    async def _flush(self) -> None:
        """Write each lane's records in memory to its spool, the priority lane first; then bound
        the spools, the priority one by `spool_max_bytes` and the routine one by what the
        priority one leaves of it."""
        if not self._spools:
            return
        if self.stats.spool_failing and not self.in_memory:
            # Everything went out from memory: ask the disk itself whether it has room again.
            try:
                async with self._lock:
                    await offload(self._spools["priority"].probe)
            except OSError as e:
                self._count_error(e)
                return
            self._spool_recovered()
            return
        wrote = False
        for lane in LANES:
            mem = self._mem[lane]
            if not mem.lines or mem.busy:
                continue
            lines = mem.take()
            mem.busy = True
            try:
                async with self._lock:
                    await offload(self._spools[lane].append, lines)
            except OSError as e:
                mem.put_back(lines)  # oldest first, ahead of what was published meanwhile
                self._spool_error(e)
                self._fold(lane)
                await self._measure()  # a cut-back segment is counted at once
                self._work.set()  # the sender takes them from memory
                return  # routine records take no space that the priority lane could not get
            finally:
                mem.busy = False
            wrote = True
        self._note_memory()
        if not wrote:
            return
        self._spool_recovered()
        # The records are on disk: the sender may take them now. It runs first (one turn of the
        # loop) and so reads them before the bound and the sizes below take the lock: five
        # thread hand-offs that a FAIL on its way to a fence no longer waits for.
        self._work.set()
        await asyncio.sleep(0)
        folded = 0
        try:
            async with self._lock:
                prio, routine = self._spools["priority"], self._spools["routine"]
                folded += await offload(prio.enforce_bound)
                left = max(0, self.cfg.spool_max_bytes - await offload(prio.size))
                folded += await offload(routine.enforce_bound, left)
        except OSError as e:
            self._count_error(e)  # the records are spooled; only the bound waits for the next flush
        await self._measure()
        if folded:
            self.stats.summarised += folded
            log.warning("spool full: oldest records summarised", records=folded, spool_bytes=self.stats.spool_bytes)
        self._work.set()

    def _spool_recovered(self) -> None:
        if self.stats.spool_failing:
            log.info("spool writable again", dir=str(self.cfg.spool_dir), error_was=self.stats.spool_failing)
            self.stats.spool_failing = ""
        self._flush_failures = 0

    # -- delivering --

    def _count_error(self, e: OSError) -> str:
        reason = errno_reason(e)
        self.stats.spool_errors[reason] = self.stats.spool_errors.get(reason, 0) + 1
        return reason

    def _spool_error(self, e: OSError) -> None:
        """A write to the spool failed: counted every time, logged when the state changes."""
        reason = self._count_error(e)
        if not self.stats.spool_failing:
            log.error("spool cannot be written: records kept in memory (bounded), retrying", reason=reason,
                      error=e.strerror or str(e), dir=str(self.cfg.spool_dir))
        self.stats.spool_failing = f"{reason}: {e.strerror or e}"

    def _note_corrupt(self, spool: Spool) -> None:
        """Lines of the spool that could not be read back: logged with where they were, and counted."""
        new = spool.stats_corrupt - spool.corrupt_reported
        notes, spool.corrupt_notes = spool.corrupt_notes, []
        spool.corrupt_reported = spool.stats_corrupt
        if new <= 0:
            return
        self.stats.corrupt += new
        self.stats.spool_errors["corrupt"] = self.stats.spool_errors.get("corrupt", 0) + new
        for seg, off, head in notes:
            log.error("corrupt spool record skipped", segment=seg, offset=off,
                      start=head.decode("utf-8", "replace"))
        if new > len(notes):
            log.error("more corrupt spool records skipped", count=new - len(notes))

    async def _spool_call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A read-side spool call (read, ack, size) under the lock; an OSError is counted, logged
        once per failing spell and re-raised for the sender to back off."""
        try:
            async with self._lock:
                out = await offload(fn, *args)
        except OSError as e:
            reason = self._count_error(e)
            if not self._read_failing:
                log.error("spool cannot be read: delivery paused, retrying", reason=reason,
                          error=e.strerror or str(e), dir=str(self.cfg.spool_dir))
            self._read_failing = True
            raise
        if self._read_failing:
            log.info("spool readable again", dir=str(self.cfg.spool_dir))
            self._read_failing = False
        return out

    async def _sender(self) -> None:
        failures = 0
        while self._running:
            await self._work.wait()
            self._work.clear()  # before looking: whatever is set meanwhile is seen next round
            batch = await self._next_batch()
            if batch is None:
                continue
            recs, settle = batch
            ok = False
            try:
                ok = await self._deliver(recs)
            finally:
                await settle(ok)  # also when cancelled at stop: records from memory go back there
            self._work.set()
            if ok:
                failures = 0
                self.stats.delivered += len(recs)
                continue
            self.stats.send_failures += 1
            # A 429's Retry-After is honoured up to max_backoff: the node's FAIL transitions get
            # through its cap, so new ones must not wait an hour behind it.
            wait = max(self._send_backoff.delay(failures), min(self._retry_after, self._max_backoff))
            self._retry_after = 0.0
            await asyncio.sleep(wait)
            failures += 1

    async def _next_batch(self) -> tuple[list[dict[str, Any]], Callable[[bool], Awaitable[None]]] | None:
        """The next records to send and what to do once the attempt is over: the priority lane
        first, each lane's spool before its memory (older first). Records in memory go straight
        to the aggregator when the spool cannot take them, cannot be read, or at stop: sending
        never waits for the disk."""
        for lane in LANES:
            spool, mem = self._spools[lane], self._mem[lane]
            disk_ok = True
            try:
                while True:
                    recs, pos = await self._spool_call(spool.read_batch, BATCH_RECORDS, self._batch_bytes)
                    self._note_corrupt(spool)
                    if recs or pos == (spool.cursor_seq, spool.cursor_off):
                        break
                    await self._spool_call(spool.ack, pos)  # skipped corrupt lines only
                if recs:
                    return recs, self._settle_spooled(spool, pos)
            except OSError:
                disk_ok = False  # counted and logged by _spool_call
            if mem.lines and not mem.busy and (self.stats.spool_failing or self._stopping or not disk_ok):
                lines = mem.take(BATCH_RECORDS, self._batch_bytes)
                mem.busy = True
                mem.inflight = len(lines)
                self._note_memory()
                return [json.loads(x) for x in lines], self._settle_memory(lane, lines)
        await self._measure()
        return None

    def _settle_spooled(self, spool: Spool, pos: tuple[int, int]) -> Callable[[bool], Awaitable[None]]:
        async def settle(ok: bool) -> None:
            if ok:
                with contextlib.suppress(OSError):  # counted and logged: delivered, the cursor moved in memory
                    await self._spool_call(spool.ack, pos)
                await self._measure()
        return settle

    def _settle_memory(self, lane: Lane, lines: list[bytes]) -> Callable[[bool], Awaitable[None]]:
        async def settle(ok: bool) -> None:
            mem = self._mem[lane]
            mem.busy, mem.inflight = False, 0
            if not ok:
                mem.put_back(lines)
                self._fold(lane)
            self._note_memory()
        return settle

    async def _post(self, recs: list[dict[str, Any]]) -> tuple[int, str]:
        assert self._push is not None
        headers = {"Content-Type": "application/json",
                   **({"Authorization": f"Bearer {self.cfg.token}"} if self.cfg.token else {})}
        data = json.dumps({"node": self.node, "events": recs}).encode()
        session = await self._push.current()

        async def send(url: str) -> tuple[int, str]:
            try:  # the whole exchange within publish.timeout (core/httpclient.py), the answer bounded
                r = await httpclient.exchange_async(session, "POST", url, deadline_s=self.cfg.timeout, body=data,
                                                    headers=headers, max_bytes=ANSWER_MAX_BYTES,
                                                    idempotent=True)  # records are applied once by their id
            except httpclient.ExchangeError as e:
                return 0, f"{e.kind}: {e}"
            if r.status == 429:  # over this node's cap: the aggregator says when to come back
                self._retry_after = _seconds(r.header("Retry-After"))
            return r.status, r.body[:500].decode(errors="replace")
        return await self.replicas.post(send)

    async def _deliver(self, recs: list[dict[str, Any]]) -> bool:
        recs = [r for r in recs if r.get("id") not in self._rejected_ids]  # already kept aside
        if not recs:
            return True
        posted = time.time()
        status, text = await self._post(recs)
        # The fence path's stage times (bench/fault_to_fence.py --trace reads them at debug level).
        log.debug("records posted", records=len(recs), status=status, posted=posted,
                  took_ms=round((time.time() - posted) * 1e3, 1))
        if status == 200:
            if not self._reachable:
                log.info("aggregator reachable: delivering", url=self.url)
            self._reachable = True
            return True
        if self._reachable:
            log.warning("aggregator unreachable: spooling", url=self.url, status=status, error=text)
        self._reachable = False
        if status == 413 and len(recs) > 1 and RECORD_TOO_LARGE not in text:  # the body: send less at once
            self._batch_bytes = max(4096, self._batch_bytes // 2)
            return False
        if status in (400, 413):  # malformed, or one record larger than the aggregator takes
            return await self._isolate(recs)
        return False  # 401/403/5xx/unreachable: keep everything and retry later

    async def _isolate(self, recs: list[dict[str, Any]]) -> bool:
        """The aggregator refused the batch as malformed: find the bad records, keep them aside."""
        for rec in recs:
            status, text = await self._post([rec])
            if status in (400, 413):
                self.stats.rejected += 1
                if len(self._rejected_ids) >= MAX_REJECTED_IDS:
                    self._rejected_ids.clear()
                self._rejected_ids.add(str(rec.get("id")))  # a later resend of its batch skips it
                log.error("aggregator rejected a record; kept in rejected.jsonl", id=rec.get("id"), error=text)
                line = json.dumps({"record": rec, "error": text}, separators=(",", ":")) + "\n"
                with contextlib.suppress(OSError):  # a full disk: it is logged above, with the record's id
                    await offload(append_line, Path(self.cfg.spool_dir) / "rejected.jsonl", line)
            elif status != 200:
                return False
        return True


def _seconds(retry_after: str) -> float:
    """Retry-After in seconds (RFC 9110 also allows a date, which the aggregator never sends: 0)."""
    try:
        return max(0.0, min(float(retry_after), 3600.0))
    except ValueError:
        return 0.0
