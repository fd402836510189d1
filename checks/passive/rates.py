"""Counter history for rate and increase judgements over a sliding window.

A counter that goes backwards (driver reload, counter reset, HCA reset) starts a new history
instead of producing a huge negative or wrapped rate.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable


class RateTracker:
    def __init__(self, window: float, max_points: int = 32) -> None:
        self.window = window
        self.max_points = max_points
        # Points closer together than this replace the newest one instead of adding another:
        # a rate over the window needs its ends, not every sample (a DGX node has ~1,000 counter
        # series; 256 points each cost the agent ~30 MiB).
        self._spacing = window / max(1, max_points - 2)
        self._h: dict[Hashable, deque[tuple[float, float]]] = {}
        self._resets: dict[Hashable, float] = {}  # when each counter last went back

    def observe(self, key: Hashable, t: float, value: float) -> None:
        h = self._h.get(key)
        if h is None:
            h = self._h[key] = deque(maxlen=self.max_points)
        if h and value < h[-1][1]:
            h.clear()  # reset: judge only what happened since
            self._resets[key] = t
        if h and (h[-1][0] == t or (len(h) >= 2 and t - h[-2][0] < self._spacing)):
            h[-1] = (t, value)
        else:
            h.append((t, value))
        while len(h) > 2 and h[1][0] <= t - self.window:
            h.popleft()

    def increase(self, key: Hashable, now: float) -> float | None:
        """How much the counter grew within the window; None without two points."""
        h = self._h.get(key)
        if not h or len(h) < 2:
            return None
        return h[-1][1] - h[0][1]

    def rate(self, key: Hashable, now: float, per: float = 1.0) -> float | None:
        h = self._h.get(key)
        if not h or len(h) < 2:
            return None
        dt = h[-1][0] - h[0][0]
        if dt <= 0:
            return None
        return (h[-1][1] - h[0][1]) / dt * per

    def reset_at(self, key: Hashable) -> float | None:
        """When the counter last went back (a reset: its history restarted then); None if never."""
        return self._resets.get(key)

    def points(self) -> dict[Hashable, tuple[tuple[float, float], ...]]:
        """A copy of every history, (time, value) oldest first (the evidence bundle's IB part)."""
        return {k: tuple(h) for k, h in self._h.items()}
