"""POST /v1/bundle: the evidence bundle an RMA ticket needs, as one bounded tar.gz.

The aggregator asks for it when it fences the node (aggregator/bundles.py) and keeps it with
the fence. The caller needs the same credential as the handover suite (a request signed with this
node's agent key, agent/nodeauth.py; closed without one; never cross-site; a JSON body): a bundle
holds host names, PCI addresses, serial numbers and kernel lines.

What goes in, each part capped (PART_MAX) and cut with a marker, the whole under MAX_BYTES:
- nvidia-smi-q.txt: `nvidia-smi -q` (argv, timeout, killed past it);
- kernel-events.json: the XID/SXid and RAS events the agent keeps (collectors/kmsg.py);
- ib-counter-history.json: the InfiniBand counter points the agent's rate history holds;
- handover-last.json: the last handover suite this agent ran (dcgmi diag, burn-in, NCCL);
- health.json: what GET /health answers now;
- dmesg-tail.txt: the end of `dmesg` (argv, timeout);
- versions.json: driver, VBIOS, HCA firmware, OFED, kernel (checks/drift.observe), podhealth;
- manifest.json: every part with its size, sha256, whether it was cut, and why it is missing.

A source that cannot be read (no nvidia-smi on the simulator, dmesg refused by
kernel.dmesg_restrict, no handover since start) gives a note in the part and the manifest,
never a failed bundle: the rest is still evidence.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from aiohttp import web

from podhealth import log, webguard
from podhealth.agent.plugin import AgentView, Plugin
from podhealth.worker import call_off_loop

if TYPE_CHECKING:
    from podhealth.agent.health import Health
    from podhealth.checks.passive.engine import Evaluator

_log = log.get("podhealth.agent.bundle")
MAX_BYTES = 8 * 1024 * 1024  # the whole tar.gz; the aggregator refuses more (bundles.max_bytes)
PART_MAX = 2 * 1024 * 1024  # one part before compression
# Tar headers (512 B a file, two end blocks) and gzip's worst case on incompressible data (a few
# bytes per 16 KiB block): what the parts leave free under MAX_BYTES.
_OVERHEAD = 64 * 1024
NVIDIA_SMI = ("nvidia-smi", "-q")
DMESG = ("dmesg",)
COMMAND_TIMEOUT = 30.0  # `nvidia-smi -q` on 8 GPUs takes a few seconds; a wedged driver hangs it
DMESG_TAIL_LINES = 5000
IB_PREFIX = "infiniband_"
MARKER = "\n[... podhealth: part cut at {kept} of {total} bytes ...]\n"


@dataclass(frozen=True)
class Part:
    """One file of the bundle. `tail`: when cut, keep the end (a log), else the start."""

    name: str
    data: bytes
    note: str = ""  # why the source gave nothing (the data then says the same)
    tail: bool = False


def _cut(p: Part, limit: int) -> tuple[bytes, bool]:
    if len(p.data) <= limit:
        return p.data, False
    keep = max(0, limit - 100)  # the marker is under 100 bytes for any size below a terabyte
    marker = MARKER.format(kept=keep, total=len(p.data)).encode()
    body = p.data[len(p.data) - keep:] if p.tail else p.data[:keep]
    return (marker + body) if p.tail else (body + marker), True


def pack(parts: Sequence[Part], meta: dict[str, Any], max_bytes: int = MAX_BYTES,
         part_max: int = PART_MAX) -> tuple[bytes, dict[str, Any]]:
    """(tar.gz bytes, manifest). Pure: parts are cut in order so that their sum, the manifest
    and the archive's own overhead stay under `max_bytes`, even if nothing compresses."""
    budget = max(0, max_bytes - _OVERHEAD)
    entries: list[dict[str, Any]] = []
    files: list[tuple[str, bytes]] = []
    for p in parts:
        data, cut = _cut(p, min(part_max, budget))
        budget -= len(data)
        files.append((p.name, data))
        entries.append({"name": p.name, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                        "truncated": cut, "original_bytes": len(p.data), "note": p.note})
    manifest = {**meta, "max_bytes": max_bytes, "part_max": part_max, "parts": entries}
    files.append(("manifest.json", json.dumps(manifest, indent=2).encode()))
    buf = io.BytesIO()
    mtime = int(meta.get("created", 0))
    # mtime=0 in the gzip header, fixed tar mtimes: the same parts give the same bytes.
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6, format=tarfile.PAX_FORMAT) as tar:
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), mtime, 0o644
            tar.addfile(info, io.BytesIO(data))
    out = buf.getvalue()
    if len(out) > max_bytes:  # cannot happen with the overhead reserved; never send more than promised
        raise ValueError(f"bundle of {len(out)} bytes exceeds {max_bytes}")
    return out, manifest


def run_command(argv: Sequence[str], timeout: float = COMMAND_TIMEOUT) -> tuple[bytes, str]:
    """(stdout, note) of a command run as argv (blocking: call off the loop). The note says why
    there is no output: not installed, timed out (killed), failed with its stderr."""
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout,
                              check=False)
    except FileNotFoundError:
        return b"", f"{argv[0]} is not installed on this node"
    except subprocess.TimeoutExpired:
        return b"", f"{' '.join(argv)} did not finish within {timeout:g}s (killed)"
    except OSError as e:
        return b"", f"cannot run {argv[0]}: {e.strerror or e}"
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()[-500:]
        note = f"{' '.join(argv)} exited {proc.returncode}: {err}".strip()
        return proc.stdout, note
    return proc.stdout, ""


