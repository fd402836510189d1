"""The aggregator's durable state: one SQLite file in WAL mode (or a PostgreSQL database, shared
by replicas: `store.url`), with versioned migrations.

The running aggregator keeps a mirror of the hot state in memory (aggregator/state.py) and
writes here through one writer thread (aggregator/writer.py) that commits in groups, so
thousands of reports per second cost a few transactions, not thousands. The audit log is
append-only, enforced by triggers, not by good intentions.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Protocol, Sequence

from podhealth.vocab import Action, Status

from podhealth.fencing.fence import FenceReason
from podhealth.aggregator.model import BreakerState, Condition, FenceMode, Silence

Op = tuple[str, tuple[Any, ...]]


class StoreError(Exception):
    pass


class StaleEpoch(StoreError):
    """A journal write under a lease epoch that is no longer the current one: refused."""


class DbConn(Protocol):
    """What the store needs of a connection: sqlite3's, or aggregator/pgstore.PgConnection."""

    @property
    def in_transaction(self) -> bool: ...

    def execute(self, sql: str, params: Any = ..., /) -> Any: ...

    def executemany(self, sql: str, seq: Any, /) -> Any: ...

    def close(self) -> None: ...


def db_errors() -> tuple[type[Exception], ...]:
    """The exceptions a database call can raise: sqlite3's, and psycopg's where it is installed."""
    try:
        from podhealth.aggregator.pgstore import ERRORS
    except ImportError:
        return (sqlite3.Error,)
    return (sqlite3.Error, *ERRORS)


def is_postgres_url(url: str) -> bool:
    return url.startswith(("postgresql://", "postgres://"))


def sqlite_path(url: str) -> Path:
    """`sqlite:////abs/path` (or `sqlite:///abs/path`) -> /abs/path."""
    rest = url[len("sqlite://"):]
    return Path("/" + rest.lstrip("/"))


