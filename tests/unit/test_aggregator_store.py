from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any, Callable

import pytest

from podhealth.fencing.fence import FenceReason
from podhealth.aggregator.model import BreakerState, Condition, FenceMode
from podhealth.aggregator.state import Memory, NodeRec, Verdict
from podhealth.aggregator.store import (
    MIGRATIONS, SCHEMA_VERSION, DbConn, NodeRow, Store, StoreError, connect, db_errors, migrate,
)
from podhealth.vocab import Action, Status
from tests.harness.pg import pg_fixture
from tests.harness.proc import free_port

# The store's contract runs on both backends: SQLite files, and databases on a private PostgreSQL.
pg = pg_fixture()
Where = Callable[[str], "Path | str"]


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Where:
    """name -> where that store lives (the same name, the same database)."""
    if request.param == "sqlite":
        return lambda name: tmp_path / name
    server = request.getfixturevalue("pg")
    urls: dict[str, str] = {}
    return lambda name: urls.setdefault(name, server.new_database())


def raw(where: Path | str) -> DbConn:
    """A connection without migrations (to build an old schema by hand)."""
    if isinstance(where, Path):
        return connect(where)
    from podhealth.aggregator import pgstore
    return pgstore.connect(where)


def integrity_errors() -> tuple[type[Exception], ...]:
    out: list[type[Exception]] = [sqlite3.IntegrityError]
    try:
        import psycopg
        out.append(psycopg.IntegrityError)
    except ImportError:
        pass
    return tuple(out)


