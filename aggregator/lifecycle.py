"""A node's fence lifecycle as pure decisions, table-tested like policy.decide().

Issue 30's step 2 starts here: the moves between what the store holds about a node's fence
(none, fencing, fenced, releasing, external) and what the backends show are decided by pure
functions of plain values, and the callers (the journal's finish, reconcile, the operator
commands, mark-healthy) only carry the moves out. Two decisions live here:

- `transition(stand, outcome, now)`: THE table of a node's fence lifecycle. What happened (an
  `Outcome` of one `Kind`) moves a node from where it stands (`Stand`: its FenceMode, whether it
  is held, whether a reset/reboot is in flight) to new record fields (`Change`), or is `Illegal`.
  `settle(mem, node, outcome, now)` applies it through Memory.set_node and returns the store's
  Ops: it is the only writer of fence, fence_reason, fenced_at, hold, hold_reason, released_at,
  opted_out and evacuated (and of the handover/ladder fields a fence move resets).
- `reconcile_move(seen)`: what reconcile does about one node; its store side is `RECONCILED`'s
  Kind, settled like any other outcome.

The case that made it necessary: a leader frozen (SIGSTOP) inside a fence was deposed; a
follower took over and fenced; an operator released the node; the old leader's late call then
drained it again. Its mark carries its epoch (fencing/fence.py: the Slurm reason's ` eN`, the
taint's `.eN`), older than the lease's, and the journal holds a release done under an epoch at
least as new as that mark: the mark is stale. It is undone and alerted, never adopted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping

from podhealth.aggregator.model import FenceMode

if TYPE_CHECKING:
    from podhealth.aggregator.state import Memory
    from podhealth.aggregator.store import Op


class Move(enum.Enum):
    NOTHING = "nothing"
    ADOPT_UNKNOWN = "adopt_unknown"  # our mark on a node the store never heard of: adopted
    RECORD_EXTERNAL = "record_external"  # someone else's fence: recorded as drained, never touched
    TAKEN_OVER = "taken_over"  # our fence was replaced by someone else's: now theirs
    ADOPT = "adopt"  # our mark on a node the store holds free, made under this epoch or one unknown
    RELEASE = "release"  # at start, the store wins: our mark on a node it holds free is removed
    UNDO_STALE = "undo_stale"  # a deposed leader's late mark on a node the journal released
    RECORD_FREE = "record_free"  # the store says fenced by someone, no backend does
    FENCE_AGAIN = "fence_again"  # at start, the store wins: our fence lost in the backends is made again
    RECORD_REMOVED = "record_removed"  # our fence was removed by someone else: recorded as free


@dataclass(frozen=True)
class Seen:
    """One node, as the store and the backends show it at a reconcile."""

    store: FenceMode | None  # None: the store has never heard of the node
    ours: bool  # some backend shows podhealth's mark
    foreign: bool  # some backend shows someone else's fence
    mark_epoch: int = 0  # the newest epoch in podhealth's marks (0: none written, an older podhealth)
    epoch: int = 0  # the lease's epoch now (0: unknown)
    released_epoch: int = 0  # the newest epoch under which the journal finished a release (0: none)
    initial: bool = False  # at start or takeover (the store wins), else the periodic reconcile
    dry_run: bool = False
    fencers: bool = True  # any real backend is configured


def stale_mark(s: Seen) -> bool:
    """Our mark was left by a leader that had been deposed, on a node released since: it carries
    an epoch older than the lease's, and the journal has a release done under that epoch or a
    later one. An old mark without an epoch is never called stale."""
    return 0 < s.mark_epoch < s.epoch and s.released_epoch >= s.mark_epoch


def reconcile_move(s: Seen) -> Move:
    """What reconcile does about one node (see Move). Listed nodes (some backend shows a fence)
    first; then the reverse: the store says fenced but no backend does."""
    listed = s.ours or s.foreign
    if s.store is None:
        if s.ours:
            return Move.ADOPT_UNKNOWN
        return Move.RECORD_EXTERNAL if s.foreign else Move.NOTHING
    if listed:
        if s.foreign and not s.store.ours and s.store is not FenceMode.EXTERNAL:
            return Move.RECORD_EXTERNAL
        if s.foreign and s.store.ours and not s.ours:
            return Move.TAKEN_OVER
        if s.ours and s.store is FenceMode.NONE:
            if stale_mark(s):
                # Even in a dry run: the mark is a real backend's, and podhealth made it by mistake.
                return Move.UNDO_STALE
            if s.initial and not s.dry_run:
                return Move.RELEASE
            return Move.ADOPT
        return Move.NOTHING
    if s.store is FenceMode.EXTERNAL:
        return Move.RECORD_FREE
    if s.store is FenceMode.FENCED and s.fencers:
        return Move.FENCE_AGAIN if s.initial else Move.RECORD_REMOVED
    return Move.NOTHING


# ---- the fence lifecycle's table -----------------------------------------------------------------


class Kind(enum.Enum):
    """What happened to a node's fence: the journal's outcomes, the operator's commands, and the
    store side of reconcile's moves."""

    FENCE_BEGIN = "fence_begin"  # the policy's fence is recorded (reason: ours)
    OPERATOR_FENCE = "operator_fence"  # an operator's fence is recorded (reason): held for them
    FENCE_AGAIN = "fence_again"  # reconcile at start: our fence, lost in every backend, is made again
    FENCE_DONE = "fence_done"  # every fencer that knows the node shows our fence (made, or already there)
    FENCE_FOREIGN = "fence_foreign"  # someone else had fenced it first (reason: theirs)
    FENCE_OPTED_OUT = "fence_opted_out"  # a backend says hands off
    FENCE_FAILED = "fence_failed"  # refused, or unknown to every fencer
    RELEASE_BEGIN = "release_begin"  # the handover suite passed; reconcile removes our mark from a free node
    OPERATOR_RELEASE = "operator_release"  # an operator's release is recorded
    RELEASE_DONE = "release_done"  # our marks are gone (reason: someone else's fence still there, else "")
    RELEASE_FAILED = "release_failed"  # refused: still fenced
    HOLD = "hold"  # flapping: held fenced for an operator (why)
    REPAIR = "repair"  # the ladder's last rung: held for a human (why), with the repair reason
    MARK_HEALTHY = "mark_healthy"  # an operator vouches for it: no ladder, no hold, nothing open fences again
    EVACUATED = "evacuated"  # what was done about its jobs (jobs: polite, forced, failed)
    OPTED_IN = "opted_in"  # a backend's opt-out was lifted
    ADOPT = "adopt"  # reconcile: our mark on a node the store holds free
    ADOPT_UNKNOWN = "adopt_unknown"  # reconcile: our mark on a node the store had never heard of
    RECORD_EXTERNAL = "record_external"  # reconcile: someone else's fence on a free node (reason: theirs)
    TAKEN_OVER = "taken_over"  # reconcile: our fence replaced by someone else's (reason: theirs)
    RECORD_FREE = "record_free"  # reconcile: someone else's fence is gone
    RECORD_REMOVED = "record_removed"  # reconcile: our fence was removed by someone else


