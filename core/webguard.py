"""Who may change things over HTTP: bearer tokens, and refusing what a browser says is cross-site.

Shared by the aggregator (ingest, admin API, UI) and the agent (POST /v1/handover), so both
apply one rule set. A bearer token travels in an Authorization header, which a cross-site form
or image can never carry; the cross-site check is the second line. It wraps each mutating
handler at registration instead of running as middleware, because aiohttp's middleware chain
would then sit on every ingest request too (about 1,000/s), and `require_guarded` refuses to
start an app that registered a mutating route without it.
"""

from __future__ import annotations

import hmac
from typing import Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

from podhealth.netaddr import is_loopback_address

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MARK = "_podhealth_same_site_only"


def bearer(request: web.Request) -> str | None:
    """The token of an `Authorization: Bearer ...` header (the scheme in any case, RFC 7235), or
    None. A header that is not UTF-8 reaches here with surrogates, which no configured token holds
    and which str.encode() refuses (a 500 on every guarded route): "" then, a token that matches nothing."""
    h = request.headers.get("Authorization", "")
    if h[:7].lower() != "bearer ":
        return None
    tok = h[7:].strip()
    try:
        tok.encode()
    except UnicodeEncodeError:
        return ""
    return tok


def same_token(expected: str, got: str | None) -> bool:
    """`got` is the configured token (constant time); an empty configured token matches nothing."""
    return bool(expected) and got is not None and hmac.compare_digest(expected.encode(), got.encode())


def same_site(request: web.Request) -> bool:
    """False when a browser says the request comes from another origin."""
    if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (agents, Alertmanager, the CLI), or a browser's same-origin GET
    try:
        parts = urlsplit(origin)
    except ValueError:  # "http://[::1" (an unclosed IPv6 bracket) was a 500: no browser sends it
        return False
    return parts.scheme in ("http", "https") and parts.netloc == request.host


def from_this_host(request: web.Request) -> bool:
    """The peer is on loopback AND the request names a loopback host.

    The Host check is what stops DNS rebinding: a page on evil.example whose name now resolves
    to 127.0.0.1 reaches the socket from loopback, but its requests say `Host: evil.example`.
    """
    host = host_name(request)  # None: Host: [::1 (an unclosed IPv6 bracket) was a 500
    return host is not None and is_loopback_address(request.remote or "") and is_loopback_address(host)


def host_name(request: web.Request) -> str | None:
    """The host the request names (its Host header without the port), lower-cased; None when it
    cannot be read (`Host: [::1`, an unclosed IPv6 bracket)."""
    try:
        return (urlsplit(f"//{request.host}").hostname or "").lower()
    except ValueError:
        return None


_READ_MARK = "_podhealth_host_checked"


def host_guard(bound_to: str, allowed: Iterable[str] = (), setting: str = "allowed_hosts") -> Callable[[Handler], Handler]:
    """A wrapper for the read routes of a server bound to `bound_to`.

    Bound to loopback, only a request naming a loopback Host (or one of `allowed`) is answered:
    a page on evil.example whose name a DNS rebinding re-resolved to 127.0.0.1 reaches the socket
    as same-origin and could read the answers, but names its own Host (421 Misdirected Request).
    Bound to other addresses, any Host reaches it (proxies and Services name their own), and the
    wrapper changes nothing. `require_host_checked` refuses an app with a read route not wrapped.
    `setting`: the config key that lists `allowed`, named in the refusal.
    """
    names = frozenset(h.lower() for h in allowed)
    loopback = is_loopback_address(bound_to)

    def wrap(handler: Handler) -> Handler:
        async def checked(request: web.Request) -> web.StreamResponse:
            if loopback:
                host = host_name(request)
                if host is None or not (is_loopback_address(host) or host in names):
                    return web.json_response({"error": "this server is bound to loopback and answers only a "
                                                       f"loopback Host (or one listed in {setting})"}, status=421)
            return await handler(request)
        setattr(checked, _READ_MARK, True)
        return checked
    return wrap


def require_host_checked(app: web.Application) -> None:
    """Raise if a read route was registered without host_guard."""
    for route in app.router.routes():
        if route.method in SAFE_METHODS and route.method != "OPTIONS" and not getattr(route.handler, _READ_MARK, False):
            raise RuntimeError(f"{route.method} {route.resource.canonical if route.resource else '?'} "
                               "is not wrapped in webguard.host_guard")


def is_json(request: web.Request) -> bool:
    """The body is declared JSON: an HTML form can only send urlencoded, multipart or text/plain."""
    return request.content_type == "application/json"


def same_site_only(handler: Handler) -> Handler:
    """`handler`, answering 403 (and doing nothing) to a cross-origin browser request."""
    async def guarded(request: web.Request) -> web.StreamResponse:
        if not same_site(request):
            return web.json_response({"error": "cross-origin request refused"}, status=403)
        return await handler(request)
    setattr(guarded, _MARK, True)
    return guarded


def require_guarded(app: web.Application) -> None:
    """Raise if a route that may change something was registered without same_site_only."""
    for route in app.router.routes():
        if route.method not in SAFE_METHODS and not getattr(route.handler, _MARK, False):
            raise RuntimeError(f"{route.method} {route.resource.canonical if route.resource else '?'} "
                               "is not wrapped in webguard.same_site_only")