def indexes(s: Store) -> set[str]:
    if s.backend == "sqlite":
        return {r[0] for r in s.conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    return {r[0] for r in s.conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'public'")}


def columns(s: Store, table: str) -> list[str]:
    if s.backend == "sqlite":
        return [r[1] for r in s.conn.execute(f"PRAGMA table_info({table})")]
    return [r[0] for r in s.conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                         (table,))]


def test_fresh_store_is_at_the_latest_version(db: Where) -> None:
    s = Store(db("a.db"))
    assert s.version == SCHEMA_VERSION == len(MIGRATIONS)
    if s.backend == "sqlite":
        assert s.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert s.conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    s.close()
    assert Store(db("a.db")).version == SCHEMA_VERSION  # reopening migrates nothing


def test_migrates_an_old_database_keeping_its_data(db: Where) -> None:
    conn = raw(db("old.db"))
    assert migrate(conn, upto=1) == 1
    conn.execute("INSERT INTO nodes (name, partition, first_seen) VALUES ('dgx01', 'batch', 5)")
    conn.execute("INSERT INTO audit (time, node, who, what, why) VALUES (1, 'dgx01', 'me', 'x', 'y')")
    conn.close()
    s = Store(db("old.db"))
    assert s.version == SCHEMA_VERSION
    assert {"audit_time", "actions_kind_created"} <= indexes(s)  # what migration 2 adds
    loaded = s.load(now=10, event_retention=100)
    assert [(n.name, n.partition) for n in loaded.nodes] == [("dgx01", "batch")]
    assert s.counts()["audit"] == 1


def test_migration_3_moves_reports_out_of_the_node_rows(db: Where) -> None:
    conn = raw(db("v2.db"))
    assert migrate(conn, upto=2) == 2
    conn.execute("INSERT INTO nodes (name, status, report, last_seen) VALUES ('dgx01', 'OK', '{\"node\": \"dgx01\"}', 7)")
    conn.execute("INSERT INTO nodes (name) VALUES ('dgx02')")
    conn.close()
    s = Store(db("v2.db"))
    assert s.version == SCHEMA_VERSION >= 3
    assert "report" not in columns(s, "nodes") and "status" in columns(s, "nodes")
    assert s.node_report("dgx01") == '{"node": "dgx01"}' and s.node_report("dgx02") == ""
    assert sorted((n.name, n.last_seen) for n in s.load(now=10, event_retention=100).nodes) == [
        ("dgx01", 7.0), ("dgx02", 0.0)]
    # a newer report replaces the stored one; a flush of last_seen leaves it alone
    s.apply([Store.op_report("dgx01", '{"v": 2}'), Store.op_node_seen("dgx01", 9.0, 8.0),
             Store.op_node_seen("dgx02", 9.0, 8.0)])
    assert s.node_report("dgx01") == '{"v": 2}'
    # a report kept as the UTF-8 bytes it arrived in is stored (and read back) as text
    s.apply([Store.op_report("dgx02", '{"summary": "caf\u00e9"}'.encode())])
    assert s.node_report("dgx02") == '{"summary": "caf\u00e9"}'
    typeof = "typeof(report)" if s.backend == "sqlite" else "pg_typeof(report)::text"
    assert tuple(s.conn.execute(f"SELECT {typeof} FROM reports WHERE name = 'dgx02'").fetchone()) == ("text",)
    assert sorted((n.name, n.last_seen, n.report_time) for n in s.load(now=10, event_retention=100).nodes) == [
        ("dgx01", 9.0, 8.0), ("dgx02", 9.0, 8.0)]


def test_migration_9_gives_old_node_rows_a_verdict_seq(db: Where) -> None:
    conn = raw(db("v8.db"))
    assert migrate(conn, upto=8) == 8
    conn.execute("INSERT INTO nodes (name, boot_id, report_seq, last_seen) VALUES ('dgx01', 'b1', 7, 5)")
    conn.close()
    s = Store(db("v8.db"))
    assert s.version == SCHEMA_VERSION >= 9
    assert {"verdict_seq", "verdict_at"} <= set(columns(s, "nodes"))
    [n] = s.load(now=10, event_retention=100).nodes
    assert (n.boot_id, n.report_seq, n.verdict_seq) == ("b1", 7, 0)
    # the old row is not "changed" by the migration: its default verdict_at is no transition
    rows, conds = s.observed_since(1.0)
    assert [(o.name, o.verdict_seq, o.changed) for o in rows] == [("dgx01", 0, False)] and conds == []


def _follower_transition(m: Memory, s: Store, node: str, status: Status, now: float, order: tuple[str, int]) -> str:
    result, ops = m.apply_verdict(node, Verdict("xid", "GPU0", status, Action.RESET_GPU, now), now, order=order)
    s.apply(ops)
    return result


def test_an_ordered_transition_is_stored_with_its_seq_and_read_back_as_changed(db: Where) -> None:
    s = Store(db("a.db"))
    m = Memory()
    _, ops = m.apply_report("dgx01", (), 100.0, "{}", 100.0, order=("b1", 10))
    s.apply(ops)
    s.apply(m.flush_seen())
    assert _follower_transition(m, s, "dgx01", Status.FAIL, 200.0, ("b1", 11)) == "applied"
    rows, conds = s.observed_since(150.0)  # after the report, before the transition
    [o] = rows
    assert (o.boot_id, o.report_seq, o.verdict_seq, o.status, o.changed) == ("b1", 10, 11, "FAIL", True)
    assert [(c.node, c.check, c.status, c.source) for c in conds] == [("dgx01", "xid", Status.FAIL, "agent")]
    assert s.observed_since(201.0) == ([], [])  # nothing since then
    # another replica's late transition (older seq) leaves the stored seq alone: it never goes back
    late = Memory()
    late.nodes["dgx01"] = NodeRec(name="dgx01", boot_id="b1", report_seq=10)
    assert _follower_transition(late, s, "dgx01", Status.OK, 210.0, ("b1", 10)) == "applied"
    [o] = s.observed_since(150.0)[0]
    assert o.verdict_seq == 11
    # ... and so does one of a boot the row has left (the stored seq is always of the stored boot)
    assert _follower_transition(m, s, "dgx01", Status.FAIL, 220.0, ("b2", 3)) == "applied"
    older = Memory()
    older.nodes["dgx01"] = NodeRec(name="dgx01", boot_id="b1", report_seq=10, verdict_seq=11)
    assert _follower_transition(older, s, "dgx01", Status.FAIL, 230.0, ("b1", 40)) == "applied"
    [o] = s.observed_since(150.0)[0]
    assert (o.boot_id, o.verdict_seq) == ("b2", 3)
    # a report of a new boot starts its transitions from 0
    _, ops = m.apply_report("dgx01", (), 300.0, "{}", 300.0, order=("b3", 1))
    s.apply(ops)
    [o] = s.observed_since(299.0)[0]
    assert (o.boot_id, o.report_seq, o.verdict_seq) == ("b3", 1, 0)
    # an agent without seq: nothing to order it by, so none is written (the leader waits for its report)
    _, ops = m.apply_verdict("dgx02", Verdict("xid", "GPU0", Status.FAIL), 400.0)
    s.apply(ops)
    assert tuple(s.conn.execute("SELECT verdict_seq, verdict_at FROM nodes WHERE name = 'dgx02'").fetchone()) == (0, 0)


def test_refuses_a_database_from_a_newer_podhealth(db: Where) -> None:
    where = db("new.db")
    if isinstance(where, Path):
        conn = sqlite3.connect(where)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        conn.close()
    else:
        c = raw(where)
        c.execute("CREATE TABLE podhealth_schema (version BIGINT NOT NULL)")
        c.execute(f"INSERT INTO podhealth_schema (version) VALUES ({SCHEMA_VERSION + 1})")
        c.close()
    with pytest.raises(StoreError, match="newer than this podhealth"):
        Store(where)


def test_a_failed_migration_leaves_the_old_version(db: Where, monkeypatch: pytest.MonkeyPatch) -> None:
    import podhealth.aggregator.store as store_mod
    where = db("x.db")
    conn = raw(where)
    migrate(conn, upto=1)
    monkeypatch.setattr(store_mod, "MIGRATIONS", MIGRATIONS[:1] + ("CREATE INDEX broken ON nope (x);",))
    monkeypatch.setattr(store_mod, "SCHEMA_VERSION", 2)
    with pytest.raises(db_errors()):
        store_mod.migrate(conn)
    if isinstance(where, Path):
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    else:
        assert conn.execute("SELECT version FROM podhealth_schema").fetchone()[0] == 1


def test_not_a_database_is_a_clear_error(tmp_path: Path) -> None:
    p = tmp_path / "junk.db"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="junk.db"):
        Store(p)


