"""Agent → aggregator delivery that survives the aggregator being away.

Everything published goes to a disk spool first: append-only segment files of JSON lines,
fsync'd in batches, then a sender delivers them in order (`POST /v1/events`) and deletes the
segments once delivered. The spool is bounded: when it is over `spool_max_bytes`, its oldest
segments are replaced by ONE summary record with counts per kind/code, so an outage costs
detail, never the fact that something happened. Every record has an id, so a resend after a
crash (delivered but cursor not yet saved) is applied once by the aggregator.

Layout of `spool_dir`: `seg-000000000001.jsonl` …, `cursor.json` ({"seq", "offset"} of the first
undelivered byte), and `rejected.jsonl` (records the aggregator refused as malformed; kept, not
retried, logged).

Faults of the spool's disk are said out loud and survived: a write that fails (ENOSPC, EIO,
EDQUOT) keeps its records in memory, bounded by summarising the oldest as the spool does, and is
retried with backoff; delivery of what is already spooled goes on. Each change of state (failing,
recovered) is logged once, every failure is counted in `publish_spool_errors{reason}`, and
`publish_connected` is 0 while records cannot be spooled. A line that cannot be read back
(corrupt, or cut short by a crash) is logged with where it was and counted (reason="corrupt").
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable

import aiohttp

from podhealth import log as plog
from podhealth.agent.failover import Replicas
from podhealth.agent.metrics.family import Family
from podhealth.agent.sequence import Sequencer
from podhealth.agent.sink import Sink
from podhealth.config import PublishConfig
from podhealth.snapshot import Snapshot
from podhealth.vocab import CheckResult, Event, MetricSpec, NodeReport, Sample, Status
from podhealth.worker import offload

log = plog.get("podhealth.publisher")
_PREFIX, _SUFFIX = "seg-", ".jsonl"
BATCH_RECORDS = 500
BATCH_BYTES = 256 * 1024
# Records held in memory while the spool cannot be written; beyond this the oldest are summarised.
MEMORY_MAX_BYTES = 4 * 1024 * 1024
MAX_CORRUPT_NOTES = 16  # corrupt lines remembered for the log per read (the count has them all)
Opener = Callable[[Path, str], IO[bytes]]
# After a burst of transitions, one full report this long after the first (see _report_soon).
REPORT_DEBOUNCE_S = 0.5

SPECS = {m.name: m for m in (
    MetricSpec("publish_records", "counter",
               "Spooled records (transitions, events, reports) by state: published, delivered, summarised\n"
               "(folded into a summary when the spool was full), rejected (refused as malformed; kept)."),
    MetricSpec("publish_spool_bytes", "gauge", "Bytes in the spool waiting for the aggregator.", "bytes"),
    MetricSpec("publish_connected", "gauge",
               "1 when records get through: the last delivery to the aggregator succeeded and the spool can be written."),
    MetricSpec("publish_spool_errors", "counter",
               "Spool faults by reason: an errno name (ENOSPC, EIO, EDQUOT: a write or read failed; records wait\n"
               "in memory, bounded, and are retried) or corrupt (a spooled line that could not be read back; logged)."),
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
    memory_bytes: int = 0  # records waiting in memory for the spool


def _seg_name(seq: int) -> str:
    return f"{_PREFIX}{seq:012d}{_SUFFIX}"


class Spool:
    """The segment files. Synchronous; the Publisher calls it from a worker thread under a lock."""

    def __init__(self, directory: Path, max_bytes: int, opener: Opener | None = None) -> None:
        """`opener(path, mode)` opens every file the spool writes (default open(): a test passes
        one whose writes fail with ENOSPC)."""
        self._open: Opener = opener or _binary_open
        self.dir = directory
        self.max_bytes = max_bytes
        self.segment_bytes = max(4096, min(1024 * 1024, max_bytes // 8))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.cursor_seq, self.cursor_off = self._load_cursor()
        segs = self.segments()
        # Always write a fresh segment after a restart: a line cut short by a crash stays isolated.
        self.write_seq = (segs[-1] + 1) if segs else max(1, self.cursor_seq)
        if self.cursor_seq < (segs[0] if segs else self.write_seq):
            self.cursor_seq, self.cursor_off = (segs[0] if segs else self.write_seq), 0
        self._fh: Any = None
        self.stats_corrupt = 0
        self.corrupt_notes: list[tuple[str, int, bytes]] = []  # (segment, offset, the line's start)
        self._corrupt_seen: set[tuple[int, int]] = set()  # counted once, however often it is re-read

    # -- files --

    def segments(self) -> list[int]:
        out = []
        for p in self.dir.iterdir():
            n = p.name
            if n.startswith(_PREFIX) and n.endswith(_SUFFIX) and n[len(_PREFIX):-len(_SUFFIX)].isdigit():
                out.append(int(n[len(_PREFIX):-len(_SUFFIX)]))
        return sorted(out)

    def path(self, seq: int) -> Path:
        return self.dir / _seg_name(seq)

    def size(self) -> int:
        total = 0
        for s in self.segments():
            with contextlib.suppress(FileNotFoundError):
                total += self.path(s).stat().st_size
        return total - (self.cursor_off if self.path(self.cursor_seq).exists() else 0)

    def _load_cursor(self) -> tuple[int, int]:
        try:
            d = json.loads((self.dir / "cursor.json").read_text())
            return int(d["seq"]), int(d["offset"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0

    def _save_cursor(self) -> None:
        tmp = self.dir / "cursor.json.tmp"
        with self._open(tmp, "wb") as f:
            f.write(json.dumps({"seq": self.cursor_seq, "offset": self.cursor_off}).encode())
        os.replace(tmp, self.dir / "cursor.json")

    # -- writing --

    def append(self, lines: list[bytes]) -> None:
        """Append records and fsync once for the whole batch. On an OSError (a full disk) the
        segment is given up, so a line it cut short stays isolated as after a crash, and the
        caller keeps `lines` and calls again (records may then be spooled twice: their ids
        make the resend harmless)."""
        try:
            if self._fh is None:
                self._fh = self._open(self.path(self.write_seq), "ab")
            for line in lines:
                self._fh.write(line)
                if self._fh.tell() >= self.segment_bytes:
                    self._rotate()
            if self._fh is not None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
        except OSError:
            self._abandon()
            raise

    def _abandon(self) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()  # flushes what it can; the rest of the buffer is lost with the file object
            self.write_seq += 1

    def _rotate(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self._fh = None
        self.write_seq += 1
        self._fh = self._open(self.path(self.write_seq), "ab")

    def close(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())
            self._fh.close()
            self._fh = None

    # -- reading and acknowledging --

    def read_batch(self, max_records: int, max_bytes: int) -> tuple[list[dict[str, Any]], tuple[int, int]]:
        """Records from the cursor on (in order), and the position just after them."""
        out: list[dict[str, Any]] = []
        size = 0
        seq, off = self.cursor_seq, self.cursor_off
        for s in [x for x in self.segments() if x >= seq]:
            if s != seq:
                seq, off = s, 0
            try:
                with open(self.path(s), "rb") as f:
                    f.seek(off)
                    data = f.read()  # segments are small (segment_bytes), so read the rest whole
            except FileNotFoundError:
                continue
            pos = 0
            while (nl := data.find(b"\n", pos)) >= 0:
                line = data[pos:nl]
                if out and (len(out) >= max_records or size + len(line) > max_bytes):
                    return out, (seq, off + pos)
                pos = nl + 1
                try:
                    rec = json.loads(line)
                    if not isinstance(rec, dict) or "id" not in rec:
                        raise ValueError("not a record")
                except ValueError:
                    self._corrupt(s, off + pos - len(line) - 1, line)
                    continue
                out.append(rec)
                size += len(line)
            if s == self.write_seq:
                return out, (seq, off + pos)
            if pos < len(data):
                self._corrupt(s, off + pos, data[pos:])  # a last line without newline in a closed segment: cut by a crash
            off += len(data)
        return out, (seq, off)

    def _corrupt(self, seq: int, offset: int, line: bytes) -> None:
        if (seq, offset) in self._corrupt_seen:
            return  # read again after a failed delivery: already counted and logged
        self._corrupt_seen.add((seq, offset))
        self.stats_corrupt += 1
        if len(self.corrupt_notes) < MAX_CORRUPT_NOTES:
            self.corrupt_notes.append((_seg_name(seq), offset, line[:200]))

    def ack(self, pos: tuple[int, int]) -> None:
        """Everything before `pos` is delivered: move the cursor, delete finished segments.

        The segments go even when the cursor cannot be saved (a full disk): that frees the space,
        and a restart then resumes at the first segment left, whose records are all undelivered."""
        self.cursor_seq, self.cursor_off = pos
        self._corrupt_seen = {k for k in self._corrupt_seen if k[0] >= self.cursor_seq}
        try:
            self._save_cursor()
        finally:
            for s in self.segments():
                if s < self.cursor_seq:
                    with contextlib.suppress(FileNotFoundError):
                        self.path(s).unlink()

    # -- bounding --

    def enforce_bound(self) -> int:
        """Fold the oldest segments into summary records until the spool fits; returns records folded."""
        folded = 0
        while self.size() > self.max_bytes:
            segs = [s for s in self.segments() if s >= self.cursor_seq]
            if len(segs) < 2:
                if self._fh is not None and segs and segs[0] == self.write_seq:
                    self._rotate()  # let the current segment be summarised too
                    continue
                break
            first, second = segs[0], segs[1]
            recs, _ = self._records_of(first, self.cursor_off if first == self.cursor_seq else 0)
            target = [first]
            if _is_summary_only(recs):
                # Already a summary: fold the next segment into it, closing the current one if need be.
                if second == self.write_seq:
                    if self._fh is not None and self._fh.tell() > 0:
                        self._rotate()
                        continue
                    break
                more, _ = self._records_of(second, 0)
                recs += more
                target.append(second)
            summary = summarise(recs)
            folded += sum(1 for r in recs if r.get("type") != "summary")
            tmp = self.dir / "summary.tmp"
            with self._open(tmp, "wb") as f:
                f.write(json.dumps(summary, separators=(",", ":")).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(target[-1]))
            for s in target[:-1]:
                self.path(s).unlink()
            self.cursor_seq, self.cursor_off = target[-1], 0
            self._save_cursor()
        return folded

    def _records_of(self, seq: int, off: int) -> tuple[list[dict[str, Any]], int]:
        try:
            data = self.path(seq).read_bytes()[off:]
        except FileNotFoundError:
            return [], 0
        out = []
        for line in data.split(b"\n"):
            if not line:
                continue
            with contextlib.suppress(ValueError):
                rec = json.loads(line)
                if isinstance(rec, dict):
                    out.append(rec)
        return out, len(data)


def _is_summary_only(recs: list[dict[str, Any]]) -> bool:
    return bool(recs) and all(r.get("type") == "summary" for r in recs)


def record_key(rec: dict[str, Any]) -> str:
    """What a record counts as in a summary: event:<kind>:<code>, transition:<check>:<status>, report."""
    t = rec.get("type")
    if t == "event":
        ev = rec.get("event") or {}
        return f"event:{ev.get('kind', '?')}:{ev.get('code', '?')}"
    if t == "transition":
        new = rec.get("new") or {}
        return f"transition:{new.get('check', '?')}:{new.get('status', '?')}"
    return str(t)


def summarise(recs: list[dict[str, Any]]) -> dict[str, Any]:
    counts: dict[str, int] = {}
    first, last, n = float("inf"), 0.0, 0
    for r in recs:
        t = float(r.get("time", 0.0))
        if r.get("type") == "summary":
            for k, v in (r.get("counts") or {}).items():
                counts[k] = counts.get(k, 0) + int(v)
            n += int(r.get("count", 0))
            first = min(first, float(r.get("first", t)))
            last = max(last, float(r.get("last", t)))
            continue
        key = record_key(r)
        counts[key] = counts.get(key, 0) + 1
        n += 1
        first, last = min(first, t), max(last, t)
    return {"id": uuid.uuid4().hex, "type": "summary", "time": last, "first": first if n else 0.0, "last": last,
            "count": n, "counts": counts}


class Publisher(Sink):
    """As the agent's sink: transitions and events are spooled as they come; `report()` (the
    node report, None before the first judgement) is spooled after each burst of transitions."""

    name = "publisher"

    def __init__(self, cfg: PublishConfig, node: str, *, fsync_batch: float = 0.05,
                 max_backoff: float = 30.0, sequencer: Sequencer | None = None,
                 spool_opener: Opener | None = None,
                 report: Callable[[], NodeReport | None] | None = None) -> None:
        self.cfg = cfg
        self._report = report
        self._report_timer: asyncio.TimerHandle | None = None
        self.node = node
        # Stamps each record with (boot_id, seq) when it is published, so the aggregator orders
        # it among heartbeats by the agent's own sequence, not by its wall clock (sequence.py).
        self.sequencer = sequencer
        self.enabled = bool(cfg.urls())
        self.replicas = Replicas(cfg.urls(), "/v1/events")
        self.stats = PublisherStats()
        self._spool: Spool | None = None
        self._lock = asyncio.Lock()
        self._buf: list[bytes] = []
        self._have_new = asyncio.Event()
        self._have_spooled = asyncio.Event()
        self._fsync_batch = fsync_batch
        self._max_backoff = max_backoff
        self._tasks: list[asyncio.Task[Any]] = []
        self._session: aiohttp.ClientSession | None = None
        self._batch_bytes = BATCH_BYTES
        self._running = False
        self._reachable = False  # the last delivery succeeded
        self._opener = spool_opener
        self._buf_bytes = 0
        self._memory_max = max(64 * 1024, min(MEMORY_MAX_BYTES, cfg.spool_max_bytes))
        self._retry = self._fsync_batch
        self._read_failing = False
        self._urgent = False  # a FAIL waits in the buffer: spool and send it without the batch wait

    @property
    def connected(self) -> bool:
        """What `publish_connected` exports: records get through, i.e. the last delivery
        succeeded AND new records can be spooled (a full spool disk delivers nothing new)."""
        return self._reachable and not self.stats.spool_failing

    # -- lifecycle --

    async def start(self) -> None:
        if not self.enabled:
            return
        self._spool = await offload(Spool, Path(self.cfg.spool_dir), self.cfg.spool_max_bytes,
                                              self._opener)
        self.stats.spool_bytes = await offload(self._spool.size)
        self._session = aiohttp.ClientSession()
        self._running = True
        self._have_spooled.set()  # whatever an earlier run left behind
        self._tasks = [asyncio.create_task(self._flusher(), name="publisher-flush"),
                       asyncio.create_task(self._sender(), name="publisher-send")]

    async def stop(self, drain: float = 2.0) -> None:
        """Flush to disk (nothing published is lost), try to deliver for up to `drain` seconds, stop."""
        if self._report_timer is not None:
            self._report_timer.cancel()
            self._report_timer = None
        if not self.enabled or not self._running:
            return
        await self._flush()
        if drain > 0:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._drained(), drain)
        self._running = False
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._flush()
        if self._buf:
            log.error("records lost at exit: the spool could not be written", records=len(self._buf),
                      error=self.stats.spool_failing)
        if self._spool is not None:
            async with self._lock:
                await offload(self._spool.close)
        if self._session is not None:
            await self._session.close()

    async def _drained(self) -> None:
        while self._buf or (self._spool is not None and self.stats.spool_bytes > 0):
            await asyncio.sleep(0.02)

    # -- publishing (non-blocking: append to a buffer the flusher writes) --

    def _put(self, rec: dict[str, Any]) -> None:
        if not self.enabled:
            return
        if self.sequencer is not None:
            self.sequencer.stamp(rec)
        line = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
        self._buf.append(line)
        self._buf_bytes += len(line)
        self.stats.published += 1
        if self._buf_bytes > self._memory_max:
            self._fold_memory()
        self.stats.memory_bytes = self._buf_bytes
        self._have_new.set()

    def _fold_memory(self) -> None:
        """Records waiting in memory (the spool cannot take them) over the bound: the oldest
        become one summary record, as the spool does with its oldest segments."""
        keep = self._memory_max // 2
        total, cut = self._buf_bytes, 0
        while cut < len(self._buf) - 1 and total > keep:
            total -= len(self._buf[cut])
            cut += 1
        recs = []
        for line in self._buf[:cut]:
            with contextlib.suppress(ValueError):
                recs.append(json.loads(line))
        summary = json.dumps(summarise(recs), separators=(",", ":")).encode() + b"\n"
        self._buf[:cut] = [summary]
        self._buf_bytes = total + len(summary)
        folded = sum(1 for r in recs if r.get("type") != "summary")
        self.stats.summarised += folded
        log.warning("spool unwritable: oldest records in memory summarised", records=folded,
                    memory_bytes=self._buf_bytes, error=self.stats.spool_failing)

    def publish_event(self, ev: Event) -> None:
        self._put({"id": ev.id, "type": "event", "time": ev.time, "event": ev.to_json()})

    def publish_transition(self, old: CheckResult | None, new: CheckResult, at: float | None = None) -> None:
        """`at`: when the transition was judged (the evaluation time, as reports carry it). A turn
        to FAIL is written and sent at once: the aggregator may fence on it, and waiting for a
        burst to gather only delays the fence (it is one record and one fsync)."""
        if new.status is Status.FAIL:
            self._urgent = True
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

    # -- flushing to disk --

    async def _flusher(self) -> None:
        while self._running:
            if self.stats.spool_failing:
                # Retry on a backoff even when nothing new is published: the disk may have room again.
                await asyncio.sleep(self._retry * (0.5 + random.random()))
                self._retry = min(self._retry * 2, self._max_backoff)
            else:
                await self._have_new.wait()
                self._have_new.clear()
                if not self._urgent:
                    await asyncio.sleep(self._fsync_batch)  # let a burst gather into one fsync
                self._urgent = False
            await self._flush()

    async def _flush(self) -> None:
        if not self._buf or self._spool is None:
            return
        lines, self._buf, self._buf_bytes = self._buf, [], 0
        spool = self._spool
        try:
            async with self._lock:
                await offload(spool.append, lines)
        except OSError as e:
            # Keep them, oldest first, ahead of what was published meanwhile; bounded by folding.
            self._buf[:0] = lines
            self._buf_bytes = sum(map(len, self._buf))
            self._spool_error(e)
            if self._buf_bytes > self._memory_max:
                self._fold_memory()
            self.stats.memory_bytes = self._buf_bytes
            return
        self.stats.memory_bytes = self._buf_bytes
        if self.stats.spool_failing:
            log.info("spool writable again", dir=str(spool.dir), error_was=self.stats.spool_failing)
            self.stats.spool_failing = ""
        self._retry = self._fsync_batch
        try:
            async with self._lock:
                folded = await offload(spool.enforce_bound)
                self.stats.spool_bytes = await offload(spool.size)
        except OSError as e:
            folded = 0
            self._count_error(e)  # the records are spooled; only the bound waits for the next flush
        if folded:
            self.stats.summarised += folded
            log.warning("spool full: oldest records summarised", records=folded, spool_bytes=self.stats.spool_bytes)
        self._have_spooled.set()

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
        new = spool.stats_corrupt - self.stats.corrupt
        notes, spool.corrupt_notes = spool.corrupt_notes, []
        self.stats.corrupt = spool.stats_corrupt
        if new <= 0:
            return
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
        backoff = 0.2
        while self._running:
            await self._have_spooled.wait()
            spool = self._spool
            assert spool is not None
            try:
                recs, pos = await self._spool_call(spool.read_batch, BATCH_RECORDS, self._batch_bytes)
                self._note_corrupt(spool)
                if not recs:
                    if pos != (spool.cursor_seq, spool.cursor_off):
                        await self._spool_call(spool.ack, pos)  # skipped corrupt lines only
                        continue
                    self._have_spooled.clear()
                    self.stats.spool_bytes = await self._spool_call(spool.size)
                    continue
                ok = await self._deliver(recs)
                if ok:
                    backoff = 0.2
                    self.stats.delivered += len(recs)
                    await self._spool_call(spool.ack, pos)
                    self.stats.spool_bytes = await self._spool_call(spool.size)
                    continue
            except OSError:  # counted and logged by _spool_call: back off, as after a failed delivery
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, self._max_backoff)
                continue
            self.stats.send_failures += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self._max_backoff)

    async def _post(self, recs: list[dict[str, Any]]) -> tuple[int, str]:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {self.cfg.token}"} if self.cfg.token else {}
        body = {"node": self.node, "events": recs}
        session = self._session

        async def send(url: str) -> tuple[int, str]:
            try:
                timeout = aiohttp.ClientTimeout(total=self.cfg.timeout)
                async with session.post(url, json=body, headers=headers, timeout=timeout) as r:
                    return r.status, (await r.text())[:500]
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                return 0, f"{type(e).__name__}: {e}"
        return await self.replicas.post(send)

    @property
    def url(self) -> str:
        """The replica delivering now (the first listed until one fails)."""
        return self.replicas.url

    @url.setter
    def url(self, value: str) -> None:
        """One full URL to push to (tests point an existing object at a server they started)."""
        self.replicas = Replicas([value], "")

    async def _deliver(self, recs: list[dict[str, Any]]) -> bool:
        status, text = await self._post(recs)
        if status == 200:
            if not self._reachable:
                log.info("aggregator reachable: delivering", url=self.url)
            self._reachable = True
            return True
        if self._reachable:
            log.warning("aggregator unreachable: spooling", url=self.url, status=status, error=text)
        self._reachable = False
        if status == 413 and len(recs) > 1:
            self._batch_bytes = max(4096, self._batch_bytes // 2)
            return False
        if status == 400:
            return await self._isolate(recs)
        return False  # 401/403/5xx/unreachable: keep everything and retry later

    async def _isolate(self, recs: list[dict[str, Any]]) -> bool:
        """The aggregator refused the batch as malformed: find the bad records, keep them aside."""
        for rec in recs:
            status, text = await self._post([rec])
            if status == 400:
                self.stats.rejected += 1
                log.error("aggregator rejected a record; kept in rejected.jsonl", id=rec.get("id"), error=text)
                assert self._spool is not None
                line = json.dumps({"record": rec, "error": text}, separators=(",", ":")) + "\n"
                await offload(_append, self._spool.dir / "rejected.jsonl", line)
            elif status != 200:
                return False
        return True


def _binary_open(path: Path, mode: str) -> IO[bytes]:
    return open(path, mode)  # noqa: SIM115 - the caller closes it


def errno_reason(e: OSError) -> str:
    """The label of a spool error: the errno's name (ENOSPC, EIO, EDQUOT), else the type."""
    return errno.errorcode.get(e.errno or 0, type(e).__name__)


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
