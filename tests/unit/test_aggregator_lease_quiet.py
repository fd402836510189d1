"""Memory.lease_quiet, the lease of nearly every heartbeat answered without a checkpoint.

It must be apply_lease exactly, wherever it answers: the same result, the same record and
conditions afterwards, and apply_lease would have had nothing to write. Where it declines
(None) it must have changed nothing, so the caller's checkpoint + apply_lease start from the
state the request found. Checked over generated node states and leases.
"""

from __future__ import annotations

import copy
from dataclasses import fields
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from podhealth.aggregator.state import Memory, NodeRec, Verdict, digest_of
from podhealth.vocab import Action, Status

NODE = "dgx01"
XID = Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, 1.0)
WARN = Verdict("ecc", "GPU1", Status.WARN, Action.NONE, 1.0)


def state(mem: Memory) -> tuple[Any, ...]:
    rec = mem.nodes.get(NODE)
    rec_fields = None if rec is None else tuple(getattr(rec, f.name) for f in fields(NodeRec))
    return rec_fields, dict(mem.conditions), {k: set(v) for k, v in mem.by_node.items()}, mem.version


@st.composite
def scene(draw: Any) -> tuple[Memory, dict[str, Any]]:
    mem = Memory()
    boot = draw(st.sampled_from(["b1", "b2"]))
    ordered = draw(st.booleans())
    verdicts = tuple(draw(st.sampled_from([(), (XID,), (WARN,)])))
    if draw(st.booleans()):  # a node this memory knows (else: none, or a lease before any report)
        mem.apply_report(NODE, verdicts, 100.0, "{}", 100.0, order=(boot, 10) if ordered else None)
        rec = mem.nodes[NODE]
        if draw(st.booleans()):
            rec.unreachable_since = 150.0
        if draw(st.booleans()):  # a transition after the report: the lease no longer stands
            mem.apply_verdict(NODE, WARN, 120.0, order=(boot, 11) if ordered else None)
        if draw(st.booleans()):
            rec.verdict_seq = draw(st.integers(0, 14))
        if draw(st.booleans()):
            rec.status, rec.ok_since = Status.UNKNOWN, None  # e.g. as adopt may leave it
    rec = mem.nodes.get(NODE)
    right = digest_of(rec.fp) if rec is not None and rec.fp else "0123456789abcdef"
    lease = {
        "digest": draw(st.sampled_from([right, "0123456789abcdef"])),
        "time": 200.0 + draw(st.sampled_from([0.0, 1.0, 10_000.0])),  # the last: a clock far ahead
        "order": draw(st.sampled_from([None, ("b1", 9), ("b1", 10), ("b1", 12), ("b2", 12), ("b3", 1)])),
    }
    return mem, lease


@settings(max_examples=400, deadline=None)
@given(scene())
def test_a_quiet_lease_is_apply_lease_with_nothing_to_write(sc: tuple[Memory, dict[str, Any]]) -> None:
    mem, lease = sc
    general = copy.deepcopy(mem)
    before = state(mem)
    got = mem.lease_quiet(NODE, lease["digest"], lease["time"], 200.0, lease["order"])
    if got is None:
        assert state(mem) == before  # declined: nothing changed, the general path takes it
        return
    result, ops = general.apply_lease(NODE, lease["digest"], lease["time"], 200.0, lease["order"])
    assert got == result and ops == []
    assert state(mem) == state(general)


def test_the_common_lease_is_quiet_and_counts_as_seen() -> None:
    """A healthy node's lease is taken by the quiet path (else the path exists for nothing)."""
    mem = Memory()
    mem.apply_report(NODE, (), 100.0, "{}", 100.0, order=("b1", 10))
    digest = digest_of(mem.nodes[NODE].fp)
    assert mem.lease_quiet(NODE, digest, 200.0, 200.0, ("b1", 11)) == "unchanged"
    rec = mem.nodes[NODE]
    assert (rec.last_seen, rec.report_time, rec.report_seq, NODE in mem.heard.dirty) == (200.0, 200.0, 11, True)
    assert mem.lease_quiet(NODE, digest, 201.0, 201.0, ("b1", 11)) == "stale"
    assert mem.lease_quiet(NODE, "0123456789abcdef", 202.0, 202.0, ("b1", 12)) is None
    assert mem.lease_quiet(NODE, digest, 202.0, 202.0, ("b9", 1)) is None  # a new boot: the general path
