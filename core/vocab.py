"""The shared vocabulary: every other module speaks in these types.

Everything here is immutable so a snapshot can be handed between the collector threads, the
event loop and the HTTP handlers without copies or locks.
"""

from __future__ import annotations

import enum
import time
import uuid
from dataclasses import dataclass, field
from typing import Literal, Mapping, cast, get_args

Labels = tuple[tuple[str, str], ...]
MetricKind = Literal["gauge", "counter", "info"]


def labels_of(**labels: object) -> Labels:
    """Labels as a sorted tuple of pairs, so equal label sets compare and hash equal."""
    return tuple(sorted((k, str(v)) for k, v in labels.items() if v is not None))


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """What a metric is, declared once per collector (help text and type live here, not in samples)."""

    name: str
    kind: MetricKind
    help: str
    unit: str = ""


@dataclass(frozen=True, slots=True)
class Sample:
    """One value of one metric for one entity. Names carry no `podhealth_` prefix and no `_total`."""

    name: str
    value: float
    labels: Labels = ()

    @classmethod
    def of(cls, name: str, value: float, **labels: object) -> "Sample":
        return cls(name, float(value), labels_of(**labels))

    def label(self, key: str, default: str = "") -> str:
        for k, v in self.labels:
            if k == key:
                return v
        return default


class Status(enum.Enum):
    """A check's verdict. UNKNOWN means "could not decide" and never fences a node by itself."""

    OK = "OK"
    WARN = "WARN"
    FAIL = "FAIL"
    UNKNOWN = "UNKNOWN"

    @property
    def metric_value(self) -> int:
        """Value of the per-check status series: alerts compare against these numbers."""
        return _STATUS_VALUE[self]

    @property
    def rank(self) -> int:
        """Order used for the node verdict: FAIL beats UNKNOWN beats WARN beats OK."""
        return _STATUS_RANK[self]

    @staticmethod
    def worst(statuses: "list[Status] | tuple[Status, ...]") -> "Status":
        return max(statuses, key=lambda s: s.rank, default=Status.OK)


_STATUS_VALUE = {Status.OK: 0, Status.WARN: 1, Status.FAIL: 2, Status.UNKNOWN: 3}
_STATUS_RANK = {Status.OK: 0, Status.WARN: 1, Status.UNKNOWN: 2, Status.FAIL: 3}


class Action(enum.Enum):
    """What a failure asks for, from the XID catalog's resolution buckets, mildest first."""

    NONE = "NONE"
    RESTART_APP = "RESTART_APP"
    RESET_GPU = "RESET_GPU"
    DRAIN = "DRAIN"
    REBOOT = "REBOOT"
    REPLACE = "REPLACE"

    @property
    def rank(self) -> int:
        return _ACTION_ORDER.index(self)

    @staticmethod
    def worst(actions: "list[Action] | tuple[Action, ...]") -> "Action":
        return max(actions, key=lambda a: a.rank, default=Action.NONE)


_ACTION_ORDER = list(Action)

Evidence = tuple[tuple[str, str], ...]
MAX_EVIDENCE_ITEMS = 16
MAX_EVIDENCE_CHARS = 256


def evidence_of(**items: object) -> Evidence:
    """Bounded evidence: at most 16 items of at most 256 characters, so a report stays small."""
    out: list[tuple[str, str]] = []
    for k, v in list(items.items())[:MAX_EVIDENCE_ITEMS]:
        text = v if isinstance(v, str) else repr(v) if not isinstance(v, (int, float)) else str(v)
        out.append((k, text[:MAX_EVIDENCE_CHARS]))
    return tuple(out)


def _number(v: object, what: str) -> float:
    """A JSON number as float; ValueError for anything else (null, a list, an integer beyond float)."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"{what}: expected a number")
    try:
        return float(v)
    except OverflowError:
        raise ValueError(f"{what}: number out of range") from None


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One verdict of one check about one entity (a GPU, an HCA port, a mount, or the node)."""

    check: str
    status: Status
    entity: str = "node"
    evidence: Evidence = ()
    action: Action = Action.NONE
    since: float = 0.0
    summary: str = ""

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check,
            "status": self.status.value,
            "entity": self.entity,
            "evidence": dict(self.evidence),
            "action": self.action.value,
            "since": self.since,
            "summary": self.summary,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "CheckResult":
        """Raises ValueError (or KeyError for a missing check/status) on a body of any other shape."""
        if not isinstance(d, Mapping):
            raise ValueError("a check result must be an object")
        ev = d.get("evidence") or {}
        if not isinstance(ev, Mapping):
            raise ValueError("evidence must be an object")
        return cls(
            check=str(d["check"]),
            status=Status(d["status"]),
            entity=str(d.get("entity", "node")),
            evidence=tuple((str(k), str(v)) for k, v in ev.items())[:MAX_EVIDENCE_ITEMS],
            action=Action(d.get("action", "NONE")),
            since=_number(d.get("since", 0.0), "since"),
            summary=str(d.get("summary", "")),
        )


