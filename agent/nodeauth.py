"""The agent's side of the signed exchange (core/nodeproof.py): who may act, and proof of who answers.

- `admit(request, limit, timeout)`: the protected routes (POST /v1/handover, /v1/gpu-reset,
  /v1/bundle) run only for a request signed with this node's agent key, within the time window,
  with a nonce never seen before (a captured request sent again byte for byte is refused, 409).
  Closed by default: an agent without a key (auth.token_file, /etc/podhealth/agent.key) refuses
  them all (403), to callers on this host too: a local user must not reset a GPU or read the
  kernel log that the evidence bundle carries.
- `middleware`: every answer to a request that carries a nonce is proven (headers over the node,
  the nonce, the time, the status and the body); a stream proves itself with its last line
  (`stream_proof`). A caller that cannot check the proof treats the answer as UNKNOWN.
"""

from __future__ import annotations

import hashlib
import time
from typing import Callable

from aiohttp import web

from podhealth import bodycoding, bodyread, log, nodeproof
from podhealth.logrepeat import Repeats

_log = log.get("podhealth.agent.nodeauth")


class NodeAuth:
    def __init__(self, node: str, key: str, clock: Callable[[], float] = time.time) -> None:
        self.node = node
        self.key = key
        self.clock = clock
        self.nonces = nodeproof.NonceCache()
        # The nonce cache lives in memory: a request signed before this process started could
        # otherwise be replayed once after a restart, within the time window. Nothing legitimate
        # was signed for an agent that did not yet exist (a caller whose clock is behind waits
        # out its skew, retried by the aggregator's runner).
        self.started = int(clock())
        # One line per route and status a minute: someone hammering the port with unsigned
        # requests must not fill the log (core/logrepeat.py).
        self._repeats = Repeats(_log)

    async def admit(self, request: web.Request, limit: int, timeout: float) -> tuple[web.Response | None, bytes]:
        """(None, the body) when the request is signed for this node and fresh; else (the
        refusal, b""). Reads the body (bounded: bodyread) because the signature covers it."""
        if not self.key:
            return self._refuse(request, 403, "this agent holds no key (auth.token_file, /etc/podhealth/agent.key): "
                                              "its handover, GPU-reset and bundle routes are closed; "
                                              "`podhealth install-units` provisions one (docs/security.md)"), b""
        problem = nodeproof.head_problem(self.key, self.node, request.headers, self.clock())
        if problem:  # refused before its body is read: an unsigned caller holds nothing open
            return self._refuse(request, 401, problem), b""
        try:
            body = await bodyread.read_body(request, limit, timeout)
        except bodycoding.BodyError as e:
            return web.json_response({"error": e.message}, status=e.status), b""
        now = self.clock()
        problem = nodeproof.request_problem(self.key, self.node, request.method, request.raw_path, request.headers,
                                            body, now)
        if problem:
            return self._refuse(request, 401, problem), b""
        nonce = nodeproof.nonce_of(request.headers)
        signed_at = int(request.headers[nodeproof.H_TIME])
        if signed_at < self.started:
            return self._refuse(request, 409, f"signed {self.started - signed_at}s before this agent started: "
                                              "not carried out (a replay across a restart?); sign it anew"), b""
        if not self.nonces.fresh(nonce, float(signed_at), now):
            if self.nonces.full():
                return web.json_response({"error": "too many signed requests at once: try again shortly"},
                                         status=503, headers={"Retry-After": "5"}), b""
            return self._refuse(request, 409, "this signed request was already carried out (a replay)"), b""
        return None, body

    def _refuse(self, request: web.Request, status: int, why: str) -> web.Response:
        self._repeats.emit("warning", f"{request.path}|{status}", "request refused", path=request.path,
                           peer=request.remote or "", status=status, why=why)
        return web.json_response({"error": why}, status=status)

    def stream_proof(self, request: web.Request, status: int, sent_sha256: str) -> bytes:
        """The proof line that ends a stream whose bytes so far hash to `sent_sha256` (b"" when
        the caller sent no nonce or this agent holds no key: there is nothing to prove to)."""
        nonce = nodeproof.nonce_of(request.headers)
        if not (nonce and self.key):
            return b""
        return nodeproof.proof_line(self.key, self.node, request.method, request.raw_path, nonce, status,
                                    sent_sha256, self.clock())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], object]) -> web.StreamResponse:
        resp = await handler(request)  # type: ignore[misc]
        assert isinstance(resp, web.StreamResponse)
        nonce = nodeproof.nonce_of(request.headers)
        if nonce and self.key and isinstance(resp, web.Response) and not resp.prepared:
            body = resp.body
            if isinstance(body, (bytes, bytearray)):
                resp.headers.update(nodeproof.prove(self.key, self.node, request.method, request.raw_path, nonce,
                                                    resp.status, bytes(body), self.clock()))
        return resp


class StreamHash:
    """The sha256 of what a handler has written to a stream so far (for its proof line)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def add(self, data: bytes) -> bytes:
        self._h.update(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()

