"""kmsg: XID / SXid events from the kernel log (and NVML's XID event set), counted and kept.

This module joins two sources into one stream of events:
  - the kernel log, read by collectors/kmsg_reader.py from `cfg.paths.kmsg` (/dev/kmsg, the
    simulated node's FIFO, or a followed log file); each line is parsed once, by
    collectors/xid_parse.py, and its Event carries what was parsed (Event.kernel). The agent
    watches the reader's descriptor (`readable_fd()`) and collects as soon as a record waits, so
    an XID reaches the checks without waiting for the collector's interval;
  - NVML's XID event set (collectors/nvml_events.py), when NVML is usable. The kernel line is
    richer (pid, process, NVLink5 registers, XID 154's recovery action), so an XID seen both ways
    counts once and the kernel line is preferred: NVML events are held briefly and dropped when the
    matching kernel line shows up.
Host RAS lines (EDAC memory error summaries, `mce: [Hardware Error]`, fatal PCIe AER) become
events too (kind edac / mce / aer, collectors/ras_parse.py); checks/passive/memory_ecc.py and
aer.py (kernel_aer) judge them.
Collectors export raw facts: what an XID means is decided in checks/passive/xid.py. Every collect() is
bounded (records and bytes per call) and never blocks.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping

from podhealth import log
from podhealth.collectors.base import Collection, specs
from podhealth.collectors import ras_parse
from podhealth.collectors.kmsg_reader import LineReader, open_reader
from podhealth.collectors.nvml_events import NvmlUnusable, XidEventSource, open_nvml_xid_events
from podhealth.collectors.xid_parse import (
    LineAssembler, Malformed, ParsedLine, event_of, line_timestamps, line_year_assumed,
)
from podhealth.config import Config
from podhealth.vocab import Event, KernelFields, MetricSpec, Sample

_log = log.get("podhealth.collectors.kmsg")
MAX_RECORDS = 5000  # per collect(): a burst of 13s prints ~15 lines per fault; this is thousands of faults
MAX_BYTES = 4 * 1024 * 1024  # per collect() from a followed file
DEDUP_S = 2.0  # an NVML XID and its kernel line further apart than this are two XIDs
NVML_HOLD_S = 2.0  # NVML events wait this long for their kernel line before standing alone
NVML_MAX_EVENTS = 256  # per collect()


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
    # Its own thread: a record on the descriptor starts a collection at once (the XID fast path),
    # never queued behind the other collectors on the shared lane (collectors/runtime.py).
    own_worker: ClassVar[bool] = True
    metrics: ClassVar[Mapping[str, MetricSpec]] = specs(
        MetricSpec("xid_events", "counter", "NVIDIA XID events (kernel log and NVML, counted once)"),
        MetricSpec("sxid_events", "counter", "NVSwitch SXid errors from the kernel log"),
        MetricSpec("ras_kernel_errors", "counter",
                   "Host memory / machine-check errors reported by EDAC summary and mce lines in the kernel log "
                   "and fatal PCIe AER lines (labels kind edac|mce|aer, source mc0|bank4|the PCI address, "
                   "severity corrected|uncorrected|unknown)"),
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
        # SXid records seen only through their continuation lines: one event each (the batch is
        # where a late header could still have claimed them)
        new.extend(self._event(p, now, boot, year) for p in self._assembler.drain())
        if nvml is not None:
            new.extend(self._nvml_events(nvml, now, errors))
        for ev in new:
            self._count(ev)
            self._recent.append(ev)
        if batch.lines:
            # The fence path's stage times (bench/fault_to_fence.py --trace reads them at debug level).
            _log.debug("kmsg read", lines=len(batch.lines), xids=sum(ev.kind == "xid" for ev in new), read_at=now)
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
        t = self._when(wall, mono, now, boot, line_year_assumed(line[:r.start]))
        return Event(kind=r.kind, code=r.count, time=t, text=r.message,
                     device=r.source, subcode=sub, source="kmsg")

    def _event(self, p: ParsedLine, now: float, boot: float, year: int) -> Event:
        t = self._when(p.wall_time, p.mono_time, now, boot, p.year_assumed)
        return event_of(p, at=t, gpu=self._gpu_of(p.pci_bus_id) if p.kind != "sxid" else None)

    @staticmethod
    def _when(wall: float | None, mono: float | None, now: float, boot: float, year_assumed: bool) -> float:
        t = wall
        if t is not None and year_assumed and t > now + 86400:
            # A syslog stamp (no year, so this year was assumed) a day or more in the future was
            # written last year, read across New Year. (A stamp that prints its year is not moved.)
            # The same calendar time a year earlier: not a count of days, which is off by one
            # whenever 29 February is not between the two (Dec 2024 -> Dec 2025 is 365 days).
            lt = time.localtime(t)
            t = time.mktime((lt.tm_year - 1, lt.tm_mon, lt.tm_mday, lt.tm_hour, lt.tm_min, lt.tm_sec, 0, 0, -1))
        if t is not None and t > now:
            # Still ahead: the logger's clock was (a node that booted with its RTC ahead, then
            # NTP stepped it back). An event is never later than its reading, else it would
            # stay in the verdict window for the skew on top of the window.
            t = now
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
            # NVML says only the GPU and the code: its fields are empty, not missing (no line to read).
            ev = Event(kind="xid", code=x.code, time=x.time, text=f"NVML XID event {x.code}",
                       pci_bus_id=x.pci_bus_id, gpu=x.gpu if x.gpu is not None else self._gpu_of(x.pci_bus_id),
                       source="nvml", kernel=KernelFields())
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
        elif ev.kind in ("edac", "mce", "aer"):
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


def create(cfg: Config, **seams: Any) -> KmsgCollector:
    """Registry factory. Without a `nvml` seam, NVML's XID events are used when NVML is usable."""
    if "nvml" not in seams:
        seams["nvml"] = lambda: open_nvml_xid_events(cfg.paths.nvml_library)
    return KmsgCollector(cfg, **seams)
