"""Bounded HTTP serving, shared by the agent and the aggregator.

Each connection costs a file descriptor, and the process shares its descriptors with what it is
there to do (the agent's collectors read sysfs through them; the aggregator's store and fencers
need them). Unbounded, ~1,000 idle sockets shut out every agent and the UI, and a node whose
descriptors ran out judged its own read errors. So:

- Idle connections are closed after `idle_timeout` seconds: between requests on a keep-alive
  connection, and before the first complete request head on a new one. aiohttp's keep-alive
  timer covers both (it closes a connection whose handler still waits for a message), so a
  slowloris client that trickles a header byte at a time is closed on the same clock. (aiohttp's
  own default is 3,630 s.)
- At most `max_connections` at once per server. One more is answered `503` and closed at once,
  counted (`on_refuse`) and logged at most once a minute with the count held back.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, cast

from aiohttp import web

# Sent to a connection over the cap, before closing it: a client sees why (and when to retry).
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 26\r\n"
            b"Connection: close\r\nRetry-After: 5\r\n\r\ntoo many open connections\n")


@dataclass(frozen=True)
class ConnLimits:
    max_connections: int
    idle_timeout: float

    def runner_kwargs(self) -> dict[str, Any]:
        """What web.AppRunner takes to apply the idle timeout."""
        return {"keepalive_timeout": self.idle_timeout}


def fd_share(limit: int, share: float, floor: int = 64) -> int:
    """A connection cap as a share of the open-file limit, leaving the rest to the work itself."""
    return max(floor, int(limit * share))


class _Refuse(asyncio.Protocol):
    """Answers 503 and closes once the request has arrived (closing with it unread would reset
    the connection, and the client would see a reset instead of the 503), within a second at most."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; they have the same methods.
        t = self._transport = cast(asyncio.Transport, transport)
        t.write(_REFUSAL)
        self._timer = asyncio.get_running_loop().call_later(1.0, t.close)

    def data_received(self, data: bytes) -> None:
        self._close()

    def eof_received(self) -> bool:
        self._close()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _close(self) -> None:
        if self._transport is not None:
            self._transport.close()


class GuardedSite(web.TCPSite):
    """web.TCPSite whose accepted connections pass the cap first (see the module doc)."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, limits: ConnLimits,
                 on_refuse: Callable[[int], None] | None = None, **kw: Any) -> None:
        super().__init__(runner, host, port, **kw)
        self.limits = limits
        self.on_refuse = on_refuse
        self.refused = 0

    def _open(self) -> int:
        server = self._runner.server
        conns = getattr(server, "_connections", None)  # a dict; .connections copies it per call
        return len(conns) if conns is not None else len(server.connections) if server is not None else 0

    def _factory(self) -> asyncio.BaseProtocol:
        server = self._runner.server
        assert server is not None
        n = self._open()
        if n >= self.limits.max_connections:
            self.refused += 1
            if self.on_refuse is not None:
                self.on_refuse(n)
            return _Refuse()
        return server()

    async def start(self) -> None:
        # TCPSite.start with our factory in place of the bare server (BaseSite.start registers the site).
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
