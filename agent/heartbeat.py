"""The agent's heartbeat to the aggregator: the node's state now, small when nothing changed.

Every `publish.report_interval` the agent POSTs to the aggregator's `/v1/reports`. Transitions
and events go through the disk spool (publisher.py) because each one matters; a heartbeat only
says how things are now, so a lost one is replaced by the next and is never spooled (which
also means it can overtake spooled transitions: the aggregator drops a report older than a
transition it applied).

A healthy node's ~100 verdicts stay the same for days while its report is ~16 KB of JSON, most of
it the same text every time. So, as Kubernetes nodes renew a Lease instead of posting their
whole NodeStatus, the agent sends the full report only when it must:
- the first time, and whenever a verdict (check, entity, status, action, since, summary) changed
  since the full report the aggregator took;
- every `publish.full_report_interval`, so evidence and live readings there stay fresh;
- when the aggregator answers a lease with 409 (it restarted, or took a transition since) or
  400 (it does not take leases).
Otherwise it sends a lease (~230 bytes) naming the digest the aggregator answered to that report.

As the agent's sink (agent/sink.py) it sends `report()` every `publish.report_interval` from
start() to stop(), skipping the beats before the first judgement (`report()` is None then).
"""

from __future__ import annotations

import asyncio
import ssl
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from podhealth import httpclient, log as plog
from podhealth.agent.failover import PushesToReplicas, Replicas
from podhealth.agent.pushsession import PushSession
from podhealth.agent.metrics.family import Family
from podhealth.agent.sequence import Sequencer
from podhealth.agent.sink import Sink
from podhealth.config import PublishConfig
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, NodeReport, Sample

log = plog.get("podhealth.heartbeat")
ANSWER_MAX_BYTES = 64 * 1024  # the aggregator answers a report with a few bytes of JSON

# What a lease vouches for: every field the aggregator takes from a result, evidence aside.
Projection = tuple[tuple[str, str, str, str, float, str], ...]

SPEC = MetricSpec("publish_heartbeats", "counter",
                  "Heartbeats to the aggregator by result: full (a full report taken), lease (a lease taken),\n"
                  "conflict (a lease refused, the full report sent at once), failed (not delivered).")


def projection(rep: NodeReport) -> Projection:
    return tuple((r.check, r.entity, r.status.value, r.action.value, r.since, r.summary) for r in rep.results)


def lease_body(rep: NodeReport, digest: str) -> dict[str, Any]:
    return {"node": rep.node, "time": rep.time, "digest": digest, "agent_version": rep.agent_version,
            "profile": rep.profile, "status": rep.status.value, "action": rep.action.value,
            "staleness": dict(rep.staleness)}


@dataclass
class HeartbeatStats:
    full: int = 0  # full reports the aggregator took
    leases: int = 0  # leases it took
    conflicts: int = 0  # leases it could not match (409), each followed by a full report
    failures: int = 0  # heartbeats that did not get through (the next one tries again)


