"""The one backoff: a first wait doubled per failure up to a cap, with optional jitter.

Every loop that tries something again after a failure takes its wait from here: the publisher's
sends and spool flushes, the InfluxDB export, and the aggregator's retries of a fencer call and of
a pending action (aggregator/actions/journal.py). Callers count their own failures (`n`, 0 for
the first wait) and reset the count on success; the policy itself holds no state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

# 2**16 x any first wait a config allows is past any cap it allows: the exponent stops here so a
# long run of failures never builds a huge float.
_MAX_DOUBLINGS = 16


@dataclass(frozen=True)
class Backoff:
    first: float  # seconds of the first wait (n = 0)
    cap: float  # no wait is longer (before jitter)
    # Spread each wait over [0.5, 1.5) x itself, so that many nodes that failed together (an
    # aggregator restart) do not all come back in the same second.
    jitter: bool = False

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < 0:
            raise ValueError(f"backoff waits must be >= 0, got first={self.first} cap={self.cap}")

    def delay(self, n: int, rand: Callable[[], float] = random.random) -> float:
        """The wait after failure `n` (0, 1, ...): `first` doubled n times, at most `cap`, jittered."""
        d = min(self.cap, self.first * (2 ** min(max(n, 0), _MAX_DOUBLINGS)))
        return d * (0.5 + rand()) if self.jitter else d


__all__ = ["Backoff"]
