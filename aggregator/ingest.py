"""Ingest: agent reports, agent event batches and Alertmanager webhooks → observations.

Parsing is pure and all-or-nothing: a batch with one bad event is rejected whole, with the
reason, before anything is applied, so a 400 never leaves half a batch behind. Applying is
idempotent: events carry ids (a re-sent one is counted as a duplicate and skipped), and every
record from an agent carries its place in the agent's own order, `boot_id` and `seq`
(agent/sequence.py): one older than what was applied is stale and skipped. The `time` a record
carries is the agent's claim: it orders nothing, the aggregator's clock times what it stores,
and a claim beyond `max_clock_skew` ahead is counted (clock_ahead). Records without `seq` (an
older agent, a pulled /health) are ordered by arrival.

`POST /v1/reports` takes a full report (NodeReport.to_json()) or, from a node whose verdicts did
not change since its last full report, a lease: {"node", "time", "digest", "boot_id", "seq", ...} where digest is
what the aggregator answered to that report. A lease saves sending and decoding ~16 KB of
results every interval (as Kubernetes' node Lease does for NodeStatus); one the aggregator
cannot match (it restarted, or a transition arrived since) is refused with 409 and the agent
sends the full report at once.

Wire format of `POST /v1/events` (what agent/publisher.py sends):

    {"node": "dgx01", "events": [          (each record also carries "boot_id" and "seq")
      {"id": "…", "type": "event",      "time": t, "event": <Event.to_json()>},
      {"id": "…", "type": "transition", "time": t, "old": <CheckResult>|null, "new": <CheckResult>},
      {"id": "…", "type": "report",     "time": t, "report": <NodeReport.to_json()>},
      {"id": "…", "type": "summary",    "time": t, "first": t0, "last": t1, "count": n,
                                         "counts": {"event:xid:79": 3, …}}]}
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Callable, Iterable, Iterator, Literal, Mapping

import msgspec
import orjson

from podhealth.vocab import Action, Status

from podhealth.hostnames import node_name_problem
from podhealth.aggregator.state import Memory, Order, Verdict, digest_of
from podhealth.aggregator.store import Op

MAX_ID = 128
MAX_NAME = 128
MAX_BOOT_ID = 64
MAX_SEQ = 2**63 - 1  # SQLite's INTEGER
EventType = Literal["event", "transition", "report", "summary"]
_EVENT_TYPES = ("event", "transition", "report", "summary")
_STATUSES = {s.value: s for s in Status}
_ACTIONS = {a.value: a for a in Action}


class BadRequest(ValueError):
    """The body is not what the endpoint takes; the message says why (returned with the 400)."""


@dataclass(frozen=True, slots=True)
class ParsedReport:
    node: str
    time: float
    verdicts: tuple[Verdict, ...]  # the results that are not OK (OK ones only count for the fingerprint)
    raw: str | bytes  # the report's JSON (bytes: valid UTF-8, left undecoded); what the store keeps
    fp: int = 0  # fingerprint of every (check, entity, status, action): unchanged reports are cheap
    order: Order | None = None  # the agent's (boot_id, seq); None: ordered by arrival
    content: int = 0  # what the stored copy shows (content_of); 0: unknown


@dataclass(frozen=True, slots=True)
class Lease:
    """A node saying "my verdicts are those of my last full report (`digest`), as of `time`"."""

    node: str
    time: float
    digest: str
    order: Order | None = None


_DIGEST = re.compile(r"[0-9a-f]{16}")


@dataclass(frozen=True, slots=True)
class WireEvent:
    id: str
    type: EventType
    time: float
    body: str  # the event as received (JSON), kept for history
    transition: Verdict | None = None
    report: ParsedReport | None = None
    order: Order | None = None


@dataclass(frozen=True, slots=True)
class EventBatch:
    node: str
    events: tuple[WireEvent, ...]


@dataclass(frozen=True, slots=True)
class AlertObservation:
    node: str
    verdict: Verdict
    severity: str
    firing: bool
    ref: str
    time: float  # when it started, on our clock: startsAt, never later than its arrival
    claim: float  # startsAt as sent (its arrival when it had none): counted when beyond max_clock_skew ahead


# ---- parsing (pure) ---------------------------------------------------------------------------


def loads(raw: bytes) -> Any:
    """Strict JSON (RFC 8259: UTF-8 only, no NaN or Infinity), decoded by orjson: a DGX node's
    ~16 KB report takes 50 us there against 125 us in the json module, at ~1,000 reports/s."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise BadRequest(f"body is not JSON: {e}") from None


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise BadRequest(f"{where}: expected an object")
    return v