def _text_part(name: str, out: bytes, note: str, tail: bool = False) -> Part:
    if not out and note:
        return Part(name, f"not collected: {note}\n".encode(), note, tail)
    return Part(name, out, note, tail)


def _json(obj: Any) -> bytes:
    return json.dumps(obj, indent=1, default=str).encode()


def ib_history(ev: "Evaluator") -> list[dict[str, Any]]:
    """The InfiniBand counter points the Evaluator's rate history holds (run in its thread)."""
    out = []
    for key, points in ev.rates.points().items():
        name, labels = key if isinstance(key, tuple) and len(key) == 2 else (str(key), ())
        if isinstance(name, str) and name.startswith(IB_PREFIX):
            out.append({"metric": name, "labels": dict(labels), "points": [list(p) for p in points]})
    return sorted(out, key=lambda d: (d["metric"], sorted(d["labels"].items())))


def kernel_release(procfs_root: Path) -> str:
    """`uname -r` of the node the agent watches: <procfs_root>/sys/kernel/osrelease, as the host
    collector reads it (on a simulated node its kernel, not this machine's); '' when unreadable."""
    from podhealth.collectors.host_versions import parse_osrelease

    try:
        return parse_osrelease((procfs_root / "sys" / "kernel" / "osrelease").read_text(errors="replace")) or ""
    except OSError:
        return ""


async def collect(agent: AgentView, health: "Health") -> list[Part]:
    """Every part, read now; the commands run in threads with timeouts, concurrently. The seam
    `bundle.dmesg` (a callable giving (bytes, note)) replaces `dmesg` where the node's kernel
    log is not this machine's (`agent --simulate`: the simulated node's kernel log)."""
    from podhealth.checks.passive import drift

    read_dmesg = agent.seams.get("bundle", {}).get("dmesg") or (lambda: run_command(DMESG))
    smi, dmesg = await asyncio.gather(call_off_loop("bundle-smi", lambda: run_command(NVIDIA_SMI)),
                                      call_off_loop("bundle-dmesg", read_dmesg))
    snap = agent.snapshot()
    events = [e.to_json() for e in snap.events]
    ib = await health.on_evaluator(ib_history)
    last = health.last_handover
    rep = health.report().to_json()
    rep["evaluated_at"] = health.evaluated_at
    observed = drift.observe(snap)
    kernel = await call_off_loop("bundle-uname", lambda: kernel_release(agent.cfg.paths.procfs_root))
    versions = {"podhealth": agent.version, "node": agent.node, "kernel_running": kernel or None,
                **{f: sorted({s.version for s in seen}) if seen else None for f, seen in observed.items()},
                "where": {f: [{"where": s.where, "version": s.version, "board": s.board} for s in seen or ()]
                          for f, seen in observed.items()}}
    dmesg_lines = dmesg[0].splitlines(keepends=True)[-DMESG_TAIL_LINES:]
    return [
        _text_part("nvidia-smi-q.txt", *smi),
        Part("kernel-events.json", _json(events), "" if events else "no kernel events kept since the agent started",
             tail=True),
        Part("ib-counter-history.json", _json(ib or []),
             "" if ib else "no InfiniBand counter history (no HCA, or no evaluation yet)"),
        Part("handover-last.json", _json(last[1].to_json() | {"received": last[0]}) if last else
             b'{"note": "no handover suite has run since the agent started"}\n',
             "" if last else "no handover suite (dcgmi diag, burn-in) has run since the agent started"),
        Part("health.json", _json(rep)),
        _text_part("dmesg-tail.txt", b"".join(dmesg_lines), dmesg[1], tail=True),
        Part("versions.json", _json(versions)),
    ]


class Bundles(Plugin):
    """The endpoint, given the agent's view (node, version, snapshot, the `bundle` seam) and the
    judge (the credential check, the report, the handover and rate history it holds)."""

    name = "bundle"

    def __init__(self, agent: AgentView, health: "Health") -> None:
        self.agent = agent
        self.health = health
        self._lock = asyncio.Lock()

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        return [web.post("/v1/bundle", webguard.same_site_only(self.post))]

    async def post(self, request: web.Request) -> web.Response:
        refusal, _ = await self.health.admit(request)
        if refusal is not None:
            return refusal
        if self._lock.locked():  # one at a time: each runs nvidia-smi and dmesg
            return web.json_response({"error": "a bundle is being built; ask again"}, status=409)
        async with self._lock:
            started = time.monotonic()
            parts = await collect(self.agent, self.health)
            meta = {"node": self.agent.node, "podhealth": self.agent.version, "created": time.time(),
                    "format": 1}
            body, manifest = await call_off_loop("bundle-pack", lambda: pack(parts, meta))
        _log.info("evidence bundle built", bytes=len(body), seconds=round(time.monotonic() - started, 3),
                  notes=[p["name"] for p in manifest["parts"] if p["note"]])
        return web.Response(body=body, headers={
            "Content-Type": "application/gzip",
            "Content-Disposition": f'attachment; filename="{self.agent.node}-bundle.tar.gz"',
            "X-Podhealth-Sha256": hashlib.sha256(body).hexdigest()})

