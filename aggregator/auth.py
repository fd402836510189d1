"""Who an ingest request speaks for, from its bearer token.

- a node's own token (derived from auth.cluster_secret, or listed in auth.node_tokens) speaks
  for that node alone, and vouches that the node is real (it counts in the breaker's fleet);
- cluster_token speaks for any node only on /v1/alertmanager (a central sender), and on the agent
  routes only with the unsafe cluster_token_for_agents; the admin token may post alerts too;
- with no credential configured at all, ingest is open: config validation allows that only on
  loopback with no fencer that can take a node out of service, and a request must name a
  loopback Host (a DNS-rebound browser page names its own).

A derived token names no node, so it is checked against the node the body names, once the body
is parsed; a missing or malformed token is refused before the body is read.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from aiohttp import web

from podhealth.credentials import node_token_matches
from podhealth.webguard import bearer, from_this_host, same_token

from podhealth.config_aggregator import AggAuthConfig

_HEX = frozenset("0123456789abcdef")
_CACHE_MAX = 100_000  # derived tokens already checked (token -> node); at most one per real node


class Refused(Exception):
    """An ingest or admin request refused: HTTP status, the metrics' result label, the reason."""

    def __init__(self, status: int, result: str, message: str, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.result, self.message = status, result, message
        self.retry_after = retry_after  # seconds, for a 429 (the Retry-After header)


@dataclass(frozen=True, slots=True)
class Speaker:
    node: str | None = None  # speaks only for this node; None = for any node
    token: str = ""  # a derived token, still to be checked against the node the body names
    vouches: bool = False  # one node's own credential: a node it reports for is real

    @property
    def is_node(self) -> bool:
        return self.node is not None or bool(self.token)


ANYONE = Speaker()


def _key(token: str) -> bytes:
    """What the token maps are keyed by: its SHA-256. A dict lookup compares keys with ==, which
    stops at the first differing byte; comparing digests leaks nothing an attacker can use to
    guess a token byte by byte (the one-to-one checks use webguard.same_token)."""
    return hashlib.sha256(token.encode()).digest()


def _looks_derived(token: str) -> bool:
    return len(token) == 64 and set(token) <= _HEX


class Auth:
    def __init__(self, cfg: AggAuthConfig) -> None:
        self.secret = cfg.cluster_secret
        self.cluster = cfg.cluster_token
        self.cluster_for_agents = cfg.cluster_token_for_agents
        self.admin = cfg.admin_token
        self.by_token = {_key(tok): node for node, tok in cfg.node_tokens.items()}
        self.open = not (self.secret or self.cluster or self.by_token)
        self._derived: dict[bytes, str] = {}  # _key(derived token) -> the node it was checked for
        self._speakers: dict[str, Speaker] = {}  # one per node that spoke with its own token (ingest is hot)

    def ingest(self, request: web.Request, central: bool = False) -> Speaker:
        """Who the request speaks as; `central` for /v1/alertmanager. Raises Refused (401)."""
        if self.open:
            # Config validation binds open ingest to loopback, but a browser on this host reaches a
            # loopback socket through DNS rebinding (evil.example re-resolved to 127.0.0.1): its
            # text/plain POST needs no preflight and its Origin matches its Host, so same_site passes.
            # The Host it names is not loopback (webguard.from_this_host), as on the agent's routes.
            if not from_this_host(request):
                raise Refused(403, "forbidden", "ingest is unauthenticated (no credential under auth): only a "
                                                "caller on this host naming a loopback Host may post")
            return ANYONE
        tok = bearer(request)
        if tok is None:
            raise Refused(401, "unauthorized", "missing bearer token")
        if self.by_token or self.secret:  # else no node token can match: skip hashing this one
            key = _key(tok)
            node = self.by_token.get(key) or self._derived.get(key)
            if node is not None:
                speaker = self._speakers.get(node)
                if speaker is None:
                    if len(self._speakers) >= _CACHE_MAX:
                        self._speakers.clear()
                    speaker = self._speakers[node] = Speaker(node=node, vouches=True)
                return speaker
        if same_token(self.cluster, tok):
            if central or self.cluster_for_agents:
                return ANYONE
            raise Refused(401, "unauthorized", "cluster_token does not speak for nodes: each node needs its own "
                                               "token (`podhealth token derive --node NAME`)")
        if central and same_token(self.admin, tok):
            return ANYONE
        if self.secret and _looks_derived(tok):
            return Speaker(token=tok, vouches=True)
        raise Refused(401, "unauthorized", "invalid token")

    def check_node(self, speaker: Speaker, node: str) -> None:
        """`speaker` may speak for `node`; raises Refused (401) when not."""
        if speaker.node is not None and speaker.node != node:
            raise Refused(401, "unauthorized", f"this token speaks for {speaker.node}, not {node}")
        if speaker.token and self._derived.get(_key(speaker.token)) != node:
            if not node_token_matches(self.secret, node, speaker.token):
                raise Refused(401, "unauthorized", f"invalid token for {node}")
            if len(self._derived) >= _CACHE_MAX:
                self._derived.clear()
            self._derived[_key(speaker.token)] = node

    def require_admin(self, request: web.Request) -> None:
        if not self.admin:
            raise Refused(403, "forbidden", "admin actions are disabled: no admin token is configured")
        if not same_token(self.admin, bearer(request)):
            raise Refused(401, "unauthorized", "admin token required")
