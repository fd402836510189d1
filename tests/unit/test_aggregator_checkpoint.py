"""Memory.checkpoint / rollback: a node's record and conditions go back exactly as they were
(the record is saved as a tuple of its fields, its mutable containers copied)."""

from __future__ import annotations

from dataclasses import fields

from podhealth.aggregator.state import Memory, NodeRec, Verdict
from podhealth.vocab import Action, Status


def as_dict(rec: NodeRec) -> dict[str, object]:
    """The record's fields now (lists copied: the record's own may change later)."""
    return {f.name: (list(v) if isinstance(v := getattr(rec, f.name), list) else v) for f in fields(NodeRec)}


def test_rollback_puts_the_record_and_its_conditions_back_in_place() -> None:
    m = Memory()
    m.apply_report("dgx01", (Verdict("xid", "gpu0", Status.FAIL, Action.REBOOT, 5.0, "XID 79"),), 10.0, b"{}", 11.0)
    rec = m.nodes["dgx01"]
    rec.cycles.append(3.0)
    before, conds = as_dict(rec), m.conditions_of("dgx01")
    cp = m.checkpoint("dgx01")
    rec.cycles.append(4.0)  # changed in place: the checkpoint must not see it
    m.apply_report("dgx01", (), 20.0, b"{}", 21.0)  # closes the condition, moves report_time
    assert m.conditions_of("dgx01") == [] and rec.report_time == 21.0
    m.rollback(cp)
    assert m.nodes["dgx01"] is rec  # in place: a coroutine holding the record sees it
    assert as_dict(rec) == before and m.conditions_of("dgx01") == conds
    rec.cycles.append(5.0)
    m.rollback(cp)  # restorable twice: the saved list was not handed out
    assert rec.cycles == [3.0]


def test_rollback_forgets_a_node_that_did_not_exist_and_names_are_taken_once() -> None:
    m = Memory()
    m.ensure_node("dgx01", 1.0)
    cp = m.checkpoint("dgx02", "dgx01", "dgx02")
    m.ensure_node("dgx02", 2.0)
    m.nodes["dgx01"].last_seen = 9.0
    m.rollback(cp, only=["dgx02"])
    assert "dgx02" not in m.nodes and "dgx02" not in m.views
    assert m.nodes["dgx01"].last_seen == 9.0  # not in `only`: left as it is
    m.rollback(cp)
    assert m.nodes["dgx01"].last_seen == 0.0
