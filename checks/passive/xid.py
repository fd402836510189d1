"""XID / SXid verdicts: NVIDIA's catalogs (checks/data/*.yaml) and workflows applied to recent events.

Meanings live in the data files; this module loads them (validated, cached) and applies the
workflows the catalog describes but cannot express as one action per code:
  - XID 13/31: repeated on the same GPU (hardware suspicion) vs spread over GPUs (application);
  - XID 48: alone (RESET_GPU) vs with 63/64 on the same GPU (drain and reset);
  - XID 154: the recovery action the driver states in the line, which also decides for the codes
    the catalog links to XID 154 (`xid154_linked`) that it summarises;
  - XID 144-150: IntrInfo / Error Status decoded with NVIDIA's "Xid 144-150 Decode" table;
  - escalation of hardware codes that recur within the window.
A verdict only looks at events inside the window, so an XID that stops recurring ages out: that
is the recovery. `evaluate_xids` is pure: events, catalog and clock in, CheckResults out.
The rules read what the collector parsed from the line (Event.kernel), never the text; an event
that carries none (an older agent's) is completed by the collector's parser, the one reader of lines.
"""

from __future__ import annotations

import functools
from collections import Counter, defaultdict
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, cast

import yaml

from podhealth import yamldata
from podhealth.collectors.xid_parse import with_kernel_fields
from podhealth.config_policy import CodePolicy, PolicyConfig, apply_code
from podhealth.vocab import Action, CheckResult, Event, KernelFields, Nvlink5Payload, Status, evidence_of

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
_STATUS: dict[Severity, Status] = {"info": Status.OK, "warning": Status.WARN, "critical": Status.FAIL}


class CatalogError(ValueError):
    """The catalog file is wrong: the message names the file and the entry."""


@dataclass(frozen=True, slots=True)
class Rule:
    action: Action
    severity: Severity

    @property
    def rank(self) -> tuple[int, int]:
        return (SEVERITIES.index(self.severity), self.action.rank)


@dataclass(frozen=True, slots=True)
class Escalation:
    incidents: int
    action: Action


@dataclass(frozen=True, slots=True)
class XidInfo:
    code: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's resolution bucket, verbatim
    investigatory: str
    action: Action
    severity: Severity
    workflow: str = ""  # xid13_31 | xid48 | xid154 | nvlink5 | xid45 | nvlink_err | ""
    escalate: Escalation | None = None
    note: str = ""
    unknown: bool = False

    @property
    def rule(self) -> Rule:
        return Rule(self.action, self.severity)


@dataclass(frozen=True, slots=True)
class SxidInfo:
    code: int
    name: str
    section: str
    potential_fatal: bool
    always_fatal: bool
    action: Action
    severity: Severity
    recovery: str = ""
    unknown: bool = False

    @property
    def rule(self) -> Rule:
        return Rule(self.action, self.severity)


@dataclass(frozen=True, slots=True)
class BitMask:
    """A catalog bit pattern ("------000000----------0000100001", MSB first): '-' bits are free."""

    care: int
    value: int

    @classmethod
    def parse(cls, text: str) -> "BitMask":
        if len(text) != 32 or set(text) - set("01-"):
            raise ValueError(f"expected 32 characters of 0/1/-, got {text!r}")
        care = value = 0
        for i, ch in enumerate(text):
            bit = 1 << (31 - i)
            if ch != "-":
                care |= bit
                if ch == "1":
                    value |= bit
        return cls(care, value)

    def matches(self, word: int) -> bool:
        return (word & self.care) == self.value


@dataclass(frozen=True, slots=True)
class Nvlink5Row:
    xid: int
    unit: str
    v1: BitMask
    v2: BitMask
    status: tuple[int, ...]
    bucket: str
    investigatory: str
    severity_text: str
    hw_sw: str
    impact: str
    action2: str = ""
    action2_v1: BitMask | None = None
    action2_v2: BitMask | None = None

    def names(self) -> tuple[str, ...]:
        return (self.unit, *self.unit.split("/"))


