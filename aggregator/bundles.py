"""Evidence for an RMA ticket: after a fence, the node's agent builds a bundle (agent/bundle.py)
and the aggregator keeps it with the fence.

The fetch runs in its own task after the fence is recorded, never inside decide() or a fencer
call: a node whose agent is down (the usual reason it was fenced) costs one timed-out request
and an audit line saying so, nothing else. A bundle is stored as
`<db dir>/bundles/<node>/<fence id>.tar.gz` with a row (node, fence id, time, size, sha256); the
node's oldest beyond bundles.keep are deleted, so disk use is bounded by
nodes x keep x bundles.max_bytes.

A bundle is stored only whole: the body is read to its end (at most bundles.max_bytes), and it
must match what the agent said of it (Content-Length, its X-Podhealth-Sha256), list as a tar.gz,
and every part must match the size and sha256 the agent's manifest.json gives it. One that does
not (a connection cut mid-body, a proxy that mangles it) is refused: a row with the reason and no
file, which the UI and `podhealth fleet bundle` show (the CLI exits non-zero), never a damaged
archive recorded as evidence.

Reading them (GET /api/v1/nodes/{name}/bundles[/{id}]) needs the admin token, or a caller on
this host when none is set: a bundle holds host names, serial numbers and kernel logs.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import io
import json
import os
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from podhealth import agentclient, httpclient, log as plog
from podhealth.atomicfile import write_atomic

from podhealth.aggregator.context import Context
from podhealth.aggregator.store import Store
from podhealth.aggregator.writer import Writer
from podhealth.config_aggregator import AggregatorConfig
from podhealth.worker import offload

log = plog.get("podhealth.aggregator.bundles")
PATH = "/v1/bundle"
GZIP_MAGIC = b"\x1f\x8b"
SHA_HEADER = "X-Podhealth-Sha256"
MANIFEST = "manifest.json"
# What the parts may unpack to, as a multiple of the archive's size limit: a gzip bomb inside a
# small archive is refused before it is read out.
UNPACKED_RATIO = 16


class BundleError(Exception):
    pass


@dataclass(frozen=True)
class Received:
    """A bundle's body as it arrived, and what the agent's headers promised about it."""

    body: bytes
    length: int | None  # Content-Length
    sha256: str  # X-Podhealth-Sha256 ('' from an agent that sends none)


def check(got: Received, max_bytes: int) -> str:
    """Why this bundle must not be stored ('' when it is whole and the agent's own). Pure."""
    body = got.body
    if got.length is not None and got.length != len(body):
        return f"incomplete: received {len(body)} of {got.length} bytes"
    digest = hashlib.sha256(body).hexdigest()
    if got.sha256 and got.sha256.lower() != digest:
        return f"sha256 {digest} of the {len(body)} bytes received is not the agent's {got.sha256}"
    if body[:2] != GZIP_MAGIC:
        return f"not a tar.gz (starts {body[:8]!r})"
    problem = _gzip_whole(body, UNPACKED_RATIO * max_bytes)
    if problem:
        return f"not a valid tar.gz: {problem}"
    try:
        with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
            members = {m.name: m for m in tar.getmembers() if m.isfile()}
            if MANIFEST not in members:
                return f"not a podhealth bundle: no {MANIFEST}"
            return _against_manifest(tar, members)
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        return f"not a valid tar.gz: {type(e).__name__}: {e}"


def _gzip_whole(body: bytes, limit: int) -> str:
    """'' when the gzip stream runs to its end (its CRC checked) and unpacks to at most `limit`
    bytes; listing the tar alone stops at the last header and misses a cut tail."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    data, total = body, 0
    try:
        while not d.eof:
            out = d.decompress(data, 1 << 20)  # bounded steps: a bomb is stopped at `limit`
            total += len(out)
            if total > limit:
                return f"unpacks to more than {UNPACKED_RATIO} x bundles.max_bytes"
            data = d.unconsumed_tail
            if not out and not data:
                break  # all read, nothing more comes out: the stream was cut
    except zlib.error as e:
        return f"gzip: {e}"
    return "" if d.eof else "the gzip stream ends early"


def _against_manifest(tar: tarfile.TarFile, members: dict[str, tarfile.TarInfo]) -> str:
    """Every part the agent's manifest lists is in the archive with its size and sha256."""
    f = tar.extractfile(members[MANIFEST])
    try:
        manifest = json.loads(f.read() if f is not None else b"")
        parts = manifest["parts"]
        listed = [(str(p["name"]), int(p["bytes"]), str(p["sha256"])) for p in parts]
    except (ValueError, KeyError, TypeError) as e:
        return f"{MANIFEST} cannot be read: {type(e).__name__}: {e}"
    for name, size, sha in listed:
        m = members.get(name)
        if m is None:
            return f"part {name} is in {MANIFEST} but not in the archive"
        data = tar.extractfile(m)
        blob = data.read() if data is not None else b""
        if len(blob) != size or hashlib.sha256(blob).hexdigest() != sha:
            return f"part {name} does not match {MANIFEST} ({len(blob)} bytes, the manifest says {size})"
    return ""


def bundle_dir(cfg: AggregatorConfig) -> Path:
    """Beside the SQLite file (with PostgreSQL: beside the `db` path of the leader that fetched it)."""
    return Path(cfg.db).parent / "bundles"


async def _download(cfg: AggregatorConfig, session: aiohttp.ClientSession, node: str, url: str) -> Received:
    """The agent's bundle: the request signed with the node's agent key, the answer only with
    its proof (core/agentclient.py; no bearer token goes to whatever holds the port), the whole
    exchange within bundles.timeout and the whole body (within bundles.max_bytes) with what the
    agent's headers say of it."""
    b = cfg.bundles
    try:
        r = await agentclient.ask_async(session, url.rstrip("/") + PATH, node, cfg.auth.agent_token_for(node),
                                        "POST", deadline_s=b.timeout, body=b"{}",
                                        headers={"Content-Type": "application/json"}, max_bytes=b.max_bytes)
    except httpclient.TooLarge:
        raise BundleError(f"bundle exceeds bundles.max_bytes ({b.max_bytes})") from None
    except httpclient.ExchangeError as e:
        if "payload is not completed" in str(e).lower():  # aiohttp: the body ended before its length
            raise BundleError(f"incomplete: the body ended early ({e})") from None
        raise BundleError(f"{e.kind}: {e}") from None
    if r.status != 200:
        raise BundleError(f"HTTP {r.status} {r.body[:500].decode(errors='replace')}".strip())
    length = r.header("Content-Length").strip()
    return Received(r.body, int(length) if length.isdigit() else None, r.header(SHA_HEADER).strip())


def _write(path: Path, body: bytes) -> None:
    """Whole or not at all: a crash leaves a .tmp, never a half bundle under the real name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, body, mode=0o600)


def _remove(paths: list[str]) -> None:
    for p in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(p)


@dataclass(frozen=True)
class Evidence:
    """What fetching bundles needs beyond the leader's Context: the config (bundles, the agents'
    keys, where the files go), the session agents are asked over, and the store's writer (a
    bundle row's id and the files it displaces come back from it)."""

    cfg: AggregatorConfig
    session: aiohttp.ClientSession
    writer: Writer


