"""The kernel log as lines: /dev/kmsg records, a FIFO carrying them, or a followed log file.

  - `/dev/kmsg` (a character device): one record per read(), non-blocking; EAGAIN means "no more
    now", EPIPE means the ring buffer overwrote records we had not read (counted by the gap in
    sequence numbers, and reading goes on from the oldest record still there). A FIFO carrying
    records in that format (the simulated node's kernel) is read the same way. Its descriptor
    (`fileno()`) turns readable when records wait, so the agent can read on readiness instead of
    on an interval.
  - a regular file (a syslog / kern.log, a capture): followed like `tail -F`, by offset and inode,
    across truncation and rotation.
Every read is bounded (lines and bytes per call) and never blocks. What the lines say is not
read here: collectors/xid_parse.py and ras_parse.py do that, collectors/kmsg.py joins them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

MAX_LINE = 64 * 1024  # a "line" longer than this without a newline is cut (never buffered forever)


@dataclass(frozen=True, slots=True)
class ReadBatch:
    lines: tuple[str, ...] = ()
    lost: int = 0  # records the kernel overwrote before we read them
    error: str = ""  # why nothing could be read (source missing, permission)


class LineReader(Protocol):
    def read(self, max_lines: int, max_bytes: int) -> ReadBatch: ...

    def close(self) -> None: ...


# ---- /dev/kmsg, and streams that behave like it -------------------------------------------------


class KmsgDeviceReader:
    """/dev/kmsg, or a FIFO that carries records in its format (the simulated node's kernel log).

    /dev/kmsg returns exactly one record per read() ("pri,seq,usec,flags;text\\n KEY=val\\n...");
    a FIFO returns whatever bytes are there, so both are read the same way: bytes are split into
    lines, a line that starts with a space is a record's dictionary and is skipped, and a line cut
    at the end of a read waits for the rest. Reads never block (O_NONBLOCK): the agent learns that
    records are waiting from the descriptor's readiness (`fileno()`, poll(2) works on both).

    Records the kernel overwrote before we read them (EPIPE, then reading goes on from the oldest
    record left) or that did not fit our buffer (EINVAL: the kernel skips it) are counted as lost,
    by the gap in sequence numbers where there is one.
    """

    RECORD_BUF = 8192  # the kernel's record limit is ~1 KiB of text plus dictionary (CONSOLE_EXT_LOG_MAX)
    STREAM_BUF = 65536  # a FIFO holds 64 KiB by default: drain it in one read

    def __init__(self, path: Path, from_start: bool,
                 read_fn: Callable[[int, int], bytes] = os.read, fifo: bool = False) -> None:
        self._path = path
        self._from_start = from_start
        self._read = read_fn
        self._fifo = fifo
        self._fd: int | None = None
        self._last_seq = -1  # the newest sequence number read; a reopened /dev/kmsg repeats up to it
        self._gap_pending = False  # EPIPE/EINVAL seen: the next record's sequence number says how many
        self._partial = b""
        self._ready: deque[bytes] = deque()  # whole lines read past max_lines (a FIFO cannot take them back)

    def _open(self) -> int:
        if self._fifo:
            # O_RDWR: the FIFO then always has a writer (us), so a simulated kernel that closes its
            # end leaves us at EAGAIN instead of an endless EOF that poll() reports as readable.
            return os.open(self._path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        fd = os.open(self._path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        if not self._from_start:
            os.lseek(fd, 0, os.SEEK_END)  # /dev/kmsg: SEEK_END = after the newest record
        return fd

    def open(self) -> str:
        """Open now (it is opened on the first read otherwise); returns why not, or ""."""
        if self._fd is None:
            try:
                self._fd = self._open()
            except OSError as e:
                return f"cannot open {self._path}: {e.strerror or e}"
        return ""

    def fileno(self) -> int | None:
        """The open descriptor (readable when records wait), or None before the first open."""
        return self._fd

    def read(self, max_lines: int, max_bytes: int) -> ReadBatch:
        err = self.open()
        if err:
            return ReadBatch(error=err)
        assert self._fd is not None
        lines: list[str] = []
        lost = 0
        # Bounded: errors that read no record (EPIPE, EINVAL, EINTR) use up turns too.
        for _ in range(max_lines + 64):
            while self._ready and len(lines) < max_lines:
                lost += self._take(self._ready.popleft(), lines)
            if len(lines) >= max_lines:
                break
            try:
                chunk = self._read(self._fd, self.STREAM_BUF if self._fifo else self.RECORD_BUF)
            except BlockingIOError:
                break  # EAGAIN: nothing more right now
            except BrokenPipeError:
                self._gap_pending = True  # overwritten; the next read returns the oldest record left
                continue
            except InterruptedError:
                continue
            except OSError as e:
                if e.errno == errno.EINVAL:  # record larger than our buffer: the kernel skips it
                    self._gap_pending = True
                    continue
                self.close()
                return ReadBatch(tuple(lines), lost, f"reading {self._path}: {e.strerror or e}")
            if not chunk:
                break  # EOF: a FIFO opened read-only whose writer left; /dev/kmsg never ends
            self._split(chunk)
        return ReadBatch(tuple(lines), lost)

    def _split(self, chunk: bytes) -> None:
        parts = (self._partial + chunk).split(b"\n")
        self._partial = parts.pop()
        if len(self._partial) > MAX_LINE:
            parts.append(self._partial[:MAX_LINE])
            self._partial = b""
        self._ready.extend(p for p in parts if p and not p.startswith(b" "))  # " KEY=val": dictionary

    def _take(self, head: bytes, lines: list[str]) -> int:
        """Add one record line (unless a reopened /dev/kmsg repeats it); returns records lost before it."""
        lost = 0
        seq = _record_seq(head)
        if seq is not None:
            if seq <= self._last_seq:
                if not self._fifo:
                    return 0  # /dev/kmsg reopened from the start: already read
                self._last_seq = -1  # a FIFO never repeats: the writer started over (a new boot)
            if self._last_seq >= 0 and seq > self._last_seq + 1:
                lost = seq - self._last_seq - 1
            elif self._gap_pending and self._last_seq < 0:
                lost = 1  # no earlier number to measure the gap by
            self._last_seq = seq
        elif self._gap_pending:
            lost = 1
        self._gap_pending = False
        lines.append(head.decode("utf-8", "replace"))
        return lost

    def close(self) -> None:
        self._partial = b""
        self._ready.clear()
        if self._fd is not None:
            try:
                os.close(self._fd)
            finally:
                self._fd = None


def _record_seq(head: bytes) -> int | None:
    """Sequence number of a /dev/kmsg record ("pri,SEQ,usec,flags;text")."""
    parts = head.split(b";", 1)[0].split(b",")
    return int(parts[1]) if len(parts) >= 3 and parts[1].isdigit() else None


# ---- a followed file ----------------------------------------------------------------------------


class FileFollower:
    """`tail -F` for a log file: keeps its descriptor; notices truncation (size < offset) and
    rotation (the path now names another inode: the old file is read to its end first)."""

    def __init__(self, path: Path, from_start: bool) -> None:
        self._path = path
        self._from_start = from_start
        self._f: Any = None  # binary file object
        self._ino: tuple[int, int] | None = None
        self._offset = 0
        self._partial = b""
        self._opened_once = False

    def _open(self) -> str:
        try:
            f = open(self._path, "rb")  # noqa: SIM115 - kept open across calls, closed in close()
        except OSError as e:
            return f"cannot open {self._path}: {e.strerror or e}"
        st = os.fstat(f.fileno())
        self._f, self._ino, self._partial = f, (st.st_dev, st.st_ino), b""
        # Only the very first open may skip history; a rotated-in file is all new lines.
        self._offset = st.st_size if (not self._from_start and not self._opened_once) else 0
        self._opened_once = True
        f.seek(self._offset)
        return ""

    def _path_inode(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return (st.st_dev, st.st_ino)

    def read(self, max_lines: int, max_bytes: int) -> ReadBatch:
        if self._f is None:
            err = self._open()
            if err:
                return ReadBatch(error=err)
        lines: list[str] = []
        budget = max_bytes
        for _ in range(2):  # at most: drain the rotated-away file, then the new one
            budget -= self._drain(lines, max_lines, budget)
            if len(lines) >= max_lines or budget <= 0:
                break
            now_ino = self._path_inode()
            if now_ino is None or now_ino == self._ino:
                break
            # Rotated: the old file is fully read (we got less than the budget); switch over.
            self._flush_partial(lines)
            self.close()
            err = self._open()
            if err:
                return ReadBatch(tuple(lines), error=err)
        return ReadBatch(tuple(lines))

    def _drain(self, lines: list[str], max_lines: int, budget: int) -> int:
        f = self._f
        size = os.fstat(f.fileno()).st_size
        if size < self._offset:  # truncated in place (logrotate copytruncate, `> file`)
            self._offset, self._partial = 0, b""
            f.seek(0)
        used = 0
        raw: list[bytes] = []  # the lines as read: positions are counted in bytes, not characters
        room = max_lines - len(lines)  # a rotated-away file's lines may be there already
        while len(raw) < room and used < budget:
            chunk = f.read(min(65536, budget - used))
            if not chunk:
                break
            used += len(chunk)
            self._offset += len(chunk)
            data = self._partial + chunk
            parts = data.split(b"\n")
            self._partial = parts.pop()
            if len(self._partial) > MAX_LINE:
                parts.append(self._partial[:MAX_LINE])
                self._partial = b""
            raw.extend(parts)
        if len(raw) > room:
            # Lines past the limit go back to the file position, not into a buffer. Measured on the
            # bytes read: a decoded line is longer than its bytes wherever U+FFFD replaced an invalid
            # byte (1 byte -> 3), and seeking back by that went before the lines (or before 0).
            back = sum(len(x) + 1 for x in raw[room:]) + len(self._partial)
            del raw[room:]
            self._offset -= back
            self._partial = b""
            f.seek(self._offset)
            used -= back
        lines.extend(p.decode("utf-8", "replace") for p in raw)
        return max(used, 0)

    def _flush_partial(self, lines: list[str]) -> None:
        if self._partial:
            lines.append(self._partial.decode("utf-8", "replace"))
            self._partial = b""

    def close(self) -> None:
        if self._f is not None:
            try:
                self._f.close()
            finally:
                self._f = None


def open_reader(path: Path, from_start: bool) -> LineReader:
    """The record reader for a character device (/dev/kmsg) or a FIFO carrying kmsg records (the
    simulated node's), else a file follower (a syslog file, a capture)."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
            return KmsgDeviceReader(path, from_start, fifo=stat.S_ISFIFO(mode))
    except OSError:
        pass  # not there yet: follow it as a file once it appears
    return FileFollower(path, from_start)