@dataclass(frozen=True, slots=True)
class ProgramReport:
    """What a site check's program said in one run (collectors/site.py reads it with
    collectors/site_parse.py; checks/passive/site.py judges it). Raw: the program's exit code and
    words, not yet a verdict (the site's config decides what a FAIL may ask for)."""

    exit_code: int | None  # None: no exit of its own (timed out, killed, could not start)
    summary: str = ""  # the first line of stdout that is not the JSON line
    entity: str = ""  # from the JSON line ("" = the node)
    action: str = ""  # from the JSON line, as written (checked against the config by the rule)
    evidence: Evidence = ()  # from the JSON line, bounded like every evidence
    problem: str = ""  # why there is no exit code, or what was wrong with the JSON line
    ran_as: str = ""
    duration: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A node's verdict: every check result plus how fresh each collector's data is."""

    node: str
    agent_version: str
    profile: str
    results: tuple[CheckResult, ...]
    staleness: tuple[tuple[str, float], ...] = ()
    time: float = field(default_factory=time.time)

    @property
    def status(self) -> Status:
        return Status.worst([r.status for r in self.results])

    @property
    def action(self) -> Action:
        return Action.worst([r.action for r in self.results if r.status is Status.FAIL])

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "agent_version": self.agent_version,
            "profile": self.profile,
            "status": self.status.value,
            "action": self.action.value,
            "time": self.time,
            "staleness": dict(self.staleness),
            "results": [r.to_json() for r in self.results],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "NodeReport":
        """Raises ValueError (or KeyError for a missing node) on a body of any other shape."""
        if not isinstance(d, Mapping):
            raise ValueError("a report must be an object")
        results = d.get("results") or []
        stale = d.get("staleness") or {}
        if not isinstance(results, list) or not isinstance(stale, Mapping):
            raise ValueError("results must be a list and staleness an object")
        return cls(
            node=str(d["node"]),
            agent_version=str(d.get("agent_version", "")),
            profile=str(d.get("profile", "")),
            results=tuple(CheckResult.from_json(r) for r in results),
            staleness=tuple((str(k), _number(v, f"staleness.{k}")) for k, v in stale.items()),
            time=_number(d.get("time", time.time()), "time"),
        )


EventKind = Literal["xid", "sxid", "kernel", "edac", "mce"]  # edac/mce: host RAS lines (collectors/ras_parse.py)


@dataclass(frozen=True, slots=True)
class Nvlink5Payload:
    """XID 144-150 fields; `registers[0]` is IntrInfo and `registers[1]` the Error Status."""

    unit: str  # "RLW_REMAP", "NETIR_LINK_EVT", "TLW_RX/TLW_RX_PIPE0", ...
    fatal: bool
    cross_contain: int
    injected: int
    link: int
    registers: tuple[int, ...]

    @property
    def intr_info(self) -> int | None:
        return self.registers[0] if self.registers else None

    @property
    def error_status(self) -> int | None:
        return self.registers[1] if len(self.registers) > 1 else None


@dataclass(frozen=True, slots=True)
class RecoveryChange:
    """XID 154: the driver's recovery action moved from one state to another."""

    from_value: int
    from_name: str
    to_value: int
    to_name: str


