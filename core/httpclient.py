"""The one HTTP client exchange of podhealth: a deadline for the WHOLE exchange, a bounded body.

`urlopen(timeout=)` and a socket timeout bound each read, not the exchange: an agent that sends
one byte every 1.5 s kept the Slurm prolog (budget 5 s) and the health check (10 s) running for
more than 90 s. Here the deadline covers connect, sending, the status line, every header and the
body: a timer shuts the socket down when it passes, so a read blocked on a trickling peer returns
at once, and the exchange raises `Deadline`. The body is read up to `max_bytes` (more is
`TooLarge`), never to the end of whatever the peer sends.

Two faces, one contract (`Reply`, `ExchangeError`):
- `exchange()`: blocking, standard library only (http.client), for the CLI and the Slurm/BCM
  hooks, which must start fast and run on nodes without aiohttp's import cost;
- `exchange_async()`: the aggregator's pulls, handovers, GPU resets and bundle downloads and the
  agent's pushes, on their aiohttp session, the whole exchange under one asyncio timeout.

Signing (core/nodeproof.py) is the caller's: it adds headers before and checks the reply after.
Every client in podhealth goes through here (tests/unit/test_httpclient.py checks that no other
module calls urlopen).
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping
from urllib.parse import urlsplit

if TYPE_CHECKING:
    import aiohttp

DEFAULT_MAX_BYTES = 1 << 20
_CHUNK = 64 * 1024
_LINE_MAX = 1 << 20  # one NDJSON line (a handover report) in a stream


class ExchangeError(Exception):
    """The exchange did not complete: `kind` says why (for metrics and messages)."""

    kind = "unreachable"


class Deadline(ExchangeError):
    kind = "deadline"


class TooLarge(ExchangeError):
    kind = "too_large"


class BadUrl(ExchangeError):
    kind = "bad_url"


class Unverified(ExchangeError):
    """An https:// server that did not prove itself in the handshake (a chain our CA did not
    sign, another name): something answered, but not provably what was asked for."""

    kind = "unverified"


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    headers: Mapping[str, str] = field(default_factory=dict)  # lower-case names

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


def _target(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, path with query) of an http(s) URL, or BadUrl."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise BadUrl(f"bad URL {url!r}: {e}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadUrl(f"expected an http(s):// URL, got {url!r}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


def request_path(url: str) -> str:
    """The path (and query) a request to `url` names on the wire: what a signature covers."""
    return _target(url)[3]


class _Watchdog:
    """Shuts the connection's socket down at the deadline, from a timer thread, so a read that
    waits on a peer sending a byte at a time returns (EOF or an error) instead of waiting on."""

    def __init__(self, conn: http.client.HTTPConnection, seconds: float) -> None:
        self.conn = conn
        self.fired = False
        self._timer = threading.Timer(max(0.0, seconds), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        self.fired = True
        sock = self.conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected yet or already closed: connect's own timeout ends it

    def cancel(self) -> None:
        self._timer.cancel()


def exchange(method: str, url: str, *, deadline_s: float, body: bytes = b"",
             headers: Mapping[str, str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
             on_line: Callable[[bytes], None] | None = None,
             connection: Callable[[str, str, int, float], http.client.HTTPConnection] | None = None,
             tls: ssl.SSLContext | None = None, server_name: str = "") -> Reply:
    """One HTTP exchange finished within `deadline_s` seconds, or an ExchangeError.

    `on_line`: the body is a stream of lines (NDJSON): each complete line goes to it as it
    arrives (progress while a handover suite runs); the Reply's body still holds them all (up
    to `max_bytes`). `connection(scheme, host, port, timeout)` builds the connection; `tls`
    verifies an https:// server (core/tls.py: client_context, cli_context; default: the
    system's trust store, never unverified). `server_name`: the name an https:// server's
    certificate must carry (and the SNI sent) when it is not the URL's host: a node's agent is
    verified by the node name while the hooks connect to 127.0.0.1.
    """
    scheme, host, port, path = _target(url)
    start = time.monotonic()
    end = start + deadline_s
    make = connection or (lambda sc, h, p, t: _plain_connection(sc, h, p, t, tls, server_name))
    conn = make(scheme, host, port, max(0.001, deadline_s))
    try:
        # Connect first (bounded by the socket timeout), so the watchdog always has a socket to shut.
        conn.connect()
    except (OSError, http.client.HTTPException, ValueError) as e:
        conn.close()
        if time.monotonic() >= end:
            raise Deadline(f"{url}: no connection within {deadline_s:g}s") from None
        if isinstance(e, ssl.SSLError):
            raise Unverified(f"{url}: {_why(e)}") from None
        raise ExchangeError(f"{url}: {_why(e)}") from None
    dog = _Watchdog(conn, end - time.monotonic())
    try:
        try:
            conn.request(method, path, body=body or None, headers=dict(headers or {}))
            resp = conn.getresponse()
            got = {k.lower(): v for k, v in resp.getheaders()}
            if resp.length is not None and resp.length > max_bytes:
                raise TooLarge(f"{url}: answer of {resp.length} bytes exceeds {max_bytes}")
            data = _read_lines(resp, max_bytes, on_line, end) if on_line else _read(resp, max_bytes, end)
        except ExchangeError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as e:
            if dog.fired or time.monotonic() >= end:
                raise Deadline(f"{url}: no complete answer within {deadline_s:g}s") from None
            raise ExchangeError(f"{url}: {_why(e)}") from None
        if dog.fired:  # the socket was shut under a read that then saw EOF: the body is cut
            raise Deadline(f"{url}: no complete answer within {deadline_s:g}s")
        return Reply(resp.status, data, got)
    finally:
        dog.cancel()
        conn.close()


def _plain_connection(scheme: str, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None,
                      server_name: str = "") -> http.client.HTTPConnection:
    if scheme == "https":
        if server_name:
            return _NamedHTTPSConnection(host, port, timeout=timeout, context=tls, server_name=server_name)
        return http.client.HTTPSConnection(host, port, timeout=timeout, context=tls)
    return http.client.HTTPConnection(host, port, timeout=timeout)


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to `host` whose certificate is checked against `server_name` (sent as SNI) instead
    of `host`: http.client has no such switch, so the socket is wrapped here."""

    def __init__(self, host: str, port: int, *, timeout: float, context: ssl.SSLContext | None,
                 server_name: str) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP only (no proxy tunnel: never used here)
        self.sock = self._context.wrap_socket(self.sock, server_hostname=self._server_name)  # type: ignore[attr-defined]


