"""The replicas' one clock: PostgreSQL's, carried between reads by each replica's monotonic clock.

Replicas stamp what they ingest (a report's receive time, when a condition opened, when a
transition was applied) and the leader reads it back and judges by it: minimum durations, the
breaker's window, "is the stored report newer than mine", the read-back cursor. Stamped with each
replica's own wall clock, a follower 120 s behind hid a failure from the leader's cursor for
ever, and one 120 s ahead held it 120 s in `waiting_min_duration`. So no replica uses its wall
clock for shared state: every lease round trip reads the database's `clock_timestamp()`, and the
replica's time is that reading plus the monotonic time since (the offset is taken at the middle
of the round trip, so its error is at most half the round trip). The wall clock is used only
before the first reading, and a replica takes its first at open, before it stores anything.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

# A round trip longer than this says little about when the server read its clock: the sample is
# kept only while no better one exists.
GOOD_RTT = 0.5


class DbClock:
    """`clock()` for a replica: the database's time, advanced by the monotonic clock."""

    def __init__(self, fallback: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self.fallback = fallback
        self.mono = mono
        self.offset: float | None = None  # database time - monotonic time
        self.rtt = float("inf")  # the round trip of the sample the offset came from
        self._lock = threading.Lock()  # samples come from the loop, reads from the writer thread too

    def __call__(self) -> float:
        off = self.offset
        return self.fallback() if off is None else self.mono() + off

    def sample(self, db_now: float, sent: float, answered: float) -> None:
        """A reading of the database's clock taken between the monotonic times `sent` and `answered`."""
        rtt = max(0.0, answered - sent)
        with self._lock:
            if rtt <= GOOD_RTT or rtt <= self.rtt:
                self.offset, self.rtt = db_now - (sent + answered) / 2, rtt

    @property
    def anchored(self) -> bool:
        return self.offset is not None
