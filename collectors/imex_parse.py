"""Pure parsers for the IMEX service's own status (`nvidia-imex-ctl`, NVIDIA IMEX user guide).

    nvidia-imex-ctl -q        one word: this node's daemon state. DCGM's reading of the same
                              output (dcgm_fields.h, DCGM_FI_IMEX_DAEMON_STATUS) names them:
                              INITIALIZING, STARTING_AUTH_SERVER, WAITING_FOR_PEERS,
                              WAITING_FOR_RECOVERY, INIT_GPU, READY, SHUTTING_DOWN, UNAVAILABLE.
    nvidia-imex-ctl -N -j     the domain as this daemon sees it: {"status": "UP"|"DOWN"|"DEGRADED",
                              "nodes": {"0": {"status": "READY", "host": ..., "version": ...,
                              "connections": {"1": {"status": "CONNECTED", ...}}}}, "timestamp"}
                              (DCGM_FI_IMEX_DOMAIN_STATUS reads its "status").

Text in, frozen dataclasses out; no I/O. Unknown words are kept as printed (a newer IMEX may add
states), never mapped to a guess. Sizes are bounded: a domain is at most a rack's 18 trays, or a
few racks; more than MAX_NODES entries is not nvidia-imex-ctl's output.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

DAEMON_STATES = ("INITIALIZING", "STARTING_AUTH_SERVER", "WAITING_FOR_PEERS", "WAITING_FOR_RECOVERY",
                 "INIT_GPU", "READY", "SHUTTING_DOWN", "UNAVAILABLE")
DOMAIN_STATES = ("UP", "DEGRADED", "DOWN")
MAX_NODES = 1024
_WORD = re.compile(r"^[A-Z][A-Z0-9_]{0,40}$")


@dataclass(frozen=True)
class ImexNode:
    index: str
    host: str
    status: str
    version: str
    unreachable: tuple[str, ...]  # peers this node reports not CONNECTED


@dataclass(frozen=True)
class ImexDomain:
    status: str
    nodes: tuple[ImexNode, ...]


def parse_daemon(text: str) -> str:
    """The daemon state word of `nvidia-imex-ctl -q`. ValueError for anything else."""
    word = text.strip().splitlines()[-1].strip() if text.strip() else ""
    if not _WORD.match(word):
        raise ValueError(f"not an nvidia-imex-ctl -q answer: {text.strip()[:80]!r}")
    return word


def _str(v: Any, limit: int = 128) -> str:
    return str(v)[:limit] if isinstance(v, (str, int, float)) else ""


def parse_domain(text: str) -> ImexDomain:
    """`nvidia-imex-ctl -N -j`. ValueError for what is not its JSON (no domain "status")."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"not nvidia-imex-ctl -N -j output: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
        raise ValueError("not nvidia-imex-ctl -N -j output: no domain \"status\"")
    raw = doc.get("nodes") or {}
    if not isinstance(raw, dict) or len(raw) > MAX_NODES:
        raise ValueError("not nvidia-imex-ctl -N -j output: \"nodes\" is not a bounded object")
    nodes = []
    for key, n in sorted(raw.items(), key=lambda kv: (len(str(kv[0])), str(kv[0]))):
        if not isinstance(n, dict):
            continue
        raw_conns = n.get("connections")
        conns: dict[Any, Any] = raw_conns if isinstance(raw_conns, dict) else {}
        down = tuple(sorted(_str(k, 16) for k, c in conns.items()
                            if not (isinstance(c, dict) and c.get("status") == "CONNECTED")))
        nodes.append(ImexNode(_str(key, 16), _str(n.get("host")), _str(n.get("status"), 40) or "?",
                              _str(n.get("version"), 40), down))
    return ImexDomain(doc["status"][:40], tuple(nodes))