def _objects(d: Mapping[str, Any], key: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each object of the list body.<key>, with where it stands (for messages)."""
    items = d.get(key)
    if not isinstance(items, list):
        raise BadRequest(f"body.{key}: expected a list")
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        yield where, _obj(item, where)


def _str(d: Mapping[str, Any], key: str, where: str, *, default: str | None = None, limit: int = MAX_NAME) -> str:
    v = d.get(key, default)
    if not isinstance(v, str) or (default is None and not v):
        raise BadRequest(f"{where}.{key}: expected a non-empty string" if default is None else
                         f"{where}.{key}: expected a string")
    if len(v) > limit:
        raise BadRequest(f"{where}.{key}: longer than {limit} characters")
    return v


def _num(d: Mapping[str, Any], key: str, where: str, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise BadRequest(f"{where}.{key}: expected a number")
    return float(v)


def _order(d: Mapping[str, Any], where: str) -> Order | None:
    """The agent's (boot_id, seq), both or neither."""
    boot, seq = d.get("boot_id"), d.get("seq")
    if boot is None and seq is None:
        return None
    if not isinstance(boot, str) or not 0 < len(boot) <= MAX_BOOT_ID or not boot.isprintable():
        raise BadRequest(f"{where}.boot_id: expected a string of 1 to {MAX_BOOT_ID} printable characters with seq")
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq <= MAX_SEQ:
        raise BadRequest(f"{where}.seq: expected an integer from 0 to {MAX_SEQ} with boot_id")
    return (boot, seq)


def _node(d: Mapping[str, Any], where: str) -> str:
    name = _str(d, "node", where)
    problem = node_name_problem(name)
    if problem:
        raise BadRequest(f"{where}.node: {problem}")
    return name


def _verdict(d: Any, where: str) -> Verdict:
    d = _obj(d, where)
    raw_status, raw_action = d.get("status"), d.get("action", "NONE")
    status = _STATUSES.get(raw_status) if isinstance(raw_status, str) else None
    if status is None:
        raise BadRequest(f"{where}.status: expected one of OK, WARN, FAIL, UNKNOWN")
    action = _ACTIONS.get(raw_action) if isinstance(raw_action, str) else None
    if action is None:
        raise BadRequest(f"{where}.action: expected one of {', '.join(_ACTIONS)}")
    summary = d.get("summary", "")
    return Verdict(check=_str(d, "check", where), entity=_str(d, "entity", where, default="node"), status=status,
                   action=action, since=_num(d, "since", where, 0.0),
                   summary=summary[:512] if isinstance(summary, str) else "")


def content_of(fp: int, texts: Iterable[tuple[float, str]], failing_evidence: Iterable[bytes]) -> int:
    """What a stored report shows, less what changes in every report: its verdicts (`fp`), each
    result's since and summary, and the evidence of the results that are not OK. Left out: the
    envelope (time, staleness, seq) and the readings in passing checks' evidence (NFS probe
    times, request counts), which Prometheus keeps live; the stored copy takes them every
    report_refresh. Python's keyed hash: memory only, like the fingerprint."""
    return hash((fp, tuple(texts), tuple(failing_evidence))) or 1


def _verdicts(results: list[Any], where: str) -> tuple[tuple[Verdict, ...], int]:
    """A report's non-OK results and the fingerprint of all of them.

    Reports arrive ~1,000/s, so the fast path accepts a well-formed result with a few type
    checks and builds nothing for an OK one; anything else goes through _verdict, which either
    accepts it too or raises with the exact reason.
    """
    bad: list[Verdict] = []
    keys: list[tuple[str, str, str, str]] = []
    for i, d in enumerate(results):
        if type(d) is dict:
            check, status, action, entity = d.get("check"), d.get("status"), d.get("action", "NONE"), d.get("entity", "node")
            since, summary = d.get("since", 0.0), d.get("summary", "")
            if (type(check) is str and type(status) is str and type(action) is str and type(entity) is str
                    and status in _STATUSES and action in _ACTIONS and 0 < len(check) <= MAX_NAME
                    and len(entity) <= MAX_NAME and type(summary) is str
                    and (type(since) is float or type(since) is int) and math.isfinite(since)):
                keys.append((check, entity, status, action))
                if status != "OK":
                    bad.append(Verdict(check, entity, _STATUSES[status], _ACTIONS[action], float(since), summary[:512]))
                continue
        v = _verdict(d, f"{where}[{i}]")
        keys.append((v.check, v.entity, v.status.value, v.action.value))
        if v.status is not Status.OK:
            bad.append(v)
    return tuple(bad), hash(tuple(keys))


def parse_report(obj: Any, raw: str | bytes, where: str = "report") -> ParsedReport:
    d = _obj(obj, where)
    results = d.get("results")
    if not isinstance(results, list):
        raise BadRequest(f"{where}.results: expected a list")
    bad, fp = _verdicts(results, f"{where}.results")
    # _verdicts took every result: each is a dict with a valid status, since and summary.
    texts = [(float(r.get("since", 0.0)), r.get("summary", "") if isinstance(r.get("summary"), str) else "")
             for r in results]
    failing = [orjson.dumps(r.get("evidence"), option=orjson.OPT_SORT_KEYS) for r in results
               if r["status"] != "OK"]
    return ParsedReport(node=_node(d, where), time=_num(d, "time", where), verdicts=bad, raw=raw, fp=fp,
                        order=_order(d, where), content=content_of(fp, texts, failing))


def read_report(raw: bytes, node: str | None = None, where: str = "report") -> ParsedReport:
    """A report body as received; `node`, when given, replaces the body's node (a pulled /health)."""
    obj = loads(raw)
    if node is not None and isinstance(obj, dict):
        obj["node"] = node
    return parse_report(obj, raw, where)


def parse_lease(obj: Any, where: str = "lease") -> Lease:
    d = _obj(obj, where)
    digest = d.get("digest")
    if not isinstance(digest, str) or _DIGEST.fullmatch(digest) is None:
        raise BadRequest(f"{where}.digest: expected the 16 hex digits the aggregator answered to a full report")
    return Lease(node=_node(d, where), time=_num(d, "time", where), digest=digest, order=_order(d, where))


def read_posted(raw: bytes) -> ParsedReport | Lease:
    """What a node POSTs to /v1/reports: a lease (a `digest`, no `results`) or a full report.

    Typed first (_read_typed); a body it does not take goes the general way, which accepts it
    as well or raises with the exact reason."""
    got = _read_typed(raw)
    if got is not None:
        return got
    obj = loads(raw)
    if isinstance(obj, dict) and "digest" in obj and "results" not in obj:
        return parse_lease(obj)
    return parse_report(obj, raw, "report")


# ---- /v1/reports decoded by type (the hot path) ------------------------------------------------
#
# ~1,000 bodies/s at 10,000 nodes. orjson builds every object of a ~16 KB report (each result's
# evidence too) and _verdicts then walks them in Python; msgspec decodes straight into the few
# typed fields ingest uses, checking types, enums and lengths in C, and skips the rest (still
# checked as JSON): a DGX report in ~25 us here instead of ~110 us, a lease in ~1 us instead of 3.
# It takes only what the general path takes with the same meaning (JSON, UTF-8, numbers in range,
# last of duplicate keys); anything it refuses is read again the general way for the reason.


if TYPE_CHECKING:
    _StatusName = str
    _ActionName = str
else:  # the names of vocab's members (strings, whose hashes are cached: the fingerprint hashes 4 per result)
    _StatusName = Literal[tuple(s.value for s in Status)]
    _ActionName = Literal[tuple(a.value for a in Action)]


class _Result(msgspec.Struct, gc=False):
    check: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]
    status: _StatusName
    entity: Annotated[str, msgspec.Meta(max_length=MAX_NAME)] = "node"
    action: _ActionName = "NONE"
    since: float = 0.0  # msgspec refuses a number out of float range, so it is finite
    summary: str = ""
    evidence: msgspec.Raw = msgspec.Raw(b"null")  # left undecoded: content_of reads a failing one's


