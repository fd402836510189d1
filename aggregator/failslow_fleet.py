"""The aggregator's fail-slow state: the probe results and job windows agents send, judged.

`POST /v1/perf` (a node's own credential, like /v1/reports) carries a node's latest probe round
and/or one job collection window:

    {"node": "dgx01", "profile": "dgx-h100", "driver": "550.90.12",
     "probes": [{"entity": "gpu3", "metric": "gemm_tflops", "value": 702.1, "firmware": "96.00.74.00.01"}, ...],
     "job": {"id": "4242", "owner": "alice",
             "gpus": [{"gpu": 0, "sm_active": 0.93, "power_w": 650, "sm_clock_mhz": 1980,
                       "throttle": ["thermal"], "nvlink_gbs": 120, "ib_gbs": 4.4}, ...]}}

`parse()` is pure and all-or-nothing (400 with the reason). `FailslowFleet` keeps the latest
result per (node, entity, metric), each entity's history and each running job's recent windows,
all in memory (bounded), all timed by the aggregator's clock. `judge(now)` runs the pure
aggregator/failslow.py and aggregator/stragglers.py and turns findings into conditions
(source "aggregator", check failslow_<metric>) through Memory.apply_verdict: from there they go
through the same rules, damping (min_duration), flap hold, caps, rate limit and breaker as
every other verdict. A finding that is gone closes its condition. Stragglers are WARN only:
shown, exported, alerted on; never a condition that could move a node or its job.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

from podhealth.aggregator import failslow, stragglers
from podhealth.aggregator.failslow import Finding, Key, Point, Sample, Scored
from podhealth.aggregator.state import Memory, Verdict
from podhealth.aggregator.store import Op
from podhealth.aggregator.stragglers import GpuObs, JobWindow, Straggler
from podhealth.config_failslow import METRICS, SHORT, FailslowAggConfig
from podhealth.hostnames import node_name_problem
from podhealth.vocab import Action, Status

MAX_NAME = 64
MAX_GPUS = 64
MAX_JOBS = 10_000
MAX_JOBS_PER_NODE = 64  # one per GPU, MIG slices and shared GPUs included; more is not a real node
JOB_GONE_S = 600.0  # a job no node has mentioned for this long has ended
CHECK_PREFIX = "failslow_"
# Probe rounds come every few hours per node: the fleet is scored again when figures arrived, and
# at least this often (figures age out of their cohorts; each scoring of 10,000 nodes costs seconds).
RESCORE_S = 3600.0


class BadPerf(ValueError):
    """The body is not what /v1/perf takes; the message says why."""


@dataclass(frozen=True)
class Probe:
    entity: str
    metric: str
    value: float
    firmware: str


@dataclass(frozen=True)
class JobPost:
    id: str
    owner: str
    gpus: tuple[GpuObs, ...]


@dataclass(frozen=True)
class PerfPost:
    node: str
    profile: str
    driver: str
    probes: tuple[Probe, ...]
    job: JobPost | None
    passive: tuple[tuple[str, str, float], ...] = ()  # entity, signal, value: the collectors' summary since the last round
    model: str = ""  # the node's GPU model as NVML names it


def _name(d: Mapping[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    v = d.get(key, "" if empty else None)
    if not isinstance(v, str) or (not v and not empty) or len(v) > MAX_NAME or not v.isprintable():
        raise BadPerf(f"{where}.{key}: expected a printable string of {'0' if empty else '1'} to {MAX_NAME} characters")
    return v


def _number(d: Mapping[str, Any], key: str, where: str) -> float:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise BadPerf(f"{where}.{key}: expected a finite number >= 0")
    return float(v)


def _obj(v: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise BadPerf(f"{where}: expected an object")
    return v


def _objects(d: Mapping[str, Any], key: str, limit: int) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Each object of the list body.<key> (absent: none; at most `limit`), with where it stands."""
    items = d.get(key, [])
    if not isinstance(items, list) or len(items) > limit:
        raise BadPerf(f"body.{key}: expected a list of at most {limit}")
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        yield where, _obj(item, where)


