"""Fail-slow on a simulated fleet (sim/perfmodel.py + sim/failslow_eval.py): the bench's figures,
asserted on a smaller fleet, and the simulator's faults and spread they rest on."""

from __future__ import annotations

import statistics

import pytest

from podhealth.sim import faults, failslow_eval, perfmodel
from podhealth.sim.state import default_state

T0 = 1_700_000_000.0


@pytest.mark.parametrize("seed", [11, 12])
def test_recall_and_false_findings_on_a_small_fleet(seed: int) -> None:
    r = failslow_eval.evaluate(16, seed, fault_share=0.5)
    assert r.injected == 8
    assert r.recall >= 0.95, r.missed
    assert r.per_1000(r.false_warn) <= 1.0, r.false
    assert r.false_drain == 0, r.false


def test_slowdowns_of_exactly_five_percent_are_found() -> None:
    r = failslow_eval.evaluate(16, 21, fault_share=0.5, min_pct=5.0, max_pct=5.0)
    assert r.recall >= 0.95, r.missed
    assert r.false_warn == 0, r.false


def test_without_the_judge_nothing_is_found() -> None:
    """The figures come from the judge: with thresholds nothing can reach, recall is 0."""
    from dataclasses import replace
    from types import MappingProxyType

    from podhealth.config_failslow import METRICS, FailslowJudgeConfig, MetricRule

    blind = replace(FailslowJudgeConfig(), metrics=MappingProxyType(
        {m: MetricRule(warn_z=-1e9, baseline_drop_pct=1e9) for m in METRICS}))
    r = failslow_eval.evaluate(8, 3, cfg=blind, fault_share=0.5)
    assert r.injected and r.found == 0


def test_natural_spread_is_one_to_two_percent_and_deterministic() -> None:
    nodes = [default_state(f"dgx{i:02d}", "dgx-h100", now=T0) for i in range(16)]
    gemm = [r.value for n in nodes for r in perfmodel.fingerprint(n, 7, T0) if r.metric == "gemm_tflops"]
    assert len(gemm) == 128
    cv = statistics.pstdev(gemm) / statistics.mean(gemm)
    assert 0.005 < cv < 0.02
    assert 0.6 < statistics.mean(gemm) / 989 < 0.8  # about the typical fraction of the peak
    again = [r.value for n in nodes for r in perfmodel.fingerprint(n, 7, T0) if r.metric == "gemm_tflops"]
    assert gemm == again
    other = [r.value for n in nodes for r in perfmodel.fingerprint(n, 8, T0) if r.metric == "gemm_tflops"]
    assert gemm != other


def test_fingerprint_covers_gpus_pairs_and_hcas() -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    by = {}
    for r in perfmodel.fingerprint(st, 1, T0):
        by.setdefault(r.metric, []).append(r.entity)
    assert len(by["nvlink_gbs"]) == 28 and "gpu0-gpu7" in by["nvlink_gbs"]
    assert len(by["gemm_tflops"]) == 8
    assert sorted(by["rdma_gbs"]) == sorted({h.device for h in st.hcas if h.role == "compute"})


@pytest.mark.parametrize("tokens,entity,metric,pct", [
    (["fault=slow-gpu", "gpu=3", "pct=7"], "gpu3", "gemm_tflops", 7.0),
    (["fault=slow-hbm", "gpu=1"], "gpu1", "hbm_gbs", 10.0),
    (["fault=slow-hca", "device=mlx5_4", "pct=20"], "mlx5_4", "rdma_gbs", 20.0),
])
def test_slow_faults_slow_their_part_by_pct(tokens: list[str], entity: str, metric: str, pct: float) -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    f = faults.parse(tokens, T0 + 10)
    faults.validate(f, st)
    before = {(r.entity, r.metric): r.value for r in perfmodel.fingerprint(st, 1, T0 + 20)}
    after = {(r.entity, r.metric): r.value for r in perfmodel.fingerprint(st.with_fault(f), 1, T0 + 20)}
    assert after[(entity, metric)] == pytest.approx(before[(entity, metric)] * (1 - pct / 100))
    assert {k for k in before if before[k] != after[k]} == {(entity, metric)}