class _Posted(msgspec.Struct, gc=False):
    node: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME)]
    time: float
    results: list[_Result] | msgspec.UnsetType = msgspec.UNSET  # absent: a lease (null: the general path says why)
    digest: str | msgspec.UnsetType = msgspec.UNSET
    boot_id: str | None = None
    seq: int | None = None


_decode_posted = msgspec.json.Decoder(_Posted).decode
_result_key = operator.attrgetter("check", "entity", "status", "action")  # what _verdicts fingerprints
_result_text = operator.attrgetter("since", "summary")  # what content_of adds
_GOOD_NAMES: set[str] = set()  # node names node_name_problem passed (one per node; bounded below)
_GOOD_NAMES_MAX = 200_000


def _read_typed(raw: bytes) -> ParsedReport | Lease | None:
    """The body as _Posted, or None when it is not one that the general path would read the
    same way (then that path decides)."""
    # msgspec checks the UTF-8 of the strings it decodes, not of the fields it skips, and the
    # body is stored and served as it came: a byte that is not UTF-8 anywhere is the general
    # path's 400 (nearly every body is ASCII, which needs no decode to know). Nesting deeper than
    # its recursion limit raises RecursionError: the general path refuses that too.
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError:
            return None
    try:
        p = _decode_posted(raw)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    node = p.node
    if node not in _GOOD_NAMES:
        if node_name_problem(node) is not None:
            return None
        if len(_GOOD_NAMES) >= _GOOD_NAMES_MAX:
            _GOOD_NAMES.clear()
        _GOOD_NAMES.add(node)
    boot, seq = p.boot_id, p.seq
    order: Order | None = None
    if boot is not None or seq is not None:
        if (boot is None or seq is None or not 0 < len(boot) <= MAX_BOOT_ID or not boot.isprintable()
                or not 0 <= seq <= MAX_SEQ):
            return None
        order = (boot, seq)
    results = p.results
    if isinstance(results, msgspec.UnsetType):
        digest = p.digest
        if isinstance(digest, msgspec.UnsetType) or _DIGEST.fullmatch(digest) is None:
            return None
        return Lease(node=node, time=p.time, digest=digest, order=order)
    failing = [r for r in results if r.status != "OK"]
    bad = tuple([Verdict(r.check, r.entity, _STATUSES[r.status], _ACTIONS[r.action], r.since, r.summary[:512])
                 for r in failing])
    fp = hash(tuple(map(_result_key, results)))
    # The failing results' evidence in the general path's canonical form (few: most reports have
    # none). What orjson cannot read (an integer beyond 64 bits) the general path refuses with why.
    try:
        evidence = [orjson.dumps(orjson.loads(bytes(r.evidence)), option=orjson.OPT_SORT_KEYS) for r in failing]
    except orjson.JSONDecodeError:
        return None
    return ParsedReport(node=node, time=p.time, verdicts=bad, raw=raw, fp=fp, order=order,
                        content=content_of(fp, map(_result_text, results), evidence))


