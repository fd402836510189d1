"""Pure parsers for NVIDIA kernel-log lines: NVRM Xid, NVSwitch SXid, "fallen off the bus".

Text in, frozen dataclasses out: no I/O and no clock. A line may arrive in any of the shapes the
kernel log is seen in: a /dev/kmsg record (`pri,seq,usec,flags;msg`), `dmesg` (`[  12.345]`),
`dmesg -T` / `--ctime` (`[Mon Jan  1 00:00:00 2024]`), `dmesg --time-format iso` with or without
`--decode` (`kern  :warn  : 2024-...`), syslog / journal (`Jan  1 00:00:00 host kernel: ...`) and
ISO-prefixed journal lines. The message is found by its marker, wherever the prefix ends, and the
prefix is then searched for a timestamp.

What a code *means* is not decided here (checks/passive/xid.py and the catalog do that); the parser only
extracts what the driver wrote: code, PCI address, pid, process name, and for the codes that
carry structured payloads (XID 144-150 NVLink5 registers, XID 154 recovery action, SXid
fatal/non-fatal) those fields too.
"""

from __future__ import annotations

import calendar
import re
import time
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Literal

# PCI addresses as the driver prints them ("PCI:0000:18:00", "0000:18:00.0", "18:00.0"): core/pci.py
from podhealth.pci import normalise as normalise_pci
from podhealth.vocab import Event, EventKind, KernelFields, Nvlink5Payload, RecoveryChange

ParsedKind = Literal["xid", "sxid", "fallen_off_bus"]

MAX_TEXT = 512  # an Xid 119 line with its RPC payload is ~200 chars; a runaway line is cut here

# ---- markers ------------------------------------------------------------------------------------

# "(?<![A-Za-z])" keeps "SXid (" from matching the Xid pattern. What is in the parentheses is a
# PCI address ("PCI:0000:3b:00.0", 20 characters): bounded, so that a line of "Xid (" repeated
# without a ")" is not read to its end again from every "Xid (" (64 KiB of them took seconds).
_XID = re.compile(r"(?:NVRM:\s*)?(?<![A-Za-z])Xid\s*\((?P<pci>[^)]{0,64})\)\s*:?\s*(?P<rest>.*)$")
_SXID = re.compile(r"(?:(?P<dev>nvidia-nvswitch\d*)\s*:\s*)?SXid\s*\((?P<pci>[^)]{0,64})\)\s*:?\s*(?P<rest>.*)$")
# A GPU the driver lost, in the resource manager's words (none of them an Xid line; the kernel-log
# path exists for when NVML hangs, so each fails the GPU as XID 79 does):
#   "GPU has fallen off the bus" (Xid 79's own text; the 570 open module prints it alone),
#   "Check failed: GPU lost from the bus [NV_ERR_GPU_IS_LOST]" (GSP-RM's RPC path, 535+; seen with
#     no Xid line in ../shared/fixtures/xid_kernel_logs/dmesg_nv_err_gpu_is_lost_*),
#   "RmInitAdapter failed!" / "rm_init_adapter failed" (the GPU could not be brought up: a Titan V
#     that "keeps disappearing", dmesg_ctime_titanv_rminitadapter_failed_*; only a reboot helps).
_FALLEN = re.compile(r"fallen\s+off\s+the\s+bus|GPU\s+lost\s+from\s+the\s+bus|NV_ERR_GPU_IS_LOST"
                     r"|\bRmInitAdapter\s+failed|\brm_init_adapter\s+failed", re.IGNORECASE)
_GSP_LOST = re.compile(r"GPU\s+lost\s+from\s+the\s+bus|NV_ERR_GPU_IS_LOST", re.IGNORECASE)
# Numbers are matched as ASCII digits of a bounded length: regex \d also takes other scripts'
# digits and int() refuses more than 4,300 digits; what no driver prints is "not a number".
_CODE = re.compile(r"^(?P<code>[0-9]{1,10})(?![\w])\s*(?P<rest>.*)$")

# "pid=1234, name=python3, detail"; pid may be '<unknown>' and the name may be <unknown>.
_PID_NAME = re.compile(
    r"^,?\s*(?:pid=(?P<pid>'[^']*'|[^,\s]*)\s*,?\s*)?(?:name=(?P<name>.*?)(?:,\s+|,$|$))?(?P<detail>.*)$"
)

