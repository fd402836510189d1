"""The signed exchange with a node's agent: who asks is proven, and so is who answers.

Both ends hold the node's agent key: the aggregator derives it from the cluster secret
(credentials.derive_agent_token), the node keeps it in its auth.token_file (0640
root:podhealth), and root on the node (the Slurm and BCM hooks, `podhealth check`) can read it.
Nothing else on the node can: a user who binds the agent's port while the agent is down
holds no key.

A request carries four headers: the node it is for, the caller's time, a fresh random nonce,
and HMAC-SHA256(key, "podhealth-request-v1", method, path, node, time, nonce, sha256(body)).
The agent refuses a request whose MAC is wrong, whose node is not its own, whose time is more
than WINDOW_S from its clock, or whose nonce it has seen (NonceCache: remembered for the
window, bounded): a request captured on the wire and sent again byte for byte does nothing.
No bearer credential travels: what crosses the wire proves the key without revealing it, so
an impostor on the port learns nothing it could use.

The answer carries the agent's time and HMAC-SHA256(key, "podhealth-answer-v1", node, method,
path, the caller's nonce, time, status, sha256(body)). The caller's nonce makes an old answer
useless, and only the key's holder can make it: an answer whose proof is missing or wrong is
UNKNOWN to every caller and never releases, resumes or drains a node. A stream of lines
(NDJSON: the handover suite's progress) ends with a proof line over every byte before it.

The agent proves every answer to a request that carries a nonce, an open GET /health too: a
proof only ever vouches for the agent's own answer to that nonce. Pure functions (no I/O, the
time is passed in): core, used by agent, checks and aggregator alike.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping

H_NODE = "X-Podhealth-Node"
H_TIME = "X-Podhealth-Time"
H_NONCE = "X-Podhealth-Nonce"
H_SIGNATURE = "X-Podhealth-Signature"
H_PROOF = "X-Podhealth-Proof"
WINDOW_S = 60.0  # a request's time may be this far from the agent's clock (NTP keeps nodes within ms)
NONCE_CAPACITY = 4096  # nonces remembered at once: far above what one aggregator sends a node in 2*WINDOW_S
_NONCE = re.compile(r"[0-9a-f]{32}")
_REQUEST = "podhealth-request-v1"
_ANSWER = "podhealth-answer-v1"


def body_hash(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def new_nonce() -> str:
    return secrets.token_hex(16)


def _mac(key: str, *fields: str) -> str:
    # Newline-joined: no field may hold a newline (node names, paths and numbers cannot; the
    # method is a token), so two different field lists never join to the same text.
    return hmac.new(key.encode(), "\n".join(fields).encode(), hashlib.sha256).hexdigest()


def _get(headers: Mapping[str, str], name: str) -> str:
    return headers.get(name) or headers.get(name.lower()) or ""


@dataclass(frozen=True)
class Signed:
    """What to send: the headers, and the nonce the answer's proof must name."""

    headers: dict[str, str]
    nonce: str


def sign(key: str, node: str, method: str, path: str, body: bytes, now: float, nonce: str = "") -> Signed:
    """Headers for a request to `node`'s agent, signed with that node's agent key."""
    nonce = nonce or new_nonce()
    ts = str(int(now))
    mac = _mac(key, _REQUEST, method.upper(), path, node, ts, nonce, body_hash(body))
    return Signed({H_NODE: node, H_TIME: ts, H_NONCE: nonce, H_SIGNATURE: mac}, nonce)


def ask(node: str, nonce: str = "") -> Signed:
    """Headers for an unsigned request (an open GET /health) that still wants a proven answer."""
    nonce = nonce or new_nonce()
    return Signed({H_NODE: node, H_NONCE: nonce}, nonce)


def nonce_of(headers: Mapping[str, str]) -> str:
    """The caller's nonce, or "" when it sent none (or not one of ours: 32 hex digits)."""
    n = _get(headers, H_NONCE)
    return n if _NONCE.fullmatch(n) else ""


def request_problem(key: str, node: str, method: str, path: str, headers: Mapping[str, str], body: bytes,
                    now: float) -> str | None:
    """Why this request is not signed by `node`'s key for this method, path and body now, or
    None. Replays are the NonceCache's to refuse, after this passed (so no one without the key
    can fill the cache)."""
    problem = head_problem(key, node, headers, now)
    if problem:
        return problem
    ts, nonce, sig = _get(headers, H_TIME), nonce_of(headers), _get(headers, H_SIGNATURE)
    want = _mac(key, _REQUEST, method.upper(), path, node, ts, nonce, body_hash(body))
    if not hmac.compare_digest(want, sig.lower()):
        return "bad signature (wrong key for this node, or the request was changed)"
    return None


