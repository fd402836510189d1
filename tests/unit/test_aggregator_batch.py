"""Fencing many nodes from one decision: one pending record each, one batch per fencer.

BatchMemFencer is MemFencer (tests/harness/agg.py) plus the optional BatchFencer methods, so the
service takes its batch path; what the batch cannot settle must go the single-node way with the
same safety rules (pending first, someone else's fence left alone, retries, never twice).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any, Sequence

import aiohttp
import pytest

from podhealth.config_aggregator import BreakerConfig, CapsConfig, RateLimitConfig, RetryConfig
from podhealth.fencing.fence import BatchFencer, FenceError, FenceOutcome, FenceReason, FenceState, Transient, render_reason
from podhealth.aggregator.model import FenceMode
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)
FAST = RetryConfig(attempts=2, backoff=0.01, max_backoff=0.05)
OPEN = dict(caps=CapsConfig(max_fenced=100, max_percent_per_partition=100.0),
            breaker=BreakerConfig(share_percent=100.0, window=60.0, min_nodes=1), retries=FAST)


@dataclasses.dataclass
class BatchMemFencer(MemFencer):
    undecided: set[str] = dataclasses.field(default_factory=set)  # read_many leaves these out
    refuse_once: set[str] = dataclasses.field(default_factory=set)  # fence_many says no to these, once
    batches: list[tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=list)

    async def read_many(self, nodes: Sequence[str]) -> dict[str, FenceState]:
        self.batches.append(("read_many", tuple(nodes)))
        self._maybe_fail("read_many", "*")
        out = {}
        for n in nodes:
            if n in self.undecided:
                continue
            reason = self.fenced.get(n, "")
            out[n] = FenceState(node=n, exists=n not in self.missing, fenced=n in self.fenced,
                                ours=reason.startswith("podhealth:"), reason=reason, opted_out=n in self.opted_out)
        return out

    async def fence_many(self, items: Sequence[tuple[str, FenceReason]]) -> dict[str, FenceOutcome | FenceError]:
        self.batches.append(("fence_many", tuple(n for n, _ in items)))
        self._maybe_fail("fence_many", "*")
        out: dict[str, FenceOutcome | FenceError] = {}
        for n, r in items:
            if n in self.refuse_once:
                self.refuse_once.discard(n)
                out[n] = Transient("busy, try later", command=("mem", "fence", n))
            elif n in self.fenced:
                out[n] = FenceOutcome(changed=False, command=("mem", "fence", n), output="already")
            else:
                self.fenced[n] = render_reason(r)
                out[n] = FenceOutcome(changed=True, command=("mem", "fence", n), output="fenced")
        return out

    def fenced_via_batch(self) -> list[str]:
        return [n for kind, nodes in self.batches if kind == "fence_many" for n in nodes]


def alerts(nodes: list[str]) -> dict[str, Any]:
    """One Alertmanager webhook naming every node: one request, one commit, so one decision."""
    return {"version": "4", "status": "firing", "alerts": [
        {"status": "firing", "labels": {"alertname": "GpuFellOffTheBus", "node": n, "severity": "critical",
                                        "action": "drain", "gpu": "3"},
         "annotations": {"summary": "XID 79"}, "fingerprint": f"fp-{n}"} for n in nodes]}


async def until(pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


def audit(agg: Any, what: str) -> list[str]:
    return sorted(a["node"] for a in agg.store.audit_tail(1000) if a["what"] == what)


def test_the_test_double_is_a_batch_fencer() -> None:
    assert isinstance(BatchMemFencer(), BatchFencer) and not isinstance(MemFencer(), BatchFencer)


async def test_one_decision_fences_its_nodes_in_one_batch(tmp_path: Path) -> None:
    fencer = BatchMemFencer(missing={"dgx04"}, undecided={"dgx05"})
    cfg = config(tmp_path, nodes=10, rate_limit=RateLimitConfig(fences_per_minute=100), **OPEN)
    nodes = [f"dgx{i:02d}" for i in range(1, 9)]
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        fencer.fenced["dgx03"] = "maintenance by hand"  # after the start-up reconcile: only the batch's read sees it
        r = await s.post(f"{url}/v1/alertmanager", json=alerts(nodes))
        assert r.status == 200 and (await r.json())["applied"] == 8
        await until(lambda: not agg.pending and len(audit(agg, "fence requested")) == 8)
        # one read of all eight, one fence call for the five the batch could settle
        assert fencer.batches[:2] == [("read_many", tuple(nodes)),
                                      ("fence_many", ("dgx01", "dgx02", "dgx06", "dgx07", "dgx08"))]
        assert fencer.count("fence") == 1 and fencer.count("fence", "dgx05") == 1  # undecided: the single path
        modes = {n: agg.mem.nodes[n].fence for n in nodes}
        assert modes == {**{n: FenceMode.FENCED for n in nodes}, "dgx03": FenceMode.EXTERNAL, "dgx04": FenceMode.NONE}
        assert fencer.fenced["dgx03"] == "maintenance by hand"  # someone else's fence is left alone
        for n in ("dgx01", "dgx02", "dgx05", "dgx06", "dgx07", "dgx08"):
            # each its own reason, with this aggregator's lease epoch
            assert fencer.fenced[n] == f"podhealth: GpuFellOffTheBus 3 DRAIN [fp-{n}] e{agg.epoch()}"
        assert audit(agg, "fence done") == ["dgx01", "dgx02", "dgx05", "dgx06", "dgx07", "dgx08"]
        assert audit(agg, "fence skipped") == ["dgx03"] and audit(agg, "fence failed") == ["dgx04"]
        states = {a.node: a.state for n in nodes for a in agg.store.actions_of(n)}
        assert states == {**{n: "done" for n in nodes}, "dgx03": "skipped", "dgx04": "failed"}
        # the audit log says per node what was run, as the single path does
        hist = await (await s.get(f"{url}/api/v1/nodes/dgx07/history")).json()
        assert ["mem", "fence", "dgx07"] in [i["command"] for i in hist["items"] if i["type"] == "audit"]
        await asyncio.sleep(0.3)
        assert fencer.fenced_via_batch().count("dgx01") == 1 and len(audit(agg, "fence requested")) == 8


async def test_the_default_rate_limit_still_holds_a_batch_back(tmp_path: Path) -> None:
    fencer = BatchMemFencer()
    cfg = config(tmp_path, nodes=20, **OPEN)  # rate_limit left at its default: 10 new fences a minute
    nodes = [f"dgx{i:02d}" for i in range(1, 16)]
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/v1/alertmanager", json=alerts(nodes))).status == 200
        await until(lambda: len(fencer.fenced) >= 10 and not agg.pending)
        runs = agg.metrics.decisions._value.get()
        await until(lambda: agg.metrics.decisions._value.get() > runs + 5)
        assert len(fencer.fenced) == 10 and len(audit(agg, "fence requested")) == 10
        assert len(agg.last_decision.notes_of("rate_limited")) == 5


async def test_a_refused_node_stays_pending_and_is_retried_alone(tmp_path: Path) -> None:
    fencer = BatchMemFencer(refuse_once={"dgx02"})
    cfg = config(tmp_path, nodes=6, rate_limit=RateLimitConfig(fences_per_minute=100), **OPEN)
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/v1/alertmanager", json=alerts(["dgx01", "dgx02", "dgx03"]))).status == 200
        await until(lambda: agg.mem.nodes["dgx02"].fence is FenceMode.FENCED and not agg.pending)
        assert audit(agg, "fence attempt failed") == ["dgx02"]
        [action] = agg.store.actions_of("dgx02")
        assert action.state == "done" and action.attempts == 1
        assert fencer.count("fence", "dgx02") == 1  # the retry took the single path
        assert sorted(fencer.fenced) == ["dgx01", "dgx02", "dgx03"]
        assert len(audit(agg, "fence requested")) == 3  # never asked twice


async def test_a_backend_down_during_a_batch_loses_nothing(tmp_path: Path) -> None:
    fencer = BatchMemFencer(fail=3)  # read_many fails twice (both tries), then the first single read
    cfg = config(tmp_path, nodes=6, rate_limit=RateLimitConfig(fences_per_minute=100), **OPEN)
    nodes = ["dgx01", "dgx02", "dgx03", "dgx04"]
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/v1/alertmanager", json=alerts(nodes))).status == 200
        await until(lambda: all(agg.mem.nodes[n].fence is FenceMode.FENCED for n in nodes) and not agg.pending)
        assert sorted(fencer.fenced) == nodes and len(audit(agg, "fence requested")) == 4
        assert sorted(audit(agg, "fence done")) == nodes
