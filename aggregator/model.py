"""The aggregator's data: what it observed about nodes and what it knows about their fences.

Shared by the store (which persists them), the policy (which reads them) and the API (which
renders them). Frozen, so a decide() run sees one consistent picture.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Literal, Mapping

from podhealth.vocab import Action, Status

from podhealth.fencing.fence import FenceReason

Source = Literal["agent", "alertmanager", "aggregator"]


class FenceMode(enum.Enum):
    """Where a node stands with fencing, from the store's point of view."""

    NONE = "none"
    FENCING = "fencing"  # a fence action is pending (recorded, not yet confirmed)
    FENCED = "fenced"  # fenced by podhealth
    RELEASING = "releasing"  # a release action is pending
    EXTERNAL = "external"  # fenced by someone else (a human's drain): never touched

    @property
    def ours(self) -> bool:
        return self in (FenceMode.FENCING, FenceMode.FENCED, FenceMode.RELEASING)


def severity_of(status: Status) -> str:
    """Severity of an agent verdict; UNKNOWN has none that could ever fence."""
    return {Status.FAIL: "critical", Status.WARN: "warning"}.get(status, "info")


@dataclass(frozen=True, slots=True)
class Condition:
    """A lasting non-OK observation about one (node, check, entity).

    `since` is when it started (the agent's first-seen time when it says so), `observed` the
    aggregator's clock at the latest observation: the breaker reset compares against it, so an
    agent's skewed clock cannot make stale news look fresh.
    """

    node: str
    check: str
    entity: str
    status: Status
    action: Action = Action.NONE
    severity: str = "critical"
    since: float = 0.0
    observed: float = 0.0
    source: Source = "agent"
    ref: str = ""  # id of the event / alert that opened it
    summary: str = ""
    notified: bool = False
    # The aggregator's clock when this (node, check, entity) turned to `status`: `since` is the
    # agent's claim and lags with its clock, so the breaker and the operator-release rule count
    # by this instead. 0 (a condition built elsewhere, e.g. in a test) falls back to `since`.
    opened: float = 0.0

    @property
    def went_bad(self) -> float:
        return self.opened or self.since

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.check, self.entity)

    def to_json(self) -> dict[str, object]:
        return {
            "check": self.check, "entity": self.entity, "status": self.status.value,
            "action": self.action.value, "severity": self.severity, "since": self.since,
            "observed": self.observed, "source": self.source, "ref": self.ref, "summary": self.summary,
            "opened": self.opened,
        }


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the policy needs to know about one node."""

    name: str
    partition: str = ""
    fence: FenceMode = FenceMode.NONE
    hold: bool = False  # an operator's fence: no automatic return to service
    opted_out: bool = False  # the backend says hands off (Kubernetes label podhealth.io/managed=false)
    ok_since: float | None = None  # all verdicts OK since then; None while any is not OK
    handover: str = ""  # "", "running", "passed", "failed"
    handover_at: float = 0.0  # last handover attempt
    can_handover: bool = False  # has an agent URL to ask
    released_at: float = 0.0  # an operator released it: conditions older than this do not fence again
    # In the fleet the breaker's percentage is taken of: configured, found in a fencer's backend,
    # or vouched for by its own credential. A name that merely arrived (open ingest, the shared
    # token) is not, so ghosts cannot dilute the breaker or a partition's cap.
    counted: bool = True
    hold_reason: str = ""  # why it is held for an operator (an operator's fence, or flapping)
    # The remediation ladder (policy._ladder): what the fence asks for (RESET_GPU / REBOOT, "" =
    # nothing to climb), on which entity (GPU3); the step now ("" none, "acting" a reset/reboot in
    # flight, "verifying" done and waiting for the handover suite, "repair" handed to a human);
    # when that step began; and when earlier attempts failed (from the action journal).
    remedy: str = ""
    remedy_entity: str = ""
    ladder: str = ""
    ladder_at: float = 0.0
    ladder_failures: tuple[float, ...] = ()
    fenced_at: float = 0.0
    fence_action: str = ""  # the action podhealth's fence reason names (DRAIN, RESET_GPU, ...)
    evacuated: str = ""  # its jobs: "" untouched, "polite" (evicted/left to finish), "forced" (requeued)


@dataclass(frozen=True, slots=True)
class Silence:
    """An operator's silence: `check` on `node` does not count toward a fence until `until` (the
    aggregator's clock). It is still shown, still stored, still alerted on by Prometheus."""

    node: str
    check: str
    until: float
    reason: str
    who: str
    created: float

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "check": self.check, "until": self.until, "reason": self.reason,
                "who": self.who, "created": self.created}


@dataclass(frozen=True, slots=True)
class BreakerState:
    tripped: bool = False
    tripped_at: float = 0.0
    reset_at: float = 0.0  # observations before this are held back until seen again
    reason: str = ""


@dataclass(frozen=True)
class FleetState:
    nodes: Mapping[str, NodeView]
    breaker: BreakerState = BreakerState()
    # start times of podhealth's recent new fences, on the `now` scale decide() is given (the
    # service measures them with a monotonic clock and converts, so a wall clock step is harmless)
    recent_fences: tuple[float, ...] = ()
    # start times of recent resets/reboots (the ladder's rate limit), on the same scale
    recent_remediations: tuple[float, ...] = ()
    # (node, check) an operator silenced, still in force at `now` (service.Aggregator.fleet_now)
    silenced: frozenset[tuple[str, str]] = frozenset()


ActionKind = Literal["fence", "release", "handover", "notify", "reset_gpu", "reboot", "repair", "evacuate"]
LADDER_STEPS = ("reset_gpu", "reboot")  # the rungs that act on a node (repair only marks it)


@dataclass(frozen=True, slots=True)
class Planned:
    """One action decide() asks for; the service executes it (or, in dry run, the dry-run fencer)."""

    kind: ActionKind
    node: str
    why: str
    reason: FenceReason | None = None
    rule: str = ""  # the rule's `do` (fence / fence_and_reboot / notify)
    condition: tuple[str, str, str] | None = None
    dry_run: bool = False
    entity: str = ""  # reset_gpu: the GPU ("GPU3")
    failed_verify: bool = False  # the attempt being verified ran out of time: journal it as failed first
    force: bool = False  # evacuate: requeue (Slurm) rather than wait for the jobs


NoteKind = Literal[
    "dry_run", "breaker_tripped", "breaker_holding", "cap_reached", "partition_cap_reached",
    "rate_limited", "opted_out", "fenced_by_other", "waiting_min_duration", "held_since_reset",
    "awaiting_manual_release", "no_agent_url", "operator_hold", "operator_released",
    "ladder_verifying", "ladder_held", "repair", "jobs_held", "silenced",
]


@dataclass(frozen=True, slots=True)
class Note:
    kind: NoteKind
    node: str = ""
    detail: str = ""


@dataclass(frozen=True)
class Decision:
    actions: tuple[Planned, ...] = ()
    notes: tuple[Note, ...] = ()
    breaker: BreakerState = field(default_factory=BreakerState)

    def notes_of(self, kind: NoteKind) -> list[Note]:
        return [n for n in self.notes if n.kind == kind]

    def of_kind(self, kind: ActionKind) -> list[Planned]:
        return [a for a in self.actions if a.kind == kind]
