"""The agent's fail-slow sink: probe the node when it is idle, summarise running jobs, send both.

Probes (`failslow.enabled`): every `failslow.interval` (times 1 +- `jitter`, drawn afresh, so a
fleet never probes at once) the sink asks whether the node is idle, and only then runs one probe
round (`podhealth perfprobe --format json` in its own process: torch and CUDA never enter the
agent). Idle means, from the latest snapshot: the jobs collector is fresh, every job source it
has could be read, and no GPU has had a job (the prolog's record, the kubelet, cgroups) for
`idle_for` seconds, and no GPU is busy (NVML utilisation) either. Anything else is "not idle":
a probe never runs during a job, and never when the agent cannot tell.

Each result is exported on /metrics (`podhealth_failslow_probe{metric, entity, sku, driver,
firmware}` and `..._fraction_of_peak`) and POSTed to the aggregator's `/v1/perf`, which judges it
against the fleet (aggregator/failslow.py). A lost post is replaced by the next round.

Job windows (`failslow.job_window`): while a job runs, every window the sink sends that job's
GPUs as the collectors see them (SM activity, power, SM clock, throttle reasons, NVLink and IB
throughput); the aggregator compares the job's GPUs and nodes with each other (stragglers).
"""

from __future__ import annotations

import asyncio
import json
import random
import ssl
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from podhealth import log as plog
from podhealth.agent.failover import Replicas
from podhealth.agent.failslow_passive import PassiveWindow
from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.metrics.family import Family
from podhealth.agent.sink import Sink
from podhealth.checks import perf_peaks
from podhealth.checks.active.perfprobe import readings_of
from podhealth.checks.handover.report import SuiteReport
from podhealth.collectors.jobs import records_from_samples
from podhealth.config import PublishConfig
from podhealth.config_failslow import FailslowProbeConfig
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample
from podhealth.worker import call_off_loop

log = plog.get("podhealth.failslow")

PROBE = MetricSpec("failslow_probe", "gauge",
                   "Latest fail-slow probe result (labels metric: gemm_tflops, sm_clock_mhz, hbm_gbs, nvlink_gbs,\n"
                   "pcie_h2d_gbs, pcie_d2h_gbs, rdma_gbs; entity gpu3, gpu0-gpu5, mlx5_4; sku, driver, firmware).")
FRACTION = MetricSpec("failslow_probe_fraction_of_peak", "gauge",
                      "The GEMM probe result as a fraction of the profile's peak (checks/data/perf_peaks.yaml).")
ROUNDS = MetricSpec("failslow_probe_rounds", "counter",
                    "Probe rounds by result: done, skipped_busy (a job or a busy GPU), skipped_unknown (job state\n"
                    "not known), failed (nothing measured).")
LAST = MetricSpec("failslow_probe_last_seconds", "gauge", "Unix time of the last probe round that measured something.")
WINDOW = MetricSpec("failslow_window", "gauge",
                    "What the collectors saw between the last two probe rounds (agent/failslow_passive.py), by entity\n"
                    "and signal: throttle_<why>_s, clock_residency, pcie_replay_per_h, ecc_corrected_per_h,\n"
                    "temp_margin_c, ib_symbol_errors_per_h, ib_link_recovery_per_h.")
# NVML's clocks-event reasons (collectors/nvml.py CLOCKS_EVENT_REASONS) as a straggler's cause
THROTTLE = {"hw_thermal_slowdown": "thermal", "sw_thermal_slowdown": "thermal", "sw_power_cap": "power",
            "hw_power_brake_slowdown": "power", "hw_slowdown": "hw_slowdown"}
BUSY_UTILIZATION = 0.05
PROBE_GRACE_S = 120.0

Reading = tuple[str, str, float, str]  # entity, metric, value, firmware
ProbeFn = Callable[[], "asyncio.Future[list[Reading]] | Any"]


def idle(snap: Snapshot) -> bool | None:
    """True: no job and no busy GPU; False: a job or a busy GPU; None: cannot tell."""
    st = snap.collectors.get("jobs")
    if st is None or snap.stale("jobs") or not st.samples and st.last_success is None:
        return None
    up = [s.value for s in st.samples if s.name == "job_source_up"]
    if not up or 0 in up:
        return None  # no job source on this node (no prolog records, no kubelet), or one unreadable
    if records_from_samples(st.samples):
        return False
    if any(s.value > BUSY_UTILIZATION for s in snap.samples("gpu_utilization_ratio")):
        return False
    return True