@dataclass(frozen=True, slots=True)
class KernelFields:
    """What the kernel-log parser (collectors/xid_parse.py) read from an NVIDIA line beyond the
    Event's common fields: the payload the XID / SXid rules judge. The collector parses the line
    once and the Event carries this, so the rules read fields and never the text."""

    fatal: bool | None = None  # SXid / NVLink5 "Fatal" vs "Non-fatal"; None when the line says neither
    link: int | None = None  # the NVLink the line names
    nvlink5: Nvlink5Payload | None = None  # XID 144-150
    recovery: RecoveryChange | None = None  # XID 154

    def to_json(self) -> dict[str, object]:
        n, r = self.nvlink5, self.recovery
        return {
            "fatal": self.fatal,
            "link": self.link,
            "nvlink5": None if n is None else {
                "unit": n.unit, "fatal": n.fatal, "cross_contain": n.cross_contain, "injected": n.injected,
                "link": n.link, "registers": list(n.registers)},
            "recovery": None if r is None else {
                "from_value": r.from_value, "from_name": r.from_name, "to_value": r.to_value, "to_name": r.to_name},
        }

    @classmethod
    def from_json(cls, d: object) -> "KernelFields":
        """Raises ValueError on a body of any other shape."""
        if not isinstance(d, Mapping):
            raise ValueError("kernel must be an object")
        n, r = d.get("nvlink5"), d.get("recovery")
        if not (n is None or isinstance(n, Mapping)) or not (r is None or isinstance(r, Mapping)):
            raise ValueError("kernel.nvlink5 and kernel.recovery must be objects")
        regs = (n.get("registers") or []) if n is not None else []
        if not isinstance(regs, list):
            raise ValueError("kernel.nvlink5.registers must be a list")
        return cls(
            fatal=_opt_bool(d.get("fatal"), "kernel.fatal"),
            link=_opt_int(d.get("link"), "kernel.link"),
            nvlink5=None if n is None else Nvlink5Payload(
                unit=str(n.get("unit", "")), fatal=_opt_bool(n.get("fatal"), "kernel.nvlink5.fatal") is True,
                cross_contain=_int(n.get("cross_contain"), "kernel.nvlink5.cross_contain"),
                injected=_int(n.get("injected"), "kernel.nvlink5.injected"),
                link=_int(n.get("link"), "kernel.nvlink5.link"),
                registers=tuple(_int(x, "kernel.nvlink5.registers") for x in regs)),
            recovery=None if r is None else RecoveryChange(
                from_value=_int(r.get("from_value"), "kernel.recovery.from_value"),
                from_name=str(r.get("from_name", "")),
                to_value=_int(r.get("to_value"), "kernel.recovery.to_value"),
                to_name=str(r.get("to_name", ""))),
        )


def _int(v: object, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{what}: expected an integer")
    return v


def _opt_int(v: object, what: str) -> int | None:
    return None if v is None else _int(v, what)


def _opt_bool(v: object, what: str) -> bool | None:
    if v is not None and not isinstance(v, bool):
        raise ValueError(f"{what}: expected true, false or null")
    return v


@dataclass(frozen=True, slots=True)
class Event:
    """A one-off occurrence (an XID line, an NVML XID event), as opposed to a lasting condition."""

    kind: EventKind
    code: int
    time: float
    text: str = ""
    pci_bus_id: str = ""  # normalised "0000:18:00.0"; empty for SXid
    gpu: int | None = None  # index, resolved from pci_bus_id by whoever knows the mapping
    pid: int | None = None
    process: str = ""
    device: str = ""  # e.g. "nvswitch3" for SXid
    subcode: int | None = None  # XID 144-150 / 154 carry extra decoded info
    source: str = "kmsg"  # kmsg | nvml
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # What the collector parsed from the line (XID / SXid / fallen-off-bus events). None: not
    # carried (an older agent's event, or one built from text alone); the rules then have the one
    # parser read it from the text (collectors.xid_parse.with_kernel_fields).
    kernel: KernelFields | None = None
    job: str = ""  # the job on that GPU when the agent knew it ("slurm job 1234 (alice)"): agent/jobmap.py

    def to_json(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "code": self.code,
            "time": self.time,
            "text": self.text,
            "pci_bus_id": self.pci_bus_id,
            "gpu": self.gpu,
            "pid": self.pid,
            "process": self.process,
            "device": self.device,
            "subcode": self.subcode,
            "source": self.source,
            "id": self.id,
            "kernel": None if self.kernel is None else self.kernel.to_json(),
            **({"job": self.job} if self.job else {}),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, object]) -> "Event":
        """The inverse of to_json. An older agent's event has no "kernel" (kernel=None). Raises
        ValueError (or KeyError for a missing kind/code/time) on a body of any other shape."""
        if not isinstance(d, Mapping):
            raise ValueError("an event must be an object")
        kind = d["kind"]
        if kind not in _EVENT_KINDS:
            raise ValueError(f"kind: expected one of {', '.join(_EVENT_KINDS)}")
        k = d.get("kernel")
        eid = d.get("id")
        return cls(
            kind=cast(EventKind, kind),
            code=_int(d["code"], "code"),
            time=_number(d["time"], "time"),
            text=str(d.get("text") or ""),
            pci_bus_id=str(d.get("pci_bus_id") or ""),
            gpu=_opt_int(d.get("gpu"), "gpu"),
            pid=_opt_int(d.get("pid"), "pid"),
            process=str(d.get("process") or ""),
            device=str(d.get("device") or ""),
            subcode=_opt_int(d.get("subcode"), "subcode"),
            source=str(d.get("source") or "kmsg"),
            kernel=None if k is None else KernelFields.from_json(k),
            job=str(d.get("job") or "")[:256],
            **({"id": str(eid)} if eid else {}),
        )


_EVENT_KINDS: tuple[str, ...] = get_args(EventKind)