# A GPU named in a non-Xid message: "NVRM: GPU 0000:29:00.0: ...", "The NVIDIA GPU 0000:b3:00.0".
_GPU_MENTION = re.compile(r"\bGPU\s+(?:at\s+PCI:)?((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")
_NVIDIA_GPU_LINE = re.compile(r"The NVIDIA GPU\s+((?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])")

# XID 144-150 (NVLink5): "<unit> <Fatal|Nonfatal> XC<n> i<n> Link <n> (<intrInfo> <errorStatus> ...)".
# The unit ends at a non-space: a lazy unit before "\s+" tried the spaces after every character
# again (a detail of 64 K spaces took seconds).
_NVLINK5 = re.compile(
    r"^(?P<unit>.*?\S)\s+(?P<sev>Fatal|Nonfatal|Non-fatal)\s+XC(?P<xc>[0-9]{1,10})\s+i(?P<inj>[0-9]{1,10})\s+Link\s+"
    r"(?P<link>-?[0-9]{1,10})"
    r"\s*(?:\((?P<regs>[^)]*))?",
    re.IGNORECASE,
)
_HEX = re.compile(r"\b0x[0-9a-fA-F]{1,16}\b")  # 64-bit registers; longer is not one
_WHOLE_REG = re.compile(r"0x[0-9a-fA-F]{8,16}")
# XID 154: "GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)".
# The names are bounded for the reason the PCI address is (_XID): "Node Reboot Required" is 20.
_RECOVERY = re.compile(
    r"recovery action changed from\s+(?P<fv>0x[0-9a-fA-F]{1,16}|[0-9]{1,10})\s*\((?P<fn>[^)]{0,128})\)\s*to\s+"
    r"(?P<tv>0x[0-9a-fA-F]{1,16}|[0-9]{1,10})\s*\((?P<tn>[^)]{0,128})\)",
    re.IGNORECASE,
)
_SXID_SEV = re.compile(r"^,?\s*(?P<sev>Fatal|Non-fatal|Nonfatal)\b", re.IGNORECASE)
_SXID_LINK = re.compile(r"\bLink\s+(?P<link>[0-9]{1,10})\b")
# NVSwitch prints one SXid as a header line plus "Severity ..." and "Data {...}" lines that repeat
# the code; those describe the header, they are not new errors.
_SXID_CONTINUATION = re.compile(r"^,?\s*(?:Severity\s+\d|Data\s*\{|SOE HALT data)", re.IGNORECASE)

# ---- timestamps ---------------------------------------------------------------------------------

_KMSG = re.compile(r"^\s*(?P<pri>[0-9]+),(?P<seq>[0-9]+),(?P<usec>[0-9]{1,20}),[^;]*;")
# "[ 1234.567890]"; `dmesg -d` adds the delta to the previous record: "[ 1234.567890 <    0.000004>]".
_MONO = re.compile(r"\[\s*(?P<sec>[0-9]{1,12}\.[0-9]{1,9})(?:\s*<\s*[0-9.]{1,22}>)?\s*\]")
_CTIME = re.compile(
    r"\[\s*(?:[A-Z][a-z]{2})\s+(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+"
    r"(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)\s+(?P<year>\d{4})\s*\]"
)
_ISO = re.compile(
    r"(?P<date>\d{4}-\d\d-\d\d)[T ](?P<time>\d\d:\d\d:\d\d)(?:[.,](?P<frac>\d+))?"
    r"(?P<tz>Z|[+-]\d\d:?\d\d)?", re.ASCII
)
# `journalctl -o short-precise` adds microseconds ("Dec 01 12:34:56.123456 host kernel: ..."): the
# fraction is allowed (and dropped: the whole second is enough to order an incident).
_SYSLOG = re.compile(
    r"^\s*(?:<[0-9]{1,3}>)?(?P<mon>[A-Z][a-z]{2})\s+(?P<day>\d{1,2})\s+(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)(?:\.[0-9]{1,9})?\s"
)
_MONTHS = {m: i for i, m in enumerate(calendar.month_abbr) if m}
# A syslog / journal header names the program that logged the line: "Jan 15 03:12:44 host
# kernel: ..." (also short-precise, ISO, "<4>" relayed). In /var/log/syslog or a plain
# `journalctl` export the same text also arrives from user space: a health daemon, NHC or a
# job script that logs the Xid line it saw ("gpud[812]: ... NVRM: Xid (...): 79, ..."), or
# `logger`. Only the kernel's copy is an XID; counting the echo too fences on a quotation.
_SYSLOG_SOURCE = re.compile(
    r"^\s*(?:<[0-9]{1,3}>)?(?:[A-Z][a-z]{2}\s+[0-9]{1,2}\s+[0-9]{2}:[0-9]{2}:[0-9]{2}(?:\.[0-9]{1,9})?"
    r"|[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}:[0-9]{2}(?:[.,][0-9]{1,9})?(?:Z|[+-][0-9]{2}:?[0-9]{2})?)"
    # `journalctl --no-hostname` drops the host: the tag may follow the time directly.
    r"\s+(?:(?P<bare>[^\s\[:]+)(?:\[[0-9]{1,10}\])?:\s|\S+\s+(?P<tag>[^\s\[:]+)(?:\[[0-9]{1,10}\])?:\s)"
)


