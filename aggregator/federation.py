"""The read-only view over several aggregator sets (one per SuperPOD or cluster).

Each set keeps its own leader and database; the view reads each one's JSON API (GET
/api/v1/fleet and /api/v1/nodes?not_state=OK) and shows them side by side. Nothing here writes
anywhere, and nothing is shared between the sets:

- one HTTP session per set (its own TLS context and no cookie jar), so a set's token, its
  certificate trust and whatever it answers stay with it; its token goes to its URL only, and a
  redirect is not followed (it would carry the token elsewhere): the set shows the redirect as
  its error;
- every set is read at once with its own deadline: one that is down, slow or wrong shows as
  unreachable with the reason, and the others are shown all the same;
- what a set answers is bounded (MAX_BYTES) and checked field by field before it is shown (node
  names by the one node-name rule); a set's answer is data, never markup (the UI renders text).

Used by `podhealth fleet --federate` (aggregator/cmd_fleet.py) and the UI (/ui/federation).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import aiohttp
import orjson

from podhealth.config_federation import FederatedSet, sends_safely
from podhealth.hostnames import node_name_problem

MAX_BYTES = 16 * 1024 * 1024  # one answer of one set (/api/v1/nodes of 20,000 nodes, all failing: ~3 MB)
MAX_PROBLEMS = 1000  # nodes not OK shown per set (the count says how many more)
MAX_TEXT = 256


class SetError(Exception):
    """A set could not be read; the message says why (shown in its tile)."""


@dataclass(frozen=True)
class Problem:
    node: str
    state: str
    checks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "checks": list(self.checks)}


@dataclass(frozen=True)
class SetView:
    name: str
    url: str
    ok: bool
    error: str = ""
    seconds: float = 0.0  # how long the read took
    nodes: int = 0
    counts: Mapping[str, int] = field(default_factory=dict)
    breaker: str = ""  # "" (not tripped) or its reason
    leader: str = ""  # the replica that leads ("" for a single aggregator)
    dry_run: bool = False
    fenced: int = 0
    cap: int = 0
    problems: tuple[Problem, ...] = ()
    more: int = 0  # nodes not OK beyond MAX_PROBLEMS

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "ok": self.ok, "error": self.error,
                "seconds": round(self.seconds, 3), "nodes": self.nodes, "counts": dict(self.counts),
                "breaker": self.breaker, "leader": self.leader, "dry_run": self.dry_run,
                "fence_budget": {"used": self.fenced, "limit": self.cap},
                "problems": [p.to_json() for p in self.problems], "more": self.more}


# ---- checking what a set answered (pure) ----------------------------------------------------------


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise SetError(f"{where}: expected a string")
    return v[:MAX_TEXT]


def _count(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SetError(f"{where}: expected a count")
    return v


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise SetError(f"{where}: expected an object")
    return v


def parse_set(s: FederatedSet, fleet: Any, nodes: Any, seconds: float) -> SetView:
    """A set's two answers as a SetView; SetError when they are not what an aggregator answers."""
    f = _obj(fleet, "/api/v1/fleet")
    counts = {_text(k, "counts"): _count(v, f"counts.{k}") for k, v in _obj(f.get("counts"), "counts").items()}
    b = _obj(f.get("breaker"), "breaker")
    breaker = (_text(b.get("reason", ""), "breaker.reason") or "tripped") if b.get("tripped") is True else ""
    budget = _obj(f.get("fence_budget"), "fence_budget")
    replica = f.get("replica")
    leader = replica.get("leader") if isinstance(replica, dict) and replica.get("role") not in (None, "single") else ""
    listed = _obj(nodes, "/api/v1/nodes").get("nodes")
    if not isinstance(listed, list):
        raise SetError("/api/v1/nodes: expected a list of nodes")
    problems: list[Problem] = []
    bad = 0
    for i, n in enumerate(listed):
        n = _obj(n, f"nodes[{i}]")
        state = _text(n.get("state"), f"nodes[{i}].state")
        if state == "OK":
            continue  # an aggregator that does not know not_state= lists every node
        name = _text(n.get("name"), f"nodes[{i}].name")
        if node_name_problem(name):
            raise SetError(f"nodes[{i}].name: {node_name_problem(name)}")
        bad += 1
        if len(problems) < MAX_PROBLEMS:
            checks = n.get("checks")
            checks = checks if isinstance(checks, list) else []
            problems.append(Problem(name, state, tuple(_text(c, f"nodes[{i}].checks") for c in checks[:32])))
    return SetView(name=s.name, url=s.url, ok=True, seconds=seconds, nodes=_count(f.get("nodes"), "nodes"),
                   counts=counts, breaker=breaker, leader=_text(leader or "", "replica.leader"),
                   dry_run=f.get("dry_run") is True, fenced=_count(budget.get("used"), "fence_budget.used"),
                   cap=_count(budget.get("limit"), "fence_budget.limit"), problems=tuple(problems),
                   more=bad - len(problems))


