"""kmsg: XID / SXid events from the kernel log (and NVML's XID event set), counted and kept.

Sources:
  - `cfg.paths.kmsg` as a character device (/dev/kmsg): one record per read(), non-blocking;
    EAGAIN means "no more now", EPIPE means the ring buffer overwrote records we had not read
    (counted by the gap in sequence numbers, and reading goes on from the oldest record still
    there). A FIFO carrying records in that format (the simulated node's kernel) is read the same
    way. The agent watches the descriptor (`readable_fd()`) and collects as soon as a record
    waits, so an XID reaches the checks without waiting for the collector's interval.
  - `cfg.paths.kmsg` as a regular file (a syslog / kern.log, a capture): followed like `tail -F`,
    by offset and inode, across truncation and rotation.
  - NVML's XID event set (nvmlEventTypeXidCriticalError), when NVML is usable. The kernel line is
    richer (pid, process, NVLink5 registers, XID 154's recovery action), so an XID seen both ways
    counts once and the kernel line is preferred: NVML events are held briefly and dropped when the
    matching kernel line shows up.
Host RAS lines (EDAC memory error summaries, `mce: [Hardware Error]`) become events too
(kind edac / mce, collectors/ras_parse.py); checks/host_errors.py judges them.
Collectors export raw facts: what an XID means is decided in checks/passive/xid.py. Every collect() is
bounded (records and bytes per call) and never blocks.
"""

from __future__ import annotations

import ctypes
import errno
import os
import stat
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Protocol

from podhealth.collectors.base import Collection, specs
from podhealth.collectors import ras_parse
from podhealth.collectors.xid_parse import LineAssembler, Malformed, ParsedLine, line_timestamps, normalise_pci
from podhealth.config import Config
from podhealth.vocab import Event, MetricSpec, Sample

MAX_RECORDS = 5000  # per collect(): a burst of 13s prints ~15 lines per fault; this is thousands of faults
MAX_BYTES = 4 * 1024 * 1024  # per collect() from a followed file
MAX_LINE = 64 * 1024  # a "line" longer than this without a newline is cut (never buffered forever)
DEDUP_S = 2.0  # an NVML XID and its kernel line further apart than this are two XIDs
NVML_HOLD_S = 2.0  # NVML events wait this long for their kernel line before standing alone
NVML_MAX_EVENTS = 256  # per collect()
NVML_WAIT_MS = 1  # nvmlEventSetWait timeout; the agent calls us every interval anyway


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
        while len(lines) < max_lines and used < budget:
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
            for p in parts:
                lines.append(p.decode("utf-8", "replace"))
        if len(lines) > max_lines:
            # Lines past the limit go back to the file position, not into a buffer.
            extra = lines[max_lines:]
            del lines[max_lines:]
            back = sum(len(x.encode("utf-8", "replace")) + 1 for x in extra) + len(self._partial)
            self._offset -= back
            self._partial = b""
            f.seek(self._offset)
            used -= back
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


# ---- NVML XID events ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NvmlXid:
    pci_bus_id: str
    gpu: int | None
    code: int
    time: float


class XidEventSource(Protocol):
    def poll(self, max_events: int) -> list[NvmlXid]: ...

    def gpu_index_by_pci(self) -> Mapping[str, int]: ...

    def close(self) -> None: ...


class NvmlUnusable(Exception):
    pass