@dataclass(frozen=True, slots=True)
class ParsedLine:
    kind: ParsedKind
    code: int  # 79 for a fallen-off-the-bus message without an Xid line
    pci_bus_id: str = ""  # normalised "0000:18:00.0"; "" when the line names none (or the SXid switch's)
    pid: int | None = None
    process: str = ""
    message: str = ""  # from the marker on (timestamp prefix dropped), cut to MAX_TEXT
    detail: str = ""  # what follows code / pid / name
    device: str = ""  # "nvswitch3" for SXid
    subcode: int | None = None  # NVLink5 IntrInfo, or XID 154's new recovery action value
    wall_time: float | None = None  # epoch seconds when the prefix carries a calendar time
    year_assumed: bool = False  # wall_time is a syslog stamp's, which prints no year: `year` was used
    mono_time: float | None = None  # seconds since boot when it carries a kernel timestamp
    fatal: bool | None = None  # SXid / NVLink5 "Fatal" vs "Non-fatal", None when the line says neither
    continuation: bool = False  # SXid "Severity ..." / "Data {...}" line belonging to a header
    link: int | None = None
    nvlink5: Nvlink5Payload | None = None
    recovery: RecoveryChange | None = None

    @property
    def kernel(self) -> KernelFields:
        """What an Event carries of this line for the rules (Event.kernel)."""
        return KernelFields(fatal=self.fatal, link=self.link, nvlink5=self.nvlink5, recovery=self.recovery)


@dataclass(frozen=True, slots=True)
class Malformed:
    """A line that is ours (it carries an Xid/SXid marker) but could not be read."""

    reason: str
    text: str


def is_candidate(line: str) -> bool:
    """True when the line carries an Xid/SXid marker, i.e. failing to parse it is a malformed line."""
    m = _SXID.search(line) or _XID.search(line)
    return m is not None and not _from_user_space(line[: m.start()])


def parse(line: str, *, year: int | None = None) -> ParsedLine | Malformed | None:
    """One line -> ParsedLine, Malformed (ours but unreadable), or None (not an XID/SXid line).

    `year` resolves syslog timestamps, which carry none; without it they yield no wall time.
    """
    line = line.rstrip("\r\n")
    m = _SXID.search(line)
    if m:
        return None if _from_user_space(line[: m.start()]) else _sxid(line, m, year)
    m = _XID.search(line)
    if m:
        return None if _from_user_space(line[: m.start()]) else _xid(line, m, year)
    f = _FALLEN.search(line)
    if f:
        return None if _from_user_space(line[: _message_start(line)]) else _fallen(line, year)
    return None


def _from_user_space(prefix: str) -> bool:
    """Does the syslog header before the marker name a program other than the kernel?"""
    h = _SYSLOG_SOURCE.match(prefix)
    return h is not None and (h.group("bare") or h.group("tag")) != "kernel"


def parse_line(line: str, *, year: int | None = None) -> ParsedLine | None:
    p = parse(line, year=year)
    return p if isinstance(p, ParsedLine) else None


_EVENT_KIND: dict[ParsedKind, EventKind] = {"xid": "xid", "sxid": "sxid", "fallen_off_bus": "kernel"}


def event_of(p: ParsedLine, *, at: float, gpu: int | None = None) -> Event:
    """The Event for a parsed line, carrying what was parsed (Event.kernel) so nothing parses it again.
    `at` is its resolved wall time (the collector's job: the line's stamps, boot time, New Year)."""
    return Event(
        kind=_EVENT_KIND[p.kind], code=p.code, time=at, text=p.message,
        pci_bus_id=p.pci_bus_id if p.kind != "sxid" else "",  # the SXid's address is the switch's: see device
        gpu=gpu, pid=p.pid, process=p.process, device=p.device, subcode=p.subcode, source="kmsg", kernel=p.kernel,
    )


