"""The fence lifecycle's pure decisions (aggregator/lifecycle.py), as tables: every Kind of move
from every FenceMode (legal: where to and what it writes; the rest illegal), and reconcile's
store state against every backend picture, with the stale-epoch cases (a deposed leader's late
mark)."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest

import podhealth.aggregator

from podhealth.aggregator.lifecycle import (
    RECONCILED, Change, Illegal, IllegalMove, Kind, Move, Outcome, Seen, Stand, reconcile_move, settle, stale_mark,
    transition,
)
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.state import Memory

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


# ---- the lifecycle's table: Kind x FenceMode -> FenceMode (None: unchanged), every other pair illegal

K = Kind
LEGAL = [
    (K.FENCE_BEGIN, N, FG), (K.OPERATOR_FENCE, N, FG), (K.FENCE_AGAIN, FD, FG),
    (K.FENCE_DONE, FG, FD), (K.FENCE_FOREIGN, FG, EX), (K.FENCE_OPTED_OUT, FG, N), (K.FENCE_FAILED, FG, N),
    (K.RELEASE_BEGIN, FD, RL), (K.RELEASE_BEGIN, N, RL),  # N: reconcile's release of our mark on a free node
    (K.OPERATOR_RELEASE, FD, RL), (K.RELEASE_DONE, RL, N), (K.RELEASE_FAILED, RL, FD),
    (K.HOLD, FD, None), (K.REPAIR, FD, None), (K.MARK_HEALTHY, N, None), (K.MARK_HEALTHY, FD, None),
    (K.EVACUATED, FD, None), (K.EVACUATED, RL, None),
    (K.OPTED_IN, N, None), (K.OPTED_IN, FG, None), (K.OPTED_IN, FD, None), (K.OPTED_IN, RL, None),
    (K.OPTED_IN, EX, None),
    (K.ADOPT, N, FD), (K.ADOPT_UNKNOWN, N, FD), (K.RECORD_EXTERNAL, N, EX),
    (K.TAKEN_OVER, FG, EX), (K.TAKEN_OVER, FD, EX), (K.TAKEN_OVER, RL, EX),
    (K.RECORD_FREE, EX, N), (K.RECORD_REMOVED, FD, N),
]
_LEGAL_PAIRS = {(k, m) for k, m, _ in LEGAL}
ILLEGAL = [(k, m) for k, m in itertools.product(Kind, FenceMode) if (k, m) not in _LEGAL_PAIRS]

AT = 500.0


def out(kind: Kind, operator: bool = False) -> Outcome:
    """An outcome carrying every field (each Kind reads its own)."""
    return Outcome(kind, reason="r", why="w", jobs="polite", operator=operator)


_FREE = {"hold": False, "hold_reason": ""}
# Kind -> the fields it writes (persisted) and the memory-only evacuated (None: left alone)
WRITES: dict[Kind, tuple[dict[str, object], str | None]] = {
    K.FENCE_BEGIN: ({"fence": FG, "fence_reason": "r", **_FREE}, None),
    K.OPERATOR_FENCE: ({"fence": FG, "fence_reason": "r", "hold": True, "hold_reason": "fenced by an operator"}, None),
    K.FENCE_AGAIN: ({"fence": FG}, None),
    K.FENCE_DONE: ({"fence": FD, "fenced_at": AT, "opted_out": False, "handover": "", "handover_at": 0.0}, ""),
    K.FENCE_FOREIGN: ({"fence": EX, "fence_reason": "r"}, None),
    K.FENCE_OPTED_OUT: ({"fence": N, "fence_reason": "", "opted_out": True}, None),
    K.FENCE_FAILED: ({"fence": N, "fence_reason": ""}, None),
    K.RELEASE_BEGIN: ({"fence": RL}, None),
    K.OPERATOR_RELEASE: ({"fence": RL, "released_at": AT}, None),
    K.RELEASE_DONE: ({"fence": EX, "fence_reason": "r", **_FREE, "handover": "", "handover_at": 0.0, "ladder": "",
                      "ladder_at": 0.0}, ""),  # reason: someone else's fence is still there
    K.RELEASE_FAILED: ({"fence": FD}, None),
    K.HOLD: ({"hold": True, "hold_reason": "w"}, None),
    K.REPAIR: ({"ladder": "repair", "ladder_at": AT, "hold": True, "hold_reason": "w", "fence_reason": "r"}, None),
    K.MARK_HEALTHY: ({"ladder": "", "ladder_at": 0.0, **_FREE, "released_at": AT}, None),
    K.EVACUATED: ({}, "polite"),
    K.OPTED_IN: ({"opted_out": False}, None),
    K.ADOPT: ({"fence": FD, "fence_reason": "r"}, None),
    K.ADOPT_UNKNOWN: ({"fence": FD, "fence_reason": "r", "fenced_at": AT}, None),
    K.RECORD_EXTERNAL: ({"fence": EX, "fence_reason": "r"}, None),
    K.TAKEN_OVER: ({"fence": EX, "fence_reason": "r", **_FREE}, None),
    K.RECORD_FREE: ({"fence": N, "fence_reason": ""}, None),
    K.RECORD_REMOVED: ({"fence": N, "fence_reason": "", **_FREE}, None),
}


def test_every_kind_is_tabled() -> None:
    assert {k for k, _, _ in LEGAL} == set(Kind) == set(WRITES)


@pytest.mark.parametrize("kind, start, to", LEGAL)
def test_legal_moves(kind: Kind, start: FenceMode, to: FenceMode | None) -> None:
    c = transition(Stand(start), Outcome(kind, reason="" if kind is K.RELEASE_DONE else "r", why="w", jobs="polite"),
                   AT)
    assert isinstance(c, Change)
    assert c.fence is to
    if kind is not K.RELEASE_DONE:
        assert (dict(c.fields), c.jobs) == WRITES[kind]
        assert not c.forget_cycles


@pytest.mark.parametrize("kind", list(Kind))
def test_what_each_move_writes(kind: Kind) -> None:
    start = next(m for k, m, _ in LEGAL if k is kind)
    c = transition(Stand(start), out(kind), AT)
    assert isinstance(c, Change)
    assert (dict(c.fields), c.jobs) == WRITES[kind]


@pytest.mark.parametrize("kind, start", ILLEGAL)
def test_illegal_moves(kind: Kind, start: FenceMode) -> None:
    for hold, acting in itertools.product((False, True), repeat=2):
        got = transition(Stand(start, hold, acting), out(kind), AT)
        assert isinstance(got, Illegal) and kind.value in got.why


@pytest.mark.parametrize("kind", [K.HOLD, K.REPAIR])
def test_a_hold_is_never_overwritten(kind: Kind) -> None:
    assert isinstance(transition(Stand(FD, hold=True), out(kind), AT), Illegal)
    assert isinstance(transition(Stand(FD, acting=True), out(kind), AT), Change)


@pytest.mark.parametrize("start", [N, FD])
def test_mark_healthy_waits_for_a_reset_or_reboot_in_flight(start: FenceMode) -> None:
    assert isinstance(transition(Stand(start, acting=True), Outcome(K.MARK_HEALTHY), AT), Illegal)
    assert isinstance(transition(Stand(start, hold=True), Outcome(K.MARK_HEALTHY), AT), Change)


@pytest.mark.parametrize("kind, start", [(k, m) for k, m, _ in LEGAL if k not in (K.HOLD, K.REPAIR, K.MARK_HEALTHY)])
def test_hold_and_acting_matter_to_no_other_move(kind: Kind, start: FenceMode) -> None:
    want = transition(Stand(start), out(kind), AT)
    for hold, acting in itertools.product((False, True), repeat=2):
        assert transition(Stand(start, hold, acting), out(kind), AT) == want


def test_a_release_ends_in_none_or_someone_elses_fence_and_an_operators_forgets_the_flaps() -> None:
    free = transition(Stand(RL), Outcome(K.RELEASE_DONE), AT)
    theirs = transition(Stand(RL), Outcome(K.RELEASE_DONE, reason="slurm: maint"), AT)
    by_op = transition(Stand(RL), Outcome(K.RELEASE_DONE, operator=True), AT)
    assert isinstance(free, Change) and isinstance(theirs, Change) and isinstance(by_op, Change)
    assert (free.fence, free.fields["fence_reason"], free.forget_cycles) == (N, "", False)
    assert (theirs.fence, theirs.fields["fence_reason"]) == (EX, "slurm: maint")
    assert by_op.forget_cycles and by_op.fence is N


@pytest.mark.parametrize("move, start", [
    (Move.ADOPT_UNKNOWN, N), (Move.RECORD_EXTERNAL, N), (Move.TAKEN_OVER, FD), (Move.ADOPT, N), (Move.RELEASE, N),
    (Move.UNDO_STALE, N), (Move.RECORD_FREE, EX), (Move.FENCE_AGAIN, FD), (Move.RECORD_REMOVED, FD),
])
def test_every_reconcile_move_is_a_legal_move_from_where_reconcile_makes_it(move: Move, start: FenceMode) -> None:
    # the store state reconcile_move makes it from (TAKEN_OVER also from FG and RL, tabled above)
    assert isinstance(transition(Stand(start), Outcome(RECONCILED[move], reason="r"), AT), Change)


def test_reconcile_moves_all_settle_but_nothing() -> None:
    assert set(RECONCILED) == set(Move) - {Move.NOTHING}


# ---- settle: the table applied to a node's record in memory ------------------------------------


@pytest.mark.parametrize("kind, start, to", LEGAL)
def test_settle_writes_memory_and_the_store_alike(kind: Kind, start: FenceMode, to: object) -> None:
    mem = Memory()
    rec, _ = mem.ensure_node("dgx01", 1.0)
    rec.fence, rec.evacuated, rec.cycles[:] = start, "forced", [1.0, 2.0]
    ops = settle(mem, "dgx01", out(kind, operator=True), AT)
    fields, jobs = WRITES[kind]  # RELEASE_DONE with a reason: to someone else's fence
    want = fields.get("fence", start)
    assert isinstance(want, FenceMode) and rec.fence is want
    assert mem.views["dgx01"].fence is rec.fence  # the view decide() reads moved with it
    assert all(getattr(rec, k) == v for k, v in fields.items())
    assert rec.evacuated == ("forced" if jobs is None else jobs)
    assert rec.cycles == ([] if kind is K.RELEASE_DONE else [1.0, 2.0])
    if fields:  # one UPDATE of the node's own columns, with the FenceMode stored as its value
        [(sql, args)] = ops
        assert sql.startswith("UPDATE nodes SET ") and args[-1] == "dgx01"
        assert (want.value in args) is ("fence" in fields)
    else:
        assert ops == []


def test_settle_refuses_an_illegal_move_and_changes_nothing() -> None:
    mem = Memory()
    rec, _ = mem.ensure_node("dgx01", 1.0)
    version = mem.version
    with pytest.raises(IllegalMove, match="dgx01: release_done from none"):
        settle(mem, "dgx01", Outcome(K.RELEASE_DONE), AT)
    assert rec.fence is N and mem.version == version


# ---- settle is the one writer ----------------------------------------------------------------

LIFECYCLE_FIELDS = {"fence", "fence_reason", "fenced_at", "hold", "hold_reason", "released_at", "opted_out"}


def test_no_fence_state_is_written_outside_the_lifecycle() -> None:
    root = Path(podhealth.aggregator.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == "lifecycle.py":
            continue
        for call in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)):
                continue
            if call.func.attr == "set_evacuated" or (
                    call.func.attr == "set_node" and LIFECYCLE_FIELDS & {k.arg for k in call.keywords}):
                found.append(f"{rel}:{call.lineno}")
    assert found == [], "fence state written beside lifecycle.settle"
