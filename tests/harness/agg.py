"""Aggregator test helpers: an in-process aggregator on a free loopback port, and a fencer double.

`MemFencer` is a test double of the Fencer protocol (fencing/fence.py): it records every call
so tests can assert "fenced exactly once", can be told to fail, and can hold nodes fenced by a
human or opted out. The real fencers (Slurm, Kubernetes) have their own tests.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

from aiohttp import web

from podhealth.config_aggregator import AggregatorConfig, NodeEntry
from podhealth.fencing.fence import (
    REASON_PREFIX, FenceOutcome, FenceReason, FenceState, Job, NodeNames, Refused, mark_epoch, render_reason,
)
from podhealth import bodycoding
from podhealth.aggregator.server import make_app
from podhealth.aggregator.service import Aggregator
from tests.harness.proc import free_port


@dataclasses.dataclass
class MemFencer:
    name: str = "mem"
    timeout: float = 10.0

    def target(self, names: NodeNames) -> str:
        return names.node
    fenced: dict[str, str] = dataclasses.field(default_factory=dict)  # node -> reason
    opted_out: set[str] = dataclasses.field(default_factory=set)
    missing: set[str] = dataclasses.field(default_factory=set)
    fail: int = 0  # the next `fail` calls raise, like a slurmctld that is down
    calls: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    def _maybe_fail(self, what: str, node: str) -> None:
        self.calls.append((what, node))
        if self.fail > 0:
            self.fail -= 1
            raise ConnectionError("backend down")

    def count(self, what: str, node: str | None = None) -> int:
        return sum(1 for w, n in self.calls if w == what and (node is None or n == node))

    async def read(self, node: str) -> FenceState:
        self._maybe_fail("read", node)
        if node in self.missing:
            return FenceState(node=node, exists=False, fenced=False, ours=False)
        reason = self.fenced.get(node, "")
        ours = reason.startswith(REASON_PREFIX)
        return FenceState(node=node, exists=True, fenced=node in self.fenced, ours=ours, reason=reason,
                          opted_out=node in self.opted_out, epoch=mark_epoch(reason) if ours else 0)

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        self._maybe_fail("fence", node)
        cmd = ("mem", "fence", node)
        if node in self.fenced:
            return FenceOutcome(changed=False, command=cmd, output="already")
        self.fenced[node] = render_reason(reason)
        return FenceOutcome(changed=True, command=cmd, output="fenced")

    async def release(self, node: str) -> FenceOutcome:
        self._maybe_fail("release", node)
        cmd = ("mem", "release", node)
        reason = self.fenced.get(node)
        if reason is None:
            return FenceOutcome(changed=False, command=cmd)
        if not reason.startswith(REASON_PREFIX):
            raise Refused("not ours", command=cmd)
        del self.fenced[node]
        return FenceOutcome(changed=True, command=cmd, output="released")

    async def list_fenced(self) -> dict[str, FenceState]:
        self.calls.append(("list", ""))
        return {n: await self.read(n) for n in list(self.fenced)}

    # Remediator (the ladder): a reboot is remembered until the test says the node came back.
    rebooting: set[str] = dataclasses.field(default_factory=set)

    async def reboot(self, node: str, reason: FenceReason) -> FenceOutcome:
        self._maybe_fail("reboot", node)
        cmd = ("mem", "reboot", node)
        if not self.fenced.get(node, "").startswith(REASON_PREFIX):
            raise Refused("not fenced by podhealth", command=cmd)
        if node in self.rebooting:
            return FenceOutcome(changed=False, command=cmd, output="reboot already requested")
        self.rebooting.add(node)
        return FenceOutcome(changed=True, command=cmd, output="reboot requested")

    # JobSource: the jobs on each node, as the test sets them; evacuate() records what it was asked.
    jobs_on: dict[str, list[Job]] = dataclasses.field(default_factory=dict)

    async def jobs(self, node: str) -> list[Job]:
        self._maybe_fail("jobs", node)
        return list(self.jobs_on.get(node, []))

    async def evacuate(self, node: str, jobs: Sequence[Job], force: bool) -> FenceOutcome:
        self._maybe_fail("evacuate" + (" force" if force else ""), node)
        if force:
            self.jobs_on[node] = [j for j in self.jobs_on.get(node, []) if j not in jobs]
        return FenceOutcome(changed=force, command=("mem", "requeue" if force else "wait", node),
                            output=", ".join(j.label() for j in jobs))

    async def remark(self, node: str, reason: FenceReason) -> FenceOutcome:
        self._maybe_fail("remark", node)
        if not self.fenced.get(node, "").startswith(REASON_PREFIX):
            # a command, as a fencer's own refusal carries: the runner audits it, as it did the outcome
            raise Refused("not fenced by podhealth", command=("mem", "remark", node))
        self.fenced[node] = render_reason(reason)
        return FenceOutcome(changed=True, command=("mem", "remark", node), output=self.fenced[node])


def config(tmp_path: Path, nodes: int = 4, **kw: Any) -> AggregatorConfig:
    base: dict[str, Any] = dict(
        db=tmp_path / "agg.db",
        nodes=tuple(NodeEntry(name=f"dgx{i:02d}", partition="batch") for i in range(1, nodes + 1)),
        healthy_for=3600.0, decide_interval=0.05,
        # Tests here post for nodes they make up; test_aggregator_auth covers learn_nodes' default (off).
        learn_nodes=True,
    )
    base.update(kw)
    return AggregatorConfig(**base)


@contextlib.asynccontextmanager
async def running(cfg: AggregatorConfig, fencers: list[Any] | None = None, housekeeping: float = 0.1,
                  middlewares: Sequence[Any] = (), clock: Callable[[], float] = time.time
                  ) -> AsyncIterator[tuple[Aggregator, str]]:
    """An aggregator with its HTTP server on a free loopback port; always stopped afterwards.
    `middlewares` go in front of its routes (a test's proxy: recording or refusing requests);
    `clock`: its wall clock (a test shifts one replica's)."""
    agg = await Aggregator.open(cfg, fencers=fencers, clock=clock)
    agg.housekeeping_interval = housekeeping
    try:
        app = make_app(agg)
        app.middlewares.extend(middlewares)
        runner = web.AppRunner(app, access_log=None, **bodycoding.RUNNER_KWARGS)  # as the daemon's runner
        await runner.setup()
        try:
            port = free_port()
            site = web.TCPSite(runner, "127.0.0.1", port)
            await site.start()
            yield agg, f"http://127.0.0.1:{port}"
        finally:
            await runner.cleanup()
    finally:
        await agg.stop()  # idempotent: also when start() (runner.setup) failed half way


def post(url: str, body: Any, token: str | None = None, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """A blocking POST for subprocess tests (async tests use aiohttp)."""
    data = raw if raw is not None else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if token:
        h["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
