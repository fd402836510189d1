"""The leader's merge of the other replicas' ingest (Memory.adopt over Store.observed_since).

Replicas share one store; each applies what its agents send and writes it there; only the
leader decides, from its own memory plus what it reads back. A transition (one verdict change
through /v1/events) moves no report_time, so the leader takes it by the agent's order: the
node's stored verdict_seq against the (boot_id, seq) of what the leader applied itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.aggregator.model import Condition, FenceMode
from podhealth.aggregator.state import Memory, Verdict
from podhealth.aggregator.store import Observed, Store
from podhealth.vocab import Action, Status

pytestmark = pytest.mark.timeout(60)
XID = Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, 1.0)
OK = Verdict("xid", "GPU0", Status.OK)


def write(s: Store, result_ops: tuple[str, list[object]]) -> str:
    result, ops = result_ops
    s.apply(ops)  # type: ignore[arg-type]
    return result


def sync(leader: Memory, s: Store, since: float) -> int:
    """One round of the leader's _sync_loop."""
    rows, conds = s.observed_since(since)
    return leader.adopt(rows, conds)


def row(report_time: float, status: str, boot_id: str, report_seq: int, verdict_seq: int, changed: bool = True,
        retired_boots: str = "", last_seen: float = 200.0) -> Observed:
    return Observed("dgx01", report_time, last_seen, status, None, boot_id, report_seq, verdict_seq, retired_boots,
                    changed)


def replicas(tmp_path: Path) -> tuple[Store, Memory, Memory]:
    """A store, the leader's memory and a follower's, both having taken the agent's report 10."""
    s = Store(tmp_path / "a.db")
    leader, follower = Memory(), Memory()
    for m in (leader, follower):
        assert write(s, m.apply_report("dgx01", (), 100.0, "{}", 100.0, order=("b1", 10))) == "applied"
    return s, leader, follower


def test_a_transition_that_reached_only_a_follower_reaches_the_leader(tmp_path: Path) -> None:
    s, leader, follower = replicas(tmp_path)
    leader.set_node("dgx01", hold=True, fence=FenceMode.NONE, ladder="acting")  # the leader's own fields
    before = leader.version
    assert write(s, follower.apply_verdict("dgx01", XID, 200.0, order=("b1", 12))) == "applied"
    assert leader.nodes["dgx01"].status is Status.OK
    assert sync(leader, s, 150.0) == 1
    rec = leader.nodes["dgx01"]
    assert rec.status is Status.FAIL and rec.ok_since is None and leader.version > before
    assert [(c.check, c.entity, c.status, c.source) for c in leader.conditions_of("dgx01")] == [
        ("xid", "GPU0", Status.FAIL, "agent")]
    assert (rec.boot_id, rec.report_seq, rec.verdict_seq, rec.fp) == ("b1", 10, 12, 0)
    assert (rec.hold, rec.ladder) == (True, "acting"), "fence/hold/ladder stay the leader's"
    assert leader.fleet().nodes["dgx01"].hold  # the view decide() reads is refreshed
    assert sync(leader, s, 150.0) == 0, "taken once"
    # the report the transition made stale is stale at the leader too (it knows seq 12 now)
    assert leader.apply_report("dgx01", (), 0.0, "{}", 210.0, order=("b1", 11))[0] == "stale"
    # the recovery, also only at the follower: the leader closes the condition
    assert write(s, follower.apply_verdict("dgx01", OK, 300.0, order=("b1", 13))) == "applied"
    assert sync(leader, s, 250.0) == 1
    assert leader.nodes["dgx01"].status is Status.OK and leader.conditions_of("dgx01") == []
    assert leader.nodes["dgx01"].verdict_seq == 13