def _read(resp: http.client.HTTPResponse, max_bytes: int, end: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        chunk = resp.read1(_CHUNK) if hasattr(resp, "read1") else resp.read(_CHUNK)
        if not chunk:
            return b"".join(parts)
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge(f"answer exceeds {max_bytes} bytes")
        parts.append(chunk)
        if time.monotonic() >= end:
            raise Deadline("the answer did not end before the deadline")


def _read_lines(resp: http.client.HTTPResponse, max_bytes: int, on_line: Callable[[bytes], None],
                end: float) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        line = resp.readline(_LINE_MAX + 1)
        if not line:
            return b"".join(parts)
        size += len(line)
        if size > max_bytes or len(line) > _LINE_MAX:
            raise TooLarge(f"answer exceeds {max_bytes} bytes (or a line {_LINE_MAX})")
        parts.append(line)
        if line.endswith(b"\n"):
            on_line(line)
        if time.monotonic() >= end:
            raise Deadline("the answer did not end before the deadline")


def _why(e: BaseException) -> str:
    if isinstance(e, socket.gaierror):
        return f"cannot resolve the host ({e.strerror})"
    if isinstance(e, ConnectionRefusedError):
        return "connection refused (nothing listens there)"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    return f"{type(e).__name__}: {e}".rstrip(": ")


async def exchange_async(session: "aiohttp.ClientSession", method: str, url: str, *, deadline_s: float,
                         body: bytes = b"", headers: Mapping[str, str] | None = None,
                         max_bytes: int = DEFAULT_MAX_BYTES, idempotent: bool = False,
                         **request_kw: object) -> Reply:
    """exchange() on an aiohttp session: the whole exchange (connect to the last body byte)
    under one asyncio timeout; the body is read up to `max_bytes`. `request_kw` goes to
    session.request (ssl=...).

    `idempotent`: the server applies this request once however often it arrives (the agent's
    pushes: records by id, reports by seq). Such a request is sent once more, within the same
    deadline, when the connection dropped before an answer came: a kept-alive connection the
    server closed (its idle timeout, a restart) just as it was reused. RFC 9112 9.3.1 allows
    that for idempotent requests; aiohttp does it by method only, and a POST is not one."""
    import aiohttp

    _target(url)
    try:
        async with asyncio.timeout(deadline_s):
            try:
                return await _request(session, method, url, body, headers, max_bytes, request_kw)
            except aiohttp.ClientConnectorError:
                raise  # no connection at all: nothing was sent, and a new one would fail the same
            except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
                if not idempotent:
                    raise
            # aiohttp closed the dropped connection: this goes out on a new one.
            return await _request(session, method, url, body, headers, max_bytes, request_kw)
    except TimeoutError:
        raise Deadline(f"{url}: no complete answer within {deadline_s:g}s") from None
    except aiohttp.ClientSSLError as e:
        raise Unverified(f"{url}: {_why(e)}") from None
    except (aiohttp.ClientError, OSError, ValueError) as e:
        raise ExchangeError(f"{url}: {_why(e)}") from None


async def _request(session: "aiohttp.ClientSession", method: str, url: str, body: bytes,
                   headers: Mapping[str, str] | None, max_bytes: int, request_kw: Mapping[str, object]) -> Reply:
    async with session.request(method, url, data=body or None, headers=dict(headers or {}),
                               **request_kw) as r:  # type: ignore[arg-type]
        if r.content_length is not None and r.content_length > max_bytes:
            raise TooLarge(f"{url}: answer of {r.content_length} bytes exceeds {max_bytes}")
        parts: list[bytes] = []
        size = 0
        while True:
            chunk = await r.content.read(_CHUNK)
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise TooLarge(f"{url}: answer exceeds {max_bytes} bytes")
            parts.append(chunk)
        return Reply(r.status, b"".join(parts), {k.lower(): v for k, v in r.headers.items()})
