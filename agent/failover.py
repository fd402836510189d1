"""The aggregator replicas an agent pushes to, and which one it is talking to.

Every replica accepts ingest (one of them leads and acts), so an agent only needs one that
answers. Each node starts at its own pick among the replicas and fails over in its own order
(rendezvous hashing of its name with each URL), so a fleet's ingest is spread evenly over them,
and the nodes of a replica that goes down spread evenly over the others instead of all landing on
the next one listed (a new replica takes only its share from each). It keeps to the replica that
took its last push, and moves to the next one in its order when that one does not answer or
answers 5xx (down, or its store cannot write). A 4xx is that
replica's verdict on the push itself and the same at every replica: no move. When none answers,
the caller keeps everything (the spool) and tries again later, as with one aggregator.
"""

from __future__ import annotations

import hashlib
from typing import Awaitable, Callable, Sequence, TypeVar

from podhealth import log as plog

log = plog.get("podhealth.failover")
T = TypeVar("T")


def node_order(urls: Sequence[str], node: str) -> list[str]:
    """`urls` in `node`'s order: by a stable hash of (node, URL), highest first (the same on every
    agent and every start, unlike hash()); unchanged without a node name."""
    if not node:
        return list(urls)
    return sorted(urls, key=lambda u: hashlib.blake2b(f"{node}\0{u}".encode(), digest_size=8).digest(),
                  reverse=True)


class Replicas:
    def __init__(self, urls: Sequence[str], path: str, node: str = "") -> None:
        """`node`: this agent's node name, which picks its replica and its failover order."""
        self.urls = [u.rstrip("/") + path for u in node_order([u.rstrip("/") for u in urls], node)]
        self.index = 0
        self.moves = 0  # times it moved to another replica (a metric, and for tests)

    @property
    def url(self) -> str:
        return self.urls[self.index] if self.urls else ""

    async def post(self, send: Callable[[str], Awaitable[tuple[int, T]]]) -> tuple[int, T]:
        """send(url) -> (HTTP status, 0 when unreachable; answer) at the current replica, then
        at each of the others once, until one takes it or refuses it with a 4xx."""
        status, answer = await send(self.url)
        for _ in range(len(self.urls) - 1):
            if status != 0 and status < 500:
                break
            old = self.url
            self.index = (self.index + 1) % len(self.urls)
            self.moves += 1
            log.warning("aggregator replica not answering: trying the next", failed=old, status=status,
                        next=self.url)
            status, answer = await send(self.url)
        return status, answer


class PushesToReplicas:
    """The `url` of a sender that pushes through its `replicas` (the heartbeat, the publisher)."""

    replicas: Replicas

    @property
    def url(self) -> str:
        """The replica delivering now (the node's pick until that one fails)."""
        return self.replicas.url

    @url.setter
    def url(self, value: str) -> None:
        """One full URL to push to (tests point an existing object at a server they started)."""
        self.replicas = Replicas([value], "")