@dataclass(frozen=True, slots=True)
class Nvlink5Decode:
    bucket: str  # the decode table's bucket, or "" when the line could not be decoded
    rule: Rule
    text: str  # human-readable cause for evidence


@dataclass(frozen=True)
class XidCatalog:
    xids: Mapping[int, XidInfo]
    sxids: Mapping[int, SxidInfo]
    unknown_xid: Rule
    unknown_sxid: Rule
    unknown_sxid_fatal: Rule
    reported_fatal: Rule
    reported_nonfatal: Rule
    repeat_codes: frozenset[int]
    incident_gap_s: float
    hardware_incidents: int
    persist_incidents: int
    repeat_hardware: Rule
    repeat_persist: Rule
    xid154_linked: frozenset[int]
    xid48_companions: frozenset[int]
    recovery_by_name: Mapping[str, Rule]
    recovery_by_value: Mapping[int, Rule]
    recovery_unstated: Rule
    nvlink5_rows: tuple[Nvlink5Row, ...]
    nvlink5_buckets: Mapping[str, Rule]
    nvlink5_undecoded_fatal: Rule
    nvlink5_undecoded_nonfatal: Rule

    def lookup(self, code: int) -> XidInfo:
        info = self.xids.get(code)
        if info is not None:
            return info
        return XidInfo(code, "UNKNOWN", "not in NVIDIA's XID catalog", "", "", self.unknown_xid.action,
                       self.unknown_xid.severity, unknown=True)

    def lookup_sxid(self, code: int) -> SxidInfo:
        info = self.sxids.get(code)
        if info is not None:
            return info
        return SxidInfo(code, "UNKNOWN", "", False, False, self.unknown_sxid.action, self.unknown_sxid.severity,
                        unknown=True)

    def recovery_rule(self, name: str, value: int | None) -> Rule | None:
        rule = self.recovery_by_name.get(name.strip().lower())
        if rule is None and value is not None:
            rule = self.recovery_by_value.get(value)
        return rule

    def decode_nvlink5(self, code: int, p: Nvlink5Payload | None) -> Nvlink5Decode:
        """XID 144-150 payload -> the decode table's bucket, or the line's own Fatal/Nonfatal."""
        if p is not None and p.intr_info is not None:
            rows = [r for r in self.nvlink5_rows if r.xid == code]
            named = [r for r in rows if p.unit in r.names()] or rows
            status = p.error_status
            for r in named:
                if r.status and status not in r.status:
                    continue
                if r.v1.matches(p.intr_info) or r.v2.matches(p.intr_info):
                    return self._decoded(r, r.bucket, p)
                if r.action2 and any(m is not None and m.matches(p.intr_info) for m in (r.action2_v1, r.action2_v2)):
                    return self._decoded(r, r.action2, p)
        fatal = p is not None and p.fatal
        rule = self.nvlink5_undecoded_fatal if fatal else self.nvlink5_undecoded_nonfatal
        what = f"{p.unit} {'Fatal' if p.fatal else 'Nonfatal'} link {p.link}" if p else "no payload"
        return Nvlink5Decode("", rule, f"not in decode table ({what})")

    def _decoded(self, r: Nvlink5Row, bucket: str, p: Nvlink5Payload) -> Nvlink5Decode:
        rule = self.nvlink5_buckets.get(bucket, self.nvlink5_undecoded_fatal if p.fatal else self.unknown_xid)
        status = f" status 0x{p.error_status:08x}" if p.error_status is not None else ""
        text = (f"{r.unit}{status} link {p.link}: {bucket}; {r.severity_text} ({r.hw_sw})"
                f"; investigate: {r.investigatory}; impact: {r.impact}")
        return Nvlink5Decode(bucket, rule, text)


# ---- loading --------------------------------------------------------------------------------

_DATA = "podhealth.checks.data"