def firmware_of(snap: Snapshot) -> dict[str, str]:
    """entity -> firmware label: each GPU's VBIOS, each HCA's firmware (from the collectors' info series)."""
    out: dict[str, str] = {}
    for s in snap.samples("gpu_info"):
        out[f"gpu{s.label('gpu')}"] = s.label("vbios_version")
    for s in snap.samples("infiniband_info"):
        out[s.label("device")] = s.label("firmware_version") or s.label("fw_ver")
    return out


def model_of(snap: Snapshot) -> str:
    """The GPUs' model as NVML names it (every sample of a GPU carries it)."""
    for s in snap.samples("gpu_info"):
        if s.label("model"):
            return s.label("model")
    return ""


def driver_of(snap: Snapshot) -> str:
    for s in snap.samples("gpu_info"):
        if s.label("driver_version"):
            return s.label("driver_version")
    return ""


@dataclass
class IbCounter:
    at: float
    total: float


def read_at(snap: Snapshot, collector: str) -> float | None:
    st = snap.collectors.get(collector)
    return None if st is None or snap.stale(collector) else st.last_success


def job_windows(snap: Snapshot, ib_gbs: float | None) -> list[dict[str, Any]]:
    """One body per running job on this node: its GPUs as the collectors see them now."""
    st = snap.collectors.get("jobs")
    if st is None or snap.stale("jobs"):
        return []
    jobs = records_from_samples(st.samples)
    if not jobs:
        return []
    per_gpu: dict[str, dict[str, Any]] = {}

    def gpu(s: Sample) -> dict[str, Any]:
        return per_gpu.setdefault(s.label("gpu"), {"throttle": []})

    for s in snap.samples("gpu_sm_clock_hertz"):
        gpu(s)["sm_clock_mhz"] = s.value / 1e6
    for s in snap.samples("gpu_power_watts"):
        gpu(s)["power_w"] = s.value
    for s in snap.samples("gpu_utilization_ratio"):
        gpu(s).setdefault("sm_active", s.value)
    for s in snap.samples("dcgm_sm_active_ratio"):
        gpu(s)["sm_active"] = s.value  # DCGM's profiling metric is the better one when it is there
    for s in snap.samples("dcgm_nvlink_tx_bytes_per_second"):
        gpu(s)["nvlink_gbs"] = gpu(s).get("nvlink_gbs", 0.0) + s.value / 1e9
    for s in snap.samples("gpu_clocks_event_active"):
        why = THROTTLE.get(s.label("reason"))
        if s.value and why and why not in gpu(s)["throttle"]:
            gpu(s)["throttle"].append(why)
    ngpu = max(1, len(per_gpu))
    out: dict[str, dict[str, Any]] = {}
    for index, recs in sorted(jobs.items()):
        g = per_gpu.get(str(index))
        if g is None or "sm_clock_mhz" not in g:
            continue  # a GPU the collectors did not read now: leave it out rather than guess
        for rec in recs:
            key = f"{rec.scheduler}:{rec.job_id}" if rec.scheduler == "slurm" else f"{rec.namespace}/{rec.pod}"
            body = out.setdefault(key, {"id": rec.job_id if rec.scheduler == "slurm" else key,
                                        "owner": rec.user or rec.namespace, "gpus": []})
            gpu_body = {"gpu": index, "sm_active": g.get("sm_active", 0.0), "power_w": g.get("power_w", 0.0),
                        "sm_clock_mhz": g["sm_clock_mhz"], "throttle": sorted(g["throttle"]),
                        "nvlink_gbs": g.get("nvlink_gbs", 0.0)}
            if ib_gbs is not None:
                gpu_body["ib_gbs"] = ib_gbs / ngpu
            body["gpus"].append(gpu_body)
    return list(out.values())


def ib_bytes(snap: Snapshot) -> float | None:
    """Bytes the node's InfiniBand ports moved (both ways), or None when not collected."""
    got = [s.value for n in ("infiniband_port_data_transmitted_bytes", "infiniband_port_data_received_bytes")
           for s in snap.samples(n)]
    return sum(got) if got else None


