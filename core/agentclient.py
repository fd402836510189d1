"""Asking a node's agent: one exchange (core/httpclient.py), signed and proven (core/nodeproof.py).

Every caller of an agent goes through `ask` (blocking: the Slurm/BCM hooks, `podhealth check`)
or `ask_async` (the aggregator's pulls, handovers, GPU resets and bundle downloads). Either
returns the agent's answer only once its proof checks out against the node's key; otherwise it
raises `Unproven` (an impostor on the port, an agent without the key, a key that does not match)
(also an https:// agent whose certificate is not the node's from the site CA)
or another httpclient.ExchangeError (unreachable, deadline, too large). Callers treat all of
them as "could not tell": UNKNOWN, never a release, a resume or a drain.

`signed=False` (an open GET /health) still sends a nonce and still requires a proven answer;
it only leaves out the request signature, which the route does not need.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable, Mapping

from podhealth import httpclient, nodeproof
from podhealth.httpclient import ExchangeError, Reply

if TYPE_CHECKING:
    import ssl

    import aiohttp


class Unproven(ExchangeError):
    """Something answered, but not provably the node's agent. `status`: the HTTP status it
    answered (0: no answer was asked for), for a message only: an unproven status means nothing."""

    kind = "unproven"

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _prepare(node: str, key: str, method: str, url: str, body: bytes, signed: bool,
             headers: Mapping[str, str] | None) -> tuple[str, nodeproof.Signed, dict[str, str]]:
    if not key:
        raise Unproven(f"no agent key for node {node}: cannot tell its agent from an impostor "
                       "(auth.token_file, /etc/podhealth/agent.key, or --token)")
    path = httpclient.request_path(url)
    s = (nodeproof.sign(key, node, method, path, body, time.time()) if signed else nodeproof.ask(node))
    return path, s, {**dict(headers or {}), **s.headers}


def _server_name(url: str, node: str) -> str:
    """An https:// agent proves it is `node` by its certificate: the name checked is the node
    name, whatever host the URL reaches it by (127.0.0.1 for the hooks, an address or FQDN in
    agent_url), as the aggregator checks a node's client certificate by the node name."""
    return node if url.startswith("https://") else ""


def _check(node: str, key: str, method: str, path: str, nonce: str, reply: Reply, stream: bool, url: str) -> Reply:
    if stream:
        problem = nodeproof.stream_problem(key, node, method, path, nonce, reply.status, reply.body)
    else:
        problem = nodeproof.answer_problem(key, node, method, path, nonce, reply.status, reply.headers, reply.body)
    if problem:
        raise Unproven(f"{url}: {problem}", reply.status)
    return reply


def ask(url: str, node: str, key: str, method: str = "GET", *, deadline_s: float, body: bytes = b"",
        signed: bool = True, headers: Mapping[str, str] | None = None, max_bytes: int = httpclient.DEFAULT_MAX_BYTES,
        on_line: Callable[[bytes], None] | None = None, tls: "ssl.SSLContext | None" = None) -> Reply:
    """The proven answer of `node`'s agent at `url`, within `deadline_s`. With `on_line` the
    answer is an NDJSON stream: lines are passed on as they come (progress to show, never to act
    on) and the whole stream is proven by its last line before this returns. `tls` verifies an
    https:// agent (core/tls.py) by the node name (_server_name)."""
    path, s, hdrs = _prepare(node, key, method, url, body, signed, headers)
    try:
        reply = httpclient.exchange(method, url, deadline_s=deadline_s, body=body, headers=hdrs, max_bytes=max_bytes,
                                    on_line=on_line, tls=tls, server_name=_server_name(url, node))
    except httpclient.Unverified as e:
        raise Unproven(f"{e} (its certificate is not {node}'s from the site CA)") from None
    stream = on_line is not None and reply.header("Content-Type").startswith("application/x-ndjson")
    return _check(node, key, method, path, s.nonce, reply, stream, url)


async def ask_async(session: "aiohttp.ClientSession", url: str, node: str, key: str, method: str = "GET", *,
                    deadline_s: float, body: bytes = b"", signed: bool = True,
                    headers: Mapping[str, str] | None = None,
                    max_bytes: int = httpclient.DEFAULT_MAX_BYTES) -> Reply:
    """ask() on the aggregator's session."""
    path, s, hdrs = _prepare(node, key, method, url, body, signed, headers)
    name = _server_name(url, node)
    try:
        reply = await httpclient.exchange_async(session, method, url, deadline_s=deadline_s, body=body, headers=hdrs,
                                                max_bytes=max_bytes, **({"server_hostname": name} if name else {}))
    except httpclient.Unverified as e:
        raise Unproven(f"{e} (its certificate is not {node}'s from the site CA)") from None
    return _check(node, key, method, path, s.nonce, reply, False, url)