async def fetch(ev: Evidence, ctx: Context, node: str, fence_id: int) -> dict[str, Any] | None:
    """Fetch, check, store and record the node's bundle for fence `fence_id`; on failure a row
    with the reason (no file), an audit line (bundle failed: why) and None. Never raises: it runs
    beside the fence, not in it."""
    writer, cfg = ev.writer, ev.cfg
    rec = ctx.mem.nodes.get(node)
    url = rec.agent_url if rec is not None else ""
    now = ctx.clock()
    try:
        if not url:
            raise BundleError("the node has no agent_url to ask")
        got = await _download(cfg, ev.session, node, url)
        body = got.body
        refused = await offload(check, got, cfg.bundles.max_bytes)
        if refused:
            raise BundleError(f"refused: {refused}")
        digest = hashlib.sha256(body).hexdigest()
        path = bundle_dir(cfg) / node / f"{fence_id}.tar.gz"
        await offload(_write, path, body)
        keep = cfg.bundles.keep
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
        log.warning("evidence bundle not stored", node=node, fence=fence_id, error=why)
        keep = cfg.bundles.keep
        with contextlib.suppress(Exception):
            _, dropped = await writer.call(lambda s: s.add_bundle(node, fence_id, now, 0, "", "", keep, why))
            await offload(_remove, [p for p in dropped if p])
        with contextlib.suppress(Exception):
            await writer.write([Store.op_audit(now, node, "podhealth", "bundle failed",
                                               f"evidence for fence {fence_id}", (), why, False, fence_id)])
        return None


def public(b: dict[str, Any]) -> dict[str, Any]:
    """A bundle row as the API shows it (not the server's file path)."""
    return {k: v for k, v in b.items() if k != "path"}