def parse(obj: Any, max_probes: int) -> PerfPost:
    d = _obj(obj, "body")
    node = _name(d, "node", "body")
    problem = node_name_problem(node)
    if problem:
        raise BadPerf(f"body.node: {problem}")
    probes = []
    for where, p in _objects(d, "probes", max_probes):
        metric = p.get("metric")
        if metric not in METRICS:
            raise BadPerf(f"{where}.metric: expected one of {', '.join(METRICS)}")
        probes.append(Probe(_name(p, "entity", where), str(metric), _number(p, "value", where),
                            _name(p, "firmware", where, empty=True)))
    job = None
    if d.get("job") is not None:
        j = _obj(d["job"], "body.job")
        gpus = j.get("gpus")
        if not isinstance(gpus, list) or not 0 < len(gpus) <= MAX_GPUS:
            raise BadPerf(f"body.job.gpus: expected a list of 1 to {MAX_GPUS}")
        obs = []
        for i, g in enumerate(gpus):
            where = f"body.job.gpus[{i}]"
            g = _obj(g, where)
            idx = g.get("gpu")
            if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < 1024:
                raise BadPerf(f"{where}.gpu: expected a GPU index 0..1023")
            thr = g.get("throttle", [])
            if not isinstance(thr, list) or len(thr) > 16 or not all(
                    isinstance(t, str) and 0 < len(t) <= 32 and t.isprintable() for t in thr):
                raise BadPerf(f"{where}.throttle: expected a list of at most 16 reason names")
            obs.append(GpuObs(node, idx, _number(g, "sm_active", where), _number(g, "power_w", where),
                              _number(g, "sm_clock_mhz", where), tuple(thr), _number(g, "nvlink_gbs", where),
                              _number(g, "ib_gbs", where) if "ib_gbs" in g else None))
        job = JobPost(_name(j, "id", "body.job"), _name(j, "owner", "body.job", empty=True), tuple(obs))
    passive = []
    for where, p in _objects(d, "passive", max_probes):
        v = p.get("value")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BadPerf(f"{where}.value: expected a finite number")
        passive.append((_name(p, "entity", where), _name(p, "signal", where), float(v)))
    if not probes and job is None:
        raise BadPerf("body: expected probes, a job window, or both")
    return PerfPost(node, _name(d, "profile", "body"), _name(d, "driver", "body"), tuple(probes), job, tuple(passive),
                    _name(d, "model", "body", empty=True))