def test_a_follower_flush_of_an_older_report_seq_does_not_hide_a_newer_transition(tmp_path: Path) -> None:
    s, leader, follower = replicas(tmp_path)
    assert write(s, leader.apply_report("dgx01", (), 0.0, "{}", 150.0, order=("b1", 20), fp=7)) == "applied"
    assert write(s, follower.apply_verdict("dgx01", XID, 200.0, order=("b1", 21))) == "applied"
    s.apply(follower.flush_seen())  # the follower's older report_seq 10 does not go over the leader's 20
    [o] = s.observed_since(150.0)[0]
    assert (o.report_seq, o.verdict_seq) == (20, 21)
    assert sync(leader, s, 150.0) == 1 and leader.nodes["dgx01"].status is Status.FAIL
    assert leader.nodes["dgx01"].report_seq == 20, "a seq never goes back"


def test_an_older_stored_state_never_overwrites_newer_memory(tmp_path: Path) -> None:
    s, leader, follower = replicas(tmp_path)
    assert write(s, follower.apply_verdict("dgx01", XID, 200.0, order=("b1", 11))) == "applied"
    rows, conds = s.observed_since(150.0)
    # Meanwhile the leader took the agent's next transition (the recovery) and has not committed
    # it yet: the stored FAIL (seq 11) is older than what it holds (seq 12).
    leader.apply_verdict("dgx01", OK, 210.0, order=("b1", 12))
    assert leader.adopt(rows, conds) == 0
    assert leader.nodes["dgx01"].status is Status.OK and leader.conditions_of("dgx01") == []
    # ... nor a stored report, however recent its time, that has not seen that transition
    newer_time = [o._replace(report_time=999.0) for o in rows]
    assert leader.adopt(newer_time, conds) == 0 and leader.conditions_of("dgx01") == []
    # a transition older than the leader's latest report is stale there
    s2, leader2, follower2 = replicas(tmp_path / "2")
    assert write(s2, follower2.apply_verdict("dgx01", XID, 200.0, order=("b1", 11))) == "applied"
    rows, conds = s2.observed_since(150.0)
    assert leader2.apply_report("dgx01", (), 0.0, "{}", 205.0, order=("b1", 12), fp=9)[0] == "applied"
    assert leader2.adopt(rows, conds) == 0 and leader2.nodes["dgx01"].status is Status.OK


def test_boots_order_the_stored_transitions(tmp_path: Path) -> None:
    s, leader, follower = replicas(tmp_path)
    # the node rebooted; its new boot's first record, a FAIL, reached only the follower
    assert write(s, follower.apply_verdict("dgx01", XID, 200.0, order=("b2", 3))) == "applied"
    assert sync(leader, s, 150.0) == 1
    rec = leader.nodes["dgx01"]
    assert (rec.boot_id, rec.report_seq, rec.verdict_seq, rec.retired) == ("b2", 0, 3, ("b1",))
    assert rec.status is Status.FAIL
    # the leader's own late record of the boot it left is stale there now, as at the follower
    assert leader.apply_report("dgx01", (), 0.0, "{}", 210.0, order=("b1", 11))[0] == "stale"
    # a stored transition of a boot the leader has retired is old news, whatever its seq
    assert leader.adopt([row(0.0, "OK", "b1", 10, 99, last_seen=300.0)], []) == 0
    assert rec.status is Status.FAIL and rec.boot_id == "b2"
    assert rec.last_seen == 300.0, "seen later is still taken"


def test_a_stale_boot_a_lagging_follower_stored_does_not_lock_the_leader_out() -> None:
    # The leader has the node's current boot b3 (it never saw b2); a follower that knew only b1
    # applies a spooled transition of b2, overtaken by b3's heartbeats (transitions are spooled,
    # heartbeats are not), and stores b2 with b1 retired. Taking b2 as newer would retire b3 here
    # and make every next b3 record stale: the stored row does not say it left b3, so no.
    leader = Memory()
    leader.apply_report("dgx01", (), 0.0, "{}", 100.0, order=("b1", 50))
    leader.apply_report("dgx01", (), 0.0, "{}", 150.0, order=("b3", 2), fp=1)
    fail = [Condition("dgx01", "xid", "GPU0", Status.FAIL, Action.RESET_GPU, source="agent")]
    assert leader.adopt([row(100.0, "FAIL", "b2", 0, 7, retired_boots="b1")], fail) == 0
    rec = leader.nodes["dgx01"]
    assert (rec.boot_id, rec.retired, rec.status) == ("b3", ("b1",), Status.OK)
    assert leader.apply_report("dgx01", (), 0.0, "{}", 210.0, order=("b3", 3), fp=2)[0] == "applied"
    # one that did leave b3 is taken, and keeps what the leader knew had been left before
    assert leader.adopt([row(100.0, "FAIL", "b4", 0, 1, retired_boots="b3")], fail) == 1
    assert (rec.boot_id, rec.retired, rec.status) == ("b4", ("b3", "b1"), Status.FAIL)
    # a memory with no boot yet (an agent's first ordered record went to a follower) takes any
    fresh = Memory()
    fresh.ensure_node("dgx01", 100.0)
    assert fresh.adopt([row(100.0, "FAIL", "b9", 0, 1)], fail) == 1
    assert fresh.nodes["dgx01"].boot_id == "b9" and fresh.nodes["dgx01"].status is Status.FAIL