def with_kernel_fields(ev: Event) -> Event:
    """`ev` carrying what this parser reads from its line (Event.kernel), for whoever judges it.

    The collector's events already carry it (the line was parsed once, in the collector). An older
    agent's event, or one built from text alone, carries none: its text is parsed here, by the same
    parser, so no rule ever reads the text itself.
    """
    if ev.kernel is not None or ev.kind not in ("xid", "sxid", "kernel"):
        return ev
    p = parse_line(ev.text)
    return replace(ev, kernel=p.kernel if p is not None else KernelFields())


def gpu_mention(line: str) -> str | None:
    """PCI address of "The NVIDIA GPU <addr>": the first line of a multi-line fallen-off-bus message."""
    m = _NVIDIA_GPU_LINE.search(line)
    return normalise_pci(m.group(1)) if m else None


def parse_nvlink5(detail: str) -> Nvlink5Payload | None:
    m = _NVLINK5.match(detail.strip())
    if not m:
        return None
    regs = _HEX.findall(m.group("regs") or "")
    if regs and not detail.rstrip().endswith(")") and not _WHOLE_REG.fullmatch(regs[-1]):
        # The line was cut (the kernel's ~1 KiB record limit, a syslog relay's line limit) inside
        # the register list: its last number is a register's first digits ("0x0000" of
        # "0x00000040"), and a wrong Error Status picks the wrong decode row. The driver prints
        # every register as 0x%08x, so a shorter last one is cut: keep the whole ones only.
        regs = regs[:-1]
    return Nvlink5Payload(
        unit=m.group("unit").strip(),
        fatal=m.group("sev").lower() == "fatal",
        cross_contain=int(m.group("xc")),
        injected=int(m.group("inj")),
        link=int(m.group("link")),
        registers=tuple(int(h, 16) for h in regs),
    )


def parse_recovery(detail: str) -> RecoveryChange | None:
    m = _RECOVERY.search(detail)
    if not m:
        return None
    return RecoveryChange(
        from_value=_int0(m.group("fv")), from_name=m.group("fn").strip(),
        to_value=_int0(m.group("tv")), to_name=m.group("tn").strip(),
    )


# ---- internals ----------------------------------------------------------------------------------


def _int0(text: str) -> int:
    """'0x2' or '2' (not int(x, 0), which refuses a decimal with a leading zero such as '02')."""
    return int(text, 16) if text[:2].lower() == "0x" else int(text, 10)


def _xid(line: str, m: re.Match[str], year: int | None) -> ParsedLine | Malformed:
    message = line[m.start():].strip()[:MAX_TEXT]
    c = _CODE.match(m.group("rest"))
    if not c:
        return Malformed("Xid code is not a number", message)
    pci = normalise_pci(m.group("pci")) or ""
    pid, process, detail = _pid_name(c.group("rest"))
    code = int(c.group("code"))
    nv5 = parse_nvlink5(detail) if 144 <= code <= 150 else None
    rec = parse_recovery(detail) if code == 154 else None
    subcode = nv5.intr_info if nv5 else rec.to_value if rec else None
    wall, mono = _timestamps(line[: m.start()], year)
    return ParsedLine(
        kind="xid", code=code, pci_bus_id=pci, pid=pid, process=process, message=message,
        detail=detail[:MAX_TEXT], subcode=subcode, wall_time=wall, mono_time=mono,
        year_assumed=wall is not None and _year_assumed(line[: m.start()]),
        fatal=nv5.fatal if nv5 else None, link=nv5.link if nv5 else None, nvlink5=nv5, recovery=rec,
    )