class Heartbeat(Sink, PushesToReplicas):
    name = "heartbeat"

    def __init__(self, cfg: PublishConfig, clock: Callable[[], float] = time.monotonic,
                 sequencer: Sequencer | None = None,
                 report: Callable[[], NodeReport | None] | None = None,
                 tls: ssl.SSLContext | None = None, tls_reloads: Callable[[], int] | None = None,
                 node: str = "") -> None:
        """`report`: the node's report now (None before the first judgement); without it start()
        only opens the session and the caller sends (tests). `tls`: how https:// aggregators are
        verified, and this node's client certificate (core/tls.py; None: the system's trust store);
        `tls_reloads`: its reload count (agent/pushsession.py). `node`: this node's name, which
        picks its replica (agent/failover.py)."""
        self.cfg = cfg
        self.tls = tls
        self._tls_reloads = tls_reloads
        self._report = report
        self._task: asyncio.Task[None] | None = None
        self.sequencer = sequencer  # the publisher's: heartbeats and spooled records share one order
        self.replicas = Replicas(cfg.urls(), "/v1/reports", node)
        self.stats = HeartbeatStats()
        self._clock = clock
        self._digest: str | None = None  # the aggregator's name for the last full report it took
        self._sent: Projection | None = None  # that report's verdicts
        self._full_at = 0.0
        self._push: PushSession | None = None
        self._failing = False

    async def start(self) -> None:
        self._push = PushSession(self.cfg, self.tls, self._tls_reloads)
        if self._report is not None:
            self._task = asyncio.get_running_loop().create_task(self._beat(self._report), name="report-heartbeat")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._push is not None:
            await self._push.close()
            self._push = None

    async def _beat(self, report: Callable[[], NodeReport | None]) -> None:
        while True:
            await asyncio.sleep(self.cfg.report_interval)
            try:
                rep = report()
                if rep is not None:
                    await self.send(rep)
            except Exception as e:  # noqa: BLE001 - a bug here must not end the heartbeats for good
                log.error("heartbeat failed", error=repr(e))

    def families(self, snap: Snapshot) -> Iterable[Family]:
        b = self.stats  # ints the loop replaces: safe to read in the render thread
        yield Family(SPEC, tuple(
            Sample.of("publish_heartbeats", float(v), result=k)
            for k, v in (("full", b.full), ("lease", b.leases), ("conflict", b.conflicts), ("failed", b.failures))))

    def lease_for(self, rep: NodeReport) -> dict[str, Any] | None:
        """The lease to send instead of `rep`, or None when the full report must go."""
        if (self._digest is None or self._clock() - self._full_at >= self.cfg.full_report_interval
                or projection(rep) != self._sent):
            return None
        return lease_body(rep, self._digest)

    async def send(self, rep: NodeReport) -> bool:
        """One heartbeat; True when the aggregator took it."""
        lease = self.lease_for(rep)
        if lease is not None:
            status, answer = await self._post(lease)
            if status == 200:
                self.stats.leases += 1
                return self._ok()
            if status not in (400, 409):
                return self._failed(status, answer)
            # 409: it does not know that report (any more); 400: it does not take leases at all.
            self.stats.conflicts += 1
            log.info("aggregator did not take the lease: sending the full report", status=status, answer=answer)
            self._digest = None
        sent = projection(rep)
        status, answer = await self._post(rep.to_json())
        if status != 200:
            return self._failed(status, answer)
        self.stats.full += 1
        digest = answer.get("digest") if isinstance(answer, dict) else None
        # No digest (the report was stale there, or an aggregator without leases): full again next time.
        self._digest = digest if isinstance(digest, str) else None
        self._sent, self._full_at = sent, self._clock()
        return self._ok()

    def _ok(self) -> bool:
        if self._failing:
            log.info("heartbeat delivered again", url=self.url)
        self._failing = False
        return True

    def _failed(self, status: int, answer: Any) -> bool:
        self.stats.failures += 1
        if not self._failing:
            log.warning("heartbeat not delivered; retrying at the next interval", url=self.url, status=status,
                        answer=answer)
        self._failing = True
        return False

    async def post(self, body: dict[str, Any]) -> tuple[int, Any]:
        """POST `body` to the replicas (this object's path): the one way a sink of this agent sends
        the aggregator something, with the token, the timeout and the failover (agent/failslow.py)."""
        return await self._post(body)

    async def _post(self, body: dict[str, Any]) -> tuple[int, Any]:
        """(HTTP status or 0 when unreachable, the answer's JSON or text)."""
        assert self._push is not None, "start() first"
        headers = {"Content-Type": "application/json"}
        if self.cfg.token:
            headers["Authorization"] = f"Bearer {self.cfg.token}"
        if self.sequencer is not None:
            self.sequencer.stamp(body)  # at sending: a resent report is newer than what came between
        data = json.dumps(body, separators=(",", ":")).encode()
        session = await self._push.current()

        async def send(url: str) -> tuple[int, Any]:
            try:  # the whole exchange within publish.timeout (core/httpclient.py), the answer bounded
                r = await httpclient.exchange_async(session, "POST", url, deadline_s=self.cfg.timeout, body=data,
                                                    headers=headers, max_bytes=ANSWER_MAX_BYTES,
                                                    idempotent=True)  # a copy: stale by its seq, or /v1/perf's latest again
            except httpclient.ExchangeError as e:
                return 0, f"{e.kind}: {e}"
            text = r.body.decode(errors="replace")
            try:
                return r.status, json.loads(text)
            except (ValueError, RecursionError):
                return r.status, text[:500]
        return await self.replicas.post(send)

