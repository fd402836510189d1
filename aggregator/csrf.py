"""Refuse mutations a browser says come from another site (CSRF defence in depth).

The mutating endpoints already need a bearer token in an Authorization header, which a
cross-site form or image can never carry; this is the second line. It wraps each mutating
handler at registration instead of running as middleware, because aiohttp's middleware chain
would then sit on every ingest request too (about 1,000/s), and `require_guarded` refuses to
start an app that registered a mutating route without it.
"""

from __future__ import annotations

from typing import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_MARK = "_podhealth_same_site_only"


def same_site(request: web.Request) -> bool:
    """False when a browser says the request comes from another origin."""
    if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
        return False
    origin = request.headers.get("Origin")
    if origin is None:
        return True  # not a browser (agents, Alertmanager, the CLI), or a browser's same-origin GET
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc == request.host


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
                               "is not wrapped in csrf.same_site_only")
