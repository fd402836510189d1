"""A node's fence lifecycle as pure decisions, table-tested like policy.decide().

Issue 30's step 2 starts here: the moves between what the store holds about a node's fence
(none, fencing, fenced, releasing, external) and what the backends show are decided by pure
functions of plain values, and the callers (reconcile today; the journal's finish, the operator
commands and mark-healthy next) only carry the moves out. This file holds reconcile's decision:
`reconcile_move`, one node at a time.

The case that made it necessary: a leader frozen (SIGSTOP) inside a fence was deposed; a
follower took over and fenced; an operator released the node; the old leader's late call then
drained it again. Its mark carries its epoch (fencing/fence.py: the Slurm reason's ` eN`, the
taint's `.eN`), older than the lease's, and the journal holds a release done under an epoch at
least as new as that mark: the mark is stale. It is undone and alerted, never adopted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from podhealth.aggregator.model import FenceMode


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
