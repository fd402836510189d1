"""The fencer seam: what the aggregator asks of Slurm, Kubernetes, or a stand-in.

Fencers are thin and idempotent: `fence` on a node that is already fenced by us changes
nothing; `release` only undoes a fence that podhealth itself made (`FenceState.ours`), so a
node an operator drained by hand is never resumed.

The contract of every call that changes something (fence, release, reboot, remark, evacuate):
it returns a `FenceOutcome` only when the thing is done (changed=True) or was already done
(changed=False). Otherwise it raises: `Transient` when the backend could not be reached or did
not complete the call (the same call may work later), `Refused` when the backend refuses the
request for good (an unknown node, a fence that is not ours, an opt-out, a name it refuses).
Both carry the command run and the backend's answer (`FenceError`), as an outcome does: the
store appends them to the audit log verbatim.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence, runtime_checkable


@dataclass(frozen=True)
class FenceReason:
    """Why podhealth fences a node; rendered into the Slurm reason / Kubernetes annotation.

    `epoch`: the lease epoch of the aggregator that leaves the mark (0: none, an older mark).
    Reconcile tells a deposed leader's late mark by it (aggregator/lifecycle.py)."""

    check: str
    entity: str
    action: str
    id: str
    epoch: int = 0


@dataclass(frozen=True)
class FenceState:
    """What a fencer sees on the node right now.

    `ours` is true only when the fence carries podhealth's mark (Slurm reason prefix
    `podhealth:`, Kubernetes taint/annotation). `opted_out` is the backend's own opt-out
    (e.g. the label `podhealth.io/managed=false`).
    """

    node: str
    exists: bool
    fenced: bool
    ours: bool
    reason: str = ""
    opted_out: bool = False
    raw: str = ""
    epoch: int = 0  # the lease epoch written into podhealth's mark (0: none, or not ours)


@dataclass(frozen=True)
class FenceOutcome:
    """A call that is done: changed=True when this call did it, False when it was already so."""

    changed: bool
    command: tuple[str, ...] = ()
    output: str = ""
    error: str = ""


class FenceError(Exception):
    """A fencer call that is not done, with what the audit log records of it: `command` (() when
    none was run), `output` (the backend's answer) and `error`, the fencer's own words on why
    (str(e), unless a caller that names the call in front passes the fencer's words on)."""

    def __init__(self, message: str, *, command: tuple[str, ...] = (), output: str = "",
                 error: str | None = None) -> None:
        super().__init__(message)
        self.error = message if error is None else error
        self.command = command
        self.output = output


class Transient(FenceError, RuntimeError):
    """The backend could not answer (slurmctld down, an API timeout): the same call may work later.
    A fencer raises it after its ONE attempt; the action journal (aggregator/actions/journal.py)
    is the only place that tries again, with backoff and a cap."""


class LeaseExpired(RuntimeError):
    """The caller's lease ran out before this external call could start (or while it ran: it
    was killed). Not Transient: a deposed leader does not try again, the next leader does."""


# Seconds left before the caller's lease deadline, on the monotonic clock (inf: no lease, a
# process that acts alone). A fencer asks it immediately before every external call it starts
# and gives that call no more time than is left: a leader frozen (SIGSTOP) between two calls of
# one fence, then deposed, starts nothing when it wakes.
Guard = Callable[[], float]


def time_left(guard: Guard | None, what: str) -> float:
    """What is left of the lease for `what` (inf without a guard); LeaseExpired when nothing is."""
    if guard is None:
        return math.inf
    left = guard()
    if left <= 0:
        raise LeaseExpired(f"{what}: not started: this aggregator's lease deadline has passed")
    return left


class Refused(FenceError, ValueError):
    """The request itself cannot be carried out (a node name the backend refuses, an unknown node,
    a fence that is not podhealth's, an opt-out, an agent's final "no"): trying again changes
    nothing. A ValueError, which is what the name validators raise."""


def refuse_bad_name(validate: Callable[[str], object], node: str) -> None:
    """`validate(node)`, a backend's name rule, with its ValueError raised as Refused."""
    try:
        validate(node)
    except ValueError as e:
        raise Refused(str(e)) from None


@dataclass(frozen=True)
class NodeNames:
    """A node's names: podhealth's own, and the ones the config gives for each backend (empty:
    the same as `node`). Each fencer picks its own (`Fencer.target`)."""

    node: str
    slurm: str = ""
    kubernetes: str = ""


