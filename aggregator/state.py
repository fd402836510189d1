"""The running aggregator's picture of the fleet, in memory, mirrored to the store.

Every mutation here happens on the event loop and returns the SQL ops that persist it; the
caller hands those to the writer and (for ingest) awaits the commit before answering. Memory
holds only what decide() and the fleet API need per node — the full latest report stays in
SQLite — so 10,000 nodes cost a few MB.
"""

from __future__ import annotations

import collections
import operator
import types
from dataclasses import dataclass, field, fields, replace
from typing import Callable, Iterable, NamedTuple

from podhealth.vocab import Action, Status

from podhealth.fencing.fence import REPAIR, parse_reason
from podhealth.aggregator.model import (
    BreakerState, Condition, FenceMode, FleetState, NodeView, Source, severity_of,
)
from podhealth.aggregator.heard import HeardIndex
from podhealth.aggregator.store import Loaded, NodeRow, Observed, Op, Store

REACHABLE_CHECK = "agent_reachable"
Order = tuple[str, int]  # an agent's (boot_id, seq): see agent/sequence.py
RETIRED_BOOTS = 8  # earlier boots remembered per node: their late records are stale
UNREACHABLE_CHECK = "node_unreachable"


class Verdict(NamedTuple):
    """One check result as ingest needs it (the agent's evidence stays in the stored report).

    A NamedTuple rather than a frozen dataclass: ingest builds ~30 per report at ~1,000 reports/s,
    and a frozen dataclass's __init__ costs several times more.
    """

    check: str
    entity: str
    status: Status
    action: Action = Action.NONE
    since: float = 0.0
    summary: str = ""


@dataclass(eq=False, slots=True)
class NodeRec:
    name: str
    agent_url: str = ""
    slurm_name: str = ""
    k8s_name: str = ""
    partition: str = ""
    learned: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    status: Status = Status.UNKNOWN
    report_time: float = 0.0  # when the aggregator received the latest report (never the agent's claim)
    fp: int = 0  # fingerprint of the last report's verdicts, to skip unchanged reports cheaply; 0 = none
    content: int = 0  # ingest.ParsedReport.content of the stored report (memory only): 0 = unknown
    # Ordering by the agent's own sequence: the boot (epoch) and the seq of the latest report;
    # verdict_seq is the newest transition applied (stored since migration 9); retired: earlier boots.
    boot_id: str = ""
    report_seq: int = 0
    verdict_seq: int = 0
    retired: tuple[str, ...] = ()
    clock_ahead: int = 0  # records whose time claim was beyond max_clock_skew ahead of ours
    clock_offset: float = 0.0  # the latest report's time claim minus our clock (memory only)
    hold_reason: str = ""
    cycles: list[float] = field(default_factory=list)  # when its recent fences were done (flap hold)
    stored_at: float = 0.0  # when its latest full report was last written to the store (memory only)
    fence: FenceMode = FenceMode.NONE
    fence_reason: str = ""
    fenced_at: float = 0.0
    hold: bool = False
    opted_out: bool = False
    ok_since: float | None = None
    handover: str = ""
    handover_at: float = 0.0
    unreachable_since: float | None = None
    released_at: float = 0.0
    # Reported with a credential that speaks for this node alone (memory only: after a restart a
    # learned node counts again from its next report, so the breaker errs towards tripping).
    vouched: bool = False
    ladder: str = ""  # the remediation ladder's step: "", acting, verifying, repair (model.NodeView)
    ladder_at: float = 0.0
    ladder_failures: tuple[float, ...] = ()  # when its reset/reboot attempts failed (from the journal)
    evacuated: str = ""  # its jobs since the fence: "", polite, forced (model.NodeView)
    evacuated_jobs: int = -1  # how many jobs that evacuation touched; -1 not known (memory only)
    jobs: tuple[dict[str, object], ...] = ()  # the jobs/pods last seen on it (memory only; node page)

    def view(self) -> NodeView:
        remedy = entity = action = ""
        if self.fence is FenceMode.FENCED and self.fence_reason:
            r = parse_reason(self.fence_reason)
            action = r.action if r is not None else ""
            if r is not None and r.action in LADDER_ACTIONS and r.check != REPAIR:
                remedy, entity = r.action, r.entity
        return NodeView(name=self.name, partition=self.partition, fence=self.fence, hold=self.hold,
                        opted_out=self.opted_out, ok_since=self.ok_since, handover=self.handover,
                        handover_at=self.handover_at, can_handover=bool(self.agent_url),
                        released_at=self.released_at, hold_reason=self.hold_reason,
                        counted=not self.learned or self.vouched, remedy=remedy, remedy_entity=entity,
                        ladder=self.ladder, ladder_at=self.ladder_at, ladder_failures=self.ladder_failures,
                        fenced_at=self.fenced_at, fence_action=action, evacuated=self.evacuated)

    @property
    def state(self) -> str:
        """One word for the UI and the nodes-by-state metric."""
        if self.fence is FenceMode.EXTERNAL:
            return "drained"
        if self.ladder == "repair" and self.fence.ours:
            return "repair"
        if self.fence is FenceMode.RELEASING or (self.fence is FenceMode.FENCED and self.handover == "running"):
            return "returning"
        if self.fence.ours:
            return "fenced"
        return self.status.value

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.name, "state": self.state, "status": self.status.value, "partition": self.partition,
            "agent_url": self.agent_url, "slurm_name": self.slurm_name or self.name,
            "k8s_name": self.k8s_name or self.name, "learned": self.learned, "first_seen": self.first_seen,
            "last_seen": self.last_seen, "report_time": self.report_time, "fence": self.fence.value,
            "fence_reason": self.fence_reason, "fenced_at": self.fenced_at, "hold": self.hold,
            "opted_out": self.opted_out, "ok_since": self.ok_since, "handover": self.handover,
            "handover_at": self.handover_at, "unreachable_since": self.unreachable_since,
            "released_at": self.released_at, "hold_reason": self.hold_reason,
            "order": {"boot_id": self.boot_id, "seq": self.report_seq, "retired_boots": list(self.retired)},
            "clock": {"ahead": self.clock_ahead, "offset": round(self.clock_offset, 3)},
            "ladder": {"step": self.ladder, "since": self.ladder_at, "failures": list(self.ladder_failures)},
            "jobs": list(self.jobs), "evacuated": self.evacuated, "evacuated_jobs": self.evacuated_jobs,
        }