def test_agents_without_seq_and_unchanged_rows_take_no_transition() -> None:
    leader = Memory()
    leader.apply_report("dgx01", (), 0.0, "{}", 100.0)
    fail = [Condition("dgx01", "xid", "GPU0", Status.FAIL, Action.RESET_GPU, source="agent")]
    # no order: nothing says the stored state is newer than the leader's but the report time
    assert leader.adopt([row(100.0, "FAIL", "", 0, 0)], fail) == 0
    assert leader.nodes["dgx01"].status is Status.OK and leader.nodes["dgx01"].last_seen == 200.0
    # a newer transition whose conditions are not in the answer (not changed since the cursor)
    assert leader.adopt([row(100.0, "FAIL", "b1", 0, 5, changed=False)], []) == 0
    assert leader.adopt([row(900.0, "FAIL", "", 0, 0, changed=False)], []) == 0
    assert leader.nodes["dgx01"].status is Status.OK
    # a newer report is still taken by its time, as before
    assert leader.adopt([row(150.0, "FAIL", "", 0, 0)], fail) == 1
    assert leader.nodes["dgx01"].status is Status.FAIL


def test_a_transition_keeps_the_leaders_own_conditions(tmp_path: Path) -> None:
    s, leader, follower = replicas(tmp_path)
    # the leader's alert (not the agent's) on another check: its own, not the store's to replace
    leader.apply_verdict("dgx01", Verdict("ib_link", "mlx5_0", Status.WARN), 150.0, source="alertmanager")
    assert write(s, follower.apply_verdict("dgx01", OK._replace(check="nvlink"), 200.0, order=("b1", 11))) == "applied"
    assert sync(leader, s, 180.0) == 1
    assert [(c.check, c.source) for c in leader.conditions_of("dgx01")] == [("ib_link", "alertmanager")]
    assert leader.nodes["dgx01"].status is Status.WARN


def test_a_newer_report_at_a_follower_is_taken_by_the_agent_order_not_by_receive_time(tmp_path: Path) -> None:
    # The agent's report 11 reached a follower a few ms after its report 10 reached the leader;
    # the replicas' readings of the database's clock differ by more than that, so the stored
    # receive time is earlier than the leader's. The agent's order decides: it is newer.
    s, leader, follower = replicas(tmp_path)
    assert write(s, follower.apply_report("dgx01", (XID,), 0.0, "{}", 99.99, order=("b1", 11))) == "applied"
    assert sync(leader, s, 50.0) == 1
    assert leader.nodes["dgx01"].status is Status.FAIL and leader.nodes["dgx01"].report_seq == 11
    # and an older one, received "later", is not taken
    s2, leader2, follower2 = replicas(tmp_path / "b")
    assert write(s2, leader2.apply_report("dgx01", (XID,), 0.0, "{}", 100.0, order=("b1", 12))) == "applied"
    assert write(s2, follower2.apply_report("dgx01", (OK,), 0.0, "{}", 100.5, order=("b1", 11))) == "applied"
    assert sync(leader2, s2, 50.0) == 0 and leader2.nodes["dgx01"].status is Status.FAIL