# Each migration moves the schema from version i to i+1; never edit one that has shipped.
MIGRATIONS: tuple[str, ...] = (
    # 1: the base schema
    """
    CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE nodes (
        name TEXT PRIMARY KEY,
        agent_url TEXT NOT NULL DEFAULT '',
        slurm_name TEXT NOT NULL DEFAULT '',
        k8s_name TEXT NOT NULL DEFAULT '',
        partition TEXT NOT NULL DEFAULT '',
        learned INTEGER NOT NULL DEFAULT 0,
        first_seen REAL NOT NULL DEFAULT 0,
        last_seen REAL NOT NULL DEFAULT 0,
        status TEXT NOT NULL DEFAULT 'UNKNOWN',
        report TEXT NOT NULL DEFAULT '',
        report_time REAL NOT NULL DEFAULT 0,
        fence TEXT NOT NULL DEFAULT 'none',
        fence_reason TEXT NOT NULL DEFAULT '',
        fenced_at REAL NOT NULL DEFAULT 0,
        hold INTEGER NOT NULL DEFAULT 0,
        opted_out INTEGER NOT NULL DEFAULT 0,
        ok_since REAL,
        handover TEXT NOT NULL DEFAULT '',
        handover_at REAL NOT NULL DEFAULT 0,
        unreachable_since REAL,
        released_at REAL NOT NULL DEFAULT 0
    );
    CREATE TABLE conditions (
        node TEXT NOT NULL, check_name TEXT NOT NULL, entity TEXT NOT NULL,
        status TEXT NOT NULL, action TEXT NOT NULL, severity TEXT NOT NULL,
        since REAL NOT NULL, observed REAL NOT NULL, source TEXT NOT NULL,
        ref TEXT NOT NULL DEFAULT '', summary TEXT NOT NULL DEFAULT '', notified INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (node, check_name, entity)
    ) WITHOUT ROWID;
    CREATE TABLE events (
        id TEXT PRIMARY KEY, node TEXT NOT NULL, type TEXT NOT NULL,
        time REAL NOT NULL, received REAL NOT NULL, body TEXT NOT NULL
    );
    CREATE INDEX events_node_time ON events (node, time);
    CREATE INDEX events_received ON events (received);
    CREATE TABLE verdicts (
        seq INTEGER PRIMARY KEY, node TEXT NOT NULL, time REAL NOT NULL, check_name TEXT NOT NULL,
        entity TEXT NOT NULL, status TEXT NOT NULL, action TEXT NOT NULL, source TEXT NOT NULL,
        summary TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX verdicts_node ON verdicts (node, seq);
    CREATE TABLE actions (
        id INTEGER PRIMARY KEY, node TEXT NOT NULL, kind TEXT NOT NULL, state TEXT NOT NULL,
        who TEXT NOT NULL, why TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', rule TEXT NOT NULL DEFAULT '',
        dry_run INTEGER NOT NULL DEFAULT 0, created REAL NOT NULL, updated REAL NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0, next_attempt REAL NOT NULL DEFAULT 0, result TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX actions_node ON actions (node, id);
    CREATE INDEX actions_pending ON actions (state) WHERE state = 'pending';
    CREATE TABLE audit (
        seq INTEGER PRIMARY KEY, time REAL NOT NULL, node TEXT NOT NULL, action_id INTEGER,
        who TEXT NOT NULL, what TEXT NOT NULL, why TEXT NOT NULL,
        command TEXT NOT NULL DEFAULT '', output TEXT NOT NULL DEFAULT '', ok INTEGER NOT NULL DEFAULT 1
    );
    CREATE INDEX audit_node ON audit (node, seq);
    CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
    CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
        BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
    """,
    # 2: fleet-wide audit queries by time (the UI's activity feed) and fence counts for the rate limit
    """
    CREATE INDEX audit_time ON audit (time);
    CREATE INDEX actions_kind_created ON actions (kind, created);
    """,
    # 3: the latest report (~12 KB, overflow pages) moves out of `nodes`, so the rows that change
    # every few seconds (last_seen, status) stay small and rewriting them touches a few pages
    """
    CREATE TABLE reports (name TEXT PRIMARY KEY, report TEXT NOT NULL);
    INSERT INTO reports (name, report) SELECT name, report FROM nodes WHERE report != '';
    ALTER TABLE nodes DROP COLUMN report;
    """,
    # 4: the aggregator's clock is the judge. A node's records are ordered by the agent's
    # (boot_id, seq), not its wall clock; report_time becomes the time the aggregator received
    # the report (a stored claim from the future, e.g. time = 1e12, is cut back to last_seen);
    # clock_ahead counts claims beyond the allowed skew; a condition's `opened` is when the
    # aggregator saw it go bad (the breaker counts by it); hold_reason says why a node is held.
    """
    ALTER TABLE nodes ADD COLUMN boot_id TEXT NOT NULL DEFAULT '';
    ALTER TABLE nodes ADD COLUMN report_seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN retired_boots TEXT NOT NULL DEFAULT '';
    ALTER TABLE nodes ADD COLUMN clock_ahead INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN hold_reason TEXT NOT NULL DEFAULT '';
    UPDATE nodes SET report_time = last_seen WHERE report_time > last_seen;
    ALTER TABLE conditions ADD COLUMN opened REAL NOT NULL DEFAULT 0;
    UPDATE conditions SET opened = MIN(since, observed);
    UPDATE events SET time = received WHERE time > received;
    """,
    # 5: fleet history for the UI's chart: node counts by state, sampled every few minutes by the
    # housekeeping loop (ui.history_interval) and pruned after ui.history_retention, so the table
    # stays bounded (7 days at one row per 5 min is ~2,000 rows)
    """
    CREATE TABLE fleet_samples (time REAL PRIMARY KEY, counts TEXT NOT NULL) WITHOUT ROWID;
    """,
    # 6: the remediation ladder. A node's step on it (ladder: '', acting, verifying, repair) and
    # when that began; a reset_gpu/reboot action's outcome after it was carried out ('' not yet,
    # verifying, passed, failed) and when that was decided: failed attempts are counted from them.
    """
    ALTER TABLE nodes ADD COLUMN ladder TEXT NOT NULL DEFAULT '';
    ALTER TABLE nodes ADD COLUMN ladder_at REAL NOT NULL DEFAULT 0;
    ALTER TABLE actions ADD COLUMN outcome TEXT NOT NULL DEFAULT '';
    ALTER TABLE actions ADD COLUMN outcome_at REAL NOT NULL DEFAULT 0;
    CREATE INDEX actions_ladder ON actions (node, created) WHERE kind IN ('reset_gpu', 'reboot');
    """,
    # 7: the fencing token. Every journaled action carries the lease epoch of the aggregator that
    # recorded it; the store refuses a journal write under an epoch that is no longer the lease's
    # (Store.begin_actions, apply(epoch=)), so a deposed leader that wakes up cannot act.
    """
    ALTER TABLE actions ADD COLUMN epoch INTEGER NOT NULL DEFAULT 0;
    """,
    # 8: operator overrides and fence evidence. A silence keeps one check on one node from counting
    # toward a fence until `until` (the aggregator's clock), with who and why; unsilencing or expiry
    # deletes the row (the audit log keeps both). A bundle is the evidence the node's agent gave for
    # one fence (aggregator/bundles.py): the file lives beside the database, the row says which
    # fence, how big, its sha256; the oldest beyond bundles.keep per node are deleted with their files.
    """
    CREATE TABLE silences (
        node TEXT NOT NULL, check_name TEXT NOT NULL, until REAL NOT NULL, reason TEXT NOT NULL,
        who TEXT NOT NULL, created REAL NOT NULL, PRIMARY KEY (node, check_name)
    );
    CREATE TABLE bundles (
        id INTEGER PRIMARY KEY, node TEXT NOT NULL, fence_id INTEGER NOT NULL, time REAL NOT NULL,
        size INTEGER NOT NULL, sha256 TEXT NOT NULL, path TEXT NOT NULL
    );
    CREATE INDEX bundles_node ON bundles (node, id);
    """,
    # 9: replicas. verdict_seq is the agent's seq of the newest transition applied in the node's
    # boot_id (reports move report_seq, transitions this), verdict_at when a replica applied it:
    # the leader reads both back (Store.observed_since) to take a transition that reached only a
    # follower without waiting for the agent's next full report.
    """
    ALTER TABLE nodes ADD COLUMN verdict_seq INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE nodes ADD COLUMN verdict_at REAL NOT NULL DEFAULT 0;
    """,
    # 10: a bundle the aggregator refused (it did not arrive whole, or does not match the agent's
    # manifest) or could not fetch: a row with the reason and no file, so the UI and `fleet bundle`
    # say why there is no evidence for that fence instead of serving a damaged one.
    """
    ALTER TABLE bundles ADD COLUMN error TEXT NOT NULL DEFAULT '';
    """,
    # 11: the leader's read-back of the other replicas' ingest in commit order. On PostgreSQL a
    # trigger (pgstore.PG_AFTER[11]) stamps every write of a node row with the id of the
    # transaction that made it, and the leader reads every row whose writer was not yet visible
    # to its previous read (Store.observed_after): a transaction that commits late, whatever
    # time it stamped, is read when it commits. SQLite has one writer and no read-back: 0 there.
    """
    ALTER TABLE nodes ADD COLUMN change_xid INTEGER NOT NULL DEFAULT 0;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)
LADDER_LOOKBACK = 366 * 86400.0  # failed attempts loaded at start: longer than any sane ladder.window


@dataclass(frozen=True)
class NodeRow:
    name: str
    agent_url: str = ""
    slurm_name: str = ""
    k8s_name: str = ""
    partition: str = ""
    learned: bool = False
    first_seen: float = 0.0
    last_seen: float = 0.0
    status: str = "UNKNOWN"
    report_time: float = 0.0
    fence: FenceMode = FenceMode.NONE
    fence_reason: str = ""
    fenced_at: float = 0.0
    hold: bool = False
    opted_out: bool = False
    ok_since: float | None = None
    handover: str = ""
    handover_at: float = 0.0
    unreachable_since: float | None = None
    released_at: float = 0.0
    boot_id: str = ""
    report_seq: int = 0
    retired_boots: str = ""  # space-separated, newest first
    clock_ahead: int = 0
    hold_reason: str = ""
    ladder: str = ""
    ladder_at: float = 0.0
    verdict_seq: int = 0  # the newest transition's seq in boot_id (migration 9)


class Observed(NamedTuple):
    """One node as the shared store holds it, for the leader's merge (Store.observed_since,
    Memory.adopt)."""

    name: str
    report_time: float
    last_seen: float
    status: str
    ok_since: float | None
    boot_id: str
    report_seq: int
    verdict_seq: int
    retired_boots: str  # space-separated, newest first: the boots the writer of boot_id saw the node leave
    # A report or transition was stored since the cursor (or, on PostgreSQL, the row was written
    # by a commit the last read did not see), so the node's open conditions are in the same
    # answer: only such a row may replace what the leader holds.
    changed: bool


@dataclass(frozen=True)
class ActionRow:
    id: int
    node: str
    kind: str
    state: str
    who: str
    why: str
    reason: FenceReason | None
    rule: str
    dry_run: bool
    created: float
    updated: float
    attempts: int
    next_attempt: float
    result: str

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id, "node": self.node, "kind": self.kind, "state": self.state, "who": self.who,
            "why": self.why, "reason": reason_to_json(self.reason), "rule": self.rule, "dry_run": self.dry_run,
            "created": self.created, "updated": self.updated, "attempts": self.attempts, "result": self.result,
        }


@dataclass(frozen=True)
class ActionStart:
    """One action to record as pending (Store.begin_actions)."""

    node: str
    kind: str
    who: str
    why: str
    now: float
    reason: FenceReason | None = None
    rule: str = ""
    dry_run: bool = False
    extra: tuple[Op, ...] = ()


@dataclass(frozen=True)
class Loaded:
    """Everything the in-memory mirror needs at start."""

    nodes: tuple[NodeRow, ...]
    conditions: tuple[Condition, ...]
    event_ids: tuple[tuple[str, float], ...]  # (id, received), oldest first
    breaker: BreakerState
    pending: tuple[ActionRow, ...]
    recent_fences: tuple[float, ...]
    # node -> when its reset/reboot attempts failed (the ladder's count), oldest first
    ladder_failures: Mapping[str, tuple[float, ...]] = dataclasses.field(default_factory=dict)
    # node -> what was done about its jobs since its fence ("polite", "forced", "failed"), from the journal
    evacuated: Mapping[str, str] = dataclasses.field(default_factory=dict)
    silences: tuple[Silence, ...] = ()  # operators' silences, expired ones included (housekeeping drops them)
    recent_steps: tuple[float, ...] = ()  # when recent resets/reboots began (the ladder's rate limit)


def reason_to_json(r: FenceReason | None) -> dict[str, str] | None:
    return None if r is None else {"check": r.check, "entity": r.entity, "action": r.action, "id": r.id}


def _reason_from(text: str) -> FenceReason | None:
    if not text:
        return None
    d = json.loads(text)
    return FenceReason(check=d["check"], entity=d["entity"], action=d["action"], id=d["id"])


_NODE_COLS = ("name, agent_url, slurm_name, k8s_name, partition, learned, first_seen, last_seen, status, "
              "report_time, fence, fence_reason, fenced_at, hold, opted_out, ok_since, handover, handover_at, "
              "unreachable_since, released_at, boot_id, report_seq, retired_boots, clock_ahead, hold_reason, ladder, "
              "ladder_at, verdict_seq")
_ACTION_COLS = "id, node, kind, state, who, why, reason, rule, dry_run, created, updated, attempts, next_attempt, result"


def _node_row(r: Sequence[Any]) -> NodeRow:
    return NodeRow(r[0], r[1], r[2], r[3], r[4], bool(r[5]), r[6], r[7], r[8], r[9], FenceMode(r[10]), r[11],
                   r[12], bool(r[13]), bool(r[14]), r[15], r[16], r[17], r[18], r[19], r[20], r[21], r[22], r[23],
                   r[24], r[25], r[26], r[27])


def _bundle(r: Sequence[Any]) -> dict[str, Any]:
    return {"id": r[0], "node": r[1], "fence_id": r[2], "time": r[3], "size": r[4], "sha256": r[5], "path": r[6],
            "error": r[7]}


def _action_row(r: Sequence[Any]) -> ActionRow:
    return ActionRow(r[0], r[1], r[2], r[3], r[4], r[5], _reason_from(r[6]), r[7], bool(r[8]), r[9], r[10],
                     r[11], r[12], r[13])


def connect(path: Path | str, *, readonly: bool = False) -> sqlite3.Connection:
    uri = f"file:{path}?mode=ro" if readonly else f"file:{path}"
    conn = sqlite3.connect(uri, uri=True, timeout=10.0, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA busy_timeout = 10000")
    if not readonly:
        conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode: a commit survives a crash of this process (the restart-safety
        # promise); only a power cut can lose the last transactions, never corrupt the file.
        conn.execute("PRAGMA synchronous = NORMAL")
    return conn


def rollback(conn: DbConn) -> None:
    """ROLLBACK after a failed statement, if SQLite has not already rolled back by itself (it
    does on SQLITE_FULL, IOERR, NOMEM): a second ROLLBACK would raise "no transaction is
    active" and hide the error that matters (the disk is full) behind one that does not."""
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def migrate(conn: DbConn, upto: int = SCHEMA_VERSION) -> int:
    """Apply pending migrations, each in its own transaction; return the resulting version."""
    if not isinstance(conn, sqlite3.Connection):
        return _migrate_pg(conn, upto)
    version = int(conn.execute("PRAGMA user_version").fetchone()[0])
    if version > SCHEMA_VERSION:
        raise StoreError(f"database schema version {version} is newer than this podhealth ({SCHEMA_VERSION}); "
                         "refusing to touch it")
    while version < upto:
        script = MIGRATIONS[version]
        conn.execute("BEGIN IMMEDIATE")
        try:
            for stmt in _statements(script):
                conn.execute(stmt)
            conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise
        version += 1
    return version