def test_a_postgresql_nobody_answers_is_a_clear_error() -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql://podhealth:secret@127.0.0.1:{free_port()}/podhealth"
    with pytest.raises(StoreError, match=r"podhealth:\*\*\*@127\.0\.0\.1") as e:
        Store(url)
    assert "secret" not in str(e.value)  # the password stays out of the message


def test_a_sqlite_url_is_the_file(tmp_path: Path) -> None:
    s = Store(f"sqlite://{tmp_path}/u.db")
    assert s.backend == "sqlite" and s.path == tmp_path / "u.db" and (tmp_path / "u.db").exists()


def test_audit_log_is_append_only(db: Where) -> None:
    s = Store(db("a.db"))
    s.apply([Store.op_audit(1.0, "dgx01", "policy", "fence", "xid", ("scontrol", "update"), "ok")])
    with pytest.raises(integrity_errors(), match="append-only"):
        s.apply([("UPDATE audit SET why = 'nothing happened'", ())])
    with pytest.raises(integrity_errors(), match="append-only"):
        s.apply([("DELETE FROM audit", ())])
    [row] = s.audit_tail()
    assert row["why"] == "xid" and row["command"] == ["scontrol", "update"]


def test_events_are_stored_once_per_id(db: Where) -> None:
    s = Store(db("a.db"))
    op = Store.op_event("e1", "dgx01", "event", 1.0, 2.0, "{}")
    s.apply([op, op])
    s.apply([op])
    assert s.counts()["events"] == 1


def test_a_failing_op_rolls_back_the_whole_transaction(db: Where) -> None:
    s = Store(db("a.db"))
    with pytest.raises(db_errors()):
        s.apply([Store.op_event("e1", "dgx01", "event", 1.0, 2.0, "{}"), ("INSERT INTO nope VALUES (1)", ())])
    assert s.counts()["events"] == 0


def test_pending_actions_survive_a_reopen(db: Where) -> None:
    s = Store(db("a.db"))
    r = FenceReason("xid", "GPU0", "RESET_GPU", "abc")
    aid = s.begin_action("dgx01", "fence", "policy", "xid 79", 100.0, r, "fence",
                         extra=[Store.op_node_insert(NodeRow("dgx01", first_seen=1.0)),
                                Store.op_node_fields("dgx01", fence="fencing")])
    done = s.begin_action("dgx02", "fence", "policy", "x", 101.0, r)
    s.apply([Store.op_action_finish(done, "done", 102.0, "fenced")])
    s.close()
    s = Store(db("a.db"))
    loaded = s.load(now=130.0, event_retention=1000)
    [p] = loaded.pending
    assert (p.id, p.node, p.kind, p.reason) == (aid, "dgx01", "fence", r)
    assert loaded.nodes[0].fence is FenceMode.FENCING
    assert sorted(loaded.recent_fences) == [100.0, 101.0]  # the rate limit survives a restart
    assert [a["what"] for a in s.audit_tail()] == ["fence requested", "fence requested"]


