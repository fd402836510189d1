"""Counter history for rate and increase judgements over a sliding window.

A counter that goes backwards (driver reload, counter reset, HCA reset) starts a new history
instead of producing a huge negative or wrapped rate.

Memory is bounded three ways (issue 32 §6): at most `max_points` points per counter; a counter
not seen for `forget_after` seconds (2 windows by default: its port, mount or GPU went away) is
forgotten; and at most `max_series` counters are held (`checks.max_series`), the longest unseen
forgotten first. Points are kept flat in one array of doubles per counter (time, value, time,
value, ...): a DGX node has ~1,000 counter series, and a deque of (time, value) tuples cost
~4 KiB each where this costs ~0.6 KiB.
"""

from __future__ import annotations

from array import array
from typing import Hashable, Iterable

MAX_SERIES = 20_000


class RateTracker:
    def __init__(self, window: float, max_points: int = 32, max_series: int = MAX_SERIES,
                 forget_after: float | None = None) -> None:
        self.window = window
        self.max_points = max(2, max_points)
        self.max_series = max(1, max_series)
        self.forget_after = forget_after if forget_after is not None else 2 * window
        # Points closer together than this replace the newest one instead of adding another:
        # a rate over the window needs its ends, not every sample.
        self._spacing = window / max(1, self.max_points - 2)
        self._h: dict[Hashable, array[float]] = {}  # key -> [t0, v0, t1, v1, ...], oldest first
        self._resets: dict[Hashable, float] = {}  # when each counter last went back
        self._next_sweep: float | None = None
        self.forgotten = 0  # counters dropped: unseen for forget_after, or over max_series

    def __len__(self) -> int:
        return len(self._h)

    def observe(self, key: Hashable, t: float, value: float) -> None:
        h = self._h.get(key)
        if h is None:
            if len(self._h) >= self.max_series:
                self._evict_one()
            h = self._h[key] = array("d")
        if h and value < h[-1]:
            del h[:]  # reset: judge only what happened since
            self._resets[key] = t
        n = len(h) // 2
        if n and (h[-2] == t or (n >= 2 and t - h[-4] < self._spacing)):
            h[-2], h[-1] = t, value
        else:
            if n >= self.max_points:
                del h[:2]
            h.append(t)
            h.append(value)
        while len(h) > 4 and h[2] <= t - self.window:
            del h[:2]
        self._sweep(t)

    def observe_many(self, items: Iterable[tuple[Hashable, float]], t: float) -> None:
        """observe(key, t, value) for each (key, value) in order, all at one time (an evaluation
        feeds ~1,400 counters at once): the same histories, without a call and a sweep check
        per counter."""
        if self.forget_after <= 0:  # every observation sweeps: no shortcut to take
            for key, value in items:
                self.observe(key, t, value)
            return
        hist, spacing, max_points = self._h, self._spacing, self.max_points
        cutoff = t - self.window
        swept = False
        for key, value in items:
            h = hist.get(key)
            if h is None:
                if len(hist) >= self.max_series:
                    self._evict_one()
                h = hist[key] = array("d")
            elif h and value < h[-1]:
                del h[:]
                self._resets[key] = t
            n = len(h) // 2
            if n and (h[-2] == t or (n >= 2 and t - h[-4] < spacing)):
                h[-2], h[-1] = t, value
            else:
                if n >= max_points:
                    del h[:2]
                h.append(t)
                h.append(value)
            while len(h) > 4 and h[2] <= cutoff:
                del h[:2]
            if not swept:  # where observe() sweeps; after that, not again before forget_after / 4
                self._sweep(t)
                swept = True

    def _sweep(self, now: float) -> None:
        """Forget counters not seen for forget_after (at most every quarter of that)."""
        if self._next_sweep is None:
            self._next_sweep = now + self.forget_after / 4
            return
        if now < self._next_sweep:
            return
        self._next_sweep = now + self.forget_after / 4
        gone = [k for k, h in self._h.items() if not h or h[-2] < now - self.forget_after]
        for k in gone:
            self._forget(k)

    def _evict_one(self) -> None:
        oldest = min(self._h, key=lambda k: self._h[k][-2] if self._h[k] else float("-inf"))
        self._forget(oldest)

    def _forget(self, key: Hashable) -> None:
        del self._h[key]
        self._resets.pop(key, None)
        self.forgotten += 1

    def increase(self, key: Hashable, now: float) -> float | None:
        """How much the counter grew within the window; None without two points."""
        h = self._h.get(key)
        if h is None or len(h) < 4:
            return None
        return h[-1] - h[1]

    def rate(self, key: Hashable, now: float, per: float = 1.0) -> float | None:
        h = self._h.get(key)
        if h is None or len(h) < 4:
            return None
        dt = h[-2] - h[0]
        if dt <= 0:
            return None
        return (h[-1] - h[1]) / dt * per

    def reset_at(self, key: Hashable) -> float | None:
        """When the counter last went back (a reset: its history restarted then); None if never."""
        return self._resets.get(key)

    def points(self) -> dict[Hashable, tuple[tuple[float, float], ...]]:
        """A copy of every history, (time, value) oldest first (the evidence bundle's IB part)."""
        return {k: tuple(zip(h[0::2], h[1::2])) for k, h in self._h.items()}

    def history_len(self, key: Hashable) -> int:
        """Points held for one counter."""
        h = self._h.get(key)
        return 0 if h is None else len(h) // 2