@dataclass(frozen=True)
class Outcome:
    """One thing that happened to a node's fence, with what its Kind needs."""

    kind: Kind
    reason: str = ""  # a fence reason: ours (FENCE_BEGIN, OPERATOR_FENCE, REPAIR, ADOPT*) or theirs
    why: str = ""  # a hold's reason (HOLD, REPAIR)
    jobs: str = ""  # EVACUATED: polite, forced, failed
    operator: bool = False  # RELEASE_DONE: an operator's release (the flap count starts afresh)


@dataclass(frozen=True)
class Stand:
    """Where a node's fence stands, as far as the legality of a move depends on it."""

    fence: FenceMode = FenceMode.NONE
    hold: bool = False  # held for an operator (an operator's fence, flapping, repair)
    acting: bool = False  # a reset or reboot is in flight (ladder "acting")


@dataclass(frozen=True)
class Change:
    """The record fields a legal move writes (persisted, through Memory.set_node), and the
    memory-only ones."""

    fields: Mapping[str, object] = field(default_factory=dict)
    jobs: str | None = None  # evacuated (memory only: the journal's evacuate actions are its record)
    forget_cycles: bool = False  # the flap count starts afresh (memory only)

    @property
    def fence(self) -> FenceMode | None:
        """The FenceMode it moves to; None: unchanged."""
        f = self.fields.get("fence")
        return f if isinstance(f, FenceMode) else None


