"""One aggregator per state store: an exclusive lease, taken at start, or the start is refused.

Two aggregators on one database both decide and both act: the same node fenced twice, caps
counted per process. The lease has two parts:

- Exclusion. For SQLite, an flock on `<db>.lock` beside the database. The kernel drops it when
  the holder dies (kill -9 included), so a restart never waits out an expiry; a second process
  that asks is refused at once, and the file names the holder for the message.
- An epoch (the fencing token). Every acquisition adds one to `lease.epoch` in the store's kv
  table, in the same place as the state it guards. It is logged, exported, and is what later
  high-availability work hands to the fencers and checks on every write: with PostgreSQL the
  exclusion becomes a leader row (holder, epoch, expiry) renewed by the leader, and a deposed
  leader's writes carry a stale epoch and are refused. `StoreLease` is the interface that stays.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol, TypeVar

from podhealth.aggregator.store import Store, StoreError, rollback

if TYPE_CHECKING:
    from podhealth.aggregator.pgstore import PgConnection

T = TypeVar("T")


class LeaseHeld(StoreError):
    """Another aggregator holds the store: the message names it."""


@dataclass(frozen=True)
class LeaseInfo:
    holder: str  # "aggregator pid N on HOST"
    epoch: int  # one more than the previous holder's: the fencing token
    since: float


class StoreLease(Protocol):
    def acquire(self, store: Store, now: float) -> LeaseInfo: ...

    def release(self) -> None: ...


def holder_name() -> str:
    return f"aggregator pid {os.getpid()} on {socket.gethostname()}"


class FileLease:
    """The SQLite store's lease: flock on `<db>.lock` (see the module doc)."""

    def __init__(self, db: Path, holder: str | None = None) -> None:
        self.path = Path(f"{db}.lock")
        self.holder = holder or holder_name()
        self._fd: int | None = None

    def acquire(self, store: Store, now: float) -> LeaseInfo:
        """Take the lock, then record the new epoch; raises LeaseHeld (or StoreError) when it cannot."""
        self.lock(now)
        try:
            return LeaseInfo(self.holder, bump_epoch(store, self.holder, now), now)
        except BaseException:
            self.release()
            raise

    def lock(self, now: float) -> None:
        """The exclusion alone (before the store is even opened: a second aggregator must not migrate it)."""
        if self._fd is not None:
            return
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise StoreError(f"{self.path}: cannot open the store's lock file: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            held = _read_holder(fd)
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise LeaseHeld(f"{self.path.with_suffix('')}: the state store is in use by another aggregator "
                                f"({held or 'holder unknown'}); stop that one, or give this one its own --db"
                                ) from None
            raise StoreError(f"{self.path}: cannot lock the state store: {e.strerror or e}") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"holder": self.holder, "since": now}).encode() + b"\n", 0)
        except OSError:
            pass  # the lock holds regardless; only the name in a refusal would be missing
        self._fd = fd

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would let two processes lock two files)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing drops the flock


def _read_holder(fd: int) -> str:
    with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
        d = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return str(d["holder"])
    return ""


def bump_epoch(store: Store, holder: str, now: float) -> int:
    """Record a new lease epoch in the store (one transaction) and return it."""
    c = store.conn
    try:
        c.execute("BEGIN IMMEDIATE")
        try:
            row = c.execute("SELECT value FROM kv WHERE key = 'lease'").fetchone()
            epoch = int(json.loads(row[0]).get("epoch", 0)) + 1 if row else 1
            c.execute("INSERT INTO kv (key, value) VALUES ('lease', ?) "
                      "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                      (json.dumps({"holder": holder, "epoch": epoch, "since": now}),))
            c.execute("COMMIT")
        except BaseException:
            rollback(c)
            raise
    except (sqlite3.Error, ValueError) as e:
        raise StoreError(f"{store.path}: cannot record the lease: {e}") from None
    return epoch


class PgLease:
    """Leadership among replicas on one PostgreSQL: the `lease` row of the kv table, taken when it
    has run out and renewed by its holder, on a connection of its own (the writer's may be busy
    with a group commit). Expiry is judged by the database's clock, never a replica's: replicas
    whose clocks disagree still agree on who leads. Each takeover adds one to the epoch; the
    store refuses journal writes under an older one (Store._check_epoch)."""

    def __init__(self, url: str, holder: str, duration: float) -> None:
        self.url = url
        self.holder = holder
        self.duration = duration
        self._conn: "PgConnection | None" = None
        self.seen: dict[str, Any] = {}  # the last lease row read: who leads, since when
        self.db_now: float | None = None  # the database's clock at the last lease call that answered

    def _c(self) -> "PgConnection":
        from podhealth.aggregator import pgstore
        if self._conn is None:
            self._conn = pgstore.connect(self.url)
        return self._conn

    def abandon(self) -> None:
        """Drop the connection after a call that did not return in time (it may still be stuck
        in a thread on a frozen socket; the next call opens a new one)."""
        self._conn = None

    def _locked_row(self) -> tuple[dict[str, Any], float]:
        c = self._c()
        c.execute("INSERT INTO kv (key, value) VALUES ('lease', '{\"epoch\": 0, \"expires\": 0}') "
                  "ON CONFLICT (key) DO NOTHING")
        row = c.execute("SELECT value, EXTRACT(EPOCH FROM clock_timestamp()) FROM kv WHERE key = 'lease' "
                        "FOR UPDATE").fetchone()
        return json.loads(row[0]), float(row[1])

    def _write(self, d: dict[str, Any]) -> None:
        self._c().execute("UPDATE kv SET value = ? WHERE key = 'lease'", (json.dumps(d),))

    def _txn(self, fn: "Callable[[dict[str, Any], float], T]") -> "T":
        c = self._c()
        c.execute("BEGIN")
        try:
            d, now = self._locked_row()
            out = fn(d, now)
            c.execute("COMMIT")
            self.db_now = now
        except BaseException:
            with contextlib.suppress(Exception):
                rollback(c)
            raise
        return out

    def try_acquire(self) -> LeaseInfo | None:
        """Take the lease if it is free or has run out (or is already ours); None if another
        replica holds it."""
        def take(d: dict[str, Any], now: float) -> LeaseInfo | None:
            self.seen = dict(d)
            if float(d.get("expires", 0) or 0) > now and d.get("holder") != self.holder:
                return None
            epoch = int(d.get("epoch", 0) or 0) + 1
            new = {"holder": self.holder, "epoch": epoch, "since": now, "expires": now + self.duration,
                   "previous": d.get("holder", "")}
            self._write(new)
            self.seen = new
            return LeaseInfo(self.holder, epoch, now)
        return self._txn(take)

    def renew(self, info: LeaseInfo) -> bool:
        """Push the expiry on; False when the lease is no longer ours (someone took it over)."""
        def extend(d: dict[str, Any], now: float) -> bool:
            self.seen = dict(d)
            if d.get("holder") != self.holder or int(d.get("epoch", 0) or 0) != info.epoch:
                return False
            d["expires"] = now + self.duration
            self._write(d)
            return True
        return self._txn(extend)

    def release(self, info: LeaseInfo) -> None:
        """A clean stop hands over at once: the lease runs out now (if it is still ours)."""
        def end(d: dict[str, Any], now: float) -> None:
            if d.get("holder") == self.holder and int(d.get("epoch", 0) or 0) == info.epoch:
                d["expires"] = 0
                self._write(d)
        self._txn(end)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