def _migrate_pg(conn: DbConn, upto: int) -> int:
    """The same migrations on PostgreSQL (pgstore translates each statement). DDL is
    transactional there too; an advisory lock keeps two replicas starting at once from both
    running a migration."""
    from podhealth.aggregator import pgstore

    while True:
        conn.execute("BEGIN")
        try:
            conn.execute(pgstore.MIGRATION_LOCK)
            pgstore.ensure_version_table(conn)
            version = pgstore.get_version(conn)
            if version > SCHEMA_VERSION:
                raise StoreError(f"database schema version {version} is newer than this podhealth ({SCHEMA_VERSION}); "
                                 "refusing to touch it")
            if version >= upto:
                conn.execute("COMMIT")
                return version
            for stmt in _statements(MIGRATIONS[version]):
                conn.execute(stmt)
            for stmt in pgstore.PG_AFTER.get(version + 1, ()):
                conn.execute(stmt)
            conn.execute(pgstore.set_version_sql(version + 1))
            conn.execute("COMMIT")
        except BaseException:
            rollback(conn)
            raise


def _statements(script: str) -> list[str]:
    """Split a migration into statements (executescript would commit on its own)."""
    out: list[str] = []
    buf = ""
    for line in script.splitlines(keepends=True):
        buf += line
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


