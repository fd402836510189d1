"""Link history per InfiniBand port across evaluations: when it went down and came back, and how
long it has been down. The Evaluator keeps one (as it keeps a RateTracker); rules only read it.

Two witnesses, because each misses what the other sees:
- state transitions between evaluations (ACTIVE/LinkUp -> anything else and back): they give
  the times, but a flap shorter than the collection interval falls between two looks;
- `link_downed` deltas: the port's PMA counts every time the link went down, however short,
  but only until it saturates (8 bits: 255) and not when.
One evaluation step counts max(link_downed delta, state downs seen in that step) downs, so a
flap both witnesses saw counts once.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Hashable

MAX_EVENTS = 64  # per port: enough for any threshold a profile sets; the oldest go first


@dataclass(frozen=True)
class LinkEvent:
    t: float
    kind: str  # "down" | "up"
    downs: int  # how many downs this event stands for (link_downed may report several at once)
    source: str  # "state" | "link_downed"


@dataclass
class _Port:
    active: bool | None = None
    down_since: float | None = None
    link_downed: float | None = None
    events: deque[LinkEvent] = field(default_factory=lambda: deque(maxlen=MAX_EVENTS))


class LinkTracker:
    def __init__(self, max_ports: int = 4096) -> None:
        # Ports in the order they were last seen (an HCA renamed or removed stops being seen):
        # past max_ports (checks.max_series) the longest unseen is forgotten.
        self._p: dict[Hashable, _Port] = {}
        self.max_ports = max(1, max_ports)

    def __len__(self) -> int:
        return len(self._p)

    def observe(self, key: Hashable, t: float, active: bool | None,
                link_downed: float | None = None, link_downed_saturated: bool = False) -> None:
        """One look at a port: `active` (None = its state could not be read) and its link_downed
        counter (None = not read; a saturated one is not evidence of anything new)."""
        p = self._p.pop(key, None)
        if p is None:
            p = _Port()
            while len(self._p) >= self.max_ports:
                del self._p[next(iter(self._p))]
        self._p[key] = p  # moved to the end: the most recently seen
        state_downs = 0
        if active is not None:
            if p.active is None and not active and p.down_since is None:
                p.down_since = t  # down at first sight: down since at least now
            elif p.active is True and not active:
                p.down_since = t
                state_downs = 1
                p.events.append(LinkEvent(t, "down", 1, "state"))
            elif p.active is False and active:
                p.down_since = None
                p.events.append(LinkEvent(t, "up", 0, "state"))
            if active:
                p.down_since = None
            p.active = active
        if link_downed is not None and not link_downed_saturated:
            if p.link_downed is not None and link_downed > p.link_downed:
                extra = int(link_downed - p.link_downed) - state_downs
                if extra > 0:
                    p.events.append(LinkEvent(t, "down", extra, "link_downed"))
            # a counter that went back was cleared (perfquery -R, a driver reload): a new baseline
            p.link_downed = link_downed

    def down_for(self, key: Hashable, now: float) -> float | None:
        """Seconds the port has been seen down without a break; None when it is not down."""
        p = self._p.get(key)
        if p is None or p.down_since is None:
            return None
        return now - p.down_since

    def downs(self, key: Hashable, now: float, window: float) -> tuple[int, tuple[LinkEvent, ...]]:
        """How many times the port went down within `window` seconds before `now`, and the
        events (downs and recoveries) of that window, oldest first."""
        p = self._p.get(key)
        if p is None:
            return 0, ()
        recent = tuple(e for e in p.events if e.t > now - window)
        return sum(e.downs for e in recent if e.kind == "down"), recent