@dataclass(frozen=True)
class Illegal:
    why: str


class IllegalMove(RuntimeError):
    """settle() was asked for a move the table does not allow: a bug in the caller."""


_N, _FG, _FD, _RL, _EX = FenceMode.NONE, FenceMode.FENCING, FenceMode.FENCED, FenceMode.RELEASING, FenceMode.EXTERNAL
_OURS = frozenset({_FG, _FD, _RL})
_ANY = frozenset(FenceMode)
OPERATOR_HOLD = "fenced by an operator"

# Kind -> the FenceModes it may start from. HOLD and REPAIR also need a node not held yet (a hold
# is never overwritten), MARK_HEALTHY one with no reset/reboot in flight.
FROM: Mapping[Kind, frozenset[FenceMode]] = {
    Kind.FENCE_BEGIN: frozenset({_N}), Kind.OPERATOR_FENCE: frozenset({_N}), Kind.FENCE_AGAIN: frozenset({_FD}),
    Kind.FENCE_DONE: frozenset({_FG}), Kind.FENCE_FOREIGN: frozenset({_FG}), Kind.FENCE_OPTED_OUT: frozenset({_FG}),
    Kind.FENCE_FAILED: frozenset({_FG}),
    Kind.RELEASE_BEGIN: frozenset({_FD, _N}),  # NONE: reconcile removes our mark from a node the store holds free
    Kind.OPERATOR_RELEASE: frozenset({_FD}), Kind.RELEASE_DONE: frozenset({_RL}), Kind.RELEASE_FAILED: frozenset({_RL}),
    Kind.HOLD: frozenset({_FD}), Kind.REPAIR: frozenset({_FD}), Kind.MARK_HEALTHY: frozenset({_N, _FD}),
    Kind.EVACUATED: frozenset({_FD, _RL}),  # RELEASING: an operator's release recorded while the evacuation ran
    Kind.OPTED_IN: _ANY,
    Kind.ADOPT: frozenset({_N}), Kind.ADOPT_UNKNOWN: frozenset({_N}), Kind.RECORD_EXTERNAL: frozenset({_N}),
    Kind.TAKEN_OVER: _OURS, Kind.RECORD_FREE: frozenset({_EX}), Kind.RECORD_REMOVED: frozenset({_FD}),
}

# reconcile's moves (reconcile_move), as what they make of the store's record
RECONCILED: Mapping[Move, Kind] = {
    Move.ADOPT_UNKNOWN: Kind.ADOPT_UNKNOWN, Move.RECORD_EXTERNAL: Kind.RECORD_EXTERNAL,
    Move.TAKEN_OVER: Kind.TAKEN_OVER, Move.ADOPT: Kind.ADOPT, Move.RELEASE: Kind.RELEASE_BEGIN,
    Move.UNDO_STALE: Kind.RELEASE_BEGIN, Move.RECORD_FREE: Kind.RECORD_FREE, Move.FENCE_AGAIN: Kind.FENCE_AGAIN,
    Move.RECORD_REMOVED: Kind.RECORD_REMOVED,
}

_FREE = {"hold": False, "hold_reason": ""}