def parse_events(obj: Any) -> EventBatch:
    d = _obj(obj, "body")
    node = _node(d, "body")
    out: list[WireEvent] = []
    for where, e in _objects(d, "events"):
        eid = _str(e, "id", where, limit=MAX_ID)
        etype = e.get("type")
        if etype not in _EVENT_TYPES:
            raise BadRequest(f"{where}.type: expected one of {', '.join(_EVENT_TYPES)}")
        t = _num(e, "time", where)
        order = _order(e, where)
        transition = report = None
        if etype == "event":
            ev = _obj(e.get("event"), f"{where}.event")
            kind = ev.get("kind")
            if (not isinstance(kind, str) or not 0 < len(kind) <= MAX_NAME or isinstance(ev.get("code"), bool)
                    or not isinstance(ev.get("code"), int)):
                raise BadRequest(f"{where}.event: expected kind (a string of 1 to {MAX_NAME} characters) "
                                 "and code (integer)")
        elif etype == "transition":
            transition = _verdict(e.get("new"), f"{where}.new")
        elif etype == "report":
            report = parse_report(e.get("report"), orjson.dumps(e.get("report")), f"{where}.report")
            if report.node != node:
                raise BadRequest(f"{where}.report.node: {report.node} in a batch for {node}")
            if order is not None:  # the record's place in the agent's order is the report's
                report = replace(report, order=order)
        else:
            counts = e.get("counts")
            if not isinstance(counts, dict) or not all(isinstance(v, int) for v in counts.values()):
                raise BadRequest(f"{where}.counts: expected an object of integers")
        body = "" if etype == "report" else orjson.dumps(e).decode()
        out.append(WireEvent(id=eid, type=etype, time=t, body=body, transition=transition, report=report,
                             order=order))
    return EventBatch(node=node, events=tuple(out))


