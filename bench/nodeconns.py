"""How a load generator's simulated nodes connect to the server under test (bench/aggregator_scale.py's Load).

- `pooled`: one pool of kept connections shared by every node (aggregator_scale.py's default: it
  measures the handler, not the connections);
- `fresh`: a new TCP connection per request, closed after its answer: what the agents did while
  aiohttp closed their idle connection (15 s) before the next heartbeat (30 s);
- `per-node`: each node keeps its own connection from one heartbeat to the next, made by the
  agent's own session factory (agent/pushsession.py `session`: the same keep-alive and limit):
  what the agents do now.

Per node, the generator holds one socket and the server another (10,000 nodes: 10,000 fds each
side), so the generator raises its soft open-file limit to the hard one, and `warm()` opens every
node's connection before a measured window (a `GET /healthz` each, not measured) and `close()`
lets them go after it: a fleet that has been running keeps its connections, so the window pays no
connect, and two servers' worth of connections are never held at once.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Literal

import aiohttp

from podhealth.agent.pushsession import session as agent_session
from podhealth.config import PublishConfig

Mode = Literal["pooled", "fresh", "per-node"]
MODES: tuple[Mode, ...] = ("pooled", "fresh", "per-node")
TIMEOUT = aiohttp.ClientTimeout(total=30)


def raise_fd_limit() -> int:
    """The soft open-file limit raised to the hard one; returns it (the subprocesses inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


class NodeConnections:
    def __init__(self, mode: Mode, interval: float) -> None:
        """`interval`: the nodes' heartbeat interval (the agent's keep-alive is derived from it)."""
        self.mode = mode
        self.interval = interval
        self._shared: aiohttp.ClientSession | None = None
        self._own: dict[str, aiohttp.ClientSession] = {}

    def session(self, node: str) -> aiohttp.ClientSession:
        if self.mode != "per-node":
            if self._shared is None:
                conn = aiohttp.TCPConnector(limit=0, limit_per_host=0, force_close=self.mode == "fresh")
                self._shared = aiohttp.ClientSession(connector=conn, timeout=TIMEOUT)
            return self._shared
        s = self._own.get(node)
        if s is None:
            s = self._own[node] = agent_session(PublishConfig(report_interval=self.interval), None)
        return s

    async def warm(self, url: str, nodes: list[str], concurrency: int) -> None:
        """Per node: its connection open before the window (nothing to do for the other modes)."""
        if self.mode != "per-node":
            return
        sem = asyncio.Semaphore(concurrency)

        async def one(node: str) -> None:
            async with sem, self.session(node).get(f"{url}/healthz", timeout=TIMEOUT) as r:
                await r.read()
        await asyncio.gather(*(one(n) for n in nodes))

    async def close(self) -> None:
        sessions = list(self._own.values()) + ([self._shared] if self._shared is not None else [])
        self._own, self._shared = {}, None
        for s in sessions:
            await s.close()