def digest_of(fp: int) -> str:
    """The token the agent echoes in a lease (ingest.Lease): a report fingerprint as 16 hex digits.

    The fingerprint is Python's keyed hash, so a token from an earlier aggregator process never
    matches (nor does any token after a restart: fingerprints are not persisted), which is the
    point: a lease is only good against the memory that took the full report.
    """
    return format(fp & 0xFFFF_FFFF_FFFF_FFFF, "016x")


STATES = ("OK", "WARN", "FAIL", "UNKNOWN", "fenced", "returning", "drained", "repair")
OURS_STATES = ("fenced", "returning", "repair")  # the states of a node whose fence is podhealth's (fence.ours), and only those
LADDER_ACTIONS = frozenset({"RESET_GPU", "REBOOT"})  # what a fence asks for that the ladder can try
# A full report whose content (ingest.ParsedReport.content) did not change replaces the stored
# one at most this often (config report_refresh): agents send one every
# publish.full_report_interval with fresh readings in passing checks' evidence, and rewriting
# ~20 KB per node for those was 9-17% of the aggregator's CPU at scale.
REPORT_REFRESH_S = 3600.0


@dataclass
class Memory:
    nodes: dict[str, NodeRec] = field(default_factory=dict)
    conditions: dict[tuple[str, str, str], Condition] = field(default_factory=dict)
    by_node: dict[str, set[tuple[str, str, str]]] = field(default_factory=dict)
    seen_ids: set[str] = field(default_factory=set)
    seen_order: collections.deque[tuple[float, str]] = field(default_factory=collections.deque)
    breaker: BreakerState = BreakerState()
    recent_fences: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=10000))
    recent_steps: collections.deque[float] = field(default_factory=lambda: collections.deque(maxlen=1000))
    views: dict[str, NodeView] = field(default_factory=dict)
    version: int = 0  # bumped on every change that could alter a decision
    # bumped when a condition opens (or turns) FAIL with an action: a change the policy may fence
    # on, which the decide loop runs for at once, never after its coalescing gap (service.py)
    actionable: int = 0
    max_skew: float = 30.0  # seconds an agent's time claim may run ahead of our clock (config max_clock_skew)
    report_refresh: float = REPORT_REFRESH_S  # config report_refresh
    heard: HeardIndex = field(default_factory=HeardIndex)  # what housekeeping must look at (heard.py)

    # ---- loading -----------------------------------------------------------------------------

    @classmethod
    def from_loaded(cls, loaded: Loaded) -> "Memory":
        m = cls()
        for r in loaded.nodes:
            m.nodes[r.name] = NodeRec(
                name=r.name, agent_url=r.agent_url, slurm_name=r.slurm_name, k8s_name=r.k8s_name,
                partition=r.partition, learned=r.learned, first_seen=r.first_seen, last_seen=r.last_seen,
                status=Status(r.status), report_time=r.report_time, fence=r.fence, fence_reason=r.fence_reason,
                fenced_at=r.fenced_at, hold=r.hold, opted_out=r.opted_out, ok_since=r.ok_since, handover=r.handover,
                handover_at=r.handover_at, unreachable_since=r.unreachable_since, released_at=r.released_at,
                boot_id=r.boot_id, report_seq=r.report_seq, verdict_seq=r.verdict_seq,
                retired=tuple(r.retired_boots.split()),
                clock_ahead=r.clock_ahead, hold_reason=r.hold_reason, ladder=r.ladder, ladder_at=r.ladder_at,
                ladder_failures=tuple(loaded.ladder_failures.get(r.name, ())),
                evacuated=loaded.evacuated.get(r.name, ""))
        for c in loaded.conditions:
            m.conditions[c.key] = c
            m.by_node.setdefault(c.node, set()).add(c.key)
        for eid, received in loaded.event_ids:
            m.seen_ids.add(eid)
            m.seen_order.append((received, eid))
        m.breaker = loaded.breaker
        m.recent_fences.extend(sorted(loaded.recent_fences))
        for rec in m.nodes.values():
            if rec.handover == "running":
                rec.handover = "failed"  # the request died with the previous process
            m.views[rec.name] = rec.view()
        m.heard = HeardIndex.of(((r.name, r.last_seen) for r in m.nodes.values() if r.last_seen),
                                (r.name for r in m.nodes.values() if r.unreachable_since is not None))
        return m

    # ---- nodes -------------------------------------------------------------------------------

    def ensure_node(self, name: str, now: float, *, learned: bool = True) -> tuple[NodeRec, list[Op]]:
        rec = self.nodes.get(name)
        if rec is not None:
            return rec, []
        rec = NodeRec(name=name, learned=learned, first_seen=now)
        self.nodes[name] = rec
        self.views[name] = rec.view()
        self.version += 1
        return rec, [Store.op_node_insert(NodeRow(name=name, learned=learned, first_seen=now))]

    def configure_node(self, name: str, agent_url: str, slurm_name: str, k8s_name: str, partition: str,
                       now: float) -> list[Op]:
        rec, ops = self.ensure_node(name, now, learned=False)
        rec.agent_url, rec.slurm_name, rec.k8s_name, rec.partition, rec.learned = (
            agent_url, slurm_name, k8s_name, partition, False)
        self._refresh(rec)
        return ops + [Store.op_node_config(name, agent_url, slurm_name, k8s_name, partition)]

    def vouch(self, name: str) -> None:
        """`name` spoke with its own credential: it is a real node (it counts in the breaker's fleet)."""
        rec = self.nodes.get(name)
        if rec is not None and not rec.vouched:
            rec.vouched = True
            self._refresh(rec)

    def forget_stale_learned(self, now: float, after: float, busy: Iterable[str] = ()) -> list[str]:
        """Learned nodes silent for `after` seconds (never one podhealth fences, or with an action
        in flight), forgotten in memory; returns their names (Store.ops_node_forget persists it)."""
        skip = set(busy)
        # Only nodes silent that long: the heard index holds them oldest first (heard.py).
        gone = []
        for name in self.heard.silent_for(now, after):
            r = self.nodes.get(name)
            if (r is not None and now - r.first_seen >= after and r.learned and r.fence is FenceMode.NONE
                    and name not in skip):
                gone.append(name)
        for name in gone:
            del self.nodes[name]
            self.views.pop(name, None)
            self.heard.drop(name)
            for key in self.by_node.pop(name, set()):
                self.conditions.pop(key, None)
        if gone:
            self.version += 1
        return gone

    def set_node(self, name: str, **fields: object) -> list[Op]:
        """Change fence/handover fields of a node and persist them."""
        rec = self.nodes[name]
        for k, v in fields.items():
            setattr(rec, k, v)
        self._refresh(rec)
        db = {k: (v.value if isinstance(v, FenceMode) else int(v) if isinstance(v, bool) else v)
              for k, v in fields.items()}
        return [Store.op_node_fields(name, **db)]

    def ladder_failed(self, name: str, at: float) -> None:
        """Count a failed reset/reboot attempt of `name` (memory only: the action journal holds it)."""
        rec = self.nodes[name]
        rec.ladder_failures = (*rec.ladder_failures, at)[-64:]
        self._refresh(rec)

    def set_evacuated(self, name: str, value: str) -> None:
        """What was done about the node's jobs since its fence (memory only: the evacuate actions
        in the journal are the record, Store.evacuations)."""
        rec = self.nodes[name]
        rec.evacuated = value
        self._refresh(rec)

    def _refresh(self, rec: NodeRec) -> None:
        self.views[rec.name] = rec.view()
        self.version += 1

    def fleet(self) -> FleetState:
        return FleetState(nodes=types.MappingProxyType(self.views), breaker=self.breaker,
                          recent_fences=tuple(self.recent_fences))

    def open_conditions(self) -> Iterable[Condition]:
        return self.conditions.values()

    def conditions_of(self, node: str) -> list[Condition]:
        return sorted((self.conditions[k] for k in self.by_node.get(node, ())), key=lambda c: (c.check, c.entity))

    def counts(self) -> dict[str, int]:
        """Nodes by `NodeRecord.state`. A walk of every node (the housekeeping pass takes it only
        when memory changed): an unfenced node's state is its status, read without the property
        that, called for each of 100,000 nodes, made the walk 3-4 times as long."""
        out = dict.fromkeys(STATES, 0)
        none = FenceMode.NONE
        for rec in self.nodes.values():
            state = rec.status.value if rec.fence is none else rec.state
            out[state] = out.get(state, 0) + 1
        return out

    # ---- observations ------------------------------------------------------------------------

    def apply_report(self, node: str, verdicts: tuple[Verdict, ...], report_time: float, raw: str | bytes,
                     now: float, fp: int | None = None, order: Order | None = None,
                     content: int = 0) -> tuple[str, list[Op]]:
        """A full verdict set from the agent (OK results may be left out when `fp`, the
        fingerprint of all of them, is given). Returns ("applied"|"unchanged"|"stale", ops).
        `content` (ingest.ParsedReport.content; 0: unknown) tells an unchanged report from one
        whose summaries or failing evidence moved: only those are written again at once; the
        others (and any of unknown content) once the stored copy is report_refresh old.

        `report_time` is the agent's claim, kept only to show its clock's offset; the report is
        ordered by `order` (or, from an agent that sends none, by arrival) and timed by `now`."""
        rec, ops = self.ensure_node(node, now)
        ops += self._claim(rec, report_time, now)
        if self._stale(rec, order, report=True):
            return "stale", ops
        ops += self._advance(rec, order, report=True)
        if fp is None:
            fp = hash(tuple((v.check, v.entity, v.status.value, v.action.value) for v in verdicts))
        if fp == rec.fp:
            ops += self._seen_unchanged(rec, now)
            if (content and content != rec.content) or now - rec.stored_at >= self.report_refresh:
                rec.stored_at, rec.content = now, content
                ops.append(Store.op_report(node, raw))  # same verdicts, new evidence (or an old copy)
            return "unchanged", ops
        rec.report_time = now
        rec.last_seen = now
        self.heard.hear(node, now)
        ops += self._reachable(rec, now)
        rec.fp = fp
        rec.content = content
        bad = {(v.check, v.entity): v for v in verdicts if v.status is not Status.OK}
        for (check, entity), v in bad.items():
            ops += self._open(node, check, entity, v.status, v.action, severity_of(v.status), v.since, now, "agent",
                              "", v.summary)
        for key in list(self.by_node.get(node, ())):
            c = self.conditions[key]
            if c.source == "agent" and (c.check, c.entity) not in bad:
                ops += self._close(key, now)
        ops += self._status(rec, now)
        ops += [Store.op_node_report(node, rec.status.value, now, now, rec.report_seq), Store.op_report(node, raw)]
        rec.stored_at = now
        self.heard.dirty.discard(node)  # the report's row carries last_seen
        return "applied", ops

    def apply_lease(self, node: str, digest: str, report_time: float, now: float,
                    order: Order | None = None) -> tuple[str, list[Op]]:
        """The node's verdicts are still those of the full report whose fingerprint gave `digest`.

        "conflict" (and nothing changes) when this memory has no such report for the node: it
        never had one, restarted since, or took an agent transition after it (which may have
        opened or closed a condition the report did not), so only a full report can say how
        things are. Otherwise "unchanged" or "stale", exactly as for a full report.
        """
        rec = self.nodes.get(node)
        if rec is None or not rec.fp or digest_of(rec.fp) != digest:
            return "conflict", []
        ops = self._claim(rec, report_time, now)
        if self._stale(rec, order, report=True):
            return "stale", ops
        ops += self._advance(rec, order, report=True)
        return "unchanged", ops + self._seen_unchanged(rec, now)

    def lease_quiet(self, node: str, digest: str, report_time: float, now: float,
                    order: Order | None) -> str | None:
        """apply_lease for the lease of nearly every heartbeat at scale: a reachable node with no
        open condition, the same boot, a clock within the skew. Then a lease changes a few fields
        of the record in place and writes nothing now (last_seen goes out with flush_seen), so
        the caller needs no checkpoint. Returns "unchanged" or "stale" as apply_lease would, or
        None when any of that does not hold (nothing changed; use apply_lease)."""
        rec = self.nodes.get(node)
        if (rec is None or not rec.fp or rec.status is not Status.OK or rec.ok_since is None
                or rec.unreachable_since is not None or node in self.by_node
                or self.claim_ahead(report_time, now) or digest_of(rec.fp) != digest
                or (order is not None and order[0] != rec.boot_id)):
            return None
        rec.clock_offset = report_time - now  # as _claim, which has nothing to write here
        if self._stale(rec, order, report=True):
            return "stale"
        if order is not None:
            rec.report_seq = order[1]  # as _advance within the boot
        rec.report_time = rec.last_seen = now
        heard = self.heard
        heard.hear(node, now)
        heard.dirty.add(node)
        return "unchanged"

    # ---- ordering: the agent's sequence, our clock -------------------------------------------

    def claim_ahead(self, claim: float, now: float) -> bool:
        """An agent's time claim further ahead of our clock than the allowed skew."""
        return claim - now > self.max_skew

    def _claim(self, rec: NodeRec, claim: float, now: float) -> list[Op]:
        """Note how far the agent's clock is from ours; count a claim from the future (it orders
        and times nothing, but the operator should know the node's clock is wrong)."""
        rec.clock_offset = claim - now
        if not self.claim_ahead(claim, now):
            return []
        rec.clock_ahead += 1
        return [Store.op_node_fields(rec.name, clock_ahead=rec.clock_ahead)]

    @staticmethod
    def _stale(rec: NodeRec, order: Order | None, *, report: bool) -> bool:
        """Older than what was applied, by the agent's (boot_id, seq). A record without one (an
        older agent, a pulled /health) is ordered by arrival: never stale.

        A report is stale when not newer than the last report, or older than a transition
        already applied (transitions go through the agent's spool and heartbeats do not, so they
        arrive in either order); a transition when older than the last report. A boot other
        than the current one starts a new epoch, unless it is one the node already left."""
        if order is None:
            return False
        boot, seq = order
        if boot != rec.boot_id:
            return boot in rec.retired
        if report:
            return seq <= rec.report_seq or seq < rec.verdict_seq
        return seq < rec.report_seq

    def _advance(self, rec: NodeRec, order: Order | None, *, report: bool) -> list[Op]:
        if order is None:
            return []
        boot, seq = order
        ops: list[Op] = []
        if boot != rec.boot_id:
            if rec.boot_id:
                rec.retired = (rec.boot_id, *rec.retired)[:RETIRED_BOOTS]
            rec.boot_id, rec.report_seq, rec.verdict_seq = boot, 0, 0
            ops.append(Store.op_node_fields(rec.name, boot_id=boot, report_seq=0, verdict_seq=0,
                                            retired_boots=" ".join(rec.retired)))
        if report:
            rec.report_seq = seq
        else:
            rec.verdict_seq = max(rec.verdict_seq, seq)
        return ops

    def reset_order(self, node: str) -> list[Op]:
        """Forget a node's ordering (an operator's call, e.g. after a forged seq): its next record
        of any boot starts afresh."""
        rec = self.nodes[node]
        rec.boot_id, rec.report_seq, rec.verdict_seq, rec.retired, rec.clock_ahead = "", 0, 0, (), 0
        rec.fp = 0  # the next heartbeat carries the full report
        return [Store.op_node_fields(node, boot_id="", report_seq=0, retired_boots="", clock_ahead=0)]

    def _seen_unchanged(self, rec: NodeRec, now: float) -> list[Op]:
        """Same verdicts as last time: only say "seen again" (the breaker reset needs it)."""
        rec.report_time = now
        rec.last_seen = now
        self.heard.hear(rec.name, now)
        ops = self._reachable(rec, now)
        for key in self.by_node.get(rec.name, ()):
            c = self.conditions[key]
            if c.source == "agent":
                self.conditions[key] = replace(c, observed=now)
        self.heard.dirty.add(rec.name)
        return ops + self._status(rec, now)

    def apply_verdict(self, node: str, v: Verdict, now: float, source: Source = "agent",
                      ref: str = "", severity: str | None = None, order: Order | None = None) -> tuple[str, list[Op]]:
        """One verdict change (an agent's transition, an alert firing or resolving); an agent's is
        ordered among its reports by `order` (see _stale), never by the event's own time claim."""
        rec, ops = self.ensure_node(node, now)
        if source == "agent":
            if self._stale(rec, order, report=False):
                return "stale", ops  # a newer full report already said how things are
            ops += self._advance(rec, order, report=False)
            if order is not None:  # for the leader, when this is a follower (adopt)
                ops.append(Store.op_node_verdict_seq(node, rec.boot_id, rec.verdict_seq, now))
            rec.fp = 0  # the last report no longer describes the node: no lease or "unchanged" until a new one
            if now > rec.last_seen:
                rec.last_seen = now
                self.heard.hear(node, now)
            self.heard.dirty.add(node)
            ops += self._reachable(rec, now)
        key = (node, v.check, v.entity)
        if v.status is Status.OK:
            if key in self.conditions:
                ops += self._close(key, now)
        else:
            ops += self._open(node, v.check, v.entity, v.status, v.action, severity or severity_of(v.status), v.since,
                              now, source, ref, v.summary)
        ops += self._status(rec, now)
        return "applied", ops

    def mark_unreachable(self, node: str, now: float, unreachable_after: float, why: str,
                         since: float | None = None) -> list[Op]:
        """UNKNOWN at once (never fences); the separate node_unreachable condition after a while."""
        rec = self.nodes[node]
        ops: list[Op] = []
        if rec.unreachable_since is None:
            rec.unreachable_since = since if since is not None else now
            ops += [Store.op_node_fields(node, unreachable_since=rec.unreachable_since)]
            ops += self._open(node, REACHABLE_CHECK, "node", Status.UNKNOWN, Action.NONE, "info",
                              rec.unreachable_since, now, "aggregator", "", why)
        if now - rec.unreachable_since >= unreachable_after and (node, UNREACHABLE_CHECK, "node") not in self.conditions:
            ops += self._open(node, UNREACHABLE_CHECK, "node", Status.FAIL, Action.NONE, "warning",
                              rec.unreachable_since, now, "aggregator", "",
                              f"unreachable for {now - rec.unreachable_since:.0f}s: {why}")
        ops += self._status(rec, now)
        self._watch(rec)
        return ops

    def _watch(self, rec: NodeRec) -> None:
        """Housekeeping looks at an unreachable node until its node_unreachable condition is open."""
        if rec.unreachable_since is not None and (rec.name, UNREACHABLE_CHECK, "node") not in self.conditions:
            self.heard.watch.add(rec.name)
        else:
            self.heard.watch.discard(rec.name)

    def _reachable(self, rec: NodeRec, now: float) -> list[Op]:
        if rec.unreachable_since is None:
            return []
        rec.unreachable_since = None
        self.heard.watch.discard(rec.name)
        ops = [Store.op_node_fields(rec.name, unreachable_since=None)]
        for check in (REACHABLE_CHECK, UNREACHABLE_CHECK):
            if (rec.name, check, "node") in self.conditions:
                ops += self._close((rec.name, check, "node"), now)
        return ops

    def mark_notified(self, key: tuple[str, str, str]) -> list[Op]:
        c = self.conditions.get(key)
        if c is None or c.notified:
            return []
        c = replace(c, notified=True)
        self.conditions[key] = c
        return [Store.op_condition(c)]

    def _open(self, node: str, check: str, entity: str, status: Status, action: Action, severity: str,
              since: float, now: float, source: Source, ref: str, summary: str) -> list[Op]:
        key = (node, check, entity)
        old = self.conditions.get(key)
        if old is not None and (old.status, old.action, old.severity) == (status, action, severity):
            self.conditions[key] = replace(old, observed=now, summary=summary or old.summary)
            return []
        # The agent's first-seen time on our clock: its claim moved by how far the node's clock
        # is from ours (clock_offset, from its latest report), so a node whose clock lags cannot
        # skip a rule's min_duration. Our receive time when it is missing or in the future.
        rec = self.nodes.get(node)
        if source == "agent" and since > 0 and rec is not None:
            since -= rec.clock_offset
        start = since if 0 < since <= now else now
        if old is not None and old.status is status:
            start = min(start, old.since)
        same = old is not None and old.status is status
        c = Condition(node=node, check=check, entity=entity, status=status, action=action, severity=severity,
                      since=start, observed=now, source=source, ref=ref, summary=summary[:512],
                      notified=old.notified if old is not None and same else False,
                      opened=(old.opened or now) if old is not None and same else now)
        self.conditions[key] = c
        self.by_node.setdefault(node, set()).add(key)
        self.version += 1
        if status is Status.FAIL and action is not Action.NONE:
            self.actionable += 1
        return [Store.op_condition(c),
                Store.op_verdict(node, now, check, entity, status.value, action.value, source, summary[:512])]

    def _close(self, key: tuple[str, str, str], now: float) -> list[Op]:
        c = self.conditions.pop(key)
        keys = self.by_node.get(c.node)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self.by_node[c.node]
        self.version += 1
        return [Store.op_condition_close(key),
                Store.op_verdict(c.node, now, c.check, c.entity, Status.OK.value, Action.NONE.value, c.source)]

    def _worst(self, rec: NodeRec) -> Status:
        """The node's status from its open conditions (OK with none once it has reported)."""
        keys = self.by_node.get(rec.name, ())
        return Status.worst([self.conditions[k].status for k in keys]) if keys else (
            Status.OK if rec.report_time else Status.UNKNOWN)

    def _status(self, rec: NodeRec, now: float) -> list[Op]:
        keys = self.by_node.get(rec.name, ())
        status = self._worst(rec)
        ok_since = rec.ok_since
        if keys:
            ok_since = None
        elif ok_since is None and rec.report_time:
            ok_since = now
        if status is rec.status and ok_since == rec.ok_since:
            return []
        rec.status, rec.ok_since = status, ok_since
        self._refresh(rec)
        return [Store.op_node_fields(rec.name, status=status.value, ok_since=ok_since)]

    def adopt(self, rows: Iterable[Observed], conditions: Iterable[Condition]) -> int:
        """Another replica's ingest, read back from the shared store (Store.observed_since).

        A node whose stored report is newer than the one held here takes the stored status and
        open conditions; one whose stored agent transition is newer than every record applied
        here (by the agent's order: a FAIL sent only to a follower) takes the stored agent
        conditions; one only seen later takes the later last_seen. A stored state older than
        this memory by the agent's (boot_id, seq) is never taken, nor one whose conditions are
        not in the answer (not changed since the cursor). Fence, hold and ladder fields are the
        leader's own and stay. Returns how many nodes took newer state (memory only: what they
        took is the store's already)."""
        by_node: dict[str, list[Condition]] = {}
        for c in conditions:
            by_node.setdefault(c.node, []).append(c)
        taken = 0
        for o in rows:
            rec = self.nodes.get(o.name)
            if rec is None:
                continue  # a node learned at another replica: the next takeover loads it
            if o.last_seen > rec.last_seen:
                rec.last_seen = o.last_seen
                self.heard.hear(o.name, o.last_seen)
            if not o.changed:
                continue
            stored = by_node.get(o.name, ())
            if self._newer_report(rec, o):
                self._replace_conditions(o.name, stored, lambda c: True)
                rec.report_time, rec.status, rec.ok_since = o.report_time, Status(o.status), o.ok_since
                rec.unreachable_since = None
                self.heard.watch.discard(o.name)
            elif self._newer_transition(rec, o):
                # Only the agent's own conditions: the leader's liveness and alerts' stay as they are.
                self._replace_conditions(o.name, stored, lambda c: c.source == "agent")
                rec.status = self._worst(rec)
                if o.name in self.by_node:
                    rec.ok_since = None
                elif rec.ok_since is None:
                    rec.ok_since = o.ok_since
            else:
                continue
            if o.boot_id != rec.boot_id:
                # The boots the store's writer saw the node leave, and those this memory saw it
                # leave; this memory's own boot only if the store says so: were the stored boot a
                # stale one (a spooled record that reached a lagging replica), retiring ours here
                # would make all its next records stale.
                left = (*o.retired_boots.split(), *rec.retired)
                rec.retired = tuple(b for b in dict.fromkeys(left) if b != o.boot_id)[:RETIRED_BOOTS]
                rec.boot_id, rec.report_seq, rec.verdict_seq = o.boot_id, o.report_seq, o.verdict_seq
            else:  # neither seq goes back (see _behind, _newer_transition)
                rec.report_seq, rec.verdict_seq = max(rec.report_seq, o.report_seq), max(rec.verdict_seq, o.verdict_seq)
            rec.fp = 0  # the next report here is compared afresh (and no lease holds: conditions moved)
            self._refresh(rec)
            taken += 1
        return taken

    @classmethod
    def _newer_report(cls, rec: NodeRec, o: Observed) -> bool:
        """The stored report is newer than this memory's: by the agent's order within one boot
        (two replicas' receive times of reports a few ms apart are not an order: each reads the
        database's clock with an error of half a round trip); by receive time, on the
        database's clock, across boots and from agents without a seq."""
        if cls._behind(rec, o):
            return False
        if o.boot_id and o.boot_id == rec.boot_id and (o.report_seq or rec.report_seq):
            return o.report_seq > rec.report_seq
        return o.report_time > rec.report_time

    @staticmethod
    def _behind(rec: NodeRec, o: Observed) -> bool:
        """The stored report is older than this memory's: of a boot the node already left, or in
        the same boot an older report, or one that has not seen a transition applied here (its
        conditions lack it: the read came before this replica's own commit)."""
        if o.boot_id != rec.boot_id:
            return o.boot_id in rec.retired
        return o.verdict_seq < rec.verdict_seq or o.report_seq < rec.report_seq

    @staticmethod
    def _newer_transition(rec: NodeRec, o: Observed) -> bool:
        """The store holds an agent transition newer than every record this memory applied: in
        the same boot, newer than its newest transition and not older than its latest report
        (such a one is stale, see _stale); or one of another boot that the stored row says
        followed this memory's (its retired_boots name this one), or any when this memory has no
        boot. Never one of a boot retired here. Agents without seq have none. The stored
        report_seq is not asked: it arrives with the lazy last-seen flush (op_node_seen),
        seconds after the report, and may lag a transition stored at once."""
        if not o.boot_id or o.verdict_seq <= 0:
            return False
        if o.boot_id != rec.boot_id:
            return o.boot_id not in rec.retired and (not rec.boot_id or rec.boot_id in o.retired_boots.split())
        return o.verdict_seq > rec.verdict_seq and o.verdict_seq >= rec.report_seq

    def _replace_conditions(self, node: str, stored: Iterable[Condition], which: Callable[[Condition], bool]) -> None:
        """The node's conditions that `which` picks become the stored ones (memory only: they are
        the store's already)."""
        was: dict[tuple[str, str, str], Condition] = {}
        for key in [k for k in self.by_node.get(node, ()) if which(self.conditions[k])]:
            was[key] = self.conditions.pop(key)
            self.by_node[node].discard(key)
        for c in stored:
            if which(c):
                old = was.get(c.key)
                if c.status is Status.FAIL and c.action is not Action.NONE and (
                        old is None or (old.status, old.action) != (c.status, c.action)):
                    self.actionable += 1  # another replica's FAIL, read back by the leader
                self.conditions[c.key] = c
                self.by_node.setdefault(node, set()).add(c.key)
        if not self.by_node.get(node, True):
            del self.by_node[node]
        self.version += 1

    # ---- events and fences -------------------------------------------------------------------

    def record_event(self, event_id: str, node: str, type_: str, time: float, body: str, now: float) -> Op:
        self.seen_ids.add(event_id)
        self.seen_order.append((now, event_id))
        # The agent's time is a claim: never later than when it arrived (history sorts by it).
        return Store.op_event(event_id, node, type_, min(time, now), now, body)

    def forget_ids(self, ids: Iterable[str]) -> None:
        """Undo record_event for a batch whose commit failed, so its resend is applied."""
        for eid in ids:
            self.seen_ids.discard(eid)

    def prune_ids(self, before: float) -> list[Op]:
        """Forget ids received before `before` (the retention window) in memory and on disk."""
        while self.seen_order and self.seen_order[0][0] < before:
            _, eid = self.seen_order.popleft()
            self.seen_ids.discard(eid)
        return [Store.op_prune_events(before)]

    def flush_seen(self) -> list[Op]:
        """last_seen of nodes whose unchanged reports were not written (persisted lazily)."""
        ops: list[Op] = []
        nodes = self.nodes
        for name in self.heard.take_dirty():  # only the nodes heard since the last flush (heard.py)
            rec = nodes.get(name)
            if rec is not None:
                ops.append(Store.op_node_seen(name, rec.last_seen, rec.report_time, rec.report_seq, rec.boot_id))
        return ops

    def set_breaker(self, b: BreakerState) -> list[Op]:
        if b == self.breaker:
            return []
        self.breaker = b
        self.version += 1
        return [Store.op_breaker(b)]

    # ---- undo for a commit that failed -----------------------------------------------------------

    def checkpoint(self, *names: str) -> "Checkpoint":
        """What `rollback` needs to put these nodes (their records and conditions) back as they
        are now: taken before a change whose ops may fail to commit (a full disk), so memory
        never runs ahead of the store (a node left `fencing` with no pending action).

        Every ingest request takes one (~1,000/s), so a record is saved as the tuple of its
        field values (one C call) rather than copied as an object."""
        saved: dict[str, tuple[object, ...] | None] = {}
        conds: dict[str, dict[tuple[str, str, str], Condition]] = {}
        for name in names if len(names) == 1 else dict.fromkeys(names):
            rec = self.nodes.get(name)
            saved[name] = None if rec is None else _save_rec(rec)
            keys = self.by_node.get(name)
            conds[name] = {k: self.conditions[k] for k in keys} if keys else {}
        return Checkpoint(saved, conds)

    def rollback(self, cp: "Checkpoint", only: Iterable[str] | None = None) -> None:
        """Put the checkpointed nodes (or `only` these of them) back, in place: coroutines
        holding a NodeRec see it too. A fence counted for the rate limit stays counted (the
        safe side: one fence fewer in this window, never one more)."""
        keep = None if only is None else set(only)
        for name, saved in cp.nodes.items():
            if keep is not None and name not in keep:
                continue
            for key in self.by_node.pop(name, set()):
                self.conditions.pop(key, None)
            if saved is None:
                self.nodes.pop(name, None)
                self.views.pop(name, None)
                self.heard.drop(name)
            else:
                rec = self.nodes.get(name)
                if rec is None:
                    rec = self.nodes[name] = NodeRec(name=name)
                _restore_rec(rec, saved)
                self.views[name] = rec.view()
            self.conditions.update(cp.conditions[name])
            if cp.conditions[name]:
                self.by_node[name] = set(cp.conditions[name])
            rec_now = self.nodes.get(name)
            if rec_now is not None:
                self._watch(rec_now)
        self.version += 1