_AM_SEVERITY = {"critical": "critical", "page": "critical", "error": "critical", "major": "critical",
                "warning": "warning", "warn": "warning", "minor": "warning", "info": "info", "none": "info"}


def parse_alertmanager(obj: Any, now: float, parse_time: Callable[[str], float | None]) -> list[AlertObservation]:
    """Alerts with a `node` label; the rest are ignored (a site's rules need not all be about nodes)."""
    d = _obj(obj, "body")
    out: list[AlertObservation] = []
    for where, a in _objects(d, "alerts"):
        labels = _obj(a.get("labels", {}), f"{where}.labels")
        if "node" not in labels:
            continue
        node = _str(labels, "node", f"{where}.labels")
        problem = node_name_problem(node)
        if problem:
            raise BadRequest(f"{where}.labels.node: {problem}")
        status = a.get("status")
        if status not in ("firing", "resolved"):
            raise BadRequest(f"{where}.status: expected firing or resolved")
        check = _str(labels, "alertname", f"{where}.labels")
        action = _ACTIONS.get(str(labels.get("action", "NONE")).upper(), Action.NONE)
        severity = _AM_SEVERITY.get(str(labels.get("severity", "warning")).lower(), "warning")
        claim = _am_time(a, "startsAt", where, parse_time)
        _am_time(a, "endsAt", where, parse_time)  # checked, not used: a resolved alert closes on arrival
        claim = now if claim is None else claim
        # The receiver's clock is the judge: an alert cannot have started after it arrived, so a
        # startsAt ahead of ours is its arrival (one beyond max_clock_skew is counted: apply_alerts).
        starts = min(claim, now)
        annotations = a.get("annotations") if isinstance(a.get("annotations"), dict) else {}
        summary = str((annotations or {}).get("summary", ""))[:512]
        firing = status == "firing"
        st = Status.OK if not firing else (Status.FAIL if severity == "critical" else Status.WARN)
        entity = str(labels.get("entity") or labels.get("gpu") or "node")[:MAX_NAME]
        ref = str(a.get("fingerprint", ""))[:MAX_ID]
        out.append(AlertObservation(node=node, verdict=Verdict(check=check[:MAX_NAME], entity=entity, status=st,
                                                               action=action, since=starts, summary=summary),
                                    severity=severity, firing=firing, ref=ref, time=starts, claim=claim))
    return out


def _am_time(a: Mapping[str, Any], key: str, where: str, parse_time: Callable[[str], float | None]) -> float | None:
    """An alert's startsAt or endsAt: None when it has none (absent, empty, or Go's zero time,
    0001-01-01T00:00:00Z, which Alertmanager sends for an unset endsAt); BadRequest when it is
    not a time, rather than a guess that would change what the aggregator records."""
    v = a.get(key)
    if v is None or v == "" or (isinstance(v, str) and v.startswith("0001-")):
        return None
    t = parse_time(v) if isinstance(v, str) and len(v) <= 64 else None
    if t is None:
        raise BadRequest(f"{where}.{key}: expected an RFC 3339 time (e.g. 2026-12-01T10:20:30Z)")
    return t


# RFC 3339 5.6 date-time (a space for the T, as its note allows), any number of fraction digits
# (Alertmanager sends nanoseconds). ASCII digits only: regex \d takes other scripts' digits.
_RFC3339 = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]+))?"
                      r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