# ---- reading the sets ---------------------------------------------------------------------------


class SetReader:
    """One set: its own session (TLS context, no cookies), its token for its URL only."""

    def __init__(self, s: FederatedSet, token: str) -> None:
        if token and not sends_safely(s.url):  # config validation says so too; the CLI's URLs come here
            raise SetError(f"{s.url}: a token goes over https or to loopback http only")
        self.set = s
        self.base = s.url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._ssl: ssl.SSLContext | bool = ssl.create_default_context(cafile=s.ca_file) if s.ca_file else True
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar(),
                                                  connector=aiohttp.TCPConnector(ssl=self._ssl, limit=4))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _get(self, path: str) -> Any:
        try:
            async with self.session().get(self.base + path, headers=self._headers, allow_redirects=False) as r:
                if 300 <= r.status < 400:
                    raise SetError(f"GET {path}: HTTP {r.status} to {r.headers.get('Location', '?')[:MAX_TEXT]}: "
                                   "not followed (the set's token would go with it)")
                if r.status != 200:
                    raise SetError(f"GET {path}: HTTP {r.status}")
                body = await r.content.read(MAX_BYTES + 1)
        except (aiohttp.ClientError, OSError, ssl.SSLError) as e:
            raise SetError(f"GET {path}: {type(e).__name__}: {e}") from None
        if len(body) > MAX_BYTES:
            raise SetError(f"GET {path}: answer larger than {MAX_BYTES} bytes")
        try:
            return orjson.loads(body)
        except orjson.JSONDecodeError as e:
            raise SetError(f"GET {path}: not JSON ({e})") from None

    async def read(self, timeout: float) -> SetView:
        t0 = time.monotonic()
        s = self.set
        try:
            async with asyncio.timeout(timeout):
                fleet = await self._get("/api/v1/fleet")
                nodes = await self._get("/api/v1/nodes?not_state=OK")
            return parse_set(s, fleet, nodes, time.monotonic() - t0)
        except TimeoutError:
            return SetView(s.name, s.url, ok=False, error=f"no answer within {timeout:g} s",
                           seconds=time.monotonic() - t0)
        except SetError as e:
            return SetView(s.name, s.url, ok=False, error=str(e), seconds=time.monotonic() - t0)


async def read_all(readers: Sequence[SetReader], timeout: float) -> list[SetView]:
    """Every set at once, each within `timeout`: the answer comes after the slowest deadline at most."""
    return list(await asyncio.gather(*(r.read(timeout) for r in readers)))


class Federation:
    """The view the UI serves: reads shared by concurrent requests and reused for `ttl` seconds,
    so a page open in many browsers reads each set once per ttl."""

    def __init__(self, readers: Sequence[SetReader], timeout: float, ttl: float = 2.0) -> None:
        self.readers = list(readers)
        self.timeout = timeout
        self.ttl = ttl
        self._last: tuple[float, list[SetView]] | None = None
        self._inflight: asyncio.Task[list[SetView]] | None = None

    async def view(self) -> list[SetView]:
        now = time.monotonic()
        if self._last is not None and now - self._last[0] < self.ttl:
            return self._last[1]
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.create_task(read_all(self.readers, self.timeout))
        views = await asyncio.shield(self._inflight)
        self._last = (time.monotonic(), views)
        return views

    async def close(self) -> None:
        if self._inflight is not None and not self._inflight.done():
            self._inflight.cancel()
            await asyncio.gather(self._inflight, return_exceptions=True)
        for r in self.readers:
            await r.close()