def _sxid(line: str, m: re.Match[str], year: int | None) -> ParsedLine | Malformed:
    message = line[m.start():].strip()[:MAX_TEXT]
    c = _CODE.match(m.group("rest"))
    if not c:
        return Malformed("SXid code is not a number", message)
    rest = c.group("rest")
    sev = _SXID_SEV.match(rest)
    fatal = None if not sev else sev.group("sev").lower() == "fatal"
    link = _SXID_LINK.search(rest)
    dev = m.group("dev") or ""
    # "nvidia-nvswitch3" -> "nvswitch3"; a line without the driver prefix is named by its PCI address.
    pci = normalise_pci(m.group("pci")) or ""
    device = dev.removeprefix("nvidia-") if dev else f"nvswitch@{pci}"
    wall, mono = _timestamps(line[: m.start()], year)
    return ParsedLine(
        kind="sxid", code=int(c.group("code")), message=message, detail=rest.lstrip(", ").strip()[:MAX_TEXT],
        device=device, wall_time=wall, mono_time=mono, fatal=fatal,
        year_assumed=wall is not None and _year_assumed(line[: m.start()]),
        continuation=bool(_SXID_CONTINUATION.match(rest)), link=int(link.group("link")) if link else None,
        pci_bus_id=pci,
    )


def _fallen(line: str, year: int | None) -> ParsedLine:
    start = _message_start(line)
    message = line[start:].strip()[:MAX_TEXT]
    g = _GPU_MENTION.search(line)
    pci = normalise_pci(g.group(1)) if g else None
    wall, mono = _timestamps(line[:start], year)
    return ParsedLine(kind="fallen_off_bus", code=79, pci_bus_id=pci or "", message=message,
                      detail=message, wall_time=wall, mono_time=mono,
                      year_assumed=wall is not None and _year_assumed(line[:start]))


def _message_start(line: str) -> int:
    """Where the message begins after any timestamp / facility prefix (for non-Xid lines)."""
    for marker in ("NVRM:", "[NVSentinel]", "XID ", "GPU has", "GPU "):
        i = line.find(marker)
        if i >= 0:
            return i
    k = _KMSG.match(line)
    return k.end() if k else 0


def _pid_name(rest: str) -> tuple[int | None, str, str]:
    m = _PID_NAME.match(rest)
    if not m:  # the pattern matches any string; this is only for the type checker
        return None, "", rest.strip()
    raw_pid = (m.group("pid") or "").strip("'")
    pid = int(raw_pid) if raw_pid.isascii() and raw_pid.isdigit() and len(raw_pid) <= 10 else None
    name = (m.group("name") or "").strip()
    process = "" if name in ("", "<unknown>") else name
    return pid, process, m.group("detail").strip()


def line_timestamps(prefix: str, year: int | None) -> tuple[float | None, float | None]:
    """(wall, mono) from a kernel-log line's prefix (the part before the message): the one
    timestamp reader for every kind of kernel line the kmsg collector turns into events."""
    return _timestamps(prefix, year)


def line_year_assumed(prefix: str) -> bool:
    """Is the wall time `line_timestamps` reads from this prefix a syslog stamp's (year assumed)?"""
    return _year_assumed(prefix)


def _year_assumed(prefix: str) -> bool:
    """Is the prefix's calendar time a syslog stamp (no year printed)? `_timestamps` prefers a
    `dmesg -T` or ISO stamp, which carry theirs, when the prefix has one."""
    return not _CTIME.search(prefix) and not _ISO.search(prefix) and bool(_SYSLOG.match(prefix))


def _timestamps(prefix: str, year: int | None) -> tuple[float | None, float | None]:
    """(wall, mono) from whatever the prefix carries. Calendar times from `dmesg -T` and syslog
    are local time (that is how dmesg and syslog print them); ISO times honour their offset."""
    mono: float | None = None
    k = _KMSG.match(prefix)
    if k:
        mono = int(k.group("usec")) / 1e6
    else:
        b = _MONO.search(prefix)
        if b:
            mono = float(b.group("sec"))
    c = _CTIME.search(prefix)
    if c:
        return _local(int(c.group("year")), _MONTHS.get(c.group("mon"), 0), c), mono
    i = _ISO.search(prefix)
    if i:
        return _iso(i), mono
    s = _SYSLOG.match(prefix)
    if s and year is not None:
        return _local(year, _MONTHS.get(s.group("mon"), 0), s), mono
    return None, mono


def _local(year: int, month: int, m: re.Match[str]) -> float | None:
    if not month:
        return None
    try:
        return time.mktime((year, month, int(m.group("day")), int(m.group("h")), int(m.group("m")),
                            int(m.group("s")), 0, 0, -1))
    except (OverflowError, ValueError):
        return None