async def run_perfprobe(profile: str, budget: float) -> list[Reading]:
    """One probe round in its own process; [] when it measured nothing (logged)."""
    argv = [sys.executable, "-m", "podhealth", "perfprobe", "--format", "json", "--profile", profile,
            "--budget", f"{budget:g}"]
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), budget + PROBE_GRACE_S)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        log.warning("probe round did not finish in time", budget=budget)
        return []
    try:
        rep = SuiteReport.from_json(json.loads(out))
    except (ValueError, KeyError, TypeError):
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        log.warning("probe round gave no report", rc=proc.returncode, error=tail[0][:200])
        return []
    return [(e, m, v, "") for e, m, v in readings_of(rep.results)]


class FailslowSink(Sink):
    name = "failslow"

    def __init__(self, cfg: FailslowProbeConfig, publish: PublishConfig, node: str, profile: str, *,
                 probe: Callable[[], Any] | None = None, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, temp_limit_c: float = 90.0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.cfg, self.node, self.profile = cfg, node, profile
        self._probe = probe or (lambda: run_perfprobe(profile, cfg.budget))
        self._clock = clock
        self._rng = rng or random.Random()
        self._snap: Snapshot | None = None
        # Last time a job (or a busy GPU, or an unknown state) was seen; the agent's start counts:
        # idle_for must pass with the agent watching before the first round.
        self._busy_at = clock()
        self._tasks: list[asyncio.Task[None]] = []
        self._poster: Heartbeat | None = None
        if publish.urls():
            # The heartbeat's one way to POST to the aggregator replicas (token, timeout, failover).
            self._poster = Heartbeat(publish, tls=tls, node=node)
            self._poster.replicas = Replicas(publish.urls(), "/v1/perf", node)
        self.latest: tuple[tuple[str, str, float, str], ...] = ()
        self.passive = PassiveWindow(temp_limit_c)
        self.latest_passive: tuple[tuple[str, str, float], ...] = ()
        self.last_round = 0.0
        self.rounds: dict[str, int] = {"done": 0, "skipped_busy": 0, "skipped_unknown": 0, "failed": 0}
        self.sent_windows = 0
        self._window_at = 0.0
        self._ib: IbCounter | None = None

    async def start(self) -> None:
        if self._poster is not None:
            await self._poster.start()
        if self.cfg.enabled:
            self._tasks.append(asyncio.get_running_loop().create_task(self._probe_loop(), name="failslow-probe"))

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._poster is not None:
            await self._poster.stop()

    def next_wait(self) -> float:
        j = self.cfg.jitter
        return self.cfg.interval * (1.0 + self._rng.uniform(-j, j))

    async def _probe_loop(self) -> None:
        # The first round after a (fleet-wide) restart is spread over the jitter's share of an interval.
        cfg = self.cfg
        await asyncio.sleep(cfg.idle_for + self._rng.uniform(0.0, cfg.jitter * cfg.interval))
        while True:
            ran = self.rounds["done"] + self.rounds["failed"]
            try:
                await self.probe_once()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - a bug here must not end the probes for good
                log.error("probe round failed", error=repr(e))
            # A round skipped for a job (or an unknown state) is tried again once the node may be
            # idle; a round that ran (or could measure nothing) waits the interval.
            skipped = self.rounds["done"] + self.rounds["failed"] == ran
            await asyncio.sleep(min(cfg.idle_for, cfg.interval) if skipped else self.next_wait())

    def idle_now(self) -> bool | None:
        if self._snap is None:
            return None
        state = idle(self._snap)
        if state is not True:
            return state
        return self._clock() - self._busy_at >= self.cfg.idle_for

    async def probe_once(self) -> bool:
        """One round if the node is idle; True when something was measured (and sent)."""
        state = self.idle_now()
        if state is not True:
            self.rounds["skipped_unknown" if state is None else "skipped_busy"] += 1
            return False
        got = self._probe()
        readings: list[Reading] = list(await got) if asyncio.iscoroutine(got) or isinstance(got, asyncio.Future) \
            else list(got)
        if self.idle_now() is not True:
            # A job started while probing: the figures shared the GPU with it; throw them away.
            self.rounds["skipped_busy"] += 1
            return False
        if not readings:
            self.rounds["failed"] += 1
            return False
        fw = firmware_of(self._snap) if self._snap is not None else {}
        self.latest = tuple((e, m, v, f or fw.get(e.split("-")[0], "")) for e, m, v, f in readings)
        self.last_round = self._clock()
        self.rounds["done"] += 1
        self.latest_passive = tuple(self.passive.take())
        await self._send({"probes": [{"entity": e, "metric": m, "value": v, "firmware": f}
                                     for e, m, v, f in self.latest],
                          "passive": [{"entity": e, "signal": s, "value": v} for e, s, v in self.latest_passive]})
        return True

    async def _send(self, extra: Mapping[str, Any]) -> None:
        if self._poster is None:
            return
        driver = driver_of(self._snap) if self._snap is not None else ""
        body = {"node": self.node, "profile": self.profile, "driver": driver or "unknown",
                "model": model_of(self._snap)[:64] if self._snap is not None else "", **extra}
        status, answer = await self._poster.post(body)
        if status != 200:
            log.warning("fail-slow results not taken by the aggregator", status=status, answer=str(answer)[:200])

    async def on_snapshot(self, snap: Snapshot) -> None:
        self._snap = snap
        if self.cfg.enabled:
            self.passive.feed(snap)
        now = self._clock()
        if idle(snap) is not True:
            self._busy_at = now
        if not self.cfg.job_windows or now - self._window_at < self.cfg.job_window:
            return
        self._window_at = now
        # IB throughput over the whole window, timed by when the infiniband collector read the
        # counters: a rate between two snapshots a second apart swings with when each read landed.
        # Unknown (None: the first window, a counter reset) is left out, never sent as 0.
        ib_gbs: float | None = None
        total, at = ib_bytes(snap), read_at(snap, "infiniband")
        if total is not None and at is not None:
            if self._ib is not None and at > self._ib.at and total >= self._ib.total:
                ib_gbs = (total - self._ib.total) / (at - self._ib.at) / 1e9
            self._ib = IbCounter(at, total)
        for job in job_windows(snap, ib_gbs):
            self.sent_windows += 1
            await self._send({"job": job})

    def families(self, snap: Snapshot) -> Iterable[Family]:
        latest, sku = self.latest, self.profile
        driver = driver_of(snap)
        pk = perf_peaks.peaks(self.profile)
        yield Family(PROBE, tuple(Sample.of("failslow_probe", v, metric=m, entity=e, sku=sku, driver=driver,
                                            firmware=f) for e, m, v, f in latest))
        if pk is not None:  # GEMM only: the figure the issue compares with the peak (the series budget)
            yield Family(FRACTION, tuple(
                Sample.of("failslow_probe_fraction_of_peak", v / pk.peak(m), metric=m, entity=e, sku=sku)
                for e, m, v, f in latest if m == "gemm_tflops" and pk.peak(m) > 0))
        # Born with the first round of each result, as the project's other event counters are: a
        # node that only sends job windows (probes off) adds no series (the series budget).
        yield Family(ROUNDS, tuple(Sample.of("failslow_probe_rounds", float(n), result=k)
                                   for k, n in self.rounds.items() if n))
        if self.last_round:
            yield Family(LAST, (Sample.of("failslow_probe_last_seconds", self.last_round),))
        # Only what is out of the ordinary (the aggregator gets all of it): a healthy DGX adds no series here.
        yield Family(WINDOW, tuple(Sample.of("failslow_window", v, entity=e, signal=s)
                                   for e, s, v in self.latest_passive if unusual(s, v)))


def unusual(signal: str, value: float) -> bool:
    """A window signal worth a series at /metrics: any throttling or error, a clock that was not
    held near its maximum, a temperature within 10 C of the limit."""
    if signal == "clock_residency":
        return value < 0.95
    if signal == "temp_margin_c":
        return value < 10.0
    return value > 0


def probe_from(fn: Callable[[], Sequence[Reading]]) -> Callable[[], Any]:
    """A probe seam (the simulator's performance model) run off the loop."""
    async def run() -> list[Reading]:
        return list(await call_off_loop("failslow-probe", fn))
    return run