def head_problem(key: str, node: str, headers: Mapping[str, str], now: float) -> str | None:
    """What request_problem finds wrong before the body is read (so an unsigned caller never gets
    the agent to wait for a body), or None."""
    if not key:
        return "this agent holds no key (auth.token_file): its protected routes are closed"
    sig = _get(headers, H_SIGNATURE)
    if not sig:
        return f"unsigned request: sign it with the node's agent key ({H_SIGNATURE})"
    asked, ts, nonce = _get(headers, H_NODE), _get(headers, H_TIME), nonce_of(headers)
    if asked != node:
        return f"the request is for node {asked!r}; this agent is {node!r}"
    if not nonce:
        return f"{H_NONCE} must be 32 hex digits"
    if not ts.isdigit() or len(ts) > 12:
        return f"{H_TIME} must be whole seconds since the epoch"
    skew = int(ts) - now
    if abs(skew) > WINDOW_S:
        return (f"the request's time is {skew:+.0f}s from this agent's clock (window {WINDOW_S:g}s): "
                "check NTP on both hosts")
    return None


class NonceCache:
    """Nonces seen within the time window, so a signed request is carried out once.

    A nonce stays for 2*WINDOW_S after the time it was signed with (its request can be accepted
    only within WINDOW_S of that time). Bounded: when `capacity` nonces are all still live,
    `fresh` answers False (the caller refuses: try again shortly) rather than forget one that
    could still be replayed; only key holders can add nonces at all.
    """

    def __init__(self, capacity: int = NONCE_CAPACITY, window: float = WINDOW_S) -> None:
        self.capacity = capacity
        self.window = window
        self._seen: OrderedDict[str, float] = OrderedDict()  # nonce -> when it may be forgotten

    def __len__(self) -> int:
        return len(self._seen)

    def fresh(self, nonce: str, signed_at: float, now: float) -> bool:
        """True the first time `nonce` is offered (and it is remembered); False for a replay or
        when the cache is full of live nonces."""
        self._expire(now)
        if nonce in self._seen:
            return False
        if len(self._seen) >= self.capacity:
            return False
        self._seen[nonce] = max(now, signed_at) + 2 * self.window
        return True

    def full(self) -> bool:
        return len(self._seen) >= self.capacity

    def _expire(self, now: float) -> None:
        # Insertion order is close to expiry order (times within the window): drop from the front
        # while expired, and sweep everything only when full.
        while self._seen:
            nonce, until = next(iter(self._seen.items()))
            if until > now:
                break
            del self._seen[nonce]
        if len(self._seen) >= self.capacity:
            for nonce in [n for n, until in self._seen.items() if until <= now]:
                del self._seen[nonce]


def prove(key: str, node: str, method: str, path: str, nonce: str, status: int, body: bytes,
          now: float) -> dict[str, str]:
    """The headers that prove an answer came from `node`'s key holder."""
    ts = str(int(now))
    mac = _mac(key, _ANSWER, node, method.upper(), path, nonce, ts, str(status), body_hash(body))
    return {H_NODE: node, H_TIME: ts, H_PROOF: mac}


def answer_problem(key: str, node: str, method: str, path: str, nonce: str, status: int,
                   headers: Mapping[str, str], body: bytes) -> str | None:
    """Why this answer is not proven to come from `node`'s agent, or None."""
    if not key:
        return f"no key for node {node} to check its agent's answer with"
    proof, ts = _get(headers, H_PROOF), _get(headers, H_TIME)
    if not proof:
        return "the answer carries no proof: not this node's agent (or an agent without its key)"
    if not ts.isdigit() or len(ts) > 12:
        return "the answer's proof has no time"
    want = _mac(key, _ANSWER, node, method.upper(), path, nonce, ts, str(status), body_hash(body))
    if not hmac.compare_digest(want, proof.lower()):
        return "the answer's proof is wrong: not this node's agent"
    return None


def proof_line(key: str, node: str, method: str, path: str, nonce: str, status: int, before: bytes | str,
               now: float) -> bytes:
    """The last line of a proven NDJSON stream: a proof over every byte sent before it.
    `before`: those bytes, or their sha256 (hex) when the sender hashed as it went."""
    digest = before if isinstance(before, str) else body_hash(before)
    ts = str(int(now))
    mac = _mac(key, _ANSWER, node, method.upper(), path, nonce, ts, str(status), digest)
    return json.dumps({"type": "proof", "time": int(ts), "proof": mac}).encode() + b"\n"


def stream_problem(key: str, node: str, method: str, path: str, nonce: str, status: int, body: bytes) -> str | None:
    """Why an NDJSON stream is not proven (its last line must be the proof over the rest), or None."""
    if not key:
        return f"no key for node {node} to check its agent's answer with"
    head, _, last = body.rstrip(b"\n").rpartition(b"\n")
    prefix = head + b"\n" if head else b""
    try:
        msg = json.loads(last)
        ok = isinstance(msg, dict) and msg.get("type") == "proof"
        ts, proof = (str(int(msg["time"])), str(msg["proof"])) if ok else ("", "")
    except (ValueError, KeyError, TypeError, RecursionError):
        ok, ts, proof = False, "", ""
    if not ok:
        return "the stream does not end with a proof: not this node's agent (or an agent without its key)"
    want = _mac(key, _ANSWER, node, method.upper(), path, nonce, ts, str(status), body_hash(prefix))
    if not hmac.compare_digest(want, proof.lower()):
        return "the stream's proof is wrong: not this node's agent"
    return None
