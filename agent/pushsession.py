"""The connection an agent pushes to the aggregator through (the heartbeat, the publisher).

`session()`: one connection per replica, kept from one heartbeat to the next. `PushSession`: that
session, made anew after the agent's TLS files were reloaded, so a renewed certificate reaches the
aggregator at the next push (a kept connection would otherwise go on with the one it was made
with as long as heartbeats keep it busy, past the old certificate's expiry).
"""

from __future__ import annotations

import ssl
from typing import Callable

import aiohttp

from podhealth.config import PublishConfig


def session(cfg: PublishConfig, tls: ssl.SSLContext | None) -> aiohttp.ClientSession:
    """A client session to the aggregator: https:// verified with `tls` (or the system's store),
    one connection per replica kept from one heartbeat to the next. aiohttp's default keep-alive
    (15 s) closed it before every 30 s heartbeat, so each one paid a new TCP connection, and with
    TLS a new handshake: 3,333 a second at 100,000 nodes. Now it is kept `cfg.keepalive()`:
    the interval + 15 s (a late beat still finds it), at most 300 s (below the idle timeouts of
    NATs and load balancers, AWS NLB's 350 s, which drop a connection telling neither end); the
    aggregator keeps it longer still (its `connections.idle_timeout`), so the agent is the side
    that closes. One connection is all a sender needs: it sends one request at a time, so a
    second would only be a second idle socket at the aggregator (its fd budget is one per node:
    README, "Faults said out loud")."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(
        ssl=tls if tls is not None else True, keepalive_timeout=cfg.keepalive(), limit_per_host=1))


class PushSession:
    def __init__(self, cfg: PublishConfig, tls: ssl.SSLContext | None,
                 tls_reloads: Callable[[], int] | None = None) -> None:
        """`tls_reloads()`: how many times the TLS files were reloaded (core/tls.py ClientTls.reloads);
        None: never (no TLS, or tests)."""
        self.cfg, self.tls = cfg, tls
        self._reloads = tls_reloads
        self._session: aiohttp.ClientSession | None = None
        self._made_at = 0  # reloads when the session was made

    async def current(self) -> aiohttp.ClientSession:
        """The session to push through now."""
        reloads = self._reloads() if self._reloads is not None else 0
        if self._session is not None and reloads != self._made_at:
            await self._session.close()  # its connections carry the certificate from before the reload
            self._session = None
        if self._session is None:
            self._session, self._made_at = session(self.cfg, self.tls), reloads
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
