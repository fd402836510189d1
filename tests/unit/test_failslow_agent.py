"""agent/failslow.py: probes only on an idle node (never during a job, never when it cannot tell),
with jitter; results on /metrics and at a real aggregator; job windows sent while a job runs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.agent import failslow
from podhealth.agent.failslow import FailslowSink
from podhealth.config import PublishConfig
from podhealth.config_aggregator import AggAuthConfig
from podhealth.config_failslow import FailslowProbeConfig
from podhealth.sim import perfmodel
from podhealth.sim.state import default_state
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Sample
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_api import call

pytestmark = pytest.mark.timeout(60)
NOW = 1_800_000_000.0


def state(name: str, samples: list[Sample], *, ok: bool = True) -> CollectorState:
    return CollectorState(name, samples=tuple(samples), last_success=NOW if ok else None, last_attempt=NOW,
                          stale=not ok)


def snap(*, jobs: list[Sample] | None = None, jobs_ok: bool = True, util: float = 0.0, with_jobs: bool = True,
         extra: list[Sample] | None = None) -> Snapshot:
    gpu = [Sample.of("gpu_utilization_ratio", util, gpu="0"),
           Sample.of("gpu_info", 1, gpu="0", driver_version="550.90.12", vbios_version="96.00.74.00.01",
                     model="NVIDIA H100 80GB HBM3")]
    cols = {"nvml": state("nvml", gpu + (extra or []))}
    if with_jobs:
        cols["jobs"] = state("jobs", [Sample.of("job_source_up", 1, source="records")] + (jobs or []), ok=jobs_ok)
    return Snapshot(NOW, cols)


JOB = Sample.of("gpu_job_info", 1, gpu="0", job_id="4242", scheduler="slurm", user="alice")


@pytest.mark.parametrize("s,expect", [
    (snap(), True),
    (snap(jobs=[JOB]), False),
    (snap(util=0.6), False),                       # a GPU busy outside any scheduler
    (snap(jobs_ok=False), None),                   # the jobs collector failed: cannot tell
    (snap(with_jobs=False), None),                 # no jobs collector at all
    (snap(jobs=[Sample.of("job_source_up", 0, source="kubelet")]), None),  # a source unreadable
    (Snapshot(NOW, {"jobs": state("jobs", [])}), None),  # no job source on the node: cannot tell
])
def test_idle_truth_table(s: Snapshot, expect: bool | None) -> None:
    assert failslow.idle(s) is expect


class Clock:
    def __init__(self) -> None:
        self.t = NOW

    def __call__(self) -> float:
        return self.t


def sink(publish: PublishConfig | None = None, probe: Any = None, clock: Clock | None = None,
         **kw: Any) -> FailslowSink:
    cfg = FailslowProbeConfig(enabled=True, idle_for=300, **kw)
    st = default_state("dgx01", "dgx-h100", now=NOW)
    readings = [(r.entity, r.metric, r.value, r.firmware) for r in perfmodel.fingerprint(st, 1, NOW)]
    calls: list[int] = []

    async def fake() -> list[tuple[str, str, float, str]]:
        calls.append(1)
        return readings

    s = FailslowSink(cfg, publish or PublishConfig(), "dgx01", "dgx-h100", probe=probe or fake, clock=clock or Clock(),
                     rng=random.Random(4))
    s.calls = calls  # type: ignore[attr-defined]
    return s


async def test_never_probes_during_a_job_or_when_it_cannot_tell() -> None:
    clock = Clock()
    s = sink(clock=clock)
    assert not await s.probe_once()  # no snapshot yet
    await s.on_snapshot(snap(jobs=[JOB]))
    clock.t += 3600
    assert not await s.probe_once()
    await s.on_snapshot(snap(jobs=[JOB]))  # the job's last snapshot
    await s.on_snapshot(snap())  # the job ended now: idle_for (300 s) has not passed
    clock.t += 299
    assert not await s.probe_once()
    await s.on_snapshot(snap(jobs_ok=False))
    clock.t += 600
    assert not await s.probe_once()
    assert s.calls == []  # type: ignore[attr-defined]
    assert s.rounds["skipped_busy"] == 2 and s.rounds["skipped_unknown"] == 2
    await s.on_snapshot(snap())
    clock.t += 301
    assert await s.probe_once()
    assert len(s.calls) == 1 and len(s.latest) == 76  # type: ignore[attr-defined]


async def test_a_job_that_starts_during_the_probe_voids_it() -> None:
    clock = Clock()
    holder: dict[str, FailslowSink] = {}

    async def probe() -> list[tuple[str, str, float, str]]:
        await holder["s"].on_snapshot(snap(jobs=[JOB]))
        return [("gpu0", "gemm_tflops", 700.0, "")]

    s = holder["s"] = sink(probe=probe, clock=clock)
    await s.on_snapshot(snap())
    clock.t += 1000
    assert not await s.probe_once()
    assert s.latest == () and s.rounds["skipped_busy"] == 1


def test_jitter_spreads_the_rounds() -> None:
    s = sink(interval=3600, jitter=0.25)
    waits = [s.next_wait() for _ in range(200)]
    assert min(waits) >= 2700 and max(waits) <= 4500
    assert max(waits) - min(waits) > 1000


async def test_results_on_metrics_with_sku_driver_firmware() -> None:
    clock = Clock()
    s = sink(clock=clock)
    await s.on_snapshot(snap())
    clock.t += 1000
    assert await s.probe_once()
    fams = {f.spec.name: f for f in s.families(snap())}
    probes = fams["failslow_probe"].samples
    assert len(probes) == 76
    gemm0 = [x for x in probes if x.label("entity") == "gpu0" and x.label("metric") == "gemm_tflops"][0]
    assert (gemm0.label("sku"), gemm0.label("driver"), gemm0.label("firmware")) == \
        ("dgx-h100", "550.90.12", "96.00.74.00.01")
    fractions = fams["failslow_probe_fraction_of_peak"].samples
    assert len(fractions) == 8 and all(0.6 < x.value < 0.8 for x in fractions)


async def test_results_reach_a_real_aggregator(tmp_path: Path) -> None:
    auth = AggAuthConfig(node_tokens={"dgx01": "tok01"})
    async with running(config(tmp_path, auth=auth), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as http:
        clock = Clock()
        s = sink(PublishConfig(aggregator_url=url, token="tok01", timeout=5), clock=clock)
        await s.start()
        try:
            await s.on_snapshot(snap(extra=[Sample.of("gpu_temperature_celsius", 61, gpu="0")]))
            clock.t += 1000
            assert await s.probe_once()
            # the collectors' summary since the last round went along
            st, hist = await call(http, "GET", f"{url}/api/v1/failslow/nodes/dgx01")
            assert {"entity": "gpu0", "signal": "temp_margin_c", "value": 29.0} in hist["passive"]
            # 29 C from the limit is nothing to export; all of it went to the aggregator
            assert not [f for f in s.families(snap()) if f.spec.name == "failslow_window"][0].samples
            st, out = await call(http, "GET", f"{url}/metrics")
            assert 'podhealth_aggregator_ingest_requests_total{endpoint="perf",result="ok"} 1.0' in out
            # A job window while a job runs: sent to the same endpoint.
            await s.on_snapshot(snap(jobs=[JOB], extra=[Sample.of("gpu_sm_clock_hertz", 1.98e9, gpu="0"),
                                                        Sample.of("gpu_power_watts", 650, gpu="0")]))
            assert s.sent_windows == 1
            st, out = await call(http, "GET", f"{url}/metrics")
            assert 'podhealth_aggregator_ingest_requests_total{endpoint="perf",result="ok"} 2.0' in out
        finally:
            await s.stop()


def test_model_and_driver_come_from_the_nvml_samples() -> None:
    assert (failslow.model_of(snap()), failslow.driver_of(snap())) == ("NVIDIA H100 80GB HBM3", "550.90.12")
    assert failslow.model_of(Snapshot(NOW, {})) == ""


def test_job_window_body() -> None:
    extra = [Sample.of("gpu_sm_clock_hertz", 1.2e9, gpu="0"), Sample.of("gpu_power_watts", 500, gpu="0"),
             Sample.of("gpu_clocks_event_active", 1, gpu="0", reason="hw_thermal_slowdown"),
             Sample.of("gpu_clocks_event_active", 0, gpu="0", reason="sw_power_cap"),
             Sample.of("dcgm_sm_active_ratio", 0.97, gpu="0")]
    (body,) = failslow.job_windows(snap(jobs=[JOB], extra=extra), ib_gbs=40.0)
    assert body["id"] == "4242" and body["owner"] == "alice"
    (g,) = body["gpus"]
    assert (g["gpu"], g["sm_clock_mhz"], g["throttle"], g["sm_active"], g["ib_gbs"]) == (0, 1200.0, ["thermal"], 0.97,
                                                                                        40.0)
    (unknown,) = failslow.job_windows(snap(jobs=[JOB], extra=extra), ib_gbs=None)
    assert "ib_gbs" not in unknown["gpus"][0]  # not known is not sent as 0
    assert failslow.job_windows(snap(), ib_gbs=0) == []
    assert failslow.job_windows(snap(jobs=[JOB]), ib_gbs=0) == []  # no clock read: the GPU is left out


def test_default_config_sends_nothing_and_probes_nothing() -> None:
    from podhealth.agent.wiring import failslow_sink
    from podhealth.config import Config

    assert failslow_sink(Config(), "dgx01", {}) is None
    import dataclasses

    from podhealth.config_failslow import FailslowProbeConfig

    pushing = dataclasses.replace(Config(), publish=PublishConfig(aggregator_url="http://127.0.0.1:9"))
    assert failslow_sink(pushing, "dgx01", {}) is not None  # job windows for the stragglers
    quiet = dataclasses.replace(pushing, failslow=FailslowProbeConfig(job_windows=False))
    assert failslow_sink(quiet, "dgx01", {}) is None