class FailslowFleet:
    """Everything fail-slow the aggregator holds. Single-threaded: the event loop owns it."""

    def __init__(self, cfg: FailslowAggConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock  # the aggregator's: the reads' "now" (judge() and take() are given theirs)
        self.samples: dict[Key, Sample] = {}
        self.histories: dict[Key, tuple[Point, ...]] = {}
        self.scored = Scored((), {}, {}, {})
        self.scored_at = 0.0
        # job -> windows by start bucket (the agents' summaries of one window, merged)
        self.jobs: dict[str, dict[int, dict[tuple[str, int], GpuObs]]] = {}
        self.owners: dict[str, str] = {}
        self.job_seen: dict[str, float] = {}
        self.stragglers: tuple[Straggler, ...] = ()
        self.open: set[tuple[str, str, str]] = set()  # (node, check, entity) this opened
        self.passive: dict[str, tuple[float, tuple[tuple[str, str, float], ...]]] = {}  # node -> (at, summary)
        self.dirty = False  # figures arrived since the last scoring
        self.node_jobs: dict[str, dict[str, float]] = {}  # node -> its jobs -> last mentioned

    def take(self, post: PerfPost, now: float) -> int:
        """Store one node's post (probes timed by our clock); returns how many items it held.
        BadPerf, with nothing stored, for a node in more running jobs than a node can be."""
        if post.job is not None:
            mine = self.node_jobs.get(post.node, {})
            live = {k for k, t in mine.items() if now - t <= JOB_GONE_S} | {post.job.id}
            if len(live) > MAX_JOBS_PER_NODE:
                raise BadPerf(f"body.job: {post.node} is in more than {MAX_JOBS_PER_NODE} running jobs")
        for p in post.probes:
            s = Sample(post.node, p.entity, p.metric, p.value, now, post.profile, post.driver, p.firmware, post.model)
            self.samples[s.key] = s
            self.dirty = True
        if post.passive:
            self.passive[post.node] = (now, post.passive)
        if post.job is not None:
            j = post.job
            mine = self.node_jobs.setdefault(post.node, {})
            mine[j.id] = now
            for gone in [k for k, t in mine.items() if now - t > JOB_GONE_S]:
                del mine[gone]
            if j.id not in self.jobs and len(self.jobs) >= MAX_JOBS:
                oldest = min(self.job_seen, key=lambda k: self.job_seen[k])
                self._drop_job(oldest)
            bucket = int(now // self.cfg.window)
            windows = self.jobs.setdefault(j.id, {})
            win = windows.setdefault(bucket, {})
            for g in j.gpus:
                win[(g.node, g.gpu)] = g
            for b in sorted(windows)[:-(self.cfg.stragglers.of + 1)]:  # the judged ones and the one filling
                del windows[b]
            if j.owner:
                self.owners[j.id] = j.owner
            self.job_seen[j.id] = now
        return len(post.probes) + (1 if post.job is not None else 0)

    def _drop_job(self, job: str) -> None:
        self.jobs.pop(job, None)
        self.owners.pop(job, None)
        self.job_seen.pop(job, None)

    def forget_node(self, node: str) -> None:
        self.passive.pop(node, None)
        self.node_jobs.pop(node, None)
        for k in [k for k in self.samples if k[0] == node]:
            del self.samples[k]
            self.histories.pop(k, None)

    def judge(self, mem: Memory, now: float) -> list[Op]:
        """Score the fleet, name the stragglers, and open/close the findings' conditions (all at
        once; the service runs `compute` off the loop: judge_once in failslow_api.py)."""
        return self.apply(mem, now, *self.compute(*self.inputs(now), self.cfg, now))

    def inputs(self, now: float) -> tuple[list[Sample] | None, dict[Key, tuple[Point, ...]], list[list[JobWindow]]]:
        """Copies of what the judges read, taken on the loop (ingest goes on while they run);
        no samples (None) when nothing arrived and the last scoring is recent: it stands."""
        for job in [j for j, t in self.job_seen.items() if now - t > JOB_GONE_S]:
            self._drop_job(job)
        rescore = self.dirty or now - self.scored_at >= RESCORE_S or not self.cfg.judge.enabled
        self.dirty = self.dirty and not rescore
        return (list(self.samples.values()) if rescore else None), dict(self.histories), self._windows(now)

    @staticmethod
    def compute(samples: list[Sample] | None, histories: dict[Key, tuple[Point, ...]], windows: list[list[JobWindow]],
                cfg: FailslowAggConfig, now: float) -> tuple[Scored | None, tuple[Straggler, ...]]:
        """The pure judgements (seconds at 10,000 nodes: the service runs this off the event loop)."""
        strag = tuple(s for w in windows for s in stragglers.judge(w, cfg.stragglers)) if cfg.stragglers.enabled else ()
        if samples is None:
            return None, strag
        scored = failslow.score(samples, histories, cfg.judge, now) if cfg.judge.enabled else Scored((), {}, {}, {})
        return scored, strag

    def apply(self, mem: Memory, now: float, scored: Scored | None, strag: tuple[Straggler, ...]) -> list[Op]:
        self.stragglers = strag
        if scored is None:
            return []  # the last scoring stands: its conditions are open already
        self.scored = scored
        if not self.cfg.judge.enabled:
            return self._sync(mem, {}, now)
        self.histories = failslow.forget(scored.histories, self.samples)
        self.scored_at = now
        want: dict[tuple[str, str, str], Finding] = {}
        for f in self.scored.findings:
            key = (f.node, f.check, f.entity)
            cur = want.get(key)
            if cur is None or f.z < cur.z:
                want[key] = f
        return self._sync(mem, want, now)

    def _sync(self, mem: Memory, want: Mapping[tuple[str, str, str], Finding], now: float) -> list[Op]:
        ops: list[Op] = []
        for (node, check, entity), f in sorted(want.items()):
            if node not in mem.nodes:
                continue  # a node the aggregator forgot (or never took): nothing to hang it on
            v = Verdict(check, entity, f.status, f.action, now, f.text(now))
            ops += mem.apply_verdict(node, v, now, source="aggregator")[1]
            self.open.add((node, check, entity))
        # Close what no longer holds: a part judged again and found at its cohort, or one with no
        # figure for `max_age` (it aged out of its cohort). A part not judged yet (the aggregator
        # restarted and has no figures, or its cohort is too small now) keeps its condition.
        judged = {(n, failslow.check_name(m), e) for (n, e, m) in self.scored.z}
        for key in sorted(self.open - set(want)):
            node, check, entity = key
            cond = mem.conditions.get(key)
            if cond is None or node not in mem.nodes:
                self.open.discard(key)
                continue
            if key in judged or now - cond.observed > self.cfg.judge.max_age:
                self.open.discard(key)
                ops += mem.apply_verdict(node, Verdict(check, entity, Status.OK, Action.NONE, now, ""), now,
                                         source="aggregator")[1]
        return ops

    def adopt_open(self, conditions: Iterable[tuple[str, str, str]]) -> None:
        """At start: the fail-slow conditions the store holds are this module's to close."""
        self.open |= {k for k in conditions if k[1].startswith(CHECK_PREFIX)}

    def _windows(self, now: float) -> list[list[JobWindow]]:
        """Each running job's complete windows, oldest first (the current one is still filling)."""
        cur = int(now // self.cfg.window)
        return [[JobWindow(job, self.owners.get(job, ""), b * self.cfg.window, tuple(w.values()))
                 for b, w in sorted(windows.items()) if b < cur] for job, windows in sorted(self.jobs.items())]

    # ---- views ----------------------------------------------------------------------------------

    def outliers(self, metric: str | None, now: float) -> dict[str, Any]:
        """`GET /api/v1/failslow/outliers[?metric=gemm]`: the cohorts and their findings."""
        want = metric_name(metric)
        cohorts = []
        for key, c in sorted(self.scored.cohorts.items()):
            if want and key.metric != want:
                continue
            zs = sorted(z for (n, e, m), z in self.scored.z.items()
                        if m == key.metric and (s := self.samples.get((n, e, m))) is not None and s.cohort == key)
            cohorts.append({"metric": key.metric, "profile": key.profile, "driver": key.driver,
                            "firmware": key.firmware, "size": c.size, "median": c.median, "mad": c.mad,
                            "judged": c.judged, "z": [round(z, 2) for z in zs]})
        found = [f.to_json(now) for f in self.scored.findings if not want or f.metric == want]
        found.sort(key=lambda f: (f["z"], f["node"], f["entity"]))  # type: ignore[arg-type,return-value]
        return {"scored_at": self.scored_at, "cohorts": cohorts, "findings": found}

    def history(self, node: str, now: float) -> dict[str, Any]:
        """One node's entities: latest value, z and ratio history (the UI links each GPU here)."""
        out = []
        for key, pts in sorted(self.histories.items()):
            if key[0] != node:
                continue
            s = self.samples.get(key)
            out.append({"entity": key[1], "metric": key[2], "value": s.value if s else None,
                        "z": self.scored.z.get(key), "points": [
                            {"at": p.at, "ratio": round(p.ratio, 4), "z": round(p.z, 2), "flagged": p.flagged}
                            for p in pts]})
        at, summary = self.passive.get(node, (0.0, ()))
        return {"node": node, "entities": out, "passive_at": at,
                "passive": [{"entity": e, "signal": s, "value": v} for e, s, v in summary]}

    def stragglers_json(self) -> dict[str, Any]:
        return {"stragglers": [s.to_json() for s in self.stragglers]}


def metric_name(name: str | None) -> str:
    """`gemm` or `gemm_tflops` -> gemm_tflops; "" for none; BadPerf for another."""
    if not name:
        return ""
    for full, short in SHORT.items():
        if name in (full, short):
            return full
    raise BadPerf(f"unknown metric {name!r} (one of {', '.join(SHORT.values())})")


class Exported:
    """The fail-slow series on the aggregator's /metrics, computed at scrape time."""

    def __init__(self, fleet: "FailslowFleet") -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        f = self.fleet
        z = GaugeMetricFamily("podhealth_aggregator_failslow_finding_z",
                              "Robust z of a fail-slow finding against its cohort (median/MAD of the same profile,\n"
                              "driver and firmware), by node, entity (gpu3, gpu0-gpu5, mlx5_4), metric, status.",
                              labels=["node", "entity", "metric", "status", "profile", "driver"])
        for x in f.scored.findings:
            z.add_metric([x.node, x.entity, x.metric, x.status.value, x.cohort.key.profile, x.cohort.key.driver], x.z)
        yield z
        med = GaugeMetricFamily("podhealth_aggregator_failslow_cohort_median", "Median probe result of each cohort.",
                                labels=["metric", "profile", "driver", "firmware"])
        size = GaugeMetricFamily("podhealth_aggregator_failslow_cohort_size", "Entities with a fresh probe result in each cohort.",
                                 labels=["metric", "profile", "driver", "firmware"])
        for k, c in sorted(f.scored.cohorts.items()):
            med.add_metric([k.metric, k.profile, k.driver, k.firmware], c.median)
            size.add_metric([k.metric, k.profile, k.driver, k.firmware], c.size)
        yield med
        yield size
        jobs = GaugeMetricFamily("podhealth_aggregator_failslow_jobs",
                                 "Running jobs whose GPUs the aggregator compares (from the agents' job windows).")
        jobs.add_metric([], len(f.jobs))
        yield jobs
        named = GaugeMetricFamily("podhealth_aggregator_failslow_stragglers",
                                  "Likely stragglers named in running jobs now (podhealth_job_straggler has them).")
        named.add_metric([], len(f.stragglers))
        yield named
        # `job` as the issue names it; Prometheus renames a scraped `job` to `exported_job` (the
        # target's own `job` wins unless honor_labels), so `job_id` carries it as well: rules use that.
        st = GaugeMetricFamily("podhealth_job_straggler",
                               "1 per likely straggler of a running job (passive comparison of the job's GPUs and\n"
                               "nodes; WARN only), by job (and job_id), owner, node, gpu (empty: the node) and reason.",
                               labels=["job", "job_id", "owner", "node", "gpu", "reason"])
        for s in f.stragglers:
            st.add_metric([s.job, s.job, s.owner, s.node, s.gpu_label, s.reason], 1.0)
        yield st