class Store:
    """Synchronous access to the state file. Use from one thread at a time (the writer's)."""

    def __init__(self, path: Path | str) -> None:
        """`path`: a SQLite file, a `sqlite:///path` URL, or a `postgresql://` URL."""
        text = str(path)
        self.url = text if is_postgres_url(text) else ""
        self.backend = "postgresql" if self.url else "sqlite"
        self.path = Path(sqlite_path(text) if text.startswith("sqlite://") else ("" if self.url else path))
        self.conn: DbConn
        if self.url:
            from podhealth.extras import MissingExtra, require
            try:
                require("postgresql")
            except MissingExtra as e:
                raise StoreError(str(e)) from None
            from podhealth.aggregator import pgstore
            self.where = pgstore.redact(self.url)
            try:
                self.conn = pgstore.connect(self.url)
                self.version = migrate(self.conn)
            except pgstore.ERRORS as e:
                raise StoreError(f"{self.where}: {str(e).strip()}") from None
        else:
            self.where = str(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self.conn = connect(self.path)
                self.version = migrate(self.conn)
            except sqlite3.DatabaseError as e:
                raise StoreError(f"{self.path}: {e}") from None
        self._reader: DbConn | None = None
        self._read_lock = threading.Lock()

    def close(self) -> None:
        with self._read_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        self.conn.close()

    # ---- writing -------------------------------------------------------------------------

    def apply(self, ops: Iterable[Op], epoch: int | None = None) -> None:
        """Run ops in one transaction; runs of the same statement go through one executemany.
        With `epoch`, only while that is still the lease's epoch (else StaleEpoch, nothing written)."""
        c = self.conn
        c.execute("BEGIN")
        try:
            if epoch is not None:
                self._check_epoch(epoch)
            for sql, group in itertools.groupby(ops, key=operator.itemgetter(0)):
                params = [p for _, p in group]
                if len(params) == 1:
                    c.execute(sql, params[0])
                else:
                    c.executemany(sql, params)
            c.execute("COMMIT")
        except BaseException:
            rollback(c)
            raise

    def begin_action(self, node: str, kind: str, who: str, why: str, now: float, reason: FenceReason | None = None,
                     rule: str = "", dry_run: bool = False, extra: Sequence[Op] = (), epoch: int | None = None) -> int:
        """Record a pending action (and `extra` ops) in one transaction, BEFORE anything is done."""
        return self.begin_actions([ActionStart(node, kind, who, why, now, reason, rule, dry_run, tuple(extra))],
                                  epoch)[0]

    def _check_epoch(self, epoch: int) -> None:
        """Inside a transaction: refuse it unless `epoch` is the lease's. On PostgreSQL the lease
        row is locked until the commit (FOR UPDATE), so a takeover (which bumps the epoch on the
        same row) cannot slip in between the check and this transaction's writes."""
        lock = " FOR UPDATE" if self.url else ""  # SQLite's writer already holds the database lock
        row = self.conn.execute(f"SELECT value FROM kv WHERE key = 'lease'{lock}").fetchone()
        current = int(json.loads(row[0]).get("epoch", 0)) if row else 0
        if current != epoch:
            raise StaleEpoch(f"lease epoch {epoch} is no longer current (now {current}): this aggregator was "
                             "deposed; the journal write is refused")

    def begin_actions(self, starts: Sequence["ActionStart"], epoch: int | None = None) -> list[int]:
        """begin_action for many actions in one transaction (a batch of fences); ids in order.
        With `epoch`, the fencing token: recorded with each action, refused when stale."""
        c = self.conn
        ids: list[int] = []
        c.execute("BEGIN")
        try:
            if epoch is not None:
                self._check_epoch(epoch)
            for a in starts:
                cur = c.execute(
                    "INSERT INTO actions (node, kind, state, who, why, reason, rule, dry_run, created, updated, epoch) "
                    "VALUES (?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                    (a.node, a.kind, a.who, a.why, json.dumps(reason_to_json(a.reason)) if a.reason else "", a.rule,
                     int(a.dry_run), a.now, a.now, epoch or 0))
                aid = int(cur.fetchone()[0])  # RETURNING, not lastrowid: PostgreSQL has no rowid
                c.execute("INSERT INTO audit (time, node, action_id, who, what, why) VALUES (?, ?, ?, ?, ?, ?)",
                          (a.now, a.node, aid, a.who, f"{a.kind} requested", a.why))
                for sql, params in a.extra:
                    c.execute(sql, params)
                ids.append(aid)
            c.execute("COMMIT")
        except BaseException:
            rollback(c)
            raise
        return ids

    # ---- op builders (pure; run later by the writer in a group commit) --------------------

    @staticmethod
    def op_node_insert(row: NodeRow) -> Op:
        return ("INSERT OR IGNORE INTO nodes (name, agent_url, slurm_name, k8s_name, partition, learned, first_seen, "
                "status) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (row.name, row.agent_url, row.slurm_name, row.k8s_name, row.partition, int(row.learned),
                 row.first_seen, row.status))

    @staticmethod
    def op_node_config(name: str, agent_url: str, slurm_name: str, k8s_name: str, partition: str) -> Op:
        return ("UPDATE nodes SET agent_url = ?, slurm_name = ?, k8s_name = ?, partition = ?, learned = 0 WHERE name = ?",
                (agent_url, slurm_name, k8s_name, partition, name))

    @staticmethod
    def ops_node_forget(name: str) -> list[Op]:
        """A learned node that stopped reporting: its row, open conditions and latest report go;
        its verdict history, events and audit entries stay."""
        return [("DELETE FROM conditions WHERE node = ?", (name,)), ("DELETE FROM reports WHERE name = ?", (name,)),
                ("DELETE FROM nodes WHERE name = ? AND learned = 1", (name,))]

    @staticmethod
    def op_node_report(name: str, status: str, report_time: float, last_seen: float, report_seq: int = 0) -> Op:
        return ("UPDATE nodes SET status = ?, report_time = ?, last_seen = ?, report_seq = ? WHERE name = ?",
                (status, report_time, last_seen, report_seq, name))

    @staticmethod
    def op_report(name: str, report: str | bytes) -> Op:
        """The node's latest report as the agent sent it (kept apart from `nodes`, see migration 3);
        as str or as UTF-8 bytes, stored as TEXT either way."""
        return ("INSERT INTO reports (name, report) VALUES (?, CAST(? AS TEXT)) "
                "ON CONFLICT (name) DO UPDATE SET report = excluded.report", (name, report))

    @staticmethod
    def op_node_seen(name: str, last_seen: float, report_time: float, report_seq: int = 0, boot_id: str = "") -> Op:
        """The lazy last-seen flush: one constant statement, so a flush of every node is one executemany.

        Nothing moves back: replicas share the row, and one that took an older heartbeat (or
        flushes later) must not undo a newer report time or seq another replica stored. The seq
        is compared only within the boot the row is in (a boot change is written at once)."""
        return ("UPDATE nodes SET last_seen = MAX(last_seen, ?), report_time = MAX(report_time, ?), "
                "report_seq = CASE WHEN boot_id = ? AND report_seq < ? THEN ? ELSE report_seq END WHERE name = ?",
                (last_seen, report_time, boot_id, report_seq, report_seq, name))

    @staticmethod
    def op_node_verdict_seq(name: str, boot_id: str, verdict_seq: int, at: float) -> Op:
        """An agent transition applied at `at`: the node's verdict_seq moves up, only within the
        boot the row is in (the boot change, op_node_fields, is written first in the same
        transaction). A replica that applies a late transition of an older boot, or one older
        than what another replica stored, leaves the row alone: it never goes back."""
        return ("UPDATE nodes SET verdict_seq = ?, verdict_at = ? WHERE name = ? AND boot_id = ? AND verdict_seq < ?",
                (verdict_seq, at, name, boot_id, verdict_seq))

    @staticmethod
    def op_node_fields(name: str, **fields: Any) -> Op:
        # The column names go into the SQL text itself: only the nodes table's own are allowed. An
        # error, not an assert, so that `python -O` keeps the check.
        unknown = set(fields) - _NODE_FIELDS
        if unknown:
            raise ValueError(f"not a column of nodes: {', '.join(sorted(unknown))}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        return (f"UPDATE nodes SET {cols} WHERE name = ?", (*fields.values(), name))

    @staticmethod
    def op_condition(c: Condition) -> Op:
        return ("INSERT OR REPLACE INTO conditions (node, check_name, entity, status, action, severity, since, observed, "
                "source, ref, summary, notified, opened) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (c.node, c.check, c.entity, c.status.value, c.action.value, c.severity, c.since, c.observed,
                 c.source, c.ref, c.summary, int(c.notified), c.opened))

    @staticmethod
    def op_condition_close(key: tuple[str, str, str]) -> Op:
        return ("DELETE FROM conditions WHERE node = ? AND check_name = ? AND entity = ?", key)

    @staticmethod
    def op_verdict(node: str, time: float, check: str, entity: str, status: str, action: str, source: str,
                   summary: str = "") -> Op:
        return ("INSERT INTO verdicts (node, time, check_name, entity, status, action, source, summary) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (node, time, check, entity, status, action, source, summary))

    @staticmethod
    def op_event(event_id: str, node: str, type_: str, time: float, received: float, body: str) -> Op:
        # OR IGNORE: the in-memory id set is the first line of idempotency, the primary key the last.
        return ("INSERT OR IGNORE INTO events (id, node, type, time, received, body) VALUES (?, ?, ?, ?, ?, ?)",
                (event_id, node, type_, time, received, body))

    @staticmethod
    def op_audit(now: float, node: str, who: str, what: str, why: str, command: Sequence[str] = (), output: str = "",
                 ok: bool = True, action_id: int | None = None) -> Op:
        return ("INSERT INTO audit (time, node, action_id, who, what, why, command, output, ok) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (now, node, action_id, who, what, why, json.dumps(list(command)) if command else "", output[:8192],
                 int(ok)))

    @staticmethod
    def op_action_attempt(aid: int, now: float, attempts: int, next_attempt: float, result: str) -> Op:
        return ("UPDATE actions SET attempts = ?, next_attempt = ?, updated = ?, result = ? WHERE id = ?",
                (attempts, next_attempt, now, result[:4096], aid))

    @staticmethod
    def op_action_epoch(aid: int, epoch: int) -> Op:
        """The epoch of the leader that carried the action out (it may have finished another
        leader's pending action after a takeover): the fencing token of the change it made."""
        return ("UPDATE actions SET epoch = ? WHERE id = ?", (epoch, aid))

    @staticmethod
    def op_action_finish(aid: int, state: str, now: float, result: str) -> Op:
        return ("UPDATE actions SET state = ?, updated = ?, result = ? WHERE id = ?", (state, now, result[:4096], aid))

    @staticmethod
    def op_action_outcome(aid: int, outcome: str, now: float) -> Op:
        """A carried-out reset/reboot's outcome: verifying (waiting for the handover suite)."""
        return ("UPDATE actions SET outcome = ?, outcome_at = ? WHERE id = ?", (outcome, now, aid))

    @staticmethod
    def op_ladder_outcome(node: str, outcome: str, now: float, why: str = "") -> Op:
        """Close the node's attempt being verified: passed (released after the handover suite) or
        failed (the suite failed, or verify_within ran out). `why` is added to the attempt's result:
        the repair queue said "reboot failed — reboot requested from 1 scheduler(s)" and not why."""
        return ("UPDATE actions SET outcome = ?, outcome_at = ?, result = result || ? "
                "WHERE node = ? AND outcome = 'verifying'", (outcome, now, f"; {outcome}: {why}" if why else "", node))

    def ladder_attempts(self, node: str, limit: int = 20) -> list[dict[str, Any]]:
        """The node's recent reset/reboot/repair actions, newest first (the repair queue shows them)."""
        with self._read_lock:
            rows = self._read().execute(
                "SELECT id, kind, state, outcome, created, updated, outcome_at, why, result FROM actions "
                "WHERE node = ? AND kind IN ('reset_gpu', 'reboot', 'repair') ORDER BY id DESC LIMIT ?",
                (node, limit)).fetchall()
        return [{"id": r[0], "kind": r[1], "state": r[2], "outcome": r[3], "created": r[4], "updated": r[5],
                 "outcome_at": r[6], "why": r[7], "result": r[8]} for r in rows]

    @staticmethod
    def op_breaker(b: BreakerState) -> Op:
        value = json.dumps({"tripped": b.tripped, "tripped_at": b.tripped_at, "reset_at": b.reset_at, "reason": b.reason})
        return ("INSERT OR REPLACE INTO kv (key, value) VALUES ('breaker', ?)", (value,))

    @staticmethod
    def op_prune_events(before: float) -> Op:
        return ("DELETE FROM events WHERE received < ?", (before,))

    @staticmethod
    def op_fleet_sample(now: float, counts: Mapping[str, int]) -> Op:
        return ("INSERT OR REPLACE INTO fleet_samples (time, counts) VALUES (?, ?)",
                (now, json.dumps(dict(counts), sort_keys=True)))

    @staticmethod
    def op_prune_fleet_samples(before: float) -> Op:
        return ("DELETE FROM fleet_samples WHERE time < ?", (before,))

    @staticmethod
    def op_silence(s: Silence) -> Op:
        return ("INSERT INTO silences (node, check_name, until, reason, who, created) VALUES (?, ?, ?, ?, ?, ?) "
                "ON CONFLICT (node, check_name) DO UPDATE SET until = excluded.until, reason = excluded.reason, "
                "who = excluded.who, created = excluded.created", (s.node, s.check, s.until, s.reason, s.who, s.created))

    @staticmethod
    def op_unsilence(node: str, check: str) -> Op:
        return ("DELETE FROM silences WHERE node = ? AND check_name = ?", (node, check))

    def add_bundle(self, node: str, fence_id: int, now: float, size: int, sha256: str, path: str,
                   keep: int, error: str = "") -> tuple[int, list[str]]:
        """Record a stored bundle (or, with `error` and no path, one refused or not fetched) and
        drop the node's oldest beyond `keep` (writer thread): (its id, the paths of the dropped
        rows, for the caller to delete)."""
        c = self.conn
        c.execute("BEGIN")
        try:
            bid = int(c.execute("INSERT INTO bundles (node, fence_id, time, size, sha256, path, error) "
                                "VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                                (node, fence_id, now, size, sha256, path, error)).fetchone()[0])
            old = c.execute("SELECT id, path FROM bundles WHERE node = ? ORDER BY id DESC LIMIT -1 OFFSET ?"
                            if not self.url else
                            "SELECT id, path FROM bundles WHERE node = ? ORDER BY id DESC OFFSET ?",
                            (node, keep)).fetchall()
            for oid, _ in old:
                c.execute("DELETE FROM bundles WHERE id = ?", (oid,))
            c.execute("COMMIT")
        except BaseException:
            rollback(c)
            raise
        return bid, [str(p) for _, p in old]

    def bundles_of(self, node: str) -> list[dict[str, Any]]:
        """The node's stored bundles, newest first."""
        with self._read_lock:
            rows = self._read().execute("SELECT id, node, fence_id, time, size, sha256, path, error FROM bundles "
                                        "WHERE node = ? ORDER BY id DESC", (node,)).fetchall()
        return [_bundle(r) for r in rows]

    def bundle(self, bid: int) -> dict[str, Any] | None:
        with self._read_lock:
            r = self._read().execute("SELECT id, node, fence_id, time, size, sha256, path, error FROM bundles WHERE id = ?",
                                     (bid,)).fetchone()
        return _bundle(r) if r else None

    # ---- reading -------------------------------------------------------------------------

    def load(self, now: float, event_retention: float, rate_window: float = 60.0) -> Loaded:
        c = self.conn
        nodes = tuple(_node_row(r) for r in c.execute(f"SELECT {_NODE_COLS} FROM nodes"))
        conds = tuple(
            Condition(node=r[0], check=r[1], entity=r[2], status=Status(r[3]), action=Action(r[4]), severity=r[5],
                      since=r[6], observed=r[7], source=r[8], ref=r[9], summary=r[10], notified=bool(r[11]),
                      opened=r[12])
            for r in c.execute("SELECT node, check_name, entity, status, action, severity, since, observed, source, "
                               "ref, summary, notified, opened FROM conditions"))
        ids = tuple((r[0], r[1]) for r in c.execute(
            "SELECT id, received FROM events WHERE received >= ? ORDER BY received", (now - event_retention,)))
        row = c.execute("SELECT value FROM kv WHERE key = 'breaker'").fetchone()
        breaker = BreakerState(**json.loads(row[0])) if row else BreakerState()
        pending = tuple(self.pending_actions())
        recent = tuple(r[0] for r in c.execute(
            "SELECT created FROM actions WHERE kind = 'fence' AND created > ? AND state != 'failed'",
            (now - rate_window,)))
        steps = tuple(r[0] for r in c.execute(
            "SELECT created FROM actions WHERE kind IN ('reset_gpu', 'reboot') AND created > ?", (now - rate_window,)))
        return Loaded(nodes, conds, ids, breaker, pending, recent, self.ladder_failures(now - LADDER_LOOKBACK),
                      self.evacuations(), self.silences(), steps)

    def event_bytes_by_node(self, since: float) -> dict[str, int]:
        """Bytes of event bodies each node holds, received since `since` (the per-node stored cap)."""
        with self._read_lock:
            rows = self._read().execute(
                "SELECT node, SUM(LENGTH(body)) FROM events WHERE received >= ? GROUP BY node", (since,)).fetchall()
        return {str(r[0]): int(r[1] or 0) for r in rows}

    def silences(self) -> tuple[Silence, ...]:
        return tuple(Silence(r[0], r[1], r[2], r[3], r[4], r[5]) for r in self.conn.execute(
            "SELECT node, check_name, until, reason, who, created FROM silences ORDER BY node, check_name"))

    def observed_since(self, since: float) -> tuple[list[Observed], list[Condition]]:
        """observed_after without the commit-order snapshot (by time alone)."""
        rows, conds, _ = self.observed_after(since, "")
        return rows, conds

    def observed_after(self, since: float, snapshot: str) -> tuple[list[Observed], list[Condition], str]:
        """What any replica ingested since `since`: the nodes seen, reported or with an agent
        transition since then, and the open conditions of those reported or with a transition
        since then (Observed.changed). On PostgreSQL also every node row written by a transaction
        that `snapshot` (the previous read's) did not yet see, whatever time it stamped: a commit
        that lands late is read when it lands. Returns this read's snapshot for the next one
        ('' on SQLite). The leader merges them (Memory.adopt): replicas all ingest, only the
        leader decides."""
        # One snapshot for both reads (PostgreSQL reads each statement in its own otherwise), so a
        # row marked changed has its conditions in the answer however the replicas write between.
        begin = "BEGIN ISOLATION LEVEL REPEATABLE READ" if self.url else "BEGIN"
        late = ""
        params: tuple[str, ...] = ()
        if self.url and snapshot:
            # change_xid >= xmin first: the index narrows it; below xmin every writer was visible
            late = (" OR (n.change_xid >= CAST(CAST(pg_snapshot_xmin(CAST(? AS pg_snapshot)) AS TEXT) AS BIGINT)"
                    " AND NOT pg_visible_in_snapshot(CAST(CAST(n.change_xid AS TEXT) AS xid8), CAST(? AS pg_snapshot)))")
            params = (snapshot, snapshot)
        with self._read_lock:
            db = self._read()
            db.execute(begin)
            try:
                now_snap = str(db.execute("SELECT CAST(pg_current_snapshot() AS TEXT)").fetchone()[0]) \
                    if self.url else ""
                rows = [Observed(str(r[0]), float(r[1]), float(r[2]), str(r[3]), r[4], str(r[5]), int(r[6]),
                                 int(r[7]), str(r[8]), bool(r[9])) for r in db.execute(
                    "SELECT n.name, n.report_time, n.last_seen, n.status, n.ok_since, n.boot_id, n.report_seq, "
                    f"n.verdict_seq, n.retired_boots, (n.report_time >= ? OR n.verdict_at >= ?{late}) FROM nodes n "
                    f"WHERE n.last_seen >= ? OR n.report_time >= ? OR n.verdict_at >= ?{late}",
                    (since, since, *params, since, since, since, *params)).fetchall()]
                conds = [Condition(node=r[0], check=r[1], entity=r[2], status=Status(r[3]), action=Action(r[4]),
                                   severity=r[5], since=r[6], observed=r[7], source=r[8], ref=r[9], summary=r[10],
                                   notified=bool(r[11]), opened=r[12])
                         for r in db.execute(
                             "SELECT c.node, c.check_name, c.entity, c.status, c.action, c.severity, c.since, "
                             "c.observed, c.source, c.ref, c.summary, c.notified, c.opened FROM conditions c "
                             f"JOIN nodes n ON n.name = c.node WHERE n.report_time >= ? OR n.verdict_at >= ?{late}",
                             (since, since, *params)).fetchall()]
                db.execute("COMMIT")
            except BaseException:
                rollback(db)
                raise
        return rows, conds, now_snap

    def evacuations(self) -> dict[str, str]:
        """node -> what the journal says was done about its jobs since its current fence: the
        last finished evacuate action recorded after the node's fenced_at (a forced one after a
        polite one is later, so it wins). No schema of its own: the action journal is the record."""
        out: dict[str, str] = {}
        for node, rule, state in self.conn.execute(
                "SELECT a.node, a.rule, a.state FROM actions a JOIN nodes n ON n.name = a.node "
                "WHERE a.kind = 'evacuate' AND a.state IN ('done', 'failed') AND a.created >= n.fenced_at "
                "AND n.fence != 'none' ORDER BY a.id"):
            out[node] = "failed" if state == "failed" else "forced" if rule == "force" else "polite"
        return out

    def ladder_failures(self, since: float) -> dict[str, tuple[float, ...]]:
        """node -> times its reset/reboot attempts failed since `since`: the step itself failed
        (state failed, at `updated`) or the node did not pass the handover suite after it
        (outcome failed, at `outcome_at`)."""
        out: dict[str, list[float]] = {}
        for node, at in self.conn.execute(
                "SELECT node, CASE WHEN state = 'failed' THEN updated ELSE outcome_at END AS at FROM actions "
                "WHERE kind IN ('reset_gpu', 'reboot') AND (state = 'failed' OR outcome = 'failed') "
                "AND created >= ? ORDER BY at", (since,)):
            out.setdefault(node, []).append(float(at))
        return {n: tuple(ts) for n, ts in out.items()}

    def recent_cycles(self, since: float) -> list[tuple[str, float, str, str]]:
        """(node, when, kind, who) of every fence done and every operator's release since
        `since`, oldest first: the flap hold counts a node's fences from them, from its last
        operator release on (service.Aggregator._flap_hold)."""
        return [(r[0], r[1], r[2], r[3]) for r in self.conn.execute(
            "SELECT node, updated, kind, who FROM actions WHERE state = 'done' AND updated >= ? AND "
            "(kind = 'fence' OR (kind = 'release' AND who LIKE 'operator:%')) ORDER BY updated, id", (since,))]

    def released_epoch(self, node: str) -> int:
        """The newest lease epoch under which the journal finished a release of `node` (0: none).
        Reconcile tells a deposed leader's late mark by it (aggregator/lifecycle.py)."""
        row = self.conn.execute("SELECT MAX(epoch) FROM actions WHERE node = ? AND kind = 'release' AND state = 'done'",
                                (node,)).fetchone()
        return int(row[0] or 0) if row else 0

    def pending_actions(self) -> list[ActionRow]:
        return [_action_row(r) for r in self.conn.execute(
            f"SELECT {_ACTION_COLS} FROM actions WHERE state = 'pending' ORDER BY id")]

    def _read(self) -> DbConn:
        if self._reader is None:
            if self.url:
                from podhealth.aggregator import pgstore
                self._reader = pgstore.connect(self.url)
            else:
                self._reader = connect(self.path)
        return self._reader

    def node_report(self, name: str) -> str:
        """The node's latest report as the agent sent it (JSON text), '' if none."""
        with self._read_lock:
            row = self._read().execute("SELECT report FROM reports WHERE name = ?", (name,)).fetchone()
        return row[0] if row else ""

    def drift_readings(self, names: Sequence[str] | None = None) -> list[tuple[str, str, str]]:
        """(node, field, versions) from the stored reports' `drift` results (checks/passive/drift.py), of
        `names` or of every node. SQLite's JSON functions pick them out of the ~18 KB reports; a
        report from an agent without the drift check gives no row, one that is not JSON none."""
        # json_extract, not ->>: SQLite before 3.38 (Ubuntu 22.04) has JSON1 but not the operators
        # HCA firmware comes per board (evidence.boards, "BOARD=VERSION, ..."), from agents that send it
        sql = ("SELECT r.name, json_extract(j.value, '$.entity'), "
               "COALESCE(json_extract(j.value, '$.evidence.boards'), json_extract(j.value, '$.evidence.observed')) "
               "FROM reports r, json_each(r.report, '$.results') j "
               "WHERE {where} json_valid(r.report) AND json_extract(j.value, '$.check') = 'drift'")
        out: list[tuple[str, str, str]] = []
        if self.url:
            return self._drift_readings_pg(names)
        with self._read_lock:
            if names is None:
                rows = self._read().execute(sql.format(where="")).fetchall()
            else:
                rows = []
                for i in range(0, len(names), 500):  # SQLite's bound-parameter limit
                    chunk = list(names[i:i + 500])
                    rows += self._read().execute(
                        sql.format(where=f"r.name IN ({','.join('?' * len(chunk))}) AND"), chunk).fetchall()
        out.extend((str(n), str(f), str(v or "")) for n, f, v in rows)
        return out

    def _drift_readings_pg(self, names: Sequence[str] | None) -> list[tuple[str, str, str]]:
        """drift_readings on PostgreSQL, which (before 16) cannot test text for JSON without
        raising: the few reports that mention drift are picked out there and parsed here."""
        sql = "SELECT name, report FROM reports WHERE report LIKE '%\"drift\"%'"
        with self._read_lock:
            rows = self._read().execute(sql).fetchall()
        want = None if names is None else set(names)
        out: list[tuple[str, str, str]] = []
        for name, text in rows:
            if want is not None and name not in want:
                continue
            try:
                results = json.loads(text).get("results", [])
            except (ValueError, AttributeError):
                continue
            for r in results if isinstance(results, list) else []:
                if isinstance(r, dict) and r.get("check") == "drift":
                    ev = r.get("evidence") if isinstance(r.get("evidence"), dict) else {}
                    observed = ev.get("boards") or ev.get("observed")
                    shown = observed if isinstance(observed, str) or observed is None else json.dumps(observed)
                    out.append((str(name), str(r.get("entity")), str(shown or "")))
        return out

    def actions_of(self, node: str, limit: int = 50) -> list[ActionRow]:
        with self._read_lock:
            rows = self._read().execute(f"SELECT {_ACTION_COLS} FROM actions WHERE node = ? ORDER BY id DESC LIMIT ?",
                                        (node, limit)).fetchall()
        return [_action_row(r) for r in rows]

    def action(self, aid: int) -> ActionRow | None:
        with self._read_lock:
            r = self._read().execute(f"SELECT {_ACTION_COLS} FROM actions WHERE id = ?", (aid,)).fetchone()
        return _action_row(r) if r else None

    def history(self, node: str, limit: int = 100, before: float | None = None) -> list[dict[str, Any]]:
        """Newest first: verdict changes, events and audit lines of one node, merged by time."""
        b = before if before is not None else float("inf")
        with self._read_lock:
            db = self._read()
            verdicts = db.execute(
                "SELECT time, check_name, entity, status, action, source, summary FROM verdicts "
                "WHERE node = ? AND time < ? ORDER BY time DESC, seq DESC LIMIT ?", (node, b, limit)).fetchall()
            events = db.execute(
                "SELECT time, id, type, body FROM events WHERE node = ? AND time < ? ORDER BY time DESC LIMIT ?",
                (node, b, limit)).fetchall()
            audit = db.execute(
                "SELECT time, seq, action_id, who, what, why, command, output, ok FROM audit "
                "WHERE node = ? AND time < ? ORDER BY seq DESC LIMIT ?", (node, b, limit)).fetchall()
        out: list[dict[str, Any]] = []
        out += [{"time": r[0], "type": "verdict", "check": r[1], "entity": r[2], "status": r[3], "action": r[4],
                 "source": r[5], "summary": r[6]} for r in verdicts]
        out += [{"time": r[0], "type": "event", "id": r[1], "kind": r[2], "event": json.loads(r[3])} for r in events]
        out += [{"time": r[0], "type": "audit", "seq": r[1], "action_id": r[2], "who": r[3], "what": r[4],
                 "why": r[5], "command": json.loads(r[6]) if r[6] else [], "output": r[7], "ok": bool(r[8])}
                for r in audit]
        out.sort(key=lambda d: d["time"], reverse=True)
        return out[:limit]

    def fleet_history(self, since: float, limit: int = 5000) -> list[tuple[float, dict[str, int]]]:
        """(time, counts by state) of the fleet samples taken since `since`, oldest first."""
        with self._read_lock:
            rows = self._read().execute(
                "SELECT time, counts FROM fleet_samples WHERE time >= ? ORDER BY time LIMIT ?", (since, limit)).fetchall()
        return [(float(r[0]), {str(k): int(v) for k, v in json.loads(r[1]).items()}) for r in rows]

    def audit_tail(self, limit: int = 100) -> list[dict[str, Any]]:
        with self._read_lock:
            rows = self._read().execute(
                "SELECT time, seq, node, action_id, who, what, why, command, output, ok FROM audit "
                "ORDER BY seq DESC LIMIT ?", (limit,)).fetchall()
        return [{"time": r[0], "seq": r[1], "node": r[2], "action_id": r[3], "who": r[4], "what": r[5], "why": r[6],
                 "command": json.loads(r[7]) if r[7] else [], "output": r[8], "ok": bool(r[9])} for r in rows]

    def counts(self) -> dict[str, int]:
        """Row counts, for tests and `fleet status`."""
        with self._read_lock:
            db = self._read()
            return {t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0])
                    for t in ("nodes", "conditions", "events", "verdicts", "actions", "audit")}


_NODE_FIELDS = frozenset(
    "agent_url slurm_name k8s_name partition learned first_seen last_seen status report_time fence "
    "fence_reason fenced_at hold opted_out ok_since handover handover_at unreachable_since released_at "
    "boot_id report_seq retired_boots clock_ahead hold_reason ladder ladder_at verdict_seq".split())
