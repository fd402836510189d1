"""Evidence for an RMA ticket: after a fence, the node's agent builds a bundle (agent/bundle.py)
and the aggregator keeps it with the fence.

The fetch runs in its own task after the fence is recorded, never inside decide() or a fencer
call: a node whose agent is down (the usual reason it was fenced) costs one timed-out request
and an audit line saying so, nothing else. A bundle is stored as
`<db dir>/bundles/<node>/<fence id>.tar.gz` with a row (node, fence id, time, size, sha256); the
node's oldest beyond bundles.keep are deleted, so disk use is bounded by
nodes x keep x bundles.max_bytes.

Reading them (GET /api/v1/nodes/{name}/bundles[/{id}]) needs the admin token, or a caller on
this host when none is set: a bundle holds host names, serial numbers and kernel logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podhealth import agentclient, httpclient, log as plog
from podhealth.atomicfile import write_atomic

from podhealth.aggregator.store import Store
from podhealth.worker import offload

if TYPE_CHECKING:
    from podhealth.aggregator.service import Aggregator

log = plog.get("podhealth.aggregator.bundles")
PATH = "/v1/bundle"
GZIP_MAGIC = b"\x1f\x8b"


class BundleError(Exception):
    pass


def bundle_dir(agg: "Aggregator") -> Path:
    """Beside the SQLite file (with PostgreSQL: beside the `db` path of the leader that fetched it)."""
    return Path(agg.cfg.db).parent / "bundles"


async def _download(agg: "Aggregator", node: str, url: str) -> bytes:
    """The agent's bundle: the request signed with the node's agent key, the answer only with
    its proof (core/agentclient.py; no bearer token goes to whatever holds the port), the whole
    exchange within bundles.timeout and the body within bundles.max_bytes."""
    cfg = agg.cfg.bundles
    try:
        r = await agentclient.ask_async(agg.session, url.rstrip("/") + PATH, node, agg.cfg.auth.agent_token_for(node),
                                        "POST", deadline_s=cfg.timeout, body=b"{}",
                                        headers={"Content-Type": "application/json"}, max_bytes=cfg.max_bytes)
    except httpclient.TooLarge:
        raise BundleError(f"bundle exceeds bundles.max_bytes ({cfg.max_bytes})") from None
    except httpclient.ExchangeError as e:
        raise BundleError(f"{e.kind}: {e}") from None
    if r.status != 200:
        raise BundleError(f"HTTP {r.status} {r.body[:500].decode(errors='replace')}".strip())
    return r.body


def _write(path: Path, body: bytes) -> None:
    """Whole or not at all: a crash leaves a .tmp, never a half bundle under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, body, mode=0o600)


def _remove(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


async def fetch(agg: "Aggregator", node: str, fence_id: int) -> dict[str, Any] | None:
    """Fetch, store and record the node's bundle for fence `fence_id`; on failure an audit line
    (bundle failed: why) and None. Never raises: it runs beside the fence, not in it."""
    mem, writer = agg.mem, agg.writer
    rec = mem.nodes.get(node)
    url = rec.agent_url if rec is not None else ""
    now = agg.clock()
    try:
        if not url:
            raise BundleError("the node has no agent_url to ask")
        body = await _download(agg, node, url)
        if body[:2] != GZIP_MAGIC:
            raise BundleError(f"not a tar.gz (starts {body[:8]!r})")
        digest = hashlib.sha256(body).hexdigest()
        path = bundle_dir(agg) / node / f"{fence_id}.tar.gz"
        await offload(_write, path, body)
        keep = agg.cfg.bundles.keep
        bid, dropped = await writer.call(
            lambda s: s.add_bundle(node, fence_id, now, len(body), digest, str(path), keep))
        await offload(_remove, [p for p in dropped if p != str(path)])
        await writer.write([Store.op_audit(now, node, "podhealth", "bundle stored", f"evidence for fence {fence_id}",
                                           (), f"{len(body)} bytes sha256 {digest}", True, fence_id)])
        log.info("evidence bundle stored", node=node, fence=fence_id, bytes=len(body), dropped=len(dropped))
        return {"id": bid, "node": node, "fence_id": fence_id, "size": len(body), "sha256": digest}
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - evidence is best effort: say why, never disturb fencing
        why = str(e) if isinstance(e, BundleError) else f"{type(e).__name__}: {e}"
        log.warning("evidence bundle not fetched", node=node, fence=fence_id, error=why)
        with contextlib.suppress(Exception):
            await writer.write([Store.op_audit(now, node, "podhealth", "bundle failed",
                                               f"evidence for fence {fence_id}", (), why, False, fence_id)])
        return None


def public(b: dict[str, Any]) -> dict[str, Any]:
    """A bundle row as the API shows it (not the server's file path)."""
    return {k: v for k, v in b.items() if k != "path"}
