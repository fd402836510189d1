"""Fail-slow settings: the agent's probes (`failslow:`) and the aggregator's judgement
(`aggregator.failslow:`), as frozen typed models.

In core beside core/config_aggregator.py for the same reason: the schema is vocabulary (the agent
reads the probe half, the aggregator the judging half, `config default` renders both) and it
must not import either side. The metric names are the one list every layer uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Literal, Mapping

from podhealth.configload import Ge, Gt, Le, Seconds, doc

# The fingerprint's metrics, each "higher is better", and what each probes.
MetricName = Literal["gemm_tflops", "hbm_gbs", "sm_clock_mhz", "nvlink_gbs", "pcie_h2d_gbs",
                     "pcie_d2h_gbs", "rdma_gbs"]
METRICS: tuple[str, ...] = ("gemm_tflops", "hbm_gbs", "sm_clock_mhz", "nvlink_gbs", "pcie_h2d_gbs",
                            "pcie_d2h_gbs", "rdma_gbs")
# Short names for the CLI (`fleet outliers --metric gemm`) and check names (`failslow_gemm`).
SHORT: Mapping[str, str] = MappingProxyType({
    "gemm_tflops": "gemm", "hbm_gbs": "hbm", "sm_clock_mhz": "clock", "nvlink_gbs": "nvlink",
    "pcie_h2d_gbs": "pcie_h2d", "pcie_d2h_gbs": "pcie_d2h", "rdma_gbs": "rdma",
})
Act = Literal["warn", "drain"]


@dataclass(frozen=True)
class MetricRule:
    warn_z: Annotated[float, Le(0, "a robust z-score (negative: below the median)")] = doc(
        "WARN when the value's robust z against its cohort (median/MAD) is at or below this...", -4.5)
    min_below_pct: Annotated[float, Ge(0, "a percentage")] = doc(
        "...and it is at least this % below the cohort's median (a very tight cohort would make 1% look\n"
        "like z -5).", 3.0)
    baseline_drop_pct: Annotated[float, Ge(0, "a percentage")] = doc(
        "WARN also when the value, relative to its cohort's median, fell this % below the same\n"
        "entity's own baseline (its earlier unflagged probes); raised to 5x the entity's own\n"
        "probe-to-probe noise where that is larger.", 3.0)
    action: Act = doc("What a finding past act_z asks for: warn (notify only) or drain (fence via the\n"
                      "aggregator's rules, caps, rate limit and breaker).", "warn")
    act_z: Annotated[float, Le(0, "a robust z-score")] = doc("With action: drain, the z at or below which...", -8.0)
    act_consecutive: Annotated[int, Ge(1, "a count")] = doc("...this many probes in a row must be.", 2)


@dataclass(frozen=True)
class FailslowJudgeConfig:
    enabled: bool = doc("Judge probe results against their cohorts (same profile, driver, firmware).", True)
    min_cohort: Annotated[int, Ge(3, "a count")] = doc(
        "Fewest entities (GPUs, GPU pairs, HCAs) with a fresh result in a cohort before anyone is judged\n"
        "against it: a small cohort's median says little.", 16)
    baseline_min: Annotated[int, Ge(1, "a count")] = doc(
        "Unflagged probes of an entity before its own baseline counts.", 3)
    history: Annotated[int, Ge(2, "a count"), Le(200, "a count")] = doc(
        "Probes kept per entity (for its baseline and the act_consecutive rule).", 30)
    max_age: Seconds = doc("Seconds a probe result stays in its cohort (older: the entity is not judged).",
                           7 * 86400.0)
    metrics: Mapping[MetricName, MetricRule] = doc(
        "Per metric (gemm_tflops, hbm_gbs, sm_clock_mhz, nvlink_gbs, pcie_h2d_gbs, pcie_d2h_gbs,\n"
        "rdma_gbs) the keys of a rule that differ from its defaults, e.g.\n"
        "{gemm_tflops: {action: drain, act_z: -8, act_consecutive: 2}}; a metric left out takes them all.",
        factory=lambda: MappingProxyType({}))

    def rule(self, metric: str) -> MetricRule:
        return self.metrics.get(metric) or MetricRule()  # type: ignore[call-overload]


@dataclass(frozen=True)
class StragglerConfig:
    enabled: bool = doc("Compare the GPUs and nodes of each running job with each other (passive, WARN only).", True)
    clock_below_pct: Annotated[float, Gt(0, "a percentage")] = doc(
        "A GPU whose SM clock is this % below the job's median with a throttle reason is a straggler.", 5.0)
    ib_below_pct: Annotated[float, Gt(0, "a percentage")] = doc(
        "A node whose IB throughput is this % below the job's median node is a straggler.", 30.0)
    min_peers: Annotated[int, Ge(2, "a count")] = doc("Fewest GPUs in a job before its peers are compared.", 4)
    windows: Annotated[int, Ge(1, "a count")] = doc(
        "Of the last `of` collection windows, this many must agree before a straggler is named.", 2)
    of: Annotated[int, Ge(1, "a count")] = doc("See windows.", 3)

    def validate(self) -> tuple[str, str] | None:
        return ("windows", f"{self.windows} is more than of ({self.of})") if self.windows > self.of else None


@dataclass(frozen=True)
class FailslowProbeConfig:
    enabled: bool = doc("Run the fail-slow probes (GEMM, HBM, SM clock, NVLink, PCIe, RDMA) when the node is idle.",
                        False)
    interval: Annotated[float, Ge(300, "seconds")] = doc("Seconds between probe rounds on an idle node.", 6 * 3600.0)
    jitter: Annotated[float, Ge(0, "a fraction"), Le(1, "a fraction")] = doc(
        "Each wait is interval * (1 +- jitter), drawn afresh, so a fleet never probes at once.", 0.25)
    budget: Annotated[float, Gt(0, "seconds"), Le(600, "seconds")] = doc("Seconds one probe round may take.", 120.0)
    idle_for: Seconds = doc("Seconds the node must have had no job (the prolog/kubelet job record) before a probe.",
                            300.0)
    job_windows: bool = doc(
        "Send each running job's GPU summary to the aggregator (its straggler comparison; passive, no\n"
        "probe). On by default whenever publish.aggregator_url is set, probes or not.", True)
    job_window: Annotated[float, Ge(5, "seconds")] = doc(
        "Seconds between two summaries of a running job's GPUs sent to the aggregator (its stragglers;\n"
        "the aggregator's failslow.window should match). Sent only with publish.aggregator_url.", 30.0)


@dataclass(frozen=True)
class FailslowAggConfig:
    judge: FailslowJudgeConfig = doc("How probe results are judged against their cohort and baseline.",
                                     factory=FailslowJudgeConfig)
    stragglers: StragglerConfig = doc("Stragglers inside running jobs (passive; WARN only, never acts on a job).",
                                      factory=StragglerConfig)
    interval: Annotated[float, Ge(1, "seconds")] = doc("Seconds between two judgements of the fleet's probe results.",
                                                       60.0)
    window: Annotated[float, Ge(1, "seconds")] = doc(
        "Seconds of one job collection window: the agents' summaries of a job within one window are\n"
        "compared with each other (the agents' failslow.window_interval).", 30.0)
    max_probes_per_node: Annotated[int, Ge(1, "a count"), Le(4096, "a count")] = doc(
        "Most probe results one node may send at once (8 GPUs: ~76).", 512)
