"""aggregator/failslow.py: the pure judge of probe results against cohort and baseline."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import pytest

from podhealth.aggregator import failslow
from podhealth.aggregator.failslow import Sample
from podhealth.config_failslow import FailslowJudgeConfig, MetricRule
from podhealth.vocab import Action, Status

DAY = 86400.0
T0 = 1_700_000_000.0
# A cohort of 40 GPUs whose GEMM rates spread like real parts (+-2.5%, so z -4.5 is ~8% below), deterministic.
SPREAD = [1.0 + ((i * 37) % 21 - 10) / 400.0 for i in range(40)]


def fleet(at: float, *, slow: dict[int, float] | None = None, scale: float = 1.0, driver: str = "550.90.12",
          n: int = 40, metric: str = "gemm_tflops") -> list[Sample]:
    slow = slow or {}
    return [Sample(f"dgx{i:02d}", "gpu3", metric, 700.0 * SPREAD[i] * scale * (1 - slow.get(i, 0.0) / 100),
                   at, "dgx-h100", driver, "96.00.74.00.01") for i in range(n)]


def cfg(**rule: object) -> FailslowJudgeConfig:
    base = FailslowJudgeConfig()
    return replace(base, metrics=MappingProxyType({"gemm_tflops": replace(MetricRule(), **rule)}))


def run(rounds: list[list[Sample]], c: FailslowJudgeConfig) -> failslow.Scored:
    hist: dict[failslow.Key, tuple[failslow.Point, ...]] = {}
    out = None
    for samples in rounds:
        out = failslow.score(samples, hist, c, samples[0].at)
        hist = dict(out.histories)
    assert out is not None
    return out


def test_robust_statistics_ignore_the_outlier() -> None:
    med, mad = failslow.robust([100.0, 101.0, 99.0, 100.0, 50.0])
    assert med == 100.0
    assert mad == pytest.approx(1.4826)
    # identical values: the MAD floor (0.25% of the median) keeps z finite
    assert failslow.robust([10.0] * 5) == (10.0, pytest.approx(0.025))


@pytest.mark.parametrize("pct,found", [(0.0, False), (4.0, False), (12.0, True), (20.0, True)])
def test_cohort_outlier_without_history(pct: float, found: bool) -> None:
    out = failslow.score(fleet(T0, slow={5: pct}), {}, FailslowJudgeConfig(), T0)
    assert [f.node for f in out.findings] == (["dgx05"] if found else [])
    if found:
        f = out.findings[0]
        assert (f.status, f.action, f.by, f.check) == (Status.WARN, Action.NONE, "cohort", "failslow_gemm")
        assert f.below_pct == pytest.approx(pct + (1 - SPREAD[5]) * 100, abs=0.5)


def test_small_cohort_judges_nobody() -> None:
    out = failslow.score(fleet(T0, slow={3: 30.0}, n=10), {}, FailslowJudgeConfig(), T0)
    assert out.findings == ()
    (cohort,) = out.cohorts.values()
    assert (cohort.size, cohort.judged) == (10, False)


def test_drop_against_own_baseline_counts_before_the_fleet_notices() -> None:
    # 4.5% slower than it used to be: not an outlier of the fleet (z > -4.5), a drop for itself.
    rounds = [fleet(T0 + d * DAY) for d in range(5)] + [fleet(T0 + 9 * DAY, slow={7: 4.5})]
    out = run(rounds, FailslowJudgeConfig())
    (f,) = out.findings
    assert (f.node, f.by, f.status) == ("dgx07", "baseline", Status.WARN)
    assert f.z > -4.5
    assert f.text(T0 + 9 * DAY).endswith("was at the median 5 days ago")


def test_finding_reads_like_the_issue() -> None:
    rounds = [fleet(T0 + d * DAY) for d in range(3)] + [fleet(T0 + 12 * DAY, slow={0: 12.0})]
    (f,) = run(rounds, FailslowJudgeConfig()).findings
    text = f.text(T0 + 12 * DAY)
    assert text.startswith("gpu3 GEMM ")
    assert "% below the median of 40 dgx-h100 GPUs on 550.90.12 (z -" in text
    assert f.by == "cohort+baseline"


def test_finding_names_the_gpu_model_when_the_agent_sent_it() -> None:
    samples = [replace(s, model="NVIDIA H100 80GB HBM3") for s in fleet(T0, slow={3: 20.0})]
    (f,) = failslow.score(samples, {}, FailslowJudgeConfig(), T0).findings
    assert "below the median of 40 H100 80GB HBM3 GPUs on 550.90.12 (z -" in f.text(T0)
    hca = [replace(s, entity="mlx5_4", metric="rdma_gbs", model="NVIDIA H100 80GB HBM3") for s in samples]
    (h,) = failslow.score(hca, {}, FailslowJudgeConfig(), T0).findings
    assert "of 40 dgx-h100 HCAs" in h.text(T0)  # an HCA is not a GPU model


def test_fleet_wide_shift_flags_nobody() -> None:
    # Every GPU 6% slower on the same driver (a site-wide change): the median moves with them.
    rounds = [fleet(T0 + d * DAY) for d in range(5)] + [fleet(T0 + 6 * DAY, scale=0.94)]
    assert run(rounds, FailslowJudgeConfig()).findings == ()


def test_driver_upgrade_is_a_new_cohort_and_history_survives_it() -> None:
    # Half the fleet upgrades to a 3% slower driver; both cohorts keep >= min_cohort members.
    n = 40
    rounds = [fleet(T0 + d * DAY, n=n) for d in range(4)]
    mixed = fleet(T0 + 5 * DAY, n=n)[:20] + fleet(T0 + 5 * DAY, n=n, scale=0.97, driver="570.124.06")[20:]
    out = run(rounds + [mixed], FailslowJudgeConfig())
    assert out.findings == ()
    assert len(out.cohorts) == 2


def test_noise_floor_of_a_noisy_entity() -> None:
    # A GPU whose own probes scatter by ~2% needs 5x that before a baseline drop counts.
    noisy = [1.0, 1.03, 0.97, 1.02, 0.98, 1.0]
    rounds = []
    for d, k in enumerate(noisy):
        r = fleet(T0 + d * DAY)
        r[9] = replace(r[9], value=700.0 * SPREAD[9] * k)
        rounds.append(r)
    r = fleet(T0 + 7 * DAY)
    r[9] = replace(r[9], value=700.0 * SPREAD[9] * 0.955)
    assert run(rounds + [r], FailslowJudgeConfig()).findings == ()


@pytest.mark.parametrize("slows,drain", [
    ([0, 20.0], False),        # once at z <= -8: WARN only
    ([20.0, 20.0], True),      # twice in a row: DRAIN
    ([20.0, 0, 20.0], False),  # not in a row
])
def test_drain_needs_consecutive_probes_past_act_z(slows: list[float], drain: bool) -> None:
    rounds = [fleet(T0 + d * DAY) for d in range(3)]
    rounds += [fleet(T0 + (3 + i) * DAY, slow={4: s}) for i, s in enumerate(slows)]
    out = run(rounds, cfg(action="drain"))
    (f,) = out.findings
    assert (f.status, f.action) == ((Status.FAIL, Action.DRAIN) if drain else (Status.WARN, Action.NONE))


def test_drain_off_by_default() -> None:
    rounds = [fleet(T0 + d * DAY, slow={4: 30.0}) for d in range(4)]
    (f,) = run(rounds, FailslowJudgeConfig()).findings
    assert (f.status, f.action, f.streak) == (Status.WARN, Action.NONE, 2)


def test_flagged_points_stay_out_of_the_baseline() -> None:
    # Slow for 10 probes: still found against the baseline it had before it slowed.
    rounds = [fleet(T0 + d * DAY) for d in range(4)]
    rounds += [fleet(T0 + (4 + d) * DAY, slow={2: 4.5}) for d in range(10)]
    out = run(rounds, FailslowJudgeConfig())
    assert [f.node for f in out.findings] == ["dgx02"]


def test_stale_and_bad_samples_are_left_out() -> None:
    s = fleet(T0)
    s[1] = replace(s[1], value=float("nan"))
    s[2] = replace(s[2], at=T0 - 30 * DAY)
    out = failslow.score(s, {}, FailslowJudgeConfig(), T0)
    (cohort,) = out.cohorts.values()
    assert cohort.size == 38


def test_rescoring_the_same_sample_does_not_grow_history() -> None:
    s = fleet(T0)
    out = failslow.score(s, {}, FailslowJudgeConfig(), T0)
    again = failslow.score(s, out.histories, FailslowJudgeConfig(), T0 + 60)
    assert all(len(v) == 1 for v in again.histories.values())
