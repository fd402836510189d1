"""Followers wake the leader's read-back at once with PostgreSQL LISTEN/NOTIFY.

Replicas share ingest: a follower writes what its agents send to the shared store, and the leader
reads it back (service.py `_sync_loop`, in commit order). Read only every SYNC_INTERVAL, a FAIL
reported to a follower waited up to that long before the leader could fence. Now a follower's
commit that opens an actionable FAIL carries `NOTIFY` (NOTIFY_OP, in the same transaction:
PostgreSQL delivers it only once that transaction has committed, so the leader's read after it
sees the rows), and the leader LISTENs and reads back as soon as one arrives.

The notify only wakes the read-back early; what is read, and in which order, stays the sync's
(the commit-ordered cursor), and the periodic read stays as the safety net: a notify lost with
the connection, or sent while the leader was not listening, is read by the next periodic round
(and the listener asks for one read each time it (re)connects). A lost LISTEN connection is
opened again after the one backoff (core/backoff.py, over the action runner's `retries`).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Callable

import psycopg

from podhealth import log as plog

from podhealth.backoff import Backoff

from podhealth.aggregator.pgstore import _CONN_OPTS, CONNECT_TIMEOUT, redact
from podhealth.aggregator.store import Op
from podhealth.config_aggregator import RetryConfig

log = plog.get("podhealth.aggregator")
CHANNEL = "podhealth_ingest"
# Sent with a follower's commit (Store.apply runs it in the transaction): delivered on commit.
NOTIFY_OP: Op = (f"SELECT pg_notify('{CHANNEL}', '')", ())
# How long one wait for notifies lasts before the loop looks at `running()` again; the connection's
# TCP keepalives (pgstore._CONN_OPTS) find a dead server within seconds meanwhile.
WAIT_S = 5.0


class Listener:
    """The leader's LISTEN connection: `wake()` on every notify, and once per (re)connect."""

    def __init__(self, url: str, wake: Callable[[], None], retries: RetryConfig) -> None:
        self.url = url
        self.wake = wake
        self.backoff = Backoff(retries.backoff, retries.max_backoff)  # the one policy (core/backoff.py)
        self.connects = 0  # connections made (tests wait for a reconnect)
        self.notifies = 0  # notifies received
        self.backend_pid: int | None = None  # the server process of the live connection (None: none)

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True, connect_timeout=CONNECT_TIMEOUT,
                                                     **_CONN_OPTS)
        try:
            await asyncio.wait_for(conn.execute(f"LISTEN {CHANNEL}"), CONNECT_TIMEOUT)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def run(self, running: Callable[[], bool]) -> None:
        failures = 0
        while running():
            conn: psycopg.AsyncConnection[Any] | None = None
            try:
                conn = await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT * 2)
                self.connects += 1
                self.backend_pid = conn.info.backend_pid
                if failures:
                    log.info("listening for the replicas' ingest again", after_failures=failures)
                failures = 0
                self.wake()  # what was committed while no one listened: read it now
                while running():
                    async for _ in conn.notifies(timeout=WAIT_S):
                        self.notifies += 1
                        self.wake()
            except asyncio.CancelledError:
                raise
            except (psycopg.Error, OSError, asyncio.TimeoutError) as e:
                log.warning("LISTEN for the replicas' ingest lost; the periodic read-back carries on",
                            db=redact(self.url), error=str(e) or type(e).__name__, failures=failures + 1)
                self.backend_pid = None
                await asyncio.sleep(self.backoff.delay(failures))
                failures += 1
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), CONNECT_TIMEOUT)
