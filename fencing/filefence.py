"""TEST-ONLY fencer: fence state in a JSON file, every state change counted.

It exists so tests can kill an aggregator process mid-fence and then count, from outside the
process, how many times a node was really fenced. Selected with `fencers.file.enabled: true`;
never use it on a real cluster (it fences nothing real).

File layout: {"nodes": {"dgx01": {"fenced": true, "reason": "podhealth: ...", "ours": true,
"opted_out": false}}, "fences": {"dgx01": 1}, "calls": {"dgx01": 2}}. A test may pre-seed a
node as fenced by a human (`ours: false`) or opted out.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podhealth.atomicfile import write_atomic
from podhealth.fencing.fence import REASON_PREFIX, FenceOutcome, FenceReason, FenceState, NodeNames, Refused, render_reason

if TYPE_CHECKING:
    from podhealth.config_aggregator import FileFencerConfig


class FileFencer:
    name = "file"
    timeout = 10.0  # a local file; a test's gate may hold a call, never longer than this

    def target(self, names: NodeNames) -> str:
        return names.node

    def __init__(self, path: Path | str, gate: Path | str | None = None, gate_after: bool = False) -> None:
        self.path = Path(path)
        self.gate = Path(gate) if gate else None
        self.gate_after = gate_after
        self._lock = asyncio.Lock()

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            data = {}
        data.setdefault("nodes", {})
        data.setdefault("fences", {})
        data.setdefault("calls", {})
        return data

    def _save(self, data: dict[str, Any]) -> None:
        write_atomic(self.path, json.dumps(data, sort_keys=True))

    async def _wait_gate(self) -> None:
        while self.gate is not None and self.gate.exists():
            await asyncio.sleep(0.02)

    @staticmethod
    def _state(node: str, d: dict[str, Any] | None) -> FenceState:
        if d is None:
            return FenceState(node=node, exists=True, fenced=False, ours=False)
        reason = str(d.get("reason", ""))
        fenced = bool(d.get("fenced"))
        return FenceState(node=node, exists=True, fenced=fenced, ours=fenced and reason.startswith(REASON_PREFIX),
                          reason=reason, opted_out=bool(d.get("opted_out")), raw=json.dumps(d))

    async def read(self, node: str) -> FenceState:
        return self._state(node, self._load()["nodes"].get(node))

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        cmd = ("file-fence", str(self.path), node, render_reason(reason))
        async with self._lock:
            data = self._load()
            data["calls"][node] = data["calls"].get(node, 0) + 1
            self._save(data)
            if not self.gate_after:
                await self._wait_gate()
            data = self._load()
            cur = data["nodes"].get(node)
            if cur and cur.get("fenced"):
                return FenceOutcome(changed=False, command=cmd, output="already fenced")
            data["nodes"][node] = {"fenced": True, "reason": render_reason(reason), "opted_out": False}
            data["fences"][node] = data["fences"].get(node, 0) + 1
            self._save(data)
            if self.gate_after:
                await self._wait_gate()
        return FenceOutcome(changed=True, command=cmd, output="fenced")

    async def release(self, node: str) -> FenceOutcome:
        cmd = ("file-release", str(self.path), node)
        async with self._lock:
            data = self._load()
            st = self._state(node, data["nodes"].get(node))
            if not st.fenced:
                return FenceOutcome(changed=False, command=cmd, output="not fenced")
            if not st.ours:
                raise Refused(f"not ours: {st.reason}", command=cmd)
            data["nodes"][node]["fenced"] = False
            data["nodes"][node]["reason"] = ""
            self._save(data)
        return FenceOutcome(changed=True, command=cmd, output="released")

    async def list_fenced(self) -> dict[str, FenceState]:
        nodes = self._load()["nodes"]
        return {n: self._state(n, d) for n, d in nodes.items() if d.get("fenced")}


def from_config(cfg: "FileFencerConfig") -> FileFencer:
    return FileFencer(cfg.path, cfg.gate or None, cfg.gate_after)
