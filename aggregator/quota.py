"""What one node may push: a byte rate (a token bucket) and the bytes of events it may hold in
the store (issue 27: one node's own token once grew the store by 115.7 MB/s).

Pure bookkeeping on an injected monotonic clock; the HTTP layer (server.py) asks `admit` before
applying a push and answers 429 with Retry-After when it says no, applying only the node's
FAIL transitions (a node that floods must still be fenced when it fails). `stored` starts from
the store's own count (`Store.event_bytes_by_node`), grows with each push applied, and is set
again from the store after retention prunes. Replicas on one PostgreSQL each keep their own
buckets (a node pushes to one at a time) and read the stored bytes from the shared store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Literal, Mapping

from podhealth.config_aggregator import NodeIngestConfig

Reason = Literal["rate", "stored"]


@dataclass(frozen=True, slots=True)
class Throttled:
    reason: Reason
    retry_after: int  # whole seconds, as the Retry-After header carries them
    message: str


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


class NodeQuota:
    def __init__(self, cfg: NodeIngestConfig, mono: Callable[[], float]) -> None:
        self.cfg = cfg
        self.mono = mono
        # One bucket per node and kind of push: a backlog of events delivered after an outage must
        # not starve the node's heartbeats (reports), or the node would look silent while it catches up.
        self._buckets: dict[tuple[str, bool], _Bucket] = {}
        self._stored: dict[str, int] = {}

    def sync(self, stored: Mapping[str, int]) -> None:
        """The store's count of each node's event bytes (after a start or a prune)."""
        self._stored = dict(stored)

    def stored(self, node: str) -> int:
        return self._stored.get(node, 0)

    def add_stored(self, node: str, nbytes: int) -> None:
        self._stored[node] = self._stored.get(node, 0) + nbytes

    def admit(self, node: str, nbytes: int, *, store: bool = True) -> Throttled | None:
        """May `node` push `nbytes` now? Takes them from its bucket when it may. `store`: the push
        adds to the node's stored events (/v1/events), so the stored cap applies too."""
        if store and self.stored(node) >= self.cfg.stored_bytes:
            return Throttled("stored", 3600, f"node {node} holds {self.stored(node)} bytes of events, its cap is "
                                             f"{self.cfg.stored_bytes} (node_ingest.stored_bytes): refused until "
                                             "retention frees room; FAIL transitions are applied")
        now = self.mono()
        b = self._buckets.get((node, store))
        if b is None:
            b = self._buckets[(node, store)] = _Bucket(float(self.cfg.burst), now)
        b.tokens = min(float(self.cfg.burst), b.tokens + (now - b.at) * self.cfg.rate)
        b.at = now
        if b.tokens >= nbytes:
            b.tokens -= nbytes
            return None
        wait = max(1, math.ceil((min(nbytes, self.cfg.burst) - b.tokens) / self.cfg.rate))
        return Throttled("rate", wait, f"node {node} pushes faster than {self.cfg.rate} bytes/s "
                                       "(node_ingest.rate): retry later; FAIL transitions are applied")
