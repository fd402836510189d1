"""Counter history for rate and increase judgements over a sliding window.

A counter that goes backwards (driver reload, counter reset, HCA reset) starts a new history
instead of producing a huge negative or wrapped rate.
"""

from __future__ import annotations

from collections import deque
from typing import Hashable


class RateTracker:
    def __init__(self, window: float, max_points: int = 256) -> None:
        self.window = window
        self.max_points = max_points
        self._h: dict[Hashable, deque[tuple[float, float]]] = {}

    def observe(self, key: Hashable, t: float, value: float) -> None:
        h = self._h.get(key)
        if h is None:
            h = self._h[key] = deque(maxlen=self.max_points)
        if h and value < h[-1][1]:
            h.clear()  # reset: judge only what happened since
        if h and h[-1][0] == t:
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

    def forget_missing(self, seen: set[Hashable]) -> None:
        for k in list(self._h):
            if k not in seen:
                del self._h[k]
