"""A pending action is typed by its kind (aggregator/actions/journal.py): a fence or ladder step
carries the reason it writes into its mark, never None; a release, handover or evacuation has
none. A marked kind whose reason the journal lost (an edited database) is ended failed, not
guessed at and not postponed forever."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.aggregator.actions import Marked, Pending
from podhealth.aggregator.actions.journal import pending_of
from podhealth.aggregator.store import ActionRow, ActionStart
from podhealth.fencing.fence import FenceReason
from tests.harness.agg import MemFencer, config, running

R = FenceReason("xid", "GPU0", "DRAIN", "abc")


def _row(kind: str, reason: FenceReason | None) -> ActionRow:
    return ActionRow(7, "dgx01", kind, "pending", "policy", "why", reason, "", False, 1.0, 1.0, 2, 5.0, "")


@pytest.mark.parametrize("kind", ["fence", "reset_gpu", "reboot", "repair"])
def test_a_marked_kind_with_its_reason_is_marked(kind: str) -> None:
    for p in (Pending.of(_row(kind, R)), pending_of(ActionStart("dgx01", kind, "policy", "why", 1.0, R), 7)):
        assert isinstance(p, Marked) and p.reason == R and p.kind == kind and p.id == 7
    assert (Pending.of(_row(kind, R)).attempts, Pending.of(_row(kind, R)).next_attempt) == (2, 5.0)


@pytest.mark.parametrize("kind", ["release", "handover", "evacuate"])
def test_the_other_kinds_carry_no_reason(kind: str) -> None:
    p = Pending.of(_row(kind, None))
    assert not isinstance(p, Marked) and p.reason is None


async def test_a_fence_whose_reason_was_lost_is_ended_failed(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path), [fencer]) as (agg, _):
        [p] = await agg.actions.journal.begin([ActionStart("dgx01", "fence", "policy", "why", 1.0)], None)
        assert not isinstance(p, Marked)
        await agg.actions.execute(p)
        assert p.done.is_set() and p.result["state"] == "failed", p.result
        assert "no reason recorded" in p.result["result"] and p.id not in agg.pending
        assert fencer.count("fence") == 0
