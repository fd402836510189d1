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
- At most a share of them per client address (`ConnLimits.client_cap`): without it one client
  (a runaway scraper, a job looping on curl) held every connection, reopening each as the idle
  timeout closed it, and the aggregator and Prometheus were refused. Over its share a client gets
  the same 503, counted and logged the same way.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, cast

from aiohttp import web

from podhealth.bodycoding import RUNNER_KWARGS
from podhealth.netaddr import is_loopback_address

# Sent to a connection over the cap, before closing it: a client sees why (and when to retry).
_REFUSAL = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: 26\r\n"
            b"Connection: close\r\nRetry-After: 5\r\n\r\ntoo many open connections\n")


# A client's share of a server's connections: a quarter, so that a flood from one address leaves
# the rest to the others (the aggregator, Prometheus, an operator), and never fewer than a browser
# opens to one server (6) plus a scraper and a CLI call.
CLIENT_SHARE = 4
CLIENT_FLOOR = 8


@dataclass(frozen=True)
class ConnLimits:
    max_connections: int
    idle_timeout: float
    per_client: int | None = None  # None: derived from max_connections (client_cap)

    def client_cap(self, bound_to: str | None) -> int:
        """The most connections one client address may hold on a server bound to `bound_to`.

        Loopback clients count like any other on a server others can reach: on a node, a job's
        flood through 127.0.0.1 must not lock out the aggregator. A server bound to loopback only
        is the exception: every client there has the same address (the simulated fleet's agents
        and its aggregator, a local proxy in front of it that carries every remote user), so a
        share of the cap would only shrink the cap, and the cap itself still bounds them all."""
        if self.per_client is not None:
            return self.per_client
        if bound_to and is_loopback_address(bound_to):
            return self.max_connections
        return max(CLIENT_FLOOR, self.max_connections // CLIENT_SHARE)

    def runner_kwargs(self) -> dict[str, Any]:
        """What web.AppRunner takes to apply the idle timeout, and to leave request bodies as
        sent (bodycoding.py decodes them; see there why)."""
        return {"keepalive_timeout": self.idle_timeout, **RUNNER_KWARGS}


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


class _Counted(asyncio.Protocol):
    """One accepted connection, admitted or refused by its client address. A protocol factory is
    not told the peer, so the choice is made here in connection_made; an admitted connection is
    counted against its client until connection_lost, which the transport calls exactly once
    after connection_made (also when the server shuts down). Everything else is passed through."""

    __slots__ = ("_site", "_inner", "_client")
    _inner: asyncio.Protocol  # set in connection_made, before the transport calls anything else

    def __init__(self, site: GuardedSite) -> None:
        self._site = site
        self._client: str | None = None  # set while this connection is counted

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else ""  # "": the peer left already
        handler = self._site._admit(client)
        if handler is None:
            self._inner = _Refuse()
        else:
            self._inner, self._client = handler, client
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received()

    def pause_writing(self) -> None:
        self._inner.pause_writing()

    def resume_writing(self) -> None:
        self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        try:
            self._inner.connection_lost(exc)
        finally:
            if self._client is not None:
                self._site._release(self._client)
                self._client = None


class GuardedSite(web.TCPSite):
    """web.TCPSite whose accepted connections pass the caps first (see the module doc)."""

    def __init__(self, runner: web.BaseRunner, host: str | None, port: int, limits: ConnLimits,
                 on_refuse: Callable[[int, str | None], None] | None = None, **kw: Any) -> None:
        """`on_refuse(open, client)` for each refusal: the connections open, and the client's
        address when it was refused for holding its share (None: the server was full)."""
        super().__init__(runner, host, port, **kw)
        self.limits = limits
        self.client_cap = limits.client_cap(host)
        self.on_refuse = on_refuse
        self.refused = 0
        self.open = 0  # admitted connections not yet lost
        self.by_client: dict[str, int] = {}  # the same, by client address; only addresses with one open

    def _factory(self) -> asyncio.BaseProtocol:
        return _Counted(self)

    def _admit(self, client: str) -> asyncio.Protocol | None:
        """aiohttp's handler for a new connection from `client`, counted; None (refuse it) when
        the server or this client is at its cap."""
        server = self._runner.server
        assert server is not None
        held = self.by_client.get(client, 0)
        full = self.open >= self.limits.max_connections
        if full or held >= self.client_cap:
            self.refused += 1
            if self.on_refuse is not None:
                self.on_refuse(self.open, None if full else client)
            return None
        self.open += 1
        self.by_client[client] = held + 1
        return server()

    def _release(self, client: str) -> None:
        self.open -= 1
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]  # a flood of distinct addresses leaves no entries behind

    async def start(self) -> None:
        # TCPSite.start with our factory in place of the bare server (BaseSite.start registers the site).
        await web.BaseSite.start(self)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self._factory, self._host, self._port, ssl=self._ssl_context, backlog=self._backlog,
            reuse_address=self._reuse_address, reuse_port=self._reuse_port)
        sockets = self._server.sockets
        self._bound_port = sockets[0].getsockname()[1] if sockets else self._port
