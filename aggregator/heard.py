"""Which nodes a housekeeping pass must look at, kept up to date as ingest hears them.

At 100,000 nodes a housekeeping pass that walks every record every 5 s took 45 ms of the event
loop, though nearly every node had only renewed its lease. Ingest already touches a node when it
hears it, so it keeps the order here at the cost of a dict move per heartbeat, and a pass looks
only at what can have changed:

- `fresh`: nodes heard within the silence threshold, oldest first (an OrderedDict moved to the
  end whenever a node is heard). A pass pops from its front only the nodes that fell silent.
- `lapsed`: nodes past the silence threshold, oldest first: what the forget scan walks.
- `watch`: nodes marked unreachable whose `node_unreachable` condition is not open yet.
- `dirty`: nodes whose last_seen changed but was not written (Memory.flush_seen).

A value is when the node was last heard, on the aggregator's clock. Adopting another replica's
newer last_seen can put a node a few seconds out of order; the scan then notices its silence
that much later, never earlier. `visited` counts every node a pass looked at
(podhealth_aggregator_housekeeping_visits_total): the test of "work per pass follows change".
"""

from __future__ import annotations

import collections
from typing import Iterable, Iterator


class HeardIndex:
    __slots__ = ("fresh", "lapsed", "watch", "dirty", "visited")

    def __init__(self) -> None:
        self.fresh: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.lapsed: collections.OrderedDict[str, float] = collections.OrderedDict()
        self.watch: set[str] = set()
        self.dirty: set[str] = set()
        self.visited = 0

    @classmethod
    def of(cls, heard: Iterable[tuple[str, float]], unreachable: Iterable[str]) -> "HeardIndex":
        """Built from loaded records: (name, last_seen) of nodes ever heard, and the unreachable ones."""
        idx = cls()
        for name, at in sorted(heard, key=lambda h: h[1]):
            idx.fresh[name] = at
        idx.watch.update(unreachable)
        return idx

    def hear(self, name: str, at: float) -> None:
        """`name` was heard at `at` (ingest's hot path: two dict operations)."""
        if self.lapsed:
            self.lapsed.pop(name, None)
        fresh = self.fresh
        fresh[name] = at
        fresh.move_to_end(name)

    def drop(self, name: str) -> None:
        """The node is forgotten (or its creation was rolled back)."""
        self.fresh.pop(name, None)
        self.lapsed.pop(name, None)
        self.watch.discard(name)
        self.dirty.discard(name)

    def lapsing(self, now: float, after: float, floor: float) -> Iterator[tuple[str, float]]:
        """Nodes silent for `after` seconds (counted from `floor` at the earliest: this process's
        start), oldest first, moved to `lapsed` as they are yielded: each is seen once per silence."""
        fresh, lapsed = self.fresh, self.lapsed
        while fresh:
            name, at = next(iter(fresh.items()))
            if now - max(at, floor) < after:
                return
            del fresh[name]
            lapsed[name] = at
            self.visited += 1
            yield name, at

    def silent_for(self, now: float, after: float) -> Iterator[str]:
        """Nodes silent for `after` seconds, oldest first in each of lapsed and fresh (the forget
        scan: it stops at the first that is not; those it cannot forget it sees again next time).
        The caller changes nothing here until it has read them all."""
        for order in (self.lapsed, self.fresh):
            for name, at in order.items():
                if now - at < after:
                    break
                self.visited += 1
                yield name

    def take_watch(self) -> list[str]:
        names = list(self.watch)
        self.visited += len(names)
        return names

    def take_dirty(self) -> list[str]:
        names, self.dirty = self.dirty, set()
        self.visited += len(names)
        return list(names)

