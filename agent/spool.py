"""What waits for the aggregator on the node: two lanes, each in memory and on disk, bounded.

A record belongs to one of two lanes (`lane_of`). The *priority* lane holds what can fence a
node: every verdict transition (all of them, so a check's FAIL and its later OK keep their
order) and fatal events (an XID or SXid whose catalog rule asks for a GPU reset or more, or is
critical; a GPU fallen off the bus). Everything else (routine XIDs, RAS lines, reports,
summaries of them) is *routine*. The publisher sends the priority lane first, and routine
records never push a priority one out: on disk the routine spool is bounded by what the
priority spool leaves of `spool_max_bytes`, and in memory each lane folds only its own oldest
records.

On disk each lane is a `Spool`: append-only segment files of JSON lines, fsync'd in batches,
deleted once delivered (the routine lane in `spool_dir`, the priority lane in
`spool_dir/priority`). Layout: `seg-000000000001.jsonl` …, `cursor.json` ({"seq", "offset"} of
the first undelivered byte), `rejected.jsonl` (records the aggregator refused as malformed).
Over its bound a spool folds its oldest segments into ONE summary record (counts per
kind/code): an outage costs detail, never the fact that something happened.

A full disk leaves nothing half-written: a batch whose write fails is cut back to where it
began (truncating needs no space), a temporary file whose write failed is removed, and at open
a segment whose last line was cut short (a crash) is cut back to its last whole line. Each such
repair is counted (`repaired`), so the bytes `spool_bytes` reports are the bytes on the disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Literal

from podhealth.checks.passive.xid import lookup, lookup_sxid
from podhealth.vocab import Action

Lane = Literal["priority", "routine"]
LANES: tuple[Lane, ...] = ("priority", "routine")  # the order they are sent in
_PREFIX, _SUFFIX = "seg-", ".jsonl"
_TMP = ".tmp"
MAX_CORRUPT_NOTES = 16  # corrupt lines remembered for the log per read (the count has them all)
Opener = Callable[[Path, str], IO[bytes]]


# ---- which lane -----------------------------------------------------------------------------

def lane_of(rec: dict[str, Any]) -> Lane:
    """The lane of a record as published (see the module's docstring)."""
    t = rec.get("type")
    if t == "transition":
        return "priority"
    if t == "event":
        ev = rec.get("event") or {}
        return "priority" if _fatal(str(ev.get("kind", "")), ev.get("code")) else "routine"
    return "routine"


def _fatal(kind: str, code: object) -> bool:
    if kind == "kernel":
        return True  # fallen off the bus
    if kind not in ("xid", "sxid") or isinstance(code, bool) or not isinstance(code, int):
        return False
    info = lookup(code) if kind == "xid" else lookup_sxid(code)
    return info.severity == "critical" or info.action.rank >= Action.RESET_GPU.rank


# ---- summaries ------------------------------------------------------------------------------

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


def summary_line(recs: list[dict[str, Any]]) -> bytes:
    return json.dumps(summarise(recs), separators=(",", ":")).encode() + b"\n"


def _is_summary_only(recs: list[dict[str, Any]]) -> bool:
    return bool(recs) and all(r.get("type") == "summary" for r in recs)


# ---- in memory ------------------------------------------------------------------------------

@dataclass
class MemoryLane:
    """Records (JSON lines) of one lane not yet on disk, oldest first, bounded by folding the
    oldest into a summary. Touched only from the event loop."""

    max_bytes: int
    lines: list[bytes] = field(default_factory=list)
    nbytes: int = 0
    busy: bool = False  # a batch of this lane is out (written or sent): the other side leaves the lane alone (order)
    inflight: int = 0  # records the sender took and has not settled (delivered, or put back)

    def add(self, line: bytes) -> None:
        self.lines.append(line)
        self.nbytes += len(line)

    def take(self, max_records: int | None = None, max_bytes: int | None = None) -> list[bytes]:
        """Remove and return the oldest lines (all of them by default)."""
        n, size = 0, 0
        while n < len(self.lines) and (max_records is None or n < max_records):
            if max_bytes is not None and n and size + len(self.lines[n]) > max_bytes:
                break
            size += len(self.lines[n])
            n += 1
        out, self.lines = self.lines[:n], self.lines[n:]
        self.nbytes -= size
        return out

    def put_back(self, lines: list[bytes]) -> None:
        """Lines taken and not delivered or written: ahead of what came meanwhile (they are older)."""
        self.lines[:0] = lines
        self.nbytes += sum(map(len, lines))

    def fold(self) -> int:
        """Over the bound: the oldest become one summary record; returns the records folded."""
        if self.nbytes <= self.max_bytes:
            return 0
        keep = self.max_bytes // 2
        total, cut = self.nbytes, 0
        while cut < len(self.lines) - 1 and total > keep:
            total -= len(self.lines[cut])
            cut += 1
        recs = []
        for line in self.lines[:cut]:
            with contextlib.suppress(ValueError):
                recs.append(json.loads(line))
        summary = summary_line(recs)
        self.lines[:cut] = [summary]
        self.nbytes = total + len(summary)
        return sum(1 for r in recs if r.get("type") != "summary")


# ---- on disk --------------------------------------------------------------------------------

def _seg_name(seq: int) -> str:
    return f"{_PREFIX}{seq:012d}{_SUFFIX}"


class Spool:
    """One lane's segment files. Synchronous; the Publisher calls it from a worker thread under a lock."""

    def __init__(self, directory: Path, max_bytes: int, opener: Opener | None = None) -> None:
        """`opener(path, mode)` opens every file the spool writes (default open(): a test passes
        one whose writes fail with ENOSPC)."""
        self._open: Opener = opener or _binary_open
        self.dir = directory
        self.max_bytes = max_bytes
        self.segment_bytes = max(4096, min(1024 * 1024, max_bytes // 8))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.repaired = 0  # half-written files cut back or removed (a full disk, a crash)
        self._repair_at_open()
        self.cursor_seq, self.cursor_off = self._load_cursor()
        segs = self.segments()
        # Always write a fresh segment after a restart: what an earlier run wrote stays as it was.
        self.write_seq = (segs[-1] + 1) if segs else max(1, self.cursor_seq)
        if self.cursor_seq < (segs[0] if segs else self.write_seq):
            self.cursor_seq, self.cursor_off = (segs[0] if segs else self.write_seq), 0
        self._fh: Any = None
        self.stats_corrupt = 0
        self.corrupt_reported = 0  # of stats_corrupt, how many the publisher has counted and logged
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
        self._replace(self.dir / "cursor.json",
                      json.dumps({"seq": self.cursor_seq, "offset": self.cursor_off}).encode(), fsync=False)

    def _replace(self, dest: Path, data: bytes, *, fsync: bool = True) -> None:
        """Write `data` to a temporary file and rename it over `dest`; a temporary that could
        not be written whole (a full disk) is removed, not left to hold the space."""
        tmp = dest.with_name(dest.name + _TMP)
        try:
            with self._open(tmp, "wb") as f:
                f.write(data)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, dest)
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
                self.repaired += 1
            raise

    def _repair_at_open(self) -> None:
        """What an earlier run left half-written: temporaries are removed, and a segment whose
        last line was cut short is cut back to its last whole line (only the crash's own line
        is lost; a line damaged in the middle is skipped and counted when read)."""
        for p in self.dir.iterdir():
            if p.name.endswith(_TMP) and p.is_file():
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
                    self.repaired += 1
        for s in self.segments():
            path = self.path(s)
            with open(path, "rb+") as f:
                end = f.seek(0, os.SEEK_END)
                if end == 0:
                    continue
                f.seek(end - 1)
                if f.read(1) == b"\n":
                    continue
                f.seek(0)
                whole = f.read().rfind(b"\n") + 1
                f.truncate(whole)
                self.repaired += 1

    def probe(self) -> None:
        """Raise OSError unless a page can be written and synced here (is the disk still full?)."""
        tmp = self.dir / ("probe" + _TMP)
        try:
            with self._open(tmp, "wb") as f:
                f.write(b"\0" * 4096)
                f.flush()
                os.fsync(f.fileno())
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()

    # -- writing --

    def append(self, lines: list[bytes]) -> None:
        """Append records and fsync once for the whole batch. On an OSError (a full disk) the
        segment being written is cut back to where this batch began in it, so nothing
        half-written holds space or reads back as corrupt, and the caller keeps `lines` and
        calls again (records that had reached an earlier segment are then spooled twice: their
        ids make the resend harmless)."""
        start = 0
        try:
            if self._fh is None:
                self._fh = self._open(self.path(self.write_seq), "ab")
            start = self._fh.tell()
            for line in lines:
                self._fh.write(line)
                if self._fh.tell() >= self.segment_bytes:
                    self._rotate()
                    start = 0
            if self._fh is not None:
                self._fh.flush()
                os.fsync(self._fh.fileno())
        except OSError:
            self._cut_back(start)
            raise

    def _cut_back(self, start: int) -> None:
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()  # may write part of its buffer: the truncate below takes it back
        path = self.path(self.write_seq)
        try:
            if path.stat().st_size > start:
                os.truncate(path, start)
                self.repaired += 1
        except FileNotFoundError:
            pass
        except OSError:
            self.write_seq += 1  # cannot cut it back: leave it, a later read skips its torn line

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
                self._corrupt(s, off + pos, data[pos:])  # a last line without newline in a closed segment
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

    def enforce_bound(self, max_bytes: int | None = None) -> int:
        """Fold the oldest segments into summary records until the spool fits `max_bytes`
        (default its own bound); returns the records folded."""
        bound = self.max_bytes if max_bytes is None else max_bytes
        folded = 0
        while self.size() > bound:
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
            folded += sum(1 for r in recs if r.get("type") != "summary")
            self._replace(self.path(target[-1]), summary_line(recs))
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


def _binary_open(path: Path, mode: str) -> IO[bytes]:
    return open(path, mode)  # noqa: SIM115 - the caller closes it


def errno_reason(e: OSError) -> str:
    """The label of a spool error: the errno's name (ENOSPC, EIO, EDQUOT), else the type."""
    return errno.errorcode.get(e.errno or 0, type(e).__name__)


def append_line(path: Path, line: str) -> None:
    with open(path, "a") as f:
        f.write(line)
        f.flush()
        os.fsync(f.fileno())