def test_slow_nvlink_slows_every_pair_of_its_gpu() -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    f = faults.parse(["fault=slow-nvlink", "gpu=2", "link=5", "pct=30"], T0)
    faults.validate(f, st)
    before = {r.entity: r.value for r in perfmodel.fingerprint(st, 1, T0) if r.metric == "nvlink_gbs"}
    after = {r.entity: r.value for r in perfmodel.fingerprint(st.with_fault(f), 1, T0) if r.metric == "nvlink_gbs"}
    changed = {e for e in before if after[e] < before[e] * 0.8}
    assert changed == {e for e in before if "gpu2" in e.split("-")}


def test_intermittent_throttle_is_on_half_of_each_period() -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    st = st.with_fault(faults.parse(["fault=thermal-throttle-intermittent", "gpu=4", "period=100", "pct=20"], T0))
    assert perfmodel.throttled(st, 4, T0 + 10) == pytest.approx(0.2)
    assert perfmodel.throttled(st, 4, T0 + 60) == 0.0
    assert perfmodel.throttled(st, 3, T0 + 10) == 0.0
    (w,) = [w for w in perfmodel.job_window(st, 1, T0 + 10) if w.gpu == 4]
    assert w.throttle == ("thermal",)


@pytest.mark.parametrize("tokens,msg", [
    (["fault=slow-gpu", "gpu=3", "pct=100"], "below 100"),
    (["fault=slow-gpu", "gpu=3", "pct=-1"], "finite number > 0"),
    (["fault=slow-gpu", "pct=5"], "needs gpu"),
    (["fault=slow-hca", "device=mlx5_4", "gpu=1"], "takes"),
])
def test_bad_slow_faults_are_refused(tokens: list[str], msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        faults.parse(tokens, T0)


def test_slow_hca_must_name_an_hca_of_the_node() -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    with pytest.raises(ValueError, match="has HCAs"):
        faults.validate(faults.parse(["fault=slow-hca", "device=mlx5_99"], T0), st)


def test_intermittent_throttle_shows_in_the_simulated_nvml() -> None:
    from podhealth.sim import nvml_lib

    st = default_state("dgx01", "dgx-h100", now=T0)
    st = st.with_fault(faults.parse(["fault=thermal-throttle-intermittent", "gpu=4", "period=100", "pct=20"], T0))
    hot, cool = nvml_lib.gpu_view(st, 4, T0 + 10), nvml_lib.gpu_view(st, 4, T0 + 60)
    assert hot.clocks[1] == int(1980 * 0.8) and hot.reasons & nvml_lib.REASON_HW_THERMAL
    assert not cool.reasons & nvml_lib.REASON_HW_THERMAL and cool.clocks[1] < hot.clocks[1]
    assert not nvml_lib.gpu_view(st, 3, T0 + 10).reasons & nvml_lib.REASON_HW_THERMAL


def test_every_gpu_profile_has_peaks_and_a_simulated_fingerprint() -> None:
    """The one list of profiles (checks/data/profiles.yaml): a new GPU kind needs its peaks too."""
    from podhealth.checks import perf_peaks, profiles
    from podhealth.sim.state import simulated_profiles

    for name in profiles.names():
        if name == "generic":
            continue
        assert perf_peaks.peaks(name) is not None, f"{name}: no entry in checks/data/perf_peaks.yaml"
    for name in simulated_profiles():
        st = default_state("n1", name, now=T0)
        got = perfmodel.fingerprint(st, 1, T0)
        assert len([r for r in got if r.metric == "gemm_tflops"]) == len(st.gpus), name


def test_a_gpu_running_a_job_computes_in_the_simulated_nvml() -> None:
    from podhealth.sim import nvml_lib

    st = default_state("dgx01", "dgx-h100", now=T0)
    idle, busy = nvml_lib.gpu_view(st, 0, T0), nvml_lib.gpu_view(st, 0, T0, loaded=True)
    assert (idle.utilization, idle.clocks[1]) == (nvml_lib.IDLE_UTIL_GPU, 345)
    assert busy.utilization == nvml_lib.LOADED_UTIL_GPU and busy.clocks[1] >= 1980 * 0.98
    assert not busy.reasons & nvml_lib.REASON_IDLE and busy.power_mw > 600_000
    hot = st.with_fault(faults.parse(["fault=thermal", "gpu=0"], T0))
    assert nvml_lib.gpu_view(hot, 0, T0, loaded=True).clocks[1] == 990  # held down while it works
