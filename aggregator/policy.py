"""What to do about the fleet: `decide(observations, fleet, now, policy) -> Decision`. Pure.

No I/O, no clock, no randomness: the same inputs give the same decision, so every safety rule
below is tested exhaustively without a cluster. The order of the safety checks matters and is
the order a human would want: a tripped breaker stops everything; then a node that is not ours
to touch is left alone; then the caps; then the rate limit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from podhealth.vocab import Action, Status

from podhealth.config_aggregator import AggregatorConfig, RuleConfig
from podhealth.fencing.fence import FenceReason
from podhealth.aggregator.model import (
    ActionKind, BreakerState, Condition, Decision, FenceMode, FleetState, NodeView, Note, Planned,
)

RATE_WINDOW = 60.0
_OURS = frozenset(m for m in FenceMode if m.ours)


@dataclass(frozen=True)
class Policy:
    rules: tuple[RuleConfig, ...]
    max_fenced: int = 10
    max_percent_per_partition: float = 10.0
    fences_per_minute: int = 10
    breaker_share_percent: float = 10.0
    breaker_window: float = 300.0
    breaker_min_nodes: int = 3
    opt_out: frozenset[str] = frozenset()
    manual_release: bool = False
    healthy_for: float = 600.0
    dry_run: bool = False
    ladder: bool = False
    ladder_max_attempts: int = 2
    ladder_window: float = 86400.0
    ladder_verify_within: float = 3600.0
    ladder_max_remediating: int = 5
    ladder_per_minute: int = 2
    jobs: bool = False
    job_modes: Mapping[str, str] = dataclasses.field(default_factory=dict)
    job_default: str = "wait"
    job_fatal: tuple[str, ...] = ()
    job_force_after: float = 3600.0
    job_evict_after: float = 1800.0

    @classmethod
    def from_config(cls, cfg: AggregatorConfig) -> "Policy":
        return cls(
            rules=cfg.rules, max_fenced=cfg.caps.max_fenced,
            max_percent_per_partition=cfg.caps.max_percent_per_partition,
            fences_per_minute=cfg.rate_limit.fences_per_minute,
            breaker_share_percent=cfg.breaker.share_percent, breaker_window=cfg.breaker.window,
            breaker_min_nodes=cfg.breaker.min_nodes, opt_out=frozenset(cfg.opt_out),
            manual_release=cfg.manual_release, healthy_for=cfg.healthy_for, dry_run=cfg.dry_run,
            ladder=cfg.ladder.enabled, ladder_max_attempts=cfg.ladder.max_attempts, ladder_window=cfg.ladder.window,
            ladder_verify_within=cfg.ladder.verify_within, ladder_max_remediating=cfg.ladder.max_remediating,
            ladder_per_minute=cfg.ladder.per_minute, jobs=cfg.jobs.enabled, job_modes=dict(cfg.jobs.modes),
            job_default=cfg.jobs.default, job_fatal=cfg.jobs.fatal, job_force_after=cfg.jobs.force_after,
            job_evict_after=cfg.jobs.evict_after,
        )


def rule_for(c: Condition, rules: Sequence[RuleConfig]) -> RuleConfig | None:
    """The first rule matching the condition. UNKNOWN ("could not decide") never matches."""
    if c.status is Status.UNKNOWN or c.status is Status.OK:
        return None
    for r in rules:
        if r.matches(c.check, c.action.value, c.severity):
            return r
    return None


def partition_limit(size: int, percent: float) -> int:
    """Nodes of a partition that may be fenced at once; at least one, so small pools are not immune."""
    return max(1, math.floor(size * percent / 100.0 + 1e-9))


@dataclass(frozen=True)
class _Candidate:
    node: str
    cond: Condition
    rule: RuleConfig
    since: float  # effective: never earlier than the breaker's last reset


def decide(observations: Iterable[Condition], fleet: FleetState, now: float, policy: Policy) -> Decision:
    notes: list[Note] = []
    actions: list[Planned] = []
    breaker = fleet.breaker
    if policy.dry_run:
        notes.append(Note("dry_run", detail="dry run: fences go to the dry-run fencer only"))

    ready: dict[str, _Candidate] = {}  # node -> earliest condition past its minimum duration
    fatal: set[str] = set()  # nodes with a failure after which their jobs are already dead
    bad_at: dict[str, float] = {}  # node -> when it turned bad (for the breaker)
    rules_of: dict[tuple[Status, str, Action, str], RuleConfig | None] = {}
    for c in observations:
        if fleet.silenced and (c.node, c.check) in fleet.silenced:
            # An operator silenced this check on this node: it counts toward no fence, no job
            # action and not the breaker until the silence ends (expiry is the service's clock).
            notes.append(Note("silenced", c.node, f"{c.check} {c.entity} {c.status.value}: silenced by an operator"))
            continue
        if policy.jobs and c.status is Status.FAIL and is_fatal(c, policy.job_fatal):
            fatal.add(c.node)
        # Conditions of one kind share their rule: matched once per decide() (at 100,000 nodes with
        # a warning each, matching every condition's globs held the event loop 200-300 ms a run).
        kind = (c.status, c.check, c.action, c.severity)
        rule = rules_of[kind] if kind in rules_of else rules_of.setdefault(kind, rule_for(c, policy.rules))
        if rule is None:
            continue
        if breaker.reset_at and c.observed < breaker.reset_at:
            # Seen only before an operator reset the breaker: never replayed, must be seen again.
            notes.append(Note("held_since_reset", c.node, f"{c.check} {c.entity} last seen before the breaker reset"))
            continue
        since = max(c.since, breaker.reset_at)
        # The breaker counts when the aggregator saw a node go bad, never the agent's claim: a
        # fleet whose clocks lag by more than the window must still trip it.
        went_bad = max(c.went_bad, breaker.reset_at)
        if rule.do == "notify":
            if not c.notified:
                actions.append(Planned("notify", c.node, f"{c.check} {c.entity} {c.status.value}", rule="notify",
                                       condition=c.key))
            continue
        bad_at[c.node] = min(bad_at.get(c.node, went_bad), went_bad)
        if now - since < rule.min_duration:
            notes.append(Note("waiting_min_duration", c.node,
                              f"{c.check} {c.entity}: {now - since:.0f}s of {rule.min_duration:g}s"))
            continue
        cur = ready.get(c.node)
        if cur is None or (since, c.check, c.entity) < (cur.since, cur.cond.check, cur.cond.entity):
            ready[c.node] = _Candidate(c.node, c, rule, since)

    breaker = _breaker(bad_at, fleet, now, policy, breaker, notes)
    nodes = fleet.nodes
    ours = 0
    part_size: dict[str, int] = {}
    part_fenced: dict[str, int] = {}
    if ready:  # the fleet-wide counts cost a pass over every node: only when there is something to fence
        none = FenceMode.NONE
        for v in nodes.values():
            if v.counted:  # a ghost must not widen its partition's cap
                part_size[v.partition] = part_size.get(v.partition, 0) + 1
            if v.fence is not none:
                part_fenced[v.partition] = part_fenced.get(v.partition, 0) + 1
                if v.fence in _OURS:
                    ours += 1
    recent = sum(1 for t in fleet.recent_fences if now - RATE_WINDOW < t <= now)

    for cand in sorted(ready.values(), key=lambda k: (k.since, k.node)):
        view = nodes.get(cand.node) or NodeView(cand.node)
        what = f"{cand.cond.check} {cand.cond.entity} {cand.cond.status.value} {cand.cond.action.value}"
        if view.fence.ours:
            continue  # already fenced or being fenced: fencing is idempotent, planning is too
        if view.released_at and cand.cond.went_bad <= view.released_at:
            notes.append(Note("operator_released", cand.node,
                              f"{what}: an operator released the node after this began; waits for a new failure"))
            continue
        if view.fence is FenceMode.EXTERNAL:
            notes.append(Note("fenced_by_other", cand.node, f"{what}: already fenced by someone else; left alone"))
            continue
        if breaker.tripped:
            notes.append(Note("breaker_holding", cand.node, f"{what}: not fenced, breaker tripped"))
            continue
        if cand.node in policy.opt_out or view.opted_out:
            why = "config opt_out" if cand.node in policy.opt_out else "backend opt-out"
            notes.append(Note("opted_out", cand.node, f"{what}: {why}"))
            continue
        if ours >= policy.max_fenced:
            notes.append(Note("cap_reached", cand.node, f"{what}: {ours} of {policy.max_fenced} fenced"))
            continue
        size = part_size.get(view.partition, 1)
        limit = partition_limit(size, policy.max_percent_per_partition)
        if part_fenced.get(view.partition, 0) >= limit:
            notes.append(Note("partition_cap_reached", cand.node,
                              f"{what}: partition '{view.partition}' has {part_fenced.get(view.partition, 0)} "
                              f"of {size} fenced (limit {limit})"))
            continue
        if recent >= policy.fences_per_minute:
            notes.append(Note("rate_limited", cand.node, f"{what}: {recent} fences in the last minute"))
            continue
        ours += 1
        recent += 1
        part_fenced[view.partition] = part_fenced.get(view.partition, 0) + 1
        # fence_and_reboot: the ladder (when on) starts at REBOOT whatever the failure asked for.
        asked = "REBOOT" if cand.rule.do == "fence_and_reboot" else cand.cond.action.value
        reason = FenceReason(check=cand.cond.check, entity=cand.cond.entity, action=asked, id=_reason_id(cand.cond))
        actions.append(Planned("fence", cand.node, what, reason=reason, rule=cand.rule.do,
                               condition=cand.cond.key, dry_run=policy.dry_run))

    actions.extend(_returns(nodes.values(), now, policy, notes))
    actions.extend(_ladder(nodes.values(), now, policy, breaker, fleet.recent_remediations, notes))
    actions.extend(_evacuations(nodes.values(), fatal, now, policy, breaker, notes))
    return Decision(actions=tuple(actions), notes=tuple(notes), breaker=breaker)


def _breaker(bad_at: dict[str, float], fleet: FleetState, now: float, policy: Policy,
             breaker: BreakerState, notes: list[Note]) -> BreakerState:
    if breaker.tripped:
        notes.append(Note("breaker_tripped", detail=breaker.reason))
        return breaker
    turned = sorted(n for n, t in bad_at.items() if t > now - policy.breaker_window)
    if len(turned) < policy.breaker_min_nodes:
        return breaker
    # Of the known fleet only (NodeView.counted): names that merely arrived do not dilute it.
    # Counted here, past the cheap test above, so a quiet decide() never walks every node.
    known = sum(1 for v in fleet.nodes.values() if v.counted)
    total = max(known, len(bad_at), 1)
    if len(turned) * 100.0 > policy.breaker_share_percent * total:
        reason = (f"{len(turned)} of {total} nodes turned bad within {policy.breaker_window:g}s "
                  f"(> {policy.breaker_share_percent:g}%): {', '.join(turned[:10])}"
                  + (" ..." if len(turned) > 10 else ""))
        notes.append(Note("breaker_tripped", detail=reason))
        return BreakerState(tripped=True, tripped_at=now, reset_at=breaker.reset_at, reason=reason)
    return breaker


def _returns(views: Iterable[NodeView], now: float, policy: Policy, notes: list[Note]) -> list[Planned]:
    out: list[Planned] = []
    fenced = FenceMode.FENCED
    healthy = [v for v in views if v.fence is fenced and v.ok_since is not None
               and now - v.ok_since >= policy.healthy_for]
    for v in sorted(healthy, key=lambda v: v.name):
        assert v.ok_since is not None
        if v.ladder == "acting":
            continue  # a reset or reboot is in flight: the handover suite waits for its outcome
        if v.hold:
            notes.append(Note("operator_hold", v.name, (v.hold_reason or "fenced by an operator")
                              + ": waits for `podhealth fleet release`"))
        elif v.name in policy.opt_out:
            notes.append(Note("opted_out", v.name, "healthy but opted out: podhealth does not release it"))
        elif policy.manual_release:
            notes.append(Note("awaiting_manual_release", v.name, f"all OK for {now - v.ok_since:.0f}s"))
        elif not v.can_handover:
            notes.append(Note("no_agent_url", v.name, "healthy but no agent URL to run the handover suite"))
        elif v.handover == "running" or (v.handover_at and now - v.handover_at < policy.healthy_for):
            continue
        else:
            out.append(Planned("handover", v.name, f"all OK for {now - v.ok_since:.0f}s", dry_run=policy.dry_run))
    return out


def _ladder(views: Iterable[NodeView], now: float, policy: Policy, breaker: BreakerState,
            recent_steps: Sequence[float], notes: list[Note]) -> list[Planned]:
    """The next rung for each node podhealth fenced for a failure that asks for RESET_GPU or REBOOT.

    A reset (first, when the failure asks for one and names a GPU), then reboots; a step that
    failed, or that the node did not follow by passing the handover suite within verify_within,
    is a failed attempt; max_attempts of them within the window (counted from the operator's last
    release) send the node to REPAIR, which is never retried automatically. Every rung that acts
    on a node is held by the breaker, the opt-out, the cap on nodes in remediation and the rate
    limit, in that order, like a fence.
    """
    if not policy.ladder:
        return []
    fenced = FenceMode.FENCED
    cands = [v for v in views if v.fence is fenced and (v.remedy or v.ladder)]
    if not cands:
        return []
    busy = sum(1 for v in views if v.ladder in ("acting", "verifying"))
    recent = sum(1 for t in recent_steps if now - RATE_WINDOW < t <= now)
    out: list[Planned] = []
    for v in sorted(cands, key=lambda v: v.name):
        if v.ladder in ("repair", "acting"):
            continue
        if v.hold:
            notes.append(Note("ladder_held", v.name, (v.hold_reason or "held for an operator") + ": no remediation"))
            continue
        failures = [t for t in v.ladder_failures if now - policy.ladder_window < t and t > v.released_at]
        failed_verify = False
        if v.ladder == "verifying":
            if v.ok_since is not None:
                continue  # healthy again: the handover suite decides whether it returns
            if now - v.ladder_at < policy.ladder_verify_within:
                notes.append(Note("ladder_verifying", v.name, f"{now - v.ladder_at:.0f}s of "
                                  f"{policy.ladder_verify_within:g}s for the handover suite to pass"))
                continue
            failed_verify = True
            failures.append(now)
        elif (v.ok_since is not None and v.handover != "failed") or not v.remedy:
            continue  # looks healthy (the handover suite decides), or nothing to climb
        if len(failures) >= policy.ladder_max_attempts:
            out.append(Planned("repair", v.name, f"{len(failures)} failed remediation attempts within "
                               f"{policy.ladder_window:g}s (limit {policy.ladder_max_attempts})",
                               entity=v.remedy_entity, failed_verify=failed_verify, dry_run=policy.dry_run))
            continue
        gpu = gpu_index(v.remedy_entity)
        step: ActionKind = "reset_gpu" if v.remedy == "RESET_GPU" and not failures and gpu is not None else "reboot"
        what = f"{step} after {len(failures)} failed attempt(s): {v.remedy} {v.remedy_entity}"
        others = busy - (1 if v.ladder == "verifying" else 0)
        if breaker.tripped:
            notes.append(Note("ladder_held", v.name, f"{what}: breaker tripped"))
        elif v.name in policy.opt_out or v.opted_out:
            notes.append(Note("ladder_held", v.name, f"{what}: opted out"))
        elif others >= policy.ladder_max_remediating:
            notes.append(Note("ladder_held", v.name, f"{what}: {others} of {policy.ladder_max_remediating} "
                              "nodes in remediation"))
        elif recent >= policy.ladder_per_minute:
            notes.append(Note("ladder_held", v.name, f"{what}: {recent} resets/reboots in the last minute"))
        else:
            busy = others + 1
            recent += 1
            out.append(Planned(step, v.name, what, entity=v.remedy_entity if step == "reset_gpu" else "",
                               failed_verify=failed_verify, dry_run=policy.dry_run))
    return out


def is_fatal(c: Condition, fatal: Sequence[str]) -> bool:
    """The failure leaves no job alive on the node: `check`, or `check:CODE` for an XID verdict
    whose summary names that code (checks/passive/xid.py: "XID 95: ...")."""
    for f in fatal:
        check, _, code = f.partition(":")
        if c.check != check:
            continue
        if not code or c.summary.split(":", 1)[0].split()[-1:] == [code]:
            return True
    return False


def job_mode(v: NodeView, fatal: bool, policy: Policy) -> str:
    return "now" if fatal else policy.job_modes.get(v.fence_action, policy.job_default)


def _evacuations(views: Iterable[NodeView], fatal: set[str], now: float, policy: Policy, breaker: BreakerState,
                 notes: list[Note]) -> list[Planned]:
    """When the jobs on a node podhealth fenced are moved off (Planned "evacuate").

    wait: Slurm's drain lets them finish; only Kubernetes pods are evicted after evict_after,
    through the Eviction API (PodDisruptionBudgets hold it). wait_then_force: the same, then
    Slurm jobs are requeued after force_after. now (a fatal failure: the jobs are already dead):
    requeued / evicted at once. Once per fence and force; never while the breaker holds, never
    on an opted-out node.
    """
    if not policy.jobs:
        return []
    out: list[Planned] = []
    fenced = FenceMode.FENCED
    # forced: done for this fence; failed: the backend refused (audited), an operator takes it from there
    for v in sorted((v for v in views if v.fence is fenced and v.evacuated not in ("forced", "failed")),
                    key=lambda v: v.name):
        mode = job_mode(v, v.name in fatal, policy)
        age = now - v.fenced_at if v.fenced_at else 0.0
        force = mode == "now" or (mode == "wait_then_force" and age >= policy.job_force_after)
        polite = not force and not v.evacuated and age >= policy.job_evict_after
        if not (force or polite):
            continue
        what = f"{'requeue/evict' if force else 'evict'} the jobs ({mode}, fenced {age:.0f}s ago)"
        if breaker.tripped:
            notes.append(Note("jobs_held", v.name, f"{what}: breaker tripped"))
        elif v.name in policy.opt_out or v.opted_out:
            notes.append(Note("jobs_held", v.name, f"{what}: opted out"))
        else:
            out.append(Planned("evacuate", v.name, what, force=force, dry_run=policy.dry_run))
    return out


def gpu_index(entity: str) -> int | None:
    """`gpu3` (checks/passive/context.py gpu_entity) -> 3: the GPU a reset is for; None when the entity
    names no single GPU (a node-wide failure cannot be fixed by resetting one)."""
    head, digits = entity[:3], entity[3:]
    if head.lower() == "gpu" and digits.isdigit() and len(digits) <= 3:
        return int(digits)
    return None


def _reason_id(c: Condition) -> str:
    """A short id that ties a Slurm reason back to the event (or condition) behind the fence."""
    if c.ref:
        clean = "".join(ch for ch in c.ref if ch.isalnum() or ch in "-_.")
        if clean:
            return clean[:16]
    return hashlib.sha1(f"{c.node}|{c.check}|{c.entity}|{c.since}".encode()).hexdigest()[:12]