@functools.lru_cache(maxsize=4)
def load_catalog(xid_path: Path | None = None, sxid_path: Path | None = None) -> XidCatalog:
    """Both catalogs, validated once and cached. Errors name the file and the entry."""
    xid_doc, xid_src = _read(xid_path, "xid_catalog.yaml")
    sxid_doc, sxid_src = _read(sxid_path, "sxid_catalog.yaml")
    return _build(xid_doc, xid_src, sxid_doc, sxid_src)


def lookup(code: int) -> XidInfo:
    return load_catalog().lookup(code)


def lookup_sxid(code: int) -> SxidInfo:
    return load_catalog().lookup_sxid(code)


def _read(path: Path | None, name: str) -> tuple[Mapping[str, Any], str]:
    if path is None:
        text = resources.files(_DATA).joinpath(name).read_text(encoding="utf-8")
        src = f"checks/data/{name}"
    else:
        text, src = Path(path).read_text(encoding="utf-8"), str(path)
    try:
        doc = yamldata.load(text)
    except yaml.YAMLError as e:
        raise CatalogError(f"{src}: not valid YAML: {e}") from e
    if not isinstance(doc, Mapping):
        raise CatalogError(f"{src}: expected a mapping at the top")
    return doc, src


class _Reader:
    def __init__(self, src: str) -> None:
        self.src = src

    def fail(self, where: str, msg: str) -> CatalogError:
        return CatalogError(f"{self.src}: {where}: {msg}")

    def rule(self, d: Any, where: str) -> Rule:
        if not isinstance(d, Mapping):
            raise self.fail(where, "expected {action: ..., severity: ...}")
        return Rule(self.action(d.get("action"), where), self.severity(d.get("severity"), where))

    def action(self, v: Any, where: str) -> Action:
        try:
            return Action(v)
        except ValueError:
            raise self.fail(where, f"action {v!r} is not one of {', '.join(a.value for a in Action)}") from None

    def severity(self, v: Any, where: str) -> Severity:
        if v not in SEVERITIES:
            raise self.fail(where, f"severity {v!r} is not one of {', '.join(SEVERITIES)}")
        return cast(Severity, v)

    def items(self, doc: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
        v = doc.get(key)
        if not isinstance(v, list) or not all(isinstance(x, Mapping) for x in v):
            raise self.fail(key, "expected a list of mappings")
        return v

    def code(self, d: Mapping[str, Any], where: str) -> int:
        c = d.get("code")
        if not isinstance(c, int) or isinstance(c, bool) or c < 0:
            raise self.fail(where, f"code {c!r} is not a non-negative integer")
        return c


def _build(xd: Mapping[str, Any], xsrc: str, sd: Mapping[str, Any], ssrc: str) -> XidCatalog:
    r = _Reader(xsrc)
    xids: dict[int, XidInfo] = {}
    for i, d in enumerate(r.items(xd, "xids")):
        where = f"xids[{i}]"
        code = r.code(d, where)
        where = f"xids[{i}] (code {code})"
        if code in xids:
            raise r.fail(where, "duplicate code")
        esc = d.get("escalate")
        escalation = None
        if esc is not None:
            if not isinstance(esc, Mapping) or not isinstance(esc.get("incidents"), int) or esc["incidents"] < 2:
                raise r.fail(where, "escalate needs {incidents: >=2, action: ...}")
            escalation = Escalation(esc["incidents"], r.action(esc.get("action"), where))
        workflow = str(d.get("workflow") or "")
        if workflow not in ("", "xid13_31", "xid48", "xid154", "nvlink5", "xid45", "nvlink_err"):
            raise r.fail(where, f"unknown workflow {workflow!r}")
        xids[code] = XidInfo(
            code=code, mnemonic=str(d.get("mnemonic", "")), description=str(d.get("description", "")),
            immediate=str(d.get("immediate", "")), investigatory=str(d.get("investigatory", "")),
            action=r.action(d.get("action"), where), severity=r.severity(d.get("severity"), where),
            workflow=workflow, escalate=escalation, note=str(d.get("note", "")),
        )
    rep = xd.get("repeat")
    if not isinstance(rep, Mapping):
        raise r.fail("repeat", "expected a mapping")
    recovery_by_name: dict[str, Rule] = {}
    recovery_by_value: dict[int, Rule] = {}
    for i, d in enumerate(r.items(xd, "xid154_recovery")):
        rule = r.rule(d, f"xid154_recovery[{i}]")
        recovery_by_name[str(d.get("name", "")).strip().lower()] = rule
        if isinstance(d.get("value"), int):
            recovery_by_value[d["value"]] = rule
    rows: list[Nvlink5Row] = []
    for i, d in enumerate(r.items(xd, "nvlink5_decode")):
        where = f"nvlink5_decode[{i}]"
        try:
            a2 = str(d.get("action2", "") or "")
            rows.append(Nvlink5Row(
                xid=int(d["xid"]), unit=str(d["unit"]), v1=BitMask.parse(str(d["v1"])), v2=BitMask.parse(str(d["v2"])),
                status=tuple(int(s) for s in d.get("status") or ()), bucket=str(d["bucket"]),
                investigatory=str(d.get("investigatory", "")), severity_text=str(d.get("severity", "")),
                hw_sw=str(d.get("hw_sw", "")), impact=str(d.get("impact", "")), action2=a2,
                action2_v1=BitMask.parse(str(d["action2_v1"])) if a2 else None,
                action2_v2=BitMask.parse(str(d["action2_v2"])) if a2 else None,
            ))
        except (KeyError, TypeError, ValueError) as e:
            raise r.fail(where, f"bad decode row: {e}") from None
    buckets_raw = xd.get("nvlink5_buckets")
    if not isinstance(buckets_raw, Mapping):
        raise r.fail("nvlink5_buckets", "expected a mapping")
    buckets = {str(k): r.rule(v, f"nvlink5_buckets.{k}") for k, v in buckets_raw.items()}
    for row in rows:
        for b in (row.bucket, row.action2):
            if b and b not in buckets:
                raise r.fail("nvlink5_decode", f"bucket {b!r} has no entry in nvlink5_buckets")
    try:
        repeat_codes = frozenset(int(c) for c in rep["codes"])
        gap, hw, persist = float(rep["incident_gap_s"]), int(rep["hardware_incidents"]), int(rep["persist_incidents"])
        companions = frozenset(int(c) for c in xd["xid48_companions"])
        linked = frozenset(int(c) for c in xd.get("xid154_linked") or ())
    except (KeyError, TypeError, ValueError) as e:
        raise r.fail("repeat", f"bad value: {e}") from None

    s = _Reader(ssrc)
    sxids: dict[int, SxidInfo] = {}
    for i, d in enumerate(s.items(sd, "sxids")):
        code = s.code(d, f"sxids[{i}]")
        where = f"sxids[{i}] (code {code})"
        if code in sxids:
            raise s.fail(where, "duplicate code")
        sxids[code] = SxidInfo(
            code=code, name=str(d.get("name", "")), section=str(d.get("section", "")),
            potential_fatal=bool(d.get("potential_fatal")), always_fatal=bool(d.get("always_fatal")),
            action=s.action(d.get("action"), where), severity=s.severity(d.get("severity"), where),
            recovery=str(d.get("recovery", "")),
        )
    return XidCatalog(
        xids=xids, sxids=sxids,
        unknown_xid=r.rule(xd.get("unknown_xid"), "unknown_xid"),
        unknown_sxid=s.rule(sd.get("unknown_sxid"), "unknown_sxid"),
        unknown_sxid_fatal=s.rule(sd.get("unknown_sxid_fatal"), "unknown_sxid_fatal"),
        reported_fatal=s.rule(sd.get("reported_fatal"), "reported_fatal"),
        reported_nonfatal=s.rule(sd.get("reported_nonfatal"), "reported_nonfatal"),
        repeat_codes=repeat_codes, incident_gap_s=gap, hardware_incidents=hw, persist_incidents=persist,
        repeat_hardware=r.rule(rep.get("hardware"), "repeat.hardware"),
        repeat_persist=r.rule(rep.get("persist"), "repeat.persist"), xid154_linked=linked,
        xid48_companions=companions, recovery_by_name=recovery_by_name, recovery_by_value=recovery_by_value,
        recovery_unstated=r.rule(xd.get("xid154_unstated"), "xid154_unstated"),
        nvlink5_rows=tuple(rows), nvlink5_buckets=buckets,
        nvlink5_undecoded_fatal=r.rule(xd.get("nvlink5_undecoded_fatal"), "nvlink5_undecoded_fatal"),
        nvlink5_undecoded_nonfatal=r.rule(xd.get("nvlink5_undecoded_nonfatal"), "nvlink5_undecoded_nonfatal"),
    )


# ---- evaluation -----------------------------------------------------------------------------

GpuIds = Mapping[str, tuple[int, str]]  # pci_bus_id -> (index, uuid), as the nvml collector labels them


@dataclass(frozen=True, slots=True)
class Finding:
    """What one code on one entity asks for, and why."""

    code: int
    rule: Rule
    reason: str
    unknown: bool = False
    detail: str = ""
    policy: str = ""  # the site's policy that changed this finding, and what the catalog said


def incidents(times: Iterable[float], gap_s: float) -> int:
    """Bursts of lines closer than `gap_s` are one incident (one fault prints many lines)."""
    n, last = 0, None
    for t in sorted(times):
        if last is None or t - last > gap_s:
            n += 1
        last = t
    return n


def evaluate_xids(
    events: Sequence[Event],
    catalog: XidCatalog,
    now: float,
    window_s: float,
    gpu_ids: GpuIds | None = None,
    *,
    switches: Iterable[str] = (),
    policy: PolicyConfig | None = None,
) -> list[CheckResult]:
    """One "xid" result per GPU (OK when it had no XID in the window) and one "sxid" result per
    NVSwitch that had SXids (or is named in `switches`). `policy`: the site's decisions per code
    (checks.policy), applied to each finding and named in the evidence of the verdicts they
    changed. Pure."""
    gpu_ids = gpu_ids or {}
    uuid_of = {idx: uuid for idx, uuid in gpu_ids.values()}
    policy = policy or PolicyConfig()
    recent = [with_kernel_fields(e) for e in events if e.time >= now - _window(e, policy, window_s)]
    by_entity: dict[str, list[Event]] = defaultdict(list)
    by_switch: dict[str, list[Event]] = defaultdict(list)
    for e in recent:
        if e.kind == "sxid":
            by_switch[e.device or "nvswitch"].append(e)
        elif e.kind == "xid" or (e.kind == "kernel" and e.code == 79):
            by_entity[_entity(e, gpu_ids)].append(e)
    # For the 13/31 workflow: on how many GPUs did each repeat code appear?
    spread: dict[int, int] = {c: sum(1 for evs in by_entity.values() if any(
        e.code == c and e.kind == "xid" for e in evs)) for c in catalog.repeat_codes}

    out: list[CheckResult] = []
    entities = {f"gpu{idx}" for idx in uuid_of} | set(by_entity)
    for ent in sorted(entities, key=_entity_order):
        idx = int(ent[3:]) if ent.startswith("gpu") and ent[3:].isdigit() else None
        uuid = uuid_of.get(idx, "") if idx is not None else ""
        evs = sorted(by_entity.get(ent, ()), key=lambda e: e.time)
        if not evs:
            out.append(CheckResult("xid", Status.OK, ent, evidence_of(uuid=uuid or None) if uuid else (),
                                   Action.NONE, 0.0, "no XID in the window"))
            continue
        found = _gpu_findings(evs, catalog, spread)
        policed = _police(found, evs, "xid", policy, catalog, now, window_s)
        out.append(_verdict("xid", ent, evs, policed, uuid=uuid, before=found))
    for dev in sorted(set(by_switch) | set(switches)):
        evs = sorted(by_switch.get(dev, ()), key=lambda e: e.time)
        if not evs:
            out.append(CheckResult("sxid", Status.OK, dev, (), Action.NONE, 0.0, "no SXid in the window"))
            continue
        found = _switch_findings(evs, catalog)
        out.append(_verdict("sxid", dev, evs, _police(found, evs, "sxid", policy, catalog, now, window_s), before=found))
    return out


def _window(e: Event, policy: PolicyConfig, window_s: float) -> float:
    """How far back an event counts: the rate window, or its code's policy window when longer."""
    table = policy.sxid if e.kind == "sxid" else policy.xid
    p = table.get(e.code)
    return max(window_s, p.window) if p is not None and p.window is not None else window_s


def _police(findings: list[Finding], evs: list[Event], kind: str, policy: PolicyConfig, cat: XidCatalog,
            now: float, window_s: float) -> list[Finding]:
    """Each finding after the site's policy for its code (config_policy.apply_code)."""
    table: Mapping[int, CodePolicy] = policy.sxid if kind == "sxid" else policy.xid
    if not table:
        return findings
    out = []
    for f in findings:
        p = table.get(f.code)
        if p is None:
            out.append(f)
            continue
        since = now - (p.window if p.window is not None else window_s)
        n = incidents((e.time for e in evs if e.code == f.code and e.time >= since), cat.incident_gap_s)
        action, severity = apply_code(f.rule.action.value, f.rule.severity, p, n)
        rule = Rule(Action(action), cast(Severity, severity))
        if rule == f.rule:
            out.append(f)
            continue
        text = (f"checks.policy.{kind}.{f.code}: {p.describe()} ({n} incident{'s' if n != 1 else ''}; "
                f"catalog: {f.rule.action.value} {f.rule.severity})")
        out.append(Finding(f.code, rule, f"{f.reason} [site policy]", f.unknown, f.detail, text))
    return out


def _entity(e: Event, gpu_ids: GpuIds) -> str:
    if e.gpu is not None:
        return f"gpu{e.gpu}"
    known = gpu_ids.get(e.pci_bus_id) if e.pci_bus_id else None
    if known is not None:
        return f"gpu{known[0]}"
    return f"pci:{e.pci_bus_id}" if e.pci_bus_id else "node"


def _entity_order(ent: str) -> tuple[int, int, str]:
    if ent.startswith("gpu") and ent[3:].isdigit():
        return (0, int(ent[3:]), "")
    return (1, 0, ent)


def _gpu_findings(evs: list[Event], cat: XidCatalog, spread: Mapping[int, int]) -> list[Finding]:
    xid_evs = [e for e in evs if e.kind == "xid"]
    codes = {e.code for e in xid_evs}
    lost_without_xid = 79 not in codes and any(e.kind == "kernel" for e in evs)
    if lost_without_xid:
        # The driver said it lost the GPU without an Xid line ("fallen off the bus" from the 570
        # open module, GSP-RM's NV_ERR_GPU_IS_LOST, RmInitAdapter failed): the same condition as
        # XID 79, and the kernel log is the path that must see it when NVML hangs.
        xid_evs = xid_evs + [e for e in evs if e.kind == "kernel"]
        codes.add(79)
    findings: list[Finding] = []
    stated = _stated_by_xid154(xid_evs, cat) if 154 in codes else None
    for code in sorted(codes):
        mine = [e for e in xid_evs if e.code == code]
        info = cat.lookup(code)
        n = incidents((e.time for e in mine), cat.incident_gap_s)
        if info.unknown:
            findings.append(Finding(code, info.rule, "code not in NVIDIA's XID catalog", unknown=True))
            continue
        wf = info.workflow
        if stated is not None and code in cat.xid154_linked and mine[-1].time <= stated[0] + cat.incident_gap_s:
            # The driver summarised this fault's recovery in its XID 154: that governs (the 154's
            # own finding carries the action), not the code's bucket.
            findings.append(Finding(code, Rule(Action.NONE, "info"), f"recovery stated by XID 154: {stated[1]}"))
        elif code in cat.repeat_codes or wf == "xid13_31":
            findings.append(_repeat(code, n, spread.get(code, 1), cat))
        elif wf == "xid48":
            with_ = sorted(codes & cat.xid48_companions)
            if with_:
                findings.append(Finding(code, Rule(Action.DRAIN, "critical"),
                                        f"DBE with XID {'/'.join(map(str, with_))}: drain and reset"))
            else:
                findings.append(Finding(code, info.rule, "DBE alone: reset the GPU"))
        elif wf == "xid154":
            findings.append(_xid154(mine[-1], cat))
        elif wf == "nvlink5":
            findings.append(_nvlink5(code, mine, 154 in codes, cat))
        elif wf == "xid45":
            others = codes - {45}
            why = f"follow XID {'/'.join(map(str, sorted(others)))}" if others else "solo: job aborted or restart fabric manager"
            findings.append(Finding(code, info.rule, why))
        elif code == 79 and lost_without_xid:
            findings.append(Finding(code, info.rule, "the driver lost the GPU (no Xid line): "
                                                     f"{info.description or info.mnemonic}"))
        else:
            findings.append(Finding(code, info.rule, info.description or info.mnemonic))
        if info.escalate and n >= info.escalate.incidents:
            esc = Rule(info.escalate.action, "critical")
            if esc.rank > findings[-1].rule.rank:
                findings[-1] = Finding(code, esc, f"{n} incidents in the window (>= {info.escalate.incidents}): "
                                                  f"{info.escalate.action.value}")
    return findings


def _repeat(code: int, n: int, gpus: int, cat: XidCatalog) -> Finding:
    if gpus >= 2:
        return Finding(code, Rule(Action.RESTART_APP, "warning"),
                       f"seen on {gpus} GPUs: application fault (CHECK_APP/CUDA)")
    if n >= cat.persist_incidents:
        return Finding(code, cat.repeat_persist,
                       f"{n} incidents on this GPU only: hardware suspected and persisting (field diag)")
    if n >= cat.hardware_incidents:
        return Finding(code, cat.repeat_hardware,
                       f"{n} incidents on this GPU only: hardware suspected (RUN_DCGMEUD)")
    return Finding(code, Rule(Action.RESTART_APP, "warning"),
                   f"{n} incident{'s' if n != 1 else ''}: application fault (CHECK_APP/CUDA)")


def _kernel(e: Event) -> KernelFields:
    """The parsed fields (evaluate_xids completed every event that came without them)."""
    return e.kernel if e.kernel is not None else KernelFields()


def _xid154(e: Event, cat: XidCatalog) -> Finding:
    rec = _kernel(e).recovery
    rule = cat.recovery_rule(rec.to_name, rec.to_value) if rec else None
    if rule is None and rec is None and e.subcode is not None and e.source != "nvml":
        rule = cat.recovery_by_value.get(e.subcode)
    if rule is None:
        return Finding(154, cat.recovery_unstated, "recovery action not stated in the line")
    what = f"{rec.from_name} -> {rec.to_name}" if rec else f"action 0x{e.subcode:x}"
    return Finding(154, rule, f"driver recovery action: {what}", detail=what)


def _stated_by_xid154(xid_evs: list[Event], cat: XidCatalog) -> tuple[float, str] | None:
    """(time, what) of the GPU's latest XID 154 when it states a recovery action podhealth reads;
    None when it does not (then every code keeps its own bucket)."""
    latest = max((e for e in xid_evs if e.code == 154), key=lambda e: e.time)
    f = _xid154(latest, cat)
    return (latest.time, f.detail) if f.detail else None


def _nvlink5(code: int, mine: list[Event], has154: bool, cat: XidCatalog) -> Finding:
    worst: Finding | None = None
    for e in mine:
        d = cat.decode_nvlink5(code, _kernel(e).nvlink5)
        rule, why = d.rule, d.text
        if d.bucket == "XID_154_EVAL" and has154:
            rule, why = Rule(Action.NONE, "info"), f"{d.text}; deferred to XID 154"
        f = Finding(code, rule, why, detail=d.text)
        if worst is None or f.rule.rank > worst.rule.rank:
            worst = f
    assert worst is not None
    return worst


def _switch_findings(evs: list[Event], cat: XidCatalog) -> list[Finding]:
    findings: list[Finding] = []
    for code in sorted({e.code for e in evs}):
        info = cat.lookup_sxid(code)
        worst: Finding | None = None
        for e in (x for x in evs if x.code == code):
            fatal = _kernel(e).fatal
            if info.unknown:
                f = Finding(code, cat.unknown_sxid_fatal if fatal else cat.unknown_sxid,
                            "SXid not in the Fabric Manager catalog", unknown=True)
            elif fatal is True and cat.reported_fatal.rank > info.rule.rank:
                f = Finding(code, cat.reported_fatal, f"{info.name}: reported Fatal")
            elif fatal is False and info.potential_fatal and not info.always_fatal:
                f = Finding(code, cat.reported_nonfatal, f"{info.name}: reported Non-fatal")
            else:
                f = Finding(code, info.rule, f"{info.name} ({info.section})")
            if worst is None or f.rule.rank > worst.rule.rank:
                worst = f
        assert worst is not None
        findings.append(worst)
    return findings


def _verdict(check: str, ent: str, evs: list[Event], findings: list[Finding], uuid: str = "",
             before: list[Finding] | None = None) -> CheckResult:
    top = max(findings, key=lambda f: f.rule.rank)
    status = _STATUS[top.rule.severity]
    action = top.rule.action if status is not Status.OK else Action.NONE
    policed = [f.policy for f in findings if f.policy]
    counts = Counter(e.code for e in evs)
    last = evs[-1]
    label = "SXid" if check == "sxid" else "XID"
    items: dict[str, object] = {}
    if uuid:
        items["uuid"] = uuid
    if last.pci_bus_id:
        items["pci_bus_id"] = last.pci_bus_id
    items["codes"] = " ".join(f"{c}x{n}" for c, n in sorted(counts.items()))
    items["code"] = top.code
    items["reason"] = top.reason
    if top.detail and top.detail != top.reason:
        items["decode"] = top.detail
    if any(f.unknown for f in findings):
        items["unknown"] = "true"
        items["unknown_codes"] = " ".join(str(f.code) for f in findings if f.unknown)
    items["events"] = len(evs)
    if policed and before:
        # The site's policy changed a finding: say which rule and what the catalog alone gives.
        old = max(before, key=lambda f: f.rule.rank)
        old_status = _STATUS[old.rule.severity]
        items["policy"] = "; ".join(policed)
        items["without_policy"] = f"{old_status.value} {(old.rule.action if old_status is not Status.OK else Action.NONE).value}"
    items["last"] = last.text or f"{label} {last.code}"
    items["last_time"] = f"{last.time:.3f}"
    summary = f"{label} {top.code}: {top.reason}"[:200]
    return CheckResult(check, status, ent, evidence_of(**items), action, evs[0].time, summary)


__all__ = [
    "CatalogError", "XidCatalog", "XidInfo", "SxidInfo", "Rule", "Finding", "Nvlink5Decode",
    "load_catalog", "lookup", "lookup_sxid", "evaluate_xids", "incidents",
]