def test_memory_round_trips_through_the_store(db: Where) -> None:
    s = Store(db("a.db"))
    m = Memory()
    ops = m.apply_report("dgx01", (Verdict("xid", "GPU3", Status.FAIL, Action.RESET_GPU, since=50.0),
                                   Verdict("nfs", "/home", Status.OK)), 60.0, '{"raw": 1}', now=61.0)[1]
    ops += m.record_event("ev1", "dgx01", "event", 55.0, "{}", 61.0),
    ops += m.set_node("dgx01", fence=FenceMode.FENCED, fence_reason="podhealth: xid", hold=True)
    ops += m.set_breaker(BreakerState(tripped=True, tripped_at=61.0, reason="storm"))
    s.apply(ops)
    m2 = Memory.from_loaded(s.load(now=62.0, event_retention=100))
    assert m2.conditions == m.conditions
    assert m2.breaker == m.breaker and "ev1" in m2.seen_ids
    r = m2.nodes["dgx01"]
    assert (r.status, r.fence, r.hold, r.fence_reason) == (Status.FAIL, FenceMode.FENCED, True, "podhealth: xid")
    assert s.node_report("dgx01") == '{"raw": 1}'
    hist = s.history("dgx01")
    assert {h["type"] for h in hist} == {"verdict", "event"}


def test_a_last_seen_flush_never_moves_a_node_back(db: Where) -> None:
    """Replicas flush last-seen lazily: a follower that took the node's older heartbeat must not
    write its older report time or seq over the newer ones another replica stored."""
    s = Store(db("a.db"))
    leader, follower = Memory(), Memory()
    s.apply(follower.apply_report("dgx01", (), 100.0, "{}", 100.0, order=("b1", 10))[1])
    s.apply(leader.apply_report("dgx01", (), 150.0, "{}", 150.0, order=("b1", 20), fp=7)[1])
    follower.heard.dirty.add("dgx01")
    follower.nodes["dgx01"].last_seen = 140.0
    s.apply(follower.flush_seen())
    [row] = s.load(now=160.0, event_retention=100).nodes
    assert (row.last_seen, row.report_time, row.report_seq) == (150.0, 150.0, 20)
    # a newer heartbeat of the same boot moves all three; another boot's seq is not compared
    follower.nodes["dgx01"].last_seen = follower.nodes["dgx01"].report_time = 170.0
    follower.nodes["dgx01"].report_seq = 25
    follower.heard.dirty.add("dgx01")
    s.apply(follower.flush_seen())
    [row] = s.load(now=180.0, event_retention=100).nodes
    assert (row.last_seen, row.report_time, row.report_seq) == (170.0, 170.0, 25)
    follower.nodes["dgx01"].boot_id, follower.nodes["dgx01"].report_seq = "b0", 99
    follower.nodes["dgx01"].last_seen = follower.nodes["dgx01"].report_time = 175.0
    follower.heard.dirty.add("dgx01")
    s.apply(follower.flush_seen())
    [row] = s.load(now=180.0, event_retention=100).nodes
    assert (row.last_seen, row.report_time, row.report_seq, row.boot_id) == (175.0, 175.0, 25, "b1")


def test_the_agents_order_survives_a_restart(db: Where) -> None:
    """A transition's seq is stored: after a restart a heartbeat sent before that transition
    (delayed in flight) is still stale and cannot close the FAIL it opened."""
    s = Store(db("a.db"))
    m = Memory()
    s.apply(m.apply_report("dgx01", (), 100.0, "{}", 100.0, order=("b1", 10))[1])
    s.apply(m.apply_verdict("dgx01", Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, 1.0), 110.0,
                            order=("b1", 12))[1])
    m2 = Memory.from_loaded(s.load(now=120.0, event_retention=100))
    assert (m2.nodes["dgx01"].boot_id, m2.nodes["dgx01"].verdict_seq) == ("b1", 12)
    assert m2.apply_report("dgx01", (), 121.0, "{}", 121.0, order=("b1", 11))[0] == "stale"
    assert m2.nodes["dgx01"].status is Status.FAIL
    assert m2.apply_report("dgx01", (), 122.0, "{}", 122.0, order=("b1", 13))[0] == "applied"


def test_event_ids_older_than_retention_are_forgotten(db: Where) -> None:
    s = Store(db("a.db"))
    m = Memory()
    s.apply([m.record_event("old", "dgx01", "event", 1.0, "{}", now=10.0),
             m.record_event("new", "dgx01", "event", 1.0, "{}", now=500.0)])
    assert {e for e, _ in s.load(now=600.0, event_retention=200).event_ids} == {"new"}
    s.apply(m.prune_ids(before=400.0))
    assert m.seen_ids == {"new"} and s.counts()["events"] == 1