class NvmlXidEvents:
    """pynvml event set for XID critical errors; `nvml` is the pynvml module (or a stand-in)."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.time, library_path: str = "") -> None:
        self._nvml = nvml
        self._clock = clock
        self._set: Any = None
        self._pci_by_key: dict[Any, str] = {}
        self._index_by_pci: dict[str, int] = {}
        self.notes: list[str] = []  # per-device registration problems, reported once
        if library_path and getattr(nvml, "nvmlLib", "absent") is None:
            try:
                nvml.nvmlLib = ctypes.CDLL(library_path)
            except OSError as e:
                raise NvmlUnusable(f"cannot load NVML library {library_path}: {e}") from e
        try:
            nvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError, missing library (OSError), anything
            raise NvmlUnusable(f"nvmlInit failed: {e}") from e
        try:
            self._setup()
        except Exception as e:  # noqa: BLE001
            self.close()
            raise NvmlUnusable(f"NVML XID events unavailable: {e}") from e

    def _setup(self) -> None:
        n = self._nvml
        self._set = n.nvmlEventSetCreate()
        registered = 0
        for i in range(n.nvmlDeviceGetCount()):
            try:
                h = n.nvmlDeviceGetHandleByIndex(i)
                pci = _nvml_pci(n, h)
                if pci:
                    self._index_by_pci[pci] = i
                    self._pci_by_key[_handle_key(h)] = pci
                n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, self._set)
                registered += 1
            except Exception as e:  # noqa: BLE001 - one GPU (lost, unsupported) must not stop the rest
                self.notes.append(f"GPU {i}: XID events not registered: {e}")
        if registered == 0:
            raise NvmlUnusable("no GPU accepted XID event registration")

    def gpu_index_by_pci(self) -> Mapping[str, int]:
        return dict(self._index_by_pci)

    def poll(self, max_events: int) -> list[NvmlXid]:
        n = self._nvml
        out: list[NvmlXid] = []
        while len(out) < max_events:
            try:
                data = n.nvmlEventSetWait_v2(self._set, NVML_WAIT_MS)
            except n.NVMLError_Timeout:
                break
            if not int(data.eventType) & int(n.nvmlEventTypeXidCriticalError):
                continue
            pci = self._pci_by_key.get(_handle_key(data.device)) or _nvml_pci(n, data.device)
            out.append(NvmlXid(pci, self._index_by_pci.get(pci), int(data.eventData), self._clock()))
        return out

    def close(self) -> None:
        n = self._nvml
        try:
            if self._set is not None:
                n.nvmlEventSetFree(self._set)
        except Exception:  # noqa: BLE001 - closing must not raise
            pass
        self._set = None
        try:
            n.nvmlShutdown()  # NVML reference-counts init/shutdown, so other users are unaffected
        except Exception:  # noqa: BLE001
            pass


def _nvml_pci(n: Any, handle: Any) -> str:
    try:
        info = n.nvmlDeviceGetPciInfo_v3(handle)
    except Exception:  # noqa: BLE001
        return ""
    raw = info.busId
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else str(raw)
    return normalise_pci(text.rstrip("\x00")) or ""


def _handle_key(h: Any) -> Any:
    try:
        return ctypes.cast(h, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(h)


def _default_nvml(cfg: Config) -> XidEventSource:
    try:
        import pynvml
    except ImportError as e:
        raise NvmlUnusable(f"pynvml not importable: {e}") from e
    return NvmlXidEvents(pynvml, library_path=cfg.paths.nvml_library)


# ---- the collector ------------------------------------------------------------------------------


@dataclass
class _Pending:
    """An event waiting to be matched against the other source (see DEDUP_S / NVML_HOLD_S)."""

    event: Event
    key: tuple[str, int]
    matched: bool = False


@dataclass
class _Counters:
    xid: dict[tuple[str, str, int], int] = field(default_factory=dict)  # (gpu, pci, code)
    sxid: dict[tuple[str, int], int] = field(default_factory=dict)
    ras: dict[tuple[str, str, str], int] = field(default_factory=dict)  # (kind, mc0/bank4, severity)
    lines: int = 0
    malformed: int = 0
    lost: int = 0
    nvml: int = 0


class KmsgCollector:
    name: ClassVar[str] = "kmsg"
    metrics: ClassVar[Mapping[str, MetricSpec]] = specs(
        MetricSpec("xid_events", "counter", "NVIDIA XID events (kernel log and NVML, counted once)"),
        MetricSpec("sxid_events", "counter", "NVSwitch SXid errors from the kernel log"),
        MetricSpec("ras_kernel_errors", "counter",
                   "Host memory / machine-check errors reported by EDAC summary and mce lines in the kernel log "
                   "(labels kind edac|mce, source mc0|bank4, severity corrected|uncorrected|unknown)"),
        MetricSpec("kmsg_lines", "counter", "Kernel log lines read"),
        MetricSpec("kmsg_malformed_lines", "counter", "NVRM Xid / NVSwitch SXid lines that did not parse"),
        MetricSpec("kmsg_records_lost", "counter", "Kernel log records overwritten before they were read"),
    )

    def __init__(
        self,
        cfg: Config,
        *,
        reader: LineReader | None = None,
        nvml: Callable[[], XidEventSource] | None = None,
        gpu_index_of: Callable[[str], int | None] | None = None,
        clock: Callable[[], float] = time.time,
        boot_time: Callable[[], float] | None = None,
        max_records: int = MAX_RECORDS,
        max_bytes: int = MAX_BYTES,
    ) -> None:
        kc = cfg.collectors.kmsg
        self._path = cfg.paths.kmsg
        self._reader = reader if reader is not None else open_reader(cfg.paths.kmsg, kc.from_start)
        self._clock = clock
        # printk timestamps are CLOCK_MONOTONIC-based; wall = boot + mono.
        self._boot = boot_time or (lambda: time.time() - time.monotonic())
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._assembler = LineAssembler()
        self._recent: deque[Event] = deque(maxlen=kc.keep_events)
        self._pending: dict[tuple[str, int], deque[_Pending]] = {}
        self._c = _Counters()
        self._gpu_index_of = gpu_index_of
        self._errors_once: list[str] = []
        self._reported: set[str] = set()
        self._nvml: XidEventSource | None = None
        self._nvml_factory = nvml
        self._nvml_tried = False

    # -- public ------------------------------------------------------------------------------

    @property
    def recent(self) -> tuple[Event, ...]:
        """The last `keep_events` events, oldest first."""
        return tuple(self._recent)

    def collect(self) -> Collection:
        now = self._clock()
        nvml = self._nvml_source()
        errors: list[str] = []
        batch = self._reader.read(self._max_records, self._max_bytes)
        self._c.lost += batch.lost
        if batch.error:
            if nvml is None:
                # Neither source can be read: this collection failed, and must say so (stale).
                raise OSError(batch.error)
            self._once(errors, batch.error)
        new: list[Event] = []
        year = time.localtime(now).tm_year
        boot = self._boot()
        for line in batch.lines:
            self._c.lines += 1
            p = self._assembler.feed(line, year=year)
            if isinstance(p, Malformed):
                self._c.malformed += 1
                continue
            if p is None:
                # Not NVIDIA's: host memory / machine-check lines become events of their own.
                ras = ras_parse.parse(line)
                if ras is not None:
                    new.append(self._ras_event(ras, line, now, boot, year))
                continue
            ev = self._event(p, now, boot, year)
            if ev.kind == "xid" and nvml is not None:
                # An NVML event for the same XID may be held waiting for this line: matching marks
                # it so it is never released, and the kernel line (pid, process, text) stands for
                # both. Either way this line is the one event reported.
                self._matches_pending(ev, source="nvml")
            new.append(ev)
        if nvml is not None:
            new.extend(self._nvml_events(nvml, now, errors))
        for ev in new:
            self._count(ev)
            self._recent.append(ev)
        errors.extend(self._errors_once)
        self._errors_once.clear()
        return Collection(self._samples(), tuple(new), tuple(errors))

    def readable_fd(self) -> int | None:
        """A descriptor that turns readable when kernel records wait (None for a followed file):
        the agent collects at once when it does, instead of waiting for the next interval."""
        fileno = getattr(self._reader, "fileno", None)
        return fileno() if fileno is not None else None

    def close(self) -> None:
        self._reader.close()
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    # -- internals ---------------------------------------------------------------------------

    def _once(self, errors: list[str], msg: str) -> None:
        if msg not in self._reported:
            self._reported.add(msg)
            errors.append(msg)

    def _nvml_source(self) -> XidEventSource | None:
        if self._nvml_tried:
            return self._nvml
        self._nvml_tried = True
        try:
            if self._nvml_factory is None:
                raise NvmlUnusable("NVML XID events disabled")
            self._nvml = self._nvml_factory()
        except NvmlUnusable as e:
            self._errors_once.append(f"NVML XID events off, kernel log only: {e}")
            self._reported.add("nvml")
            return None
        notes = getattr(self._nvml, "notes", ())
        self._errors_once.extend(notes)
        return self._nvml

    def _ras_event(self, r: ras_parse.RasLine, line: str, now: float, boot: float, year: int) -> Event:
        wall, mono = line_timestamps(line[:r.start], year)
        sub = None if r.uncorrected is None else int(r.uncorrected)
        return Event(kind=r.kind, code=r.count, time=self._when(wall, mono, now, boot, year), text=r.message,
                     device=r.source, subcode=sub, source="kmsg")

    def _event(self, p: ParsedLine, now: float, boot: float, year: int) -> Event:
        t = self._when(p.wall_time, p.mono_time, now, boot, year)
        pci = p.pci_bus_id if p.kind != "sxid" else ""
        kind = {"xid": "xid", "sxid": "sxid", "fallen_off_bus": "kernel"}[p.kind]
        return Event(
            kind=kind,  # type: ignore[arg-type]
            code=p.code, time=t, text=p.message, pci_bus_id=pci, gpu=self._gpu_of(pci), pid=p.pid,
            process=p.process, device=p.device, subcode=p.subcode, source="kmsg",
        )

    @staticmethod
    def _when(wall: float | None, mono: float | None, now: float, boot: float, year: int) -> float:
        t = wall
        if t is not None and t > now + 86400:
            # Only a syslog stamp (no year, so this year was assumed) lands a day or more in the
            # future: it was written last year, read across New Year.
            t -= (366 if _leap(year - 1) else 365) * 86400
        if t is None and mono is not None:
            t = min(boot + mono, now)
        return now if t is None else t

    def _gpu_of(self, pci: str) -> int | None:
        if not pci:
            return None
        if self._gpu_index_of is not None:
            return self._gpu_index_of(pci)
        if self._nvml is not None:
            return self._nvml.gpu_index_by_pci().get(pci)
        return None

    def _key(self, ev: Event) -> tuple[str, int]:
        return (ev.pci_bus_id or f"gpu{ev.gpu}", ev.code)

    def _matches_pending(self, ev: Event, source: str) -> bool:
        """Is there an unmatched `source` event for the same GPU and code within DEDUP_S?"""
        key = self._key(ev)
        waiting = self._pending.setdefault(key, deque(maxlen=1024))
        for p in waiting:
            if not p.matched and p.event.source == source and abs(p.event.time - ev.time) <= DEDUP_S:
                p.matched = True
                return True
        waiting.append(_Pending(ev, key))
        return False

    def _nvml_events(self, nvml: XidEventSource, now: float, errors: list[str]) -> list[Event]:
        try:
            got = nvml.poll(NVML_MAX_EVENTS)
        except Exception as e:  # noqa: BLE001 - NVML failing mid-run: keep the kernel log going
            self._once(errors, f"NVML XID event wait failed: {e}")
            got = []
        for x in got:
            self._c.nvml += 1
            ev = Event(kind="xid", code=x.code, time=x.time, text=f"NVML XID event {x.code}",
                       pci_bus_id=x.pci_bus_id, gpu=x.gpu if x.gpu is not None else self._gpu_of(x.pci_bus_id),
                       source="nvml")
            self._matches_pending(ev, source="kmsg")  # matched: the kernel line already counted it
        return self._release(now)

    def _release(self, now: float) -> list[Event]:
        """NVML events whose kernel line did not come within the hold time stand alone; entries
        older than any possible match are forgotten (this keeps the table small)."""
        out: list[Event] = []
        for key in list(self._pending):
            keep: deque[_Pending] = deque(maxlen=1024)
            for p in self._pending[key]:
                age = now - p.event.time
                if p.event.source == "nvml" and not p.matched and age >= NVML_HOLD_S:
                    out.append(p.event)
                elif age <= max(DEDUP_S, NVML_HOLD_S) * 2:
                    keep.append(p)
            if keep:
                self._pending[key] = keep
            else:
                del self._pending[key]
        return out

    def _count(self, ev: Event) -> None:
        if ev.kind == "xid":
            k = ("" if ev.gpu is None else str(ev.gpu), ev.pci_bus_id, ev.code)
            self._c.xid[k] = self._c.xid.get(k, 0) + 1
        elif ev.kind == "sxid":
            ks = (ev.device, ev.code)
            self._c.sxid[ks] = self._c.sxid.get(ks, 0) + 1
        elif ev.kind in ("edac", "mce"):
            kr = (ev.kind, ev.device, _RAS_SEVERITY[ev.subcode])
            self._c.ras[kr] = self._c.ras.get(kr, 0) + ev.code

    def _samples(self) -> tuple[Sample, ...]:
        out = [Sample.of("xid_events", n, gpu=g, pci_bus_id=pci, code=code)
               for (g, pci, code), n in sorted(self._c.xid.items())]
        out += [Sample.of("sxid_events", n, device=d, code=code) for (d, code), n in sorted(self._c.sxid.items())]
        out += [Sample.of("ras_kernel_errors", n, kind=k, source=src, severity=sev)
                for (k, src, sev), n in sorted(self._c.ras.items())]
        out += [
            Sample.of("kmsg_lines", self._c.lines),
            Sample.of("kmsg_malformed_lines", self._c.malformed),
            Sample.of("kmsg_records_lost", self._c.lost),
        ]
        return tuple(out)


_RAS_SEVERITY = {None: "unknown", 0: "corrected", 1: "uncorrected"}


def _leap(y: int) -> bool:
    return y % 4 == 0 and (y % 100 != 0 or y % 400 == 0)


def create(cfg: Config, **seams: Any) -> KmsgCollector:
    """Registry factory. Without a `nvml` seam, NVML's XID events are used when NVML is usable."""
    if "nvml" not in seams:
        seams["nvml"] = lambda: _default_nvml(cfg)
    return KmsgCollector(cfg, **seams)