class Checkpoint(NamedTuple):  # not a frozen dataclass: one per ingest request, and its __init__ is slower
    nodes: dict[str, tuple[object, ...] | None]  # a record's field values (_save_rec); None: it did not exist
    conditions: dict[str, dict[tuple[str, str, str], Condition]]


_REC_FIELDS = tuple(f.name for f in fields(NodeRec))
_rec_values = operator.attrgetter(*_REC_FIELDS)
# Fields holding a mutable container (NodeRec.cycles): saved as a copy, or a later in-place
# change would show in the checkpoint too.
_REC_MUTABLE = tuple(i for i, f in enumerate(fields(NodeRec)) if f.default_factory in (list, dict, set))


def _save_rec(rec: NodeRec) -> tuple[object, ...]:
    values: tuple[object, ...] = _rec_values(rec)
    if not _REC_MUTABLE:
        return values
    out = list(values)
    for i in _REC_MUTABLE:
        v = out[i]
        out[i] = type(v)(v)  # type: ignore[call-arg]  # list, dict or set: a shallow copy
    return tuple(out)


def _restore_rec(rec: NodeRec, values: tuple[object, ...]) -> None:
    """Put `values` (_save_rec) back into `rec`, in place (coroutines holding it see it too);
    mutable containers are copied again, so the checkpoint can be restored twice."""
    for i, (name, v) in enumerate(zip(_REC_FIELDS, values)):
        setattr(rec, name, type(v)(v) if i in _REC_MUTABLE else v)  # type: ignore[call-arg]

