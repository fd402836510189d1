"""Verdicts inside the agent: /health, the check_status/node_health series, the handover endpoint.

`install(agent)` adds the checks engine to a built (not yet started) Agent as its judge, a plugin
(agent/plugin.py) given the agent's `AgentView`, with the endpoints that share its credential:
- after every snapshot change the Evaluator judges it (damped), and the latest results become
  the node report served at GET /health and rendered as `check_status` / `node_health`;
- POST /v1/handover (signed with this node's agent key, agent/nodeauth.py; closed without one;
  never cross-site; a JSON body) collects every source afresh, runs
  the handover suite undamped and streams progress as NDJSON (or answers one JSON report when
  the client does not ask for a stream);
- verdict transitions and new XID/SXid events go to the optional `on_transition` / publisher.

The fast path: new kernel-log events (an XID 79 line) are judged at once by the `immediate`
checks they feed (checks/data/rules.yaml: xid, kernel_ras), without waiting for the end of the
snapshot burst or the other checks, and their transitions go out straight away. The full
evaluation that follows finds the same verdict and publishes nothing twice; a full evaluation of
an older snapshot that finishes later cannot take the fast verdict back (`_fast_hold`).
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, TypeVar

from aiohttp import web

from podhealth import bodycoding, log, webguard
from podhealth.agent.metrics.family import Family
from podhealth.agent.nodeauth import StreamHash
from podhealth.agent.plugin import AgentView, Plugin
from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.checks.handover.suite import ActiveTest, run_suite
from podhealth.checks.handover.report import SuiteReport
from podhealth.snapshot import Snapshot
from podhealth.worker import Worker, call_off_loop
from podhealth.vocab import Action, CheckResult, MetricSpec, NodeReport, Sample, Status

if TYPE_CHECKING:
    from podhealth.agent.agent import Agent
    from podhealth.agent.jobmap import JobMap

_log = log.get("podhealth.agent.health")

CHECK_STATUS = MetricSpec("check_status", "gauge",
                          "Verdict of one check about one entity: 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN.")
NODE_HEALTH = MetricSpec("node_health", "gauge",
                         "The node's verdict (worst check): 0 OK, 1 WARN, 2 FAIL, 3 UNKNOWN; `action` is the worst FAIL action.")
# The collectors whose events the fast path judges (the kernel log; NVML XID events come through it too).
EVENT_SOURCES = ("kmsg",)
# A snapshot that brings no new reading (the kernel-log collector's once-a-second run on a quiet
# node: same counters, no events) is judged only when the last judgement is this old, for what
# changes with time alone (an XID leaving checks.rate_window, the end of a grace period).
REJUDGE_S = 5.0
# (old, new, evaluated at): the time is the evaluation's, as the report that follows carries it.
Transition = Callable[[CheckResult | None, CheckResult, float], None]
T = TypeVar("T")
HANDOVER_BODY_MAX = 64 * 1024  # {"reason": ...}
BODY_TIMEOUT_S = 30.0  # seconds the body may take after its head (core/bodyread.py)


class Health(Plugin):
    """The judge: the agent's verdicts, /health and the handover suite."""

    name = "health"

    def __init__(self, agent: AgentView, active_tests: Callable[[], list[ActiveTest]] | None = None) -> None:
        self.agent = agent
        cfg = agent.cfg
        self.profile = profiles.of_config(cfg)
        self.mounts = [m.path for m in cfg.collectors.nfs.mounts] if cfg.collectors.nfs.enabled else []
        self.evaluator: Evaluator | None = None
        self.results: tuple[CheckResult, ...] = ()
        self.evaluated_at = 0.0
        self.on_transition: list[Transition] = []
        self.active_tests = active_tests or (lambda: [])
        self._handover_lock = asyncio.Lock()
        self.last_handover: tuple[float, SuiteReport] | None = None  # (when, report): the evidence bundle's
        self._latest: Snapshot | None = None
        self._latest_version = 0  # the store's version when _latest was handed over
        self._judged: Snapshot | None = None
        self._judging: asyncio.Task[None] | None = None
        self._fast: asyncio.Task[None] | None = None
        self._fast_pending = False
        # (check, entity) -> (fast verdict, store version it judged): kept until a full evaluation
        # of that version or a newer one has judged the same facts.
        self._fast_hold: dict[tuple[str, str], tuple[CheckResult, int]] = {}
        self.jobmap: "JobMap | None" = None  # which job holds each GPU (agent/jobmap.py): GPU evidence names it
        # One thread: evaluations are serial (the Evaluator keeps rate and damping state).
        self._worker: Worker[Any] = Worker("health")

    # ---- continuous judgement -------------------------------------------------------------------

    def _ensure_evaluator(self, snap: Snapshot) -> Evaluator:
        if self.evaluator is None:
            enabled = [n for n, st in snap.collectors.items() if st.enabled or n in self.agent.collectors()]
            # The checks remember events past the snapshot's ring (collectors.kmsg.keep_events, 256):
            # 4x it (1,024 by default), so the bound is the config's too.
            self.evaluator = Evaluator(self.profile, self.agent.cfg.checks, mounts=self.mounts, enabled=enabled,
                                       keep_events=4 * self.agent.cfg.collectors.kmsg.keep_events)
        return self.evaluator

    def on_snapshot(self, snap: Snapshot) -> None:
        """Called on the loop after a burst of snapshot changes: only schedules a judgement.

        Judging runs in a worker thread (a few ms for a DGX node, more on a loaded host), and
        changes that arrive while it runs are coalesced into one more pass over the newest
        snapshot, so the event loop never waits on the rules.
        """
        if not self._material(snap):
            return
        self._latest = snap
        self._latest_version = self.agent.store_version()
        if self._judging is None or self._judging.done():
            self._judging = asyncio.get_running_loop().create_task(self._judge_loop(), name="health-judge")

    def _material(self, snap: Snapshot) -> bool:
        """Whether `snap` can change a verdict: new events, or some collector's readings,
        staleness or errors changed since the last snapshot judged (or REJUDGE_S passed). A
        run that only moved a last-success stamp costs a full evaluation (~2 ms on a DGX node,
        every second for the kernel log) and changes nothing."""
        prev = self._latest or self._judged
        if prev is None or snap.events is not prev.events or time.time() - self.evaluated_at >= REJUDGE_S:
            return True
        if snap.collectors.keys() != prev.collectors.keys():
            return True
        for name, st in snap.collectors.items():
            old = prev.collectors[name]
            if st is not old and (st.samples != old.samples or st.stale != old.stale
                                  or st.enabled != old.enabled or st.errors != old.errors):
                return True
        return False

    async def _judge_loop(self) -> None:
        while self._latest is not None and self._latest is not self._judged:
            snap, version = self._latest, self._latest_version
            self._judged = snap
            now = time.time()
            try:
                ev = self._ensure_evaluator(snap)
                results = await self._worker.submit(lambda: ev.evaluate(snap, now, between=self._worker.between))
            except Exception as e:  # noqa: BLE001 - a bug in a rule must not take the agent down
                _log.error("check evaluation failed", error=repr(e))
                return
            self._publish(self._over_fast(results, version), now)

    # ---- the fast path ------------------------------------------------------------------------

    def on_events(self, events: tuple[object, ...]) -> None:
        """New events in the store (on the loop): judge the immediate checks they feed now."""
        if not events or self.evaluator is None:
            return  # before the first judgement: that one sees the events anyway
        self._fast_pending = True
        if self._fast is None or self._fast.done():
            self._fast = asyncio.get_running_loop().create_task(self._fast_loop(), name="health-fast")

    async def _fast_loop(self) -> None:
        while self._fast_pending and self.evaluator is not None:
            self._fast_pending = False
            snap, version = self.agent.snapshot(), self.agent.store_version()
            now = time.time()
            try:
                # The full evaluation's thread (the Evaluator is not thread-safe), ahead of what is
                # queued there and between two checks of an evaluation in flight, not after it.
                judge = self.evaluator.judge_immediate
                results = await self._worker.submit_first(lambda: judge(snap, now, EVENT_SOURCES))
            except Exception as e:  # noqa: BLE001 - the full evaluation still runs
                _log.error("fast check evaluation failed", error=repr(e))
                return
            self._merge_fast(results, version, now)

    def _merge_fast(self, fresh: tuple[CheckResult, ...], version: int, now: float) -> None:
        """Fold fast verdicts into the current results: transitions go out now, once."""
        if not fresh:
            return
        for r in fresh:
            self._fast_hold[(r.check, r.entity)] = (r, version)
        by_key = {(r.check, r.entity): r for r in fresh}
        merged = [by_key.pop((r.check, r.entity), r) for r in self.results]
        merged.extend(by_key.values())  # entities not judged before (a GPU's first XID)
        self._publish(tuple(merged), now)

    def _over_fast(self, results: tuple[CheckResult, ...], version: int) -> tuple[CheckResult, ...]:
        """A full evaluation of a snapshot older than a fast verdict's keeps the fast verdict."""
        if not self._fast_hold:
            return results
        newer = {k: r for k, (r, v) in self._fast_hold.items() if v > version}
        self._fast_hold = {k: hv for k, hv in self._fast_hold.items() if k in newer}
        if not newer:
            return results
        out = [newer.pop((r.check, r.entity), r) for r in results]
        out.extend(newer.values())
        return tuple(out)

    def _publish(self, results: tuple[CheckResult, ...], now: float) -> None:
        if self.jobmap is not None:
            from podhealth.agent.jobmap import annotate

            results = annotate(results, self.jobmap.jobs)
        old = {(r.check, r.entity): r for r in self.results}
        for r in results:
            prev = old.get((r.check, r.entity))
            if prev is None or prev.status is not r.status or prev.action is not r.action:
                if prev is not None or r.status is not Status.OK:
                    _log.info("check transition", check=r.check, entity=r.entity,
                              old=prev.status.value if prev else None, new=r.status.value,
                              action=r.action.value, summary=r.summary)
                for cb in self.on_transition:
                    try:
                        cb(prev, r, now)
                    except Exception as e:  # noqa: BLE001
                        _log.warning("transition callback failed", error=repr(e))
        self.results = results
        self.evaluated_at = now
        self.agent.invalidate()  # check_status / node_health changed without a new snapshot

    def report(self) -> NodeReport:
        snap = self.agent.snapshot()
        stale = tuple((n, round(time.time() - st.last_success, 3) if st.last_success else -1.0)
                      for n, st in sorted(snap.collectors.items()) if st.enabled)
        return NodeReport(self.agent.node, self.agent.version, self.profile.name, self.results, stale, self.evaluated_at)

    def families(self, snap: Snapshot) -> Iterable[Family]:
        results = self.results  # replaced whole on the loop; safe to read from the render thread
        samples = tuple(Sample.of("check_status", r.status.metric_value, check=r.check, entity=r.entity,
                                  action=r.action.value) for r in results)
        yield Family(CHECK_STATUS, samples)
        worst = Status.worst([r.status for r in results]) if results else Status.UNKNOWN
        action = Action.worst([r.action for r in results if r.status is Status.FAIL])
        yield Family(NODE_HEALTH, (Sample.of("node_health", worst.metric_value, action=action.value),))

    # ---- HTTP -----------------------------------------------------------------------------------

    def routes(self) -> Iterable[web.AbstractRouteDef]:
        return [web.get("/health", self.get_health), web.post("/v1/handover", webguard.same_site_only(self.post_handover))]

    async def get_health(self, request: web.Request) -> web.Response:
        body: dict[str, Any] = self.report().to_json()
        body["evaluated_at"] = self.evaluated_at
        return web.json_response(body)

    def handover_running(self) -> bool:
        return self._handover_lock.locked()

    async def admit(self, request: web.Request, limit: int = HANDOVER_BODY_MAX,
                    timeout: float = BODY_TIMEOUT_S) -> tuple[web.Response | None, bytes]:
        """(None, body) when this caller may run the handover suite (on a GPU node a 30 s burn-in
        and NCCL), reset a GPU (agent/gpureset.py) or take the evidence bundle (agent/bundle.py):
        a request signed with this node's agent key, fresh, never seen before
        (agent/nodeauth.py); else (the refusal, b""). A cross-site browser request was already
        refused (webguard.same_site_only)."""
        if not webguard.is_json(request):  # an HTML form cannot send it
            return web.json_response({"error": "expected Content-Type: application/json"}, status=415), b""
        problem = bodycoding.unsupported(bodycoding.header_of(request.headers.getall("Content-Encoding", [])))
        if problem is not None:  # the body arrives as sent; bodycoding.decode reads what is not refused here
            return web.json_response({"error": problem}, status=415), b""
        return await self.agent.auth.admit(request, limit, timeout)

    async def post_handover(self, request: web.Request) -> web.StreamResponse:
        refusal, _ = await self.admit(request)
        if refusal is not None:
            return refusal
        if self._handover_lock.locked():
            return web.json_response({"error": "a handover suite is already running"}, status=409)
        stream = "application/x-ndjson" in request.headers.get("Accept", "")
        async with self._handover_lock:
            if not stream:
                rep = await self.run_handover()
                return web.json_response(rep.to_json())
            resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
            await resp.prepare(request)
            sent = StreamHash()  # the stream ends with a proof over every line (agent/nodeauth.py)
            queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

            def progress(step: str, done: int, total: int) -> None:
                queue.put_nowait({"type": "progress", "step": step, "done": done, "total": total})
            task = asyncio.get_running_loop().create_task(self.run_handover(progress))
            while not task.done() or not queue.empty():
                getter = asyncio.ensure_future(queue.get())
                await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    await resp.write(sent.add(json.dumps(getter.result()).encode() + b"\n"))
                else:
                    getter.cancel()
            try:
                rep = task.result()
                await resp.write(sent.add(json.dumps({"type": "report", "report": rep.to_json()}).encode() + b"\n"))
            except Exception as e:  # noqa: BLE001
                await resp.write(sent.add(json.dumps({"type": "error", "error": f"{type(e).__name__}: {e}"}).encode()
                                          + b"\n"))
            await resp.write(self.agent.auth.stream_proof(request, resp.status, sent.hexdigest()))
            await resp.write_eof()
            return resp

    async def run_handover(self, progress: Callable[[str, int, int], None] | None = None) -> SuiteReport:
        # Deciding which active tests can run may probe CUDA in a subprocess: not on the loop.
        tests = await call_off_loop("handover-tests", self.active_tests)
        rep = await run_suite(self.agent.cfg, _AgentSource(self.agent.collect_now), self.agent.node, progress, tests)
        self.last_handover = (time.time(), rep)
        return rep

    async def on_evaluator(self, fn: Callable[[Evaluator], T]) -> T | None:
        """fn(evaluator) in the evaluator's own thread (it is not thread-safe: the rate history
        changes while it judges); None before the first judgement."""
        ev = self.evaluator
        if ev is None:
            return None
        return await self._worker.submit(lambda: fn(ev))


class _AgentSource:
    """Fresh data for the handover suite from the agent's own scheduler."""

    def __init__(self, collect_now: Callable[[], Awaitable[Snapshot]]) -> None:
        self._collect_now = collect_now

    async def collect_now(self) -> Snapshot:
        return await self._collect_now()


def install(agent: "Agent", active_tests: Callable[[], list[ActiveTest]] | None = None) -> Health:
    from podhealth.checks.passive import xid

    xid.load_catalog()  # parse the catalog now, not inside the first evaluation
    view = agent.view()
    h = Health(view, active_tests)
    agent.add_judge(h)
    from podhealth.agent import gpureset

    # POST /v1/gpu-reset, behind the same credential as the handover suite
    agent.add_plugin(gpureset.GpuReset(view.cfg.gpu_reset, view.cfg.paths.nvml_library, h.admit,
                                       busy=h.handover_running, invalidate=view.invalidate))
    from podhealth.agent import bundle

    agent.add_plugin(bundle.Bundles(view, h))  # POST /v1/bundle (the evidence for an RMA ticket), the same credential
    from podhealth.agent import jobmap

    h.jobmap = jobmap.install(agent)  # the job on each GPU, in GPU evidence and dcgm-exporter's files
    return h