def _change(o: Outcome, now: float) -> Change:
    """What a legal move writes."""
    k = o.kind
    if k is Kind.FENCE_BEGIN:
        return Change({"fence": _FG, "fence_reason": o.reason, **_FREE})
    if k is Kind.OPERATOR_FENCE:
        return Change({"fence": _FG, "fence_reason": o.reason, "hold": True, "hold_reason": OPERATOR_HOLD})
    if k is Kind.FENCE_AGAIN:
        return Change({"fence": _FG})
    if k is Kind.FENCE_DONE:
        # a new fence: its jobs have not been looked at yet, and no handover has run on it
        return Change({"fence": _FD, "fenced_at": now, "opted_out": False, "handover": "", "handover_at": 0.0},
                      jobs="")
    if k in (Kind.FENCE_FOREIGN, Kind.RECORD_EXTERNAL):
        return Change({"fence": _EX, "fence_reason": o.reason})
    if k is Kind.FENCE_OPTED_OUT:
        return Change({"fence": _N, "fence_reason": "", "opted_out": True})
    if k in (Kind.FENCE_FAILED, Kind.RECORD_FREE):
        return Change({"fence": _N, "fence_reason": ""})
    if k is Kind.RELEASE_BEGIN:
        return Change({"fence": _RL})
    if k is Kind.OPERATOR_RELEASE:
        # the operator has seen what is open now: only a failure that starts later fences again
        return Change({"fence": _RL, "released_at": now})
    if k is Kind.RELEASE_DONE:
        return Change({"fence": _EX if o.reason else _N, "fence_reason": o.reason, **_FREE, "handover": "",
                       "handover_at": 0.0, "ladder": "", "ladder_at": 0.0}, jobs="", forget_cycles=o.operator)
    if k is Kind.RELEASE_FAILED:
        return Change({"fence": _FD})
    if k is Kind.HOLD:
        return Change({"hold": True, "hold_reason": o.why})
    if k is Kind.REPAIR:
        return Change({"ladder": "repair", "ladder_at": now, "hold": True, "hold_reason": o.why,
                       "fence_reason": o.reason})
    if k is Kind.MARK_HEALTHY:
        return Change({"ladder": "", "ladder_at": 0.0, **_FREE, "released_at": now})
    if k is Kind.EVACUATED:
        return Change(jobs=o.jobs)
    if k is Kind.OPTED_IN:
        return Change({"opted_out": False})
    if k is Kind.ADOPT:
        return Change({"fence": _FD, "fence_reason": o.reason})
    if k is Kind.ADOPT_UNKNOWN:
        return Change({"fence": _FD, "fence_reason": o.reason, "fenced_at": now})
    if k is Kind.TAKEN_OVER:
        return Change({"fence": _EX, "fence_reason": o.reason, **_FREE})
    assert k is Kind.RECORD_REMOVED, k
    return Change({"fence": _N, "fence_reason": "", **_FREE})


def transition(stand: Stand, o: Outcome, now: float) -> Change | Illegal:
    """The move `o` makes from `stand` (see FROM), or why it is illegal."""
    k = o.kind
    if stand.fence not in FROM[k]:
        return Illegal(f"{k.value} from {stand.fence.value}")
    if k in (Kind.HOLD, Kind.REPAIR) and stand.hold:
        return Illegal(f"{k.value} on a node already held")
    if k is Kind.MARK_HEALTHY and stand.acting:
        return Illegal("mark_healthy while a reset or reboot is in flight")
    return _change(o, now)


def settle(mem: Memory, node: str, o: Outcome, now: float) -> list[Op]:
    """Carry out `o` on the node's record in `mem` (the table above); the store's Ops to commit
    with it. IllegalMove: the table does not allow it, and nothing is changed."""
    rec = mem.nodes[node]
    c = transition(Stand(rec.fence, rec.hold, rec.ladder == "acting"), o, now)
    if isinstance(c, Illegal):
        raise IllegalMove(f"{node}: {c.why}")
    if c.forget_cycles:
        rec.cycles.clear()
    if c.jobs is not None:
        mem.set_evacuated(node, c.jobs)
    return mem.set_node(node, **c.fields) if c.fields else []