def test_conditions_keep_their_start_while_they_persist() -> None:
    m = Memory()
    m.apply_report("dgx01", (Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, since=10.0),), 20.0, "", 21.0,
                   order=("b1", 20))
    m.apply_report("dgx01", (Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, since=10.0),
                             Verdict("nfs", "/home", Status.WARN),), 30.0, "", 31.0, order=("b1", 30))
    c = m.conditions[("dgx01", "xid", "GPU0")]
    assert (c.since, c.observed, c.opened) == (11.0, 31.0, 21.0)  # since 10 on the agent's clock, 1 s behind ours
    # an older report (by the agent's sequence) is stale and changes nothing
    assert m.apply_report("dgx01", (), 25.0, "", 32.0, order=("b1", 25)) == ("stale", [])
    assert ("dgx01", "xid", "GPU0") in m.conditions
    # the same verdicts again only refresh the observation time
    status, ops = m.apply_report("dgx01", (Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, since=10.0),
                                           Verdict("nfs", "/home", Status.WARN)), 40.0, "", 41.0, order=("b1", 40))
    assert status == "unchanged" and ops == [] and m.conditions[("dgx01", "xid", "GPU0")].observed == 41.0
    # gone from the report: closed, and the node is OK from then on
    m.apply_report("dgx01", (Verdict("xid", "GPU0", Status.OK),), 50.0, "", 51.0, order=("b1", 50))
    assert not m.conditions and m.nodes["dgx01"].status is Status.OK and m.nodes["dgx01"].ok_since == 51.0


def test_unreachable_is_unknown_first_then_a_separate_condition() -> None:
    m = Memory()
    m.apply_report("dgx01", (), 1.0, "", 1.0)
    m.mark_unreachable("dgx01", 100.0, 60.0, "connection refused")
    assert set(c.check for c in m.conditions.values()) == {"agent_reachable"}
    assert m.nodes["dgx01"].status is Status.UNKNOWN and m.nodes["dgx01"].ok_since is None
    m.mark_unreachable("dgx01", 161.0, 60.0, "connection refused")
    un = m.conditions[("dgx01", "node_unreachable", "node")]
    assert un.status is Status.FAIL and un.severity == "warning" and un.action is Action.NONE
    m.apply_report("dgx01", (), 170.0, "", 170.0)
    assert not m.conditions and m.nodes["dgx01"].status is Status.OK


def test_condition_type_is_the_one_policy_reads() -> None:
    m = Memory()
    m.apply_verdict("dgx02", Verdict("GpuXid", "node", Status.FAIL, Action.DRAIN, since=5.0), 6.0,
                    source="alertmanager", ref="fp1", severity="warning")
    [c] = m.open_conditions()
    assert isinstance(c, Condition) and c.source == "alertmanager" and c.severity == "warning" and c.ref == "fp1"


def test_a_postgresql_store_without_psycopg_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from podhealth import config, extras
    cfg = config.loads('aggregator:\n  store:\n    url: "postgresql://ph@127.0.0.1:5432/ph"\n')
    assert extras.needed_by(cfg) == [("aggregator.store.url", "postgresql")]
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if not installed
    assert [(k, e.extra.name) for k, e in extras.missing(cfg)] == [("aggregator.store.url", "postgresql")]
    with pytest.raises(StoreError, match=r"pip install 'podhealth\[postgresql\]'"):
        Store("postgresql://ph@127.0.0.1:5432/ph")


def test_a_bad_store_url_is_a_config_error_naming_the_key() -> None:
    from podhealth import config, configload
    with pytest.raises(configload.ConfigError, match=r"aggregator\.store\.url.*expected sqlite:////abs/path"):
        config.loads('aggregator:\n  store:\n    url: "mysql://x"\n', "agg.yaml")


@pytest.mark.parametrize("col", ["fence = ?, hold", "no_such_column"])
def test_a_node_field_that_is_no_column_is_refused_even_under_python_O(col: str) -> None:
    """The column names go into the SQL text: anything but the nodes table's own is a ValueError,
    not an assert that `python -O` strips (issue 30)."""
    from podhealth.aggregator.store import Store

    with pytest.raises(ValueError, match="not a column of nodes"):
        Store.op_node_fields("dgx01", **{col: 1})
    assert Store.op_node_fields("dgx01", hold=1)[0] == "UPDATE nodes SET hold = ? WHERE name = ?"