@runtime_checkable
class Fencer(Protocol):
    """One attempt per call, bounded by the fencer's own timeout; never a retry loop inside.

    A call that changes something returns an outcome only for done or already done, and raises
    Transient (try again later) or Refused (never) otherwise (see the module docstring)."""

    name: str
    # Seconds one backend call may take (`fencers.<name>.timeout`). A public call is a few of them
    # (read, update, read back): the action runner gives each public call 2 x this, no more.
    timeout: float

    def target(self, names: NodeNames) -> str:
        """The node's name in this backend: every other call takes this name."""
        ...

    async def read(self, node: str) -> FenceState: ...

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Idempotent: already fenced (by anyone) → changed=False."""
        ...

    async def release(self, node: str) -> FenceOutcome:
        """Only if ours: a fence podhealth did not make is left alone (Refused says why)."""
        ...

    async def list_fenced(self) -> dict[str, FenceState]:
        """Every node this backend sees as fenced (ours or not), for reconcile on start."""
        ...


@runtime_checkable
class BatchFencer(Protocol):
    """Optional extension of Fencer: read and fence many nodes per backend round trip.

    Per node, the answers mean exactly what `read` and `fence` answer for it (fence_many is
    idempotent and reads before and after, like fence): fence_many's value for a node is the
    outcome, or the Transient/Refused that fence would raise for it. A node missing from an answer means
    "could not say for this one" (a name the backend refuses, an ambiguous error): the caller
    then uses the single-node call for it, which gives the precise error.
    """

    async def read_many(self, nodes: Sequence[str]) -> dict[str, FenceState]: ...

    async def fence_many(self, items: Sequence[tuple[str, FenceReason]]
                         ) -> dict[str, FenceOutcome | FenceError]: ...


@runtime_checkable
class SeenFencer(Protocol):
    """Optional extension of Fencer: fence from a state the caller has just read.

    `fence_seen(node, reason, seen)` answers what `fence` answers, with `seen` (this fencer's
    `read` of the node, taken right before) standing for fence's own read before the change, so
    a fence is one read and one change. It is idempotent the same way (already fenced, by anyone:
    changed=False, nothing sent). A caller retrying after a wait calls `fence`, which reads
    again: in the wait someone may have drained the node.
    """

    async def fence_seen(self, node: str, reason: FenceReason, seen: FenceState) -> FenceOutcome: ...


@runtime_checkable
class Remediator(Protocol):
    """Optional extension of Fencer: the scheduler's own way to reboot a node, and to change the
    reason on a fence podhealth made (REPAIR). Single attempts, like every fencer call: the action
    journal (aggregator/actions/journal.py) is the one retrier."""

    async def reboot(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Have the node rebooted once its jobs are done, and kept out of service afterwards (the
        handover suite returns it). Only on a fence podhealth made; a reboot already requested
        is changed=False."""
        ...

    async def remark(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Give podhealth's fence on `node` a new reason; someone else's fence -> Refused."""
        ...


@dataclass(frozen=True)
class Job:
    """Work on a node: a Slurm job or a Kubernetes pod, and the GPUs it holds there."""

    id: str  # Slurm job id; a pod's namespace/name
    owner: str = ""  # Slurm user; the pod's namespace
    name: str = ""
    state: str = ""
    gpus: tuple[int, ...] = ()  # indices on this node; () = none known (or none requested)

    def label(self) -> str:
        """`4101 (alice, GPU 0-7)`: how an audit line or a reason names it."""
        gpus = f", GPU {','.join(str(g) for g in self.gpus)}" if self.gpus else ""
        return f"{self.id} ({self.owner}{gpus})"

    def to_json(self) -> dict[str, object]:
        return {"id": self.id, "owner": self.owner, "name": self.name, "state": self.state, "gpus": list(self.gpus)}


@runtime_checkable
class JobSource(Protocol):
    """Optional extension of Fencer: the work on a node, and getting it off the node."""

    async def jobs(self, node: str) -> list[Job]:
        """The jobs/pods on `node` now (raises when the backend cannot answer)."""
        ...

    async def evacuate(self, node: str, jobs: Sequence[Job], force: bool) -> FenceOutcome:
        """Move `jobs` off a node podhealth fenced. force=False is the polite way (Slurm: the drain
        already lets jobs finish, nothing to do; Kubernetes: the Eviction API, which honours
        PodDisruptionBudgets); force=True: Slurm `scontrol requeue`. One attempt."""
        ...


REASON_PREFIX = "podhealth:"
REPAIR = "REPAIR"  # the check name of a REPAIR reason: `podhealth: REPAIR <check>/<entity> <action> [<id>]`


_EPOCH = re.compile(r"e([0-9]{1,18})")


def parse_reason(text: str) -> FenceReason | None:
    """A FenceReason back from a rendered `podhealth: check entity action [id] eEPOCH` (older
    marks have no epoch; Slurm may append text after it, e.g. ` : reboot issued`); None when the
    text is not one of ours."""
    if not text.startswith(REASON_PREFIX):
        return None
    parts = text[len(REASON_PREFIX):].split()
    if len(parts) >= 4 and parts[3].startswith("[") and parts[3].endswith("]"):
        m = _EPOCH.fullmatch(parts[4]) if len(parts) >= 5 else None
        return FenceReason(check=parts[0], entity=parts[1], action=parts[2], id=parts[3][1:-1],
                           epoch=int(m.group(1)) if m else 0)
    return None


def mark_epoch(text: str) -> int:
    """The lease epoch in a rendered reason (0: none, or not ours)."""
    r = parse_reason(text)
    return r.epoch if r is not None else 0


def repair_reason(r: FenceReason) -> FenceReason:
    """The distinct reason of a node handed to repair: `podhealth: REPAIR xid/gpu3 RESET_GPU [id]`."""
    if r.check == REPAIR:
        return r
    return FenceReason(check=REPAIR, entity=f"{r.check}/{r.entity}", action=r.action, id=r.id, epoch=r.epoch)


def render_reason(reason: FenceReason) -> str:
    """`podhealth: <check> <entity> <action> [<id>] e<epoch>` — the mark that makes a fence ours
    (without ` e<epoch>` when there is none)."""
    epoch = f" e{reason.epoch}" if reason.epoch > 0 else ""
    return f"{REASON_PREFIX} {reason.check} {reason.entity} {reason.action} [{reason.id}]{epoch}"


@dataclass
class _DryRunNode:
    fenced: bool
    reason: str
    at: float


@dataclass
class DryRunFencer:
    """Remembers what it would have done and touches nothing outside this process.

    Used in dry-run mode and where neither Slurm nor Kubernetes is configured; its state is
    in memory only, so after a restart it reports nothing fenced (reconcile then trusts the
    store, since a dry-run fence never existed outside it).
    """

    name: str = "dryrun"
    timeout: float = 10.0  # it calls nothing outside this process; the default of every backend
    _nodes: dict[str, _DryRunNode] = field(default_factory=dict)

    def target(self, names: NodeNames) -> str:
        return names.node

    async def read(self, node: str) -> FenceState:
        n = self._nodes.get(node)
        if n is None or not n.fenced:
            return FenceState(node=node, exists=True, fenced=False, ours=False)
        return FenceState(node=node, exists=True, fenced=True, ours=True, reason=n.reason)

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        text = render_reason(reason)
        cmd = ("dryrun", "fence", node, text)
        n = self._nodes.get(node)
        if n is not None and n.fenced:
            return FenceOutcome(changed=False, command=cmd, output="already fenced")
        self._nodes[node] = _DryRunNode(fenced=True, reason=text, at=time.time())
        return FenceOutcome(changed=True, command=cmd, output="would fence (dry run)")

    async def release(self, node: str) -> FenceOutcome:
        cmd = ("dryrun", "release", node)
        n = self._nodes.get(node)
        if n is None or not n.fenced:
            return FenceOutcome(changed=False, command=cmd, output="not fenced")
        n.fenced = False
        return FenceOutcome(changed=True, command=cmd, output="would release (dry run)")

    async def list_fenced(self) -> dict[str, FenceState]:
        return {k: await self.read(k) for k, v in self._nodes.items() if v.fenced}

    async def reboot(self, node: str, reason: FenceReason) -> FenceOutcome:
        return FenceOutcome(changed=False, command=("dryrun", "reboot", node),
                            output="would reboot (dry run)")

    async def remark(self, node: str, reason: FenceReason) -> FenceOutcome:
        n = self._nodes.get(node)
        if n is not None and n.fenced:
            n.reason = render_reason(reason)
        return FenceOutcome(changed=n is not None, command=("dryrun", "remark", node, render_reason(reason)),
                            output="would mark (dry run)")

    async def read_many(self, nodes: Sequence[str]) -> dict[str, FenceState]:
        return {n: await self.read(n) for n in nodes}

    async def fence_many(self, items: Sequence[tuple[str, FenceReason]]) -> dict[str, FenceOutcome | FenceError]:
        return {n: await self.fence(n, r) for n, r in items}


def dryrun_from_config(cfg: object) -> DryRunFencer:
    """`fencers.dryrun` (fencing/build.py): it has nothing to configure but being on."""
    return DryRunFencer()
