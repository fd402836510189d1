"""What an executor is given (`run(pending, ctx)`): the fencers and the node's agent to talk to,
under the journal's one retrier, and the leader's current mirror to read, never to write (the
journal's end applies the Outcome an executor returns). Built once by the runner; the mirror is
read through `Context` at each use, so a takeover's new one is seen.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, TypeVar

import aiohttp

from podhealth import agentclient, log as plog
from podhealth.httpclient import Reply

from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.actions.journal import NotLeader, Pending
from podhealth.aggregator.context import Context
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.build import build_fencers
from podhealth.fencing.fence import (
    FenceError, FenceOutcome, FenceReason, FenceState, Fencer, Job, JobSource, NodeNames,
)

T = TypeVar("T")
log = plog.get("podhealth.aggregator")


@dataclass
class Ctx:
    cfg: AggregatorConfig
    fencers: list[Fencer]
    retrier: Callable[[Fencer, str, Callable[[], Awaitable[Any]]], Awaitable[Any]]  # Journal.call
    metrics: Metrics
    session: aiohttp.ClientSession
    context: Callable[[], Context]
    clock: Callable[[], float]
    acting: Callable[[], bool]
    epoch: Callable[[], int | None]
    _job_readers: list[Any] | None = None

    @property
    def mem(self) -> Memory:
        return self.context().mem

    async def call(self, fencer: Fencer, what: str, fn: Callable[[], Awaitable[T]]) -> T:
        """One call of `fencer` under the one retry policy (Journal.call)."""
        result: T = await self.retrier(fencer, what, fn)
        return result

    def target(self, fencer: Fencer, node: str) -> str:
        """The node's name in this fencer's backend (slurm_name, k8s_name, else the node's own)."""
        rec = self.mem.nodes.get(node)
        if rec is None:
            return fencer.target(NodeNames(node))
        return fencer.target(NodeNames(node, slurm=rec.slurm_name, kubernetes=rec.k8s_name))

    def marked(self, reason: FenceReason) -> FenceReason:
        """The reason a fencer writes into its mark: with this leader's epoch, so that a mark a
        deposed leader leaves late is told apart (aggregator/lifecycle.py)."""
        return dataclasses.replace(reason, epoch=self.epoch() or 0)

    async def read_all(self, node: str) -> list[tuple[Fencer, FenceState]]:
        out = []
        for f in self.fencers:
            target = self.target(f, node)
            st = await self.call(f, f"{f.name} read {target}", lambda f=f, t=target: f.read(t))  # type: ignore[misc]
            out.append((f, st))
        return out

    def audit_outcome(self, p: Pending, fencer: Fencer, what: str, o: FenceOutcome | FenceError) -> Op:
        if isinstance(o, FenceError):  # not done: the fencer's own account of why
            return Store.op_audit(self.clock(), p.node, p.who, f"{what} via {fencer.name}", p.why, o.command,
                                  o.error or o.output, False, p.id)
        return Store.op_audit(self.clock(), p.node, p.who, f"{what} via {fencer.name}", p.why, o.command,
                              o.output, True, p.id)

    def not_done(self, p: Pending, f: Fencer, what: str, target: str, e: FenceError, ops: list[Op]) -> str:
        """A call the fencer could not do: audited into `ops` like an outcome with the command it
        ran (the Outcome carries them); '<fencer> <what> <target>: why' for the action's result.
        One with no command (the backend did not answer before any was run) was never an outcome:
        it goes up."""
        if not e.command:
            raise e
        ops.append(self.audit_outcome(p, f, what, e))
        return f"{f.name} {what} {target}: {e.error or e.output}"

    async def ask_agent(self, node: str, url: str, payload: dict[str, Any], deadline_s: float) -> Reply:
        """POST `payload` to the node's agent, signed with its agent key; the answer only once
        its proof checks out (core/agentclient.py). No bearer credential crosses the wire. Asked
        only while this replica's lease holds, checked immediately before (the agent acts on it)."""
        if not self.acting():
            raise NotLeader(f"not leading: POST {url} not started")
        return await agentclient.ask_async(self.session, url, node, self.cfg.auth.agent_token_for(node), "POST",
                                           deadline_s=deadline_s, body=json.dumps(payload).encode(),
                                           headers={"Content-Type": "application/json"})

    def job_sources(self) -> list[Any]:
        """The backends that list and move jobs. In dry run the real Slurm/Kubernetes fencers are
        built for reading only (jobs()), so a dry run says which jobs each action would touch."""
        if self._job_readers is None:
            fencers = self.fencers
            if self.cfg.dry_run:
                try:
                    fencers = build_fencers(dataclasses.replace(self.cfg, dry_run=False))
                except Exception as e:  # noqa: BLE001 - a dry run must not fail for a backend it cannot reach
                    log.warning("dry run: cannot build the fencers to list jobs", error=str(e))
                    fencers = []
            self._job_readers = [f for f in fencers if isinstance(f, JobSource)]
        return self._job_readers

    async def list_jobs(self, node: str) -> list[tuple[Any, list[Job]]]:
        out = []
        for f in self.job_sources():
            target = self.target(f, node)
            jobs = await self.call(f, f"{f.name} jobs {target}", lambda f=f, t=target: f.jobs(t))  # type: ignore[misc]
            out.append((f, jobs))
        return out


__all__ = ["Ctx"]