def _iso(m: re.Match[str]) -> float | None:
    try:
        dt = datetime.strptime(f"{m.group('date')} {m.group('time')}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return None
    frac = m.group("frac")
    if frac:
        dt += timedelta(microseconds=int(frac[:6].ljust(6, "0")))
    tz = m.group("tz")
    if tz is None:
        return dt.timestamp()  # naive: local time, as journalctl prints it
    if tz == "Z":
        return dt.replace(tzinfo=timezone.utc).timestamp()
    sign = 1 if tz[0] == "+" else -1
    digits = tz[1:].replace(":", "")
    hours, minutes = int(digits[:2]), int(digits[2:])
    if hours > 23 or minutes > 59:  # not an offset (timezone() refuses a day or more)
        return None
    off = timedelta(hours=hours, minutes=minutes)
    return dt.replace(tzinfo=timezone(sign * off)).timestamp()


class LineAssembler:
    """Stateful glue for messages the kernel splits over several lines (still pure: no I/O, no clock).

    - "The NVIDIA GPU 0000:b3:00.0" / "(PCI ID ...) installed in this system has" / "fallen off the
      bus ...": the PCI address of the first line is given to the fallen-off-bus line.
    - NVSwitch "Severity ..." / "Data {...}" lines repeat the header's code: one record is one
      event. Near a header for the same switch and code (within LOOKBACK lines, or PAIR_S by their
      stamps) they are absorbed (None), before it or after it; alone (the header was lost), the
      record's continuation lines stand for the SXid once, from `drain()` at the end of the batch,
      so it is not missed.
    - A GPU falling off the bus is printed twice: the Xid 79 record, then the driver's own
      "NVRM: GPU 0000:91:00.0: GPU has fallen off the bus." (both real captures in
      ../shared/fixtures/xid_kernel_logs: the next line, 4 us later, same address). That second
      line is the same fault: it is absorbed (None) when an Xid 79 for the same PCI address came
      within the last few lines and, where both lines are stamped, within PAIR_S. Alone (no Xid
      line: the 570 open module's "The NVIDIA GPU ... has fallen off the bus", or the Xid record
      lost), it stands for the fault itself so it is never missed. An Xid 79 is never absorbed:
      it is the catalogued record (the metric, the match with NVML's event).
    """

    LOOKBACK = 16  # lines; NVSwitch interleaves several switches' lines within a few records
    PAIR_S = 2.0  # an Xid 79 and a bus line of the same GPU stamped further apart are two faults
    LOST_ECHO_S = 60.0  # GSP-RM's address-less "GPU lost" lines this soon after a lost GPU are its echo

    def __init__(self) -> None:
        self._n = 0
        self._gpu_at: tuple[int, str, float | None, float | None, bool] | None = None
        self._headers: dict[tuple[str, int], tuple[int, float | None, float | None]] = {}  # (line, wall, mono)
        # continuation lines still waiting for their header: key -> [(where, first line, kinds seen)]
        self._orphans: dict[tuple[str, int], list[tuple[tuple[int, float | None, float | None], ParsedLine,
                                                        frozenset[str]]]] = {}
        self._xid79: dict[str, tuple[int, float | None, float | None]] = {}  # pci -> (line, wall, mono)
        self._lost_at: tuple[int, float | None, float | None] | None = None  # the last GPU lost with its address

    def feed(self, line: str, *, year: int | None = None) -> ParsedLine | Malformed | None:
        self._n += 1
        p = parse(line, year=year)
        if p is None:
            g = gpu_mention(line)
            if g:
                start = line.find("NVRM:")
                prefix = line[: max(start, 0)]
                self._gpu_at = (self._n, g, *_timestamps(prefix, year), _year_assumed(prefix))
            return None
        if isinstance(p, Malformed):
            return p
        if p.kind == "fallen_off_bus" and not p.pci_bus_id and self._gpu_at and self._n - self._gpu_at[0] <= 3:
            # Continuation lines carry no timestamp of their own: they share the first line's.
            _, pci, wall, mono, assumed = self._gpu_at
            if p.wall_time is None and p.mono_time is None:
                p = replace(p, pci_bus_id=pci, wall_time=wall, mono_time=mono, year_assumed=wall is not None and assumed)
            else:
                p = replace(p, pci_bus_id=pci)
        if p.kind == "fallen_off_bus":
            if not p.pci_bus_id and self._after_a_lost_gpu(p):
                return None
            if self._follows_its_xid79(p):
                return None
            if p.pci_bus_id:
                self._lost_at = (self._n, p.wall_time, p.mono_time)
            return p
        if p.kind == "xid" and p.code == 79:
            self._lost_at = (self._n, p.wall_time, p.mono_time)
        if p.kind == "xid" and p.code == 79 and p.pci_bus_id:
            self._xid79[p.pci_bus_id] = (self._n, p.wall_time, p.mono_time)
            if len(self._xid79) > 256:  # bounded: forget the oldest
                for addr in sorted(self._xid79, key=lambda a: self._xid79[a][0])[:128]:
                    del self._xid79[addr]
        if p.kind == "sxid":
            return self._sxid_record(p)
        return p

    def drain(self) -> list[ParsedLine]:
        """The SXid records seen only through their continuation lines, one per record: call it
        after each batch of lines (a header that comes later in the same batch has claimed its
        own). Order of first appearance."""
        out = [rec[1] for recs in self._orphans.values() for rec in recs]
        self._orphans.clear()
        return out

    def _near(self, then: tuple[int, float | None, float | None], p: ParsedLine) -> bool:
        """Do two lines belong to one record: within LOOKBACK lines, or stamped within PAIR_S
        (switches interleave: 8 NVSwitches' records can put a header 30 lines before its Data)."""
        n, wall, mono = then
        stamped = [(a, b) for a, b in ((wall, p.wall_time), (mono, p.mono_time)) if a is not None and b is not None]
        if stamped:
            return all(abs(b - a) <= self.PAIR_S for a, b in stamped)
        return self._n - n <= self.LOOKBACK

    def _sxid_record(self, p: ParsedLine) -> ParsedLine | None:
        """One event per SXid record (header + "Severity" + "Data" lines, all carrying the code),
        whatever order its lines arrive in."""
        key = (p.device, p.code)
        at = (self._n, p.wall_time, p.mono_time)
        if p.continuation:
            seen = self._headers.get(key)
            if seen is not None and self._near(seen, p):
                return None
            # No header yet: it may follow (lines of one record out of order). Held until the
            # batch ends (drain); another continuation of the same record joins it.
            recs = self._orphans.setdefault(key, [])
            kind = p.detail.split(None, 1)[0].lower() if p.detail else ""
            if recs and self._near(recs[-1][0], p) and kind not in recs[-1][2]:
                recs[-1] = (at, recs[-1][1], recs[-1][2] | {kind})
            else:
                recs.append((at, p, frozenset({kind})))
            if sum(len(r) for r in self._orphans.values()) > 256:  # bounded: let the oldest stand now
                self._orphans.pop(next(iter(self._orphans)))
            return None
        self._headers[key] = at
        if len(self._headers) > 256:  # bounded: forget the oldest headers
            for k in sorted(self._headers, key=lambda k: self._headers[k][0])[:128]:
                del self._headers[k]
        waiting = self._orphans.get(key)
        if waiting and self._near(waiting[-1][0], p):
            # the header of a record whose continuation came first: the record is this header
            waiting.pop()
            if not waiting:
                del self._orphans[key]
        return p

    def _after_a_lost_gpu(self, p: ParsedLine) -> bool:
        """Is this address-less lost-GPU line ("Check failed: GPU lost from the bus
        [NV_ERR_GPU_IS_LOST]", which GSP-RM repeats for every RPC still in flight) the echo of a GPU
        already reported lost with its address (an Xid 79, a bus line) just before? Then it is that
        fault, not another one on an unknown GPU. Alone, it stands: the node lost a GPU."""
        if self._lost_at is None or not _GSP_LOST.search(p.message):
            return False  # the driver's own "fallen off the bus" line without an address stands
        n, wall, mono = self._lost_at
        stamped = [(then, now) for then, now in ((wall, p.wall_time), (mono, p.mono_time))
                   if then is not None and now is not None]
        if stamped:
            return all(0 <= now - then <= self.LOST_ECHO_S for then, now in stamped)
        return self._n - n <= self.LOOKBACK

    def _follows_its_xid79(self, p: ParsedLine) -> bool:
        """Is this fallen-off-the-bus line the driver's summary of an Xid 79 just read for the
        same GPU? A line that names no GPU cannot be matched, and stands."""
        seen = self._xid79.get(p.pci_bus_id) if p.pci_bus_id else None
        if seen is None or self._n - seen[0] > self.LOOKBACK:
            return False
        _, wall, mono = seen
        for then, now in ((wall, p.wall_time), (mono, p.mono_time)):
            if then is not None and now is not None and abs(now - then) > self.PAIR_S:
                return False
        return True