def parse_rfc3339(text: str) -> float | None:
    """Seconds since the epoch of an RFC 3339 time, or None. The offset counts: the fraction's
    digits were once taken together with the offset's ("...30.123456789+02:00" read as UTC), and
    an alert stamped -05:00 then started five hours early, before any rule's min_duration."""
    from datetime import datetime
    if not text or text.startswith("0001-"):
        return None
    m = _RFC3339.fullmatch(text)
    if m is None:
        return None
    date, clock, frac, zone = m.groups()
    micros = f".{frac[:6]:0<6}" if frac else ""  # datetime takes microseconds
    try:
        dt = datetime.fromisoformat(f"{date}T{clock}{micros}{'+00:00' if zone in 'Zz' else zone}")
    except ValueError:  # a month 13, a minute 61, an offset of 99:99
        return None
    return dt.timestamp()


# ---- applying (on the event loop; returns ops for the writer) --------------------------------


@dataclass
class Applied:
    applied: int = 0
    duplicate: int = 0
    stale: int = 0
    unchanged: int = 0
    clock_ahead: int = 0  # time claims beyond max_clock_skew ahead (counted, not in the answer)

    def to_json(self) -> dict[str, int]:
        return {"applied": self.applied, "duplicate": self.duplicate, "stale": self.stale, "unchanged": self.unchanged}


def apply_report(mem: Memory, rep: ParsedReport, now: float) -> tuple[Applied, list[Op]]:
    result, ops = mem.apply_report(rep.node, rep.verdicts, rep.time, rep.raw, now, rep.fp, rep.order, rep.content)
    out = Applied(clock_ahead=int(mem.claim_ahead(rep.time, now)))
    setattr(out, result, 1)
    return out, ops


def apply_lease(mem: Memory, lease: Lease, now: float) -> tuple[Applied | None, list[Op]]:
    """None when the lease does not match what this aggregator knows (the caller answers 409)."""
    result, ops = mem.apply_lease(lease.node, lease.digest, lease.time, now, lease.order)
    if result == "conflict":
        return None, ops
    out = Applied(clock_ahead=int(mem.claim_ahead(lease.time, now)))
    setattr(out, result, 1)
    return out, ops


def apply_events(mem: Memory, batch: EventBatch, now: float) -> tuple[Applied, list[Op], list[str]]:
    """Apply a batch in order; returns counts, ops, and the ids newly marked seen (to undo on a failed commit)."""
    out = Applied()
    ops: list[Op] = []
    new_ids: list[str] = []
    _, node_ops = mem.ensure_node(batch.node, now)
    ops += node_ops
    in_batch: set[str] = set()
    for e in batch.events:
        out.clock_ahead += mem.claim_ahead(e.time, now)
        if e.type == "report":
            assert e.report is not None
            res, rops = mem.apply_report(batch.node, e.report.verdicts, e.report.time, e.report.raw, now,
                                         e.report.fp, e.report.order, e.report.content)
            ops += rops
            setattr(out, res, getattr(out, res) + 1)
            continue
        if e.id in mem.seen_ids or e.id in in_batch:
            out.duplicate += 1
            continue
        in_batch.add(e.id)
        new_ids.append(e.id)
        ops.append(mem.record_event(e.id, batch.node, e.type, e.time, e.body, now))
        if e.transition is not None:
            res, vops = mem.apply_verdict(batch.node, e.transition, now, "agent", ref=e.id, order=e.order)
            ops += vops
            if res == "stale":
                out.stale += 1
                continue
        out.applied += 1
    return out, ops, new_ids


def apply_alerts(mem: Memory, alerts: list[AlertObservation], now: float, learn: bool) -> tuple[Applied, list[Op]]:
    out = Applied()
    ops: list[Op] = []
    for a in alerts:
        out.clock_ahead += mem.claim_ahead(a.claim, now)  # Prometheus' or Alertmanager's clock, not the node's
        if a.node not in mem.nodes and not learn:
            out.stale += 1
            continue
        _, vops = mem.apply_verdict(a.node, a.verdict, now, "alertmanager", ref=a.ref, severity=a.severity)
        ops += vops
        out.applied += 1
    return out, ops
