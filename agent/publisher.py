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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from podhealth import log as plog
from podhealth.agent.sequence import Sequencer
from podhealth.config import PublishConfig
from podhealth.vocab import CheckResult, Event, NodeReport

log = plog.get("podhealth.publisher")
_PREFIX, _SUFFIX = "seg-", ".jsonl"
BATCH_RECORDS = 500
BATCH_BYTES = 256 * 1024


@dataclass
class PublisherStats:
    published: int = 0
    delivered: int = 0
    summarised: int = 0  # records folded into summary records
    rejected: int = 0  # records the aggregator refused as malformed (kept in rejected.jsonl)
    corrupt: int = 0  # unreadable spool lines (a write cut short by a crash)
    send_failures: int = 0
    spool_bytes: int = 0


def _seg_name(seq: int) -> str:
    return f"{_PREFIX}{seq:012d}{_SUFFIX}"


class Spool:
    """The segment files. Synchronous; the Publisher calls it from a worker thread under a lock."""

    def __init__(self, directory: Path, max_bytes: int) -> None:
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
        tmp.write_text(json.dumps({"seq": self.cursor_seq, "offset": self.cursor_off}))
        os.replace(tmp, self.dir / "cursor.json")

    # -- writing --

    def append(self, lines: list[bytes]) -> None:
        """Append records and fsync once for the whole batch."""
        if self._fh is None:
            self._fh = open(self.path(self.write_seq), "ab")
        for line in lines:
            self._fh.write(line)
            if self._fh.tell() >= self.segment_bytes:
                self._rotate()
        if self._fh is not None:
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def _rotate(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        self.write_seq += 1
        self._fh = open(self.path(self.write_seq), "ab")

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
                    self.stats_corrupt += 1
                    continue
                out.append(rec)
                size += len(line)
            if s == self.write_seq:
                return out, (seq, off + pos)
            if pos < len(data):
                self.stats_corrupt += 1  # a last line without newline in a closed segment: cut by a crash
            off += len(data)
        return out, (seq, off)

    def ack(self, pos: tuple[int, int]) -> None:
        """Everything before `pos` is delivered: move the cursor, delete finished segments."""
        self.cursor_seq, self.cursor_off = pos
        self._save_cursor()
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
            with open(tmp, "wb") as f:
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


class Publisher:
    def __init__(self, cfg: PublishConfig, node: str, *, fsync_batch: float = 0.05,
                 max_backoff: float = 30.0, sequencer: Sequencer | None = None) -> None:
        self.cfg = cfg
        self.node = node
        # Stamps each record with (boot_id, seq) when it is published, so the aggregator orders
        # it among heartbeats by the agent's own sequence, not by its wall clock (sequence.py).
        self.sequencer = sequencer
        self.enabled = bool(cfg.aggregator_url)
        self.url = cfg.aggregator_url.rstrip("/") + "/v1/events"
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
        self.connected = False

    # -- lifecycle --

    async def start(self) -> None:
        if not self.enabled:
            return
        self._spool = await asyncio.to_thread(Spool, Path(self.cfg.spool_dir), self.cfg.spool_max_bytes)
        self.stats.spool_bytes = await asyncio.to_thread(self._spool.size)
        self._session = aiohttp.ClientSession()
        self._running = True
        self._have_spooled.set()  # whatever an earlier run left behind
        self._tasks = [asyncio.create_task(self._flusher(), name="publisher-flush"),
                       asyncio.create_task(self._sender(), name="publisher-send")]

    async def stop(self, drain: float = 2.0) -> None:
        """Flush to disk (nothing published is lost), try to deliver for up to `drain` seconds, stop."""
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
        if self._spool is not None:
            async with self._lock:
                await asyncio.to_thread(self._spool.close)
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
        self._buf.append(json.dumps(rec, separators=(",", ":")).encode() + b"\n")
        self.stats.published += 1
        self._have_new.set()

    def publish_event(self, ev: Event) -> None:
        self._put({"id": ev.id, "type": "event", "time": ev.time, "event": ev.to_json()})

    def publish_transition(self, old: CheckResult | None, new: CheckResult, at: float | None = None) -> None:
        """`at`: when the transition was judged (the evaluation time, as reports carry it)."""
        self._put({"id": uuid.uuid4().hex, "type": "transition", "time": time.time() if at is None else at,
                   "old": old.to_json() if old is not None else None, "new": new.to_json()})

    def publish_report(self, rep: NodeReport) -> None:
        self._put({"id": uuid.uuid4().hex, "type": "report", "time": rep.time, "report": rep.to_json()})

    # -- flushing to disk --

    async def _flusher(self) -> None:
        while self._running:
            await self._have_new.wait()
            self._have_new.clear()
            await asyncio.sleep(self._fsync_batch)  # let a burst gather into one fsync
            await self._flush()

    async def _flush(self) -> None:
        if not self._buf or self._spool is None:
            return
        lines, self._buf = self._buf, []
        spool = self._spool
        async with self._lock:
            await asyncio.to_thread(spool.append, lines)
            folded = await asyncio.to_thread(spool.enforce_bound)
            self.stats.spool_bytes = await asyncio.to_thread(spool.size)
        if folded:
            self.stats.summarised += folded
            log.warning("spool full: oldest records summarised", records=folded, spool_bytes=self.stats.spool_bytes)
        self._have_spooled.set()

    # -- delivering --

    async def _sender(self) -> None:
        backoff = 0.2
        while self._running:
            await self._have_spooled.wait()
            spool = self._spool
            assert spool is not None
            async with self._lock:
                recs, pos = await asyncio.to_thread(spool.read_batch, BATCH_RECORDS, self._batch_bytes)
                self.stats.corrupt = spool.stats_corrupt
            if not recs:
                if pos != (spool.cursor_seq, spool.cursor_off):
                    async with self._lock:
                        await asyncio.to_thread(spool.ack, pos)  # skipped corrupt lines only
                    continue
                self._have_spooled.clear()
                self.stats.spool_bytes = await asyncio.to_thread(spool.size)
                continue
            ok = await self._deliver(recs)
            if ok:
                backoff = 0.2
                async with self._lock:
                    await asyncio.to_thread(spool.ack, pos)
                    self.stats.spool_bytes = await asyncio.to_thread(spool.size)
                self.stats.delivered += len(recs)
                continue
            self.stats.send_failures += 1
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, self._max_backoff)

    async def _post(self, recs: list[dict[str, Any]]) -> tuple[int, str]:
        assert self._session is not None
        headers = {"Authorization": f"Bearer {self.cfg.token}"} if self.cfg.token else {}
        body = {"node": self.node, "events": recs}
        try:
            timeout = aiohttp.ClientTimeout(total=self.cfg.timeout)
            async with self._session.post(self.url, json=body, headers=headers, timeout=timeout) as r:
                return r.status, (await r.text())[:500]
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
            return 0, f"{type(e).__name__}: {e}"

    async def _deliver(self, recs: list[dict[str, Any]]) -> bool:
        status, text = await self._post(recs)
        if status == 200:
            if not self.connected:
                log.info("aggregator reachable: delivering", url=self.url)
            self.connected = True
            return True
        if self.connected:
            log.warning("aggregator unreachable: spooling", url=self.url, status=status, error=text)
        self.connected = False
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
                await asyncio.to_thread(_append, self._spool.dir / "rejected.jsonl", line)
            elif status != 200:
                return False
        return True


def _append(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
