"""The fence lifecycle's pure decisions (aggregator/lifecycle.py), as a table: every store state
against every backend picture, and the stale-epoch cases (a deposed leader's late mark)."""

from __future__ import annotations

import pytest

from podhealth.aggregator.lifecycle import Move, Seen, reconcile_move, stale_mark
from podhealth.aggregator.model import FenceMode

N, FG, FD, RL, EX = FenceMode.NONE, FenceMode.FENCING, FenceMode.FENCED, FenceMode.RELEASING, FenceMode.EXTERNAL

# (store, ours, foreign, initial) -> move, with no epochs in play (marks of an older podhealth)
TABLE = [
    (None, False, False, False, Move.NOTHING),
    (None, True, False, False, Move.ADOPT_UNKNOWN),
    (None, True, True, True, Move.ADOPT_UNKNOWN),
    (None, False, True, False, Move.RECORD_EXTERNAL),
    (N, False, True, False, Move.RECORD_EXTERNAL),
    (N, False, True, True, Move.RECORD_EXTERNAL),
    (EX, False, True, False, Move.NOTHING),  # already recorded
    (FD, False, True, False, Move.TAKEN_OVER),
    (FG, False, True, True, Move.TAKEN_OVER),
    (RL, False, True, False, Move.TAKEN_OVER),
    (FD, True, True, False, Move.NOTHING),  # ours is still there beside theirs
    (N, True, False, False, Move.ADOPT),  # the periodic reconcile adopts an unexplained mark ...
    (N, True, False, True, Move.RELEASE),  # ... at start the store wins
    (FD, True, False, False, Move.NOTHING),
    (FG, True, False, True, Move.NOTHING),
    (RL, True, False, False, Move.NOTHING),
    (EX, True, False, False, Move.NOTHING),
    (EX, False, False, False, Move.RECORD_FREE),
    (FD, False, False, True, Move.FENCE_AGAIN),
    (FD, False, False, False, Move.RECORD_REMOVED),
    (N, False, False, True, Move.NOTHING),
    (FG, False, False, False, Move.NOTHING),  # in flight: the action settles it
    (RL, False, False, True, Move.NOTHING),
]


@pytest.mark.parametrize("store, ours, foreign, initial, move", TABLE)
def test_reconcile_moves(store: FenceMode | None, ours: bool, foreign: bool, initial: bool, move: Move) -> None:
    assert reconcile_move(Seen(store, ours, foreign, initial=initial)) is move


def test_a_dry_run_never_releases_at_start_and_no_fencer_never_fences_again() -> None:
    assert reconcile_move(Seen(N, True, False, initial=True, dry_run=True)) is Move.ADOPT
    assert reconcile_move(Seen(FD, False, False, initial=True, fencers=False)) is Move.NOTHING


# (mark_epoch, epoch now, released_epoch) -> stale? A mark is stale only when an older leader
# made it and the journal released the node under that epoch or a later one.
STALE = [
    (5, 6, 6, True),  # leader 5 froze, 6 took over, fenced and released; 5's late drain
    (5, 7, 5, True),  # released by 5 itself before it froze (its own late mark after its release)
    (5, 6, 4, False),  # the only release predates the mark: the journal does not say it was released
    (5, 6, 0, False),  # never released
    (6, 6, 6, False),  # this leader's own mark
    (0, 6, 6, False),  # an older podhealth's mark without an epoch: as before
    (7, 6, 7, False),  # a mark newer than the lease this replica knows: not for it to judge
    (5, 0, 6, False),  # no epoch known here
]


@pytest.mark.parametrize("mark, epoch, released, stale", STALE)
def test_stale_marks(mark: int, epoch: int, released: int, stale: bool) -> None:
    s = Seen(N, True, False, mark_epoch=mark, epoch=epoch, released_epoch=released)
    assert stale_mark(s) is stale
    # stale: undone (even at start, even in a dry run); otherwise what the table says
    for initial in (False, True):
        for dry in (False, True):
            got = reconcile_move(Seen(N, True, False, mark, epoch, released, initial=initial, dry_run=dry))
            want = Move.UNDO_STALE if stale else (Move.RELEASE if initial and not dry else Move.ADOPT)
            assert got is want, (initial, dry)


@pytest.mark.parametrize("store", [FD, FG, RL, EX, None])
def test_an_old_epoch_matters_only_on_a_node_the_store_holds_free(store: FenceMode | None) -> None:
    # the store says fenced (by us or someone): the stale-mark rule does not apply
    got = reconcile_move(Seen(store, True, False, mark_epoch=5, epoch=6, released_epoch=6))
    assert got is not Move.UNDO_STALE
