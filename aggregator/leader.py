"""Which replica acts: the leadership loop over a PgLease.

Every replica ingests and serves; only the leader decides and acts. The loop takes the lease
when it is free and renews it every lease/4. The leader counts itself as leader only until
lease/2 after the start of its last successful renewal (on the monotonic clock): a leader cut
off from PostgreSQL, or frozen, stops acting at least lease/2 before a follower may take over
(the lease row expires `lease` after the database saw that renewal), and the store refuses
its journal writes under the old epoch whatever happens.
"""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from podhealth import log as plog

from podhealth.aggregator.dbclock import DbClock
from podhealth.aggregator.lease import LeaseInfo, PgLease
from podhealth.worker import offload

log = plog.get("podhealth.aggregator.leader")


class Leadership:
    def __init__(self, lease: PgLease, on_elected: Callable[[LeaseInfo], Awaitable[None]],
                 on_deposed: Callable[[str], Awaitable[None]], mono: Callable[[], float] = time.monotonic,
                 clock: DbClock | None = None) -> None:
        """`clock`: the replica's clock, given every reading of the database's clock a lease call makes."""
        self.lease = lease
        self.clock = clock
        self.duration = lease.duration
        self.on_elected = on_elected
        self.on_deposed = on_deposed
        self.mono = mono
        self.info: LeaseInfo | None = None
        self.valid_until = float("-inf")  # monotonic: act only before this
        self.leader_since = 0.0  # wall time (the database's) of this replica's takeover
        self.last_renewal = float("-inf")  # monotonic
        self.last_look = mono()  # monotonic: the last lease call that answered (as leader or follower)
        self.error = ""
        self._takeover: asyncio.Task[None] | None = None

    def acting(self) -> bool:
        return self.info is not None and self.mono() < self.valid_until

    async def _ask(self, fn: Callable[[], object], budget: float) -> object:
        """One lease call off the loop, given at most `budget` seconds. A call that runs out (a
        frozen server) is abandoned with its connection: a thread cannot be cancelled. A call
        that answers also read the database's clock: the replica's clock takes it."""
        sent = self.mono()
        self.lease.db_now = None
        try:
            out = await asyncio.wait_for(offload(fn), timeout=max(0.1, budget))
        except asyncio.TimeoutError:
            self.lease.abandon()
            raise
        if self.clock is not None and self.lease.db_now is not None:
            self.clock.sample(self.lease.db_now, sent, self.mono())
        return out

    async def step(self) -> None:
        """One round: take the lease, or renew it (or give up leading)."""
        t0 = self.mono()
        if self.info is None:
            try:
                got = await self._ask(self.lease.try_acquire, self.duration / 2)
            except Exception as e:  # noqa: BLE001 - the database is away: try again next round
                self._note_error(e)
                return
            self.error = ""
            self.last_look = t0
            if isinstance(got, LeaseInfo):
                self.info, self.valid_until, self.last_renewal = got, t0 + self.duration / 2, t0
                self.leader_since = got.since
                log.info("leading", epoch=got.epoch, holder=got.holder, previous=self.lease.seen.get("previous", ""))
                # Off this loop: loading the store and reconciling may outlast lease/2, and the
                # lease must be renewed meanwhile.
                self._takeover = asyncio.create_task(self._take_over(got), name="takeover")
            return
        info = self.info
        try:
            ok = await self._ask(lambda: self.lease.renew(info), self.valid_until - self.mono())
        except Exception as e:  # noqa: BLE001 - cannot renew: keep trying until valid_until passes
            self._note_error(e)
            ok = None
        if ok is not None:
            self.last_look = t0
        if ok is True:
            self.error = ""
            self.valid_until, self.last_renewal = t0 + self.duration / 2, t0
        elif ok is False or not self.acting():
            await self.depose("lease taken over by " + str(self.lease.seen.get("holder", "?")) if ok is False
                              else f"could not renew the lease within {self.duration / 2:g}s ({self.error})")

    async def _take_over(self, info: LeaseInfo) -> None:
        try:
            await self.on_elected(info)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001 - a takeover that failed hands the lease back
            log.exception("takeover failed")
            if self.info is info:
                await self.depose(f"takeover failed: {type(e).__name__}: {e}")
                await self.release_lease(info)

    async def depose(self, why: str) -> None:
        if self.info is None:
            return
        log.error("no longer leading: decide and act stop", epoch=self.info.epoch, why=why)
        self.info, self.valid_until = None, float("-inf")
        t, self._takeover = self._takeover, None
        if t is not None and not t.done() and t is not asyncio.current_task():
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
        await self.on_deposed(why)

    def _note_error(self, e: Exception) -> None:
        msg = f"{type(e).__name__}: {e}".strip()
        if msg != self.error:
            log.warning("lease call failed", error=msg)
        self.error = msg

    async def run(self, running: Callable[[], bool]) -> None:
        while running():
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - the loop that decides who acts must outlive one bad round
                log.exception("leadership round failed")
            # Sleep a quarter lease, but wake in time to give up leading when renewals fail.
            pause = self.duration / 4
            if self.info is not None:
                pause = max(0.05, min(pause, self.valid_until - self.mono()))
            await asyncio.sleep(pause)

    async def release_lease(self, info: LeaseInfo) -> None:
        try:
            await self._ask(lambda: self.lease.release(info), 2.0)
        except Exception as e:  # noqa: BLE001 - the lease then runs out by itself
            log.warning("could not hand the lease back; it runs out by itself", error=str(e))

    async def release(self) -> None:
        """A clean stop: let a follower take over at once."""
        info, self.info = self.info, None
        t, self._takeover = self._takeover, None
        if t is not None and not t.done():
            t.cancel()
            await asyncio.gather(t, return_exceptions=True)
        if info is not None:
            await self.release_lease(info)
        await offload(self.lease.close)
