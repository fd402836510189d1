"""Fail-slow: judge each probe result against its cohort and its own past. Pure.

`score(samples, histories, cfg, now)` takes the latest probe result of every (node, entity,
metric) the fleet sent, the entities' earlier points, and the settings; it returns findings, the
cohorts' statistics (for the UI and `fleet outliers`) and the updated histories. No I/O, no clock,
no randomness, like aggregator/policy.py: the same inputs give the same answer, so it is table-tested.

Method (docs/failslow.md):
- A cohort is (metric, profile, driver, firmware): only like is compared with like, so a driver
  upgrade that makes every GPU 3% slower moves its cohort's median and flags nobody.
- The robust z of a value is (value - median) / (1.4826 * MAD) over its cohort's fresh results;
  MAD is floored at 0.25% of the median so a cohort of identical results cannot make 0.1% a z of -50.
  A cohort smaller than `min_cohort` judges nobody.
- An entity's history holds its value as a ratio to its cohort's median at the time (so the
  history survives driver upgrades and fleet-wide shifts); its baseline is the median ratio of
  its earlier unflagged points. A drop against the baseline catches the part that was at the median
  last week and is 5% slower today, long before it is an outlier of the fleet.
- WARN when z <= warn_z and at least min_below_pct below the median, or when the ratio fell
  baseline_drop_pct (or 5x the entity's own noise, if larger) below its baseline while below the
  median. With `action: drain`, DRAIN when z <= act_z on act_consecutive probes in a row.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from podhealth.config_failslow import SHORT, FailslowJudgeConfig
from podhealth.vocab import Action, Status

MAD_SCALE = 1.4826  # MAD of a normal distribution * this = its standard deviation
MAD_FLOOR = 0.0025  # of the median
NOISE_K = 5.0  # a baseline drop must be this many times the entity's own probe-to-probe noise
DAY = 86400.0

Key = tuple[str, str, str]  # node, entity, metric


@dataclass(frozen=True, slots=True)
class Sample:
    """One probe result as the aggregator received it; `at` is the aggregator's clock."""

    node: str
    entity: str  # gpu3 | gpu0-gpu5 (an NVLink pair) | mlx5_4
    metric: str
    value: float
    at: float
    profile: str
    driver: str
    firmware: str  # VBIOS for GPU metrics, HCA firmware for rdma
    model: str = ""  # the GPU model NVML names ("NVIDIA H100 80GB HBM3"): what a finding calls the cohort

    @property
    def key(self) -> Key:
        return (self.node, self.entity, self.metric)

    @property
    def cohort(self) -> "CohortKey":
        return CohortKey(self.metric, self.profile, self.driver, self.firmware)


@dataclass(frozen=True, slots=True, order=True)
class CohortKey:
    metric: str
    profile: str
    driver: str
    firmware: str

    def label(self) -> str:
        return f"{self.profile} on {self.driver}" + (f" / {self.firmware}" if self.firmware else "")


@dataclass(frozen=True, slots=True)
class Point:
    at: float
    ratio: float  # value / its cohort's median then
    z: float
    flagged: bool


@dataclass(frozen=True, slots=True)
class Cohort:
    key: CohortKey
    size: int
    median: float
    mad: float  # scaled (a standard deviation's equivalent), floored
    judged: bool  # size >= min_cohort


@dataclass(frozen=True, slots=True)
class Finding:
    node: str
    entity: str
    metric: str
    value: float
    cohort: Cohort
    z: float
    below_pct: float  # % below the cohort's median (negative: above)
    by: str  # "cohort" | "baseline" | "cohort+baseline"
    status: Status
    action: Action
    streak: int  # probes in a row at or below act_z
    baseline_ratio: float | None = None
    baseline_at: float | None = None
    model: str = ""

    @property
    def check(self) -> str:
        return check_name(self.metric)

    def text(self, now: float) -> str:
        """`gpu3 GEMM 7.4% below the median of 412 H100 SXM GPUs on 550.90 (z -5.8); was at the
        median 9 days ago`."""
        c = self.cohort
        s = (f"{self.entity} {SHORT.get(self.metric, self.metric).upper()} {self.below_pct:.1f}% below the median "
             f"of {c.size} {_things(self.entity, self.model, c.key.profile)} on {c.key.driver} (z {self.z:.1f})")
        if self.baseline_ratio is not None and self.baseline_at is not None:
            off = (self.baseline_ratio - 1.0) * 100.0
            ago = _ago(now - self.baseline_at)
            s += ("; was at the median " if abs(off) < 1.0 else f"; was {abs(off):.1f}% "
                  f"{'below' if off < 0 else 'above'} the median ") + ago
        return s

    def to_json(self, now: float) -> dict[str, object]:
        return {"node": self.node, "entity": self.entity, "metric": self.metric, "value": self.value,
                "median": self.cohort.median, "cohort_size": self.cohort.size, "profile": self.cohort.key.profile,
                "driver": self.cohort.key.driver, "firmware": self.cohort.key.firmware, "z": round(self.z, 2),
                "below_pct": round(self.below_pct, 2), "by": self.by, "status": self.status.value,
                "action": self.action.value, "streak": self.streak, "baseline_ratio": self.baseline_ratio,
                "check": self.check, "summary": self.text(now)}


@dataclass(frozen=True)
class Scored:
    findings: tuple[Finding, ...]
    cohorts: Mapping[CohortKey, Cohort]
    histories: Mapping[Key, tuple[Point, ...]]
    z: Mapping[Key, float]  # every judged entity's z (the UI's distribution)


def check_name(metric: str) -> str:
    return f"failslow_{SHORT.get(metric, metric)}"


def robust(values: Sequence[float]) -> tuple[float, float]:
    """(median, scaled MAD floored at MAD_FLOOR of the median)."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values) * MAD_SCALE
    return med, max(mad, abs(med) * MAD_FLOOR, 1e-12)


def score(samples: Iterable[Sample], histories: Mapping[Key, Sequence[Point]], cfg: FailslowJudgeConfig,
          now: float) -> Scored:
    latest: dict[Key, Sample] = {}
    for s in samples:
        if now - s.at > cfg.max_age or not math.isfinite(s.value) or s.value < 0:
            continue
        cur = latest.get(s.key)
        if cur is None or s.at > cur.at:
            latest[s.key] = s
    groups: dict[CohortKey, list[Sample]] = {}
    for s in latest.values():
        groups.setdefault(s.cohort, []).append(s)
    cohorts: dict[CohortKey, Cohort] = {}
    findings: list[Finding] = []
    out_hist: dict[Key, tuple[Point, ...]] = {k: tuple(v) for k, v in histories.items()}
    zs: dict[Key, float] = {}
    for ck in sorted(groups):
        members = groups[ck]
        med, mad = robust([s.value for s in members])
        cohort = Cohort(ck, len(members), med, mad, judged=len(members) >= cfg.min_cohort and med > 0)
        cohorts[ck] = cohort
        if not cohort.judged:
            continue
        rule = cfg.rule(ck.metric)
        for s in sorted(members, key=lambda s: s.key):
            past = tuple(histories.get(s.key, ()))
            fresh = not past or s.at > past[-1].at
            earlier = past if fresh else past[:-1]  # the point for this sample may already be there
            z = (s.value - med) / mad
            ratio = s.value / med
            below = (1.0 - ratio) * 100.0
            zs[s.key] = z
            base = [p for p in earlier if not p.flagged]
            by: list[str] = []
            if z <= rule.warn_z and below >= rule.min_below_pct:
                by.append("cohort")
            b_ratio = b_at = None
            if len(base) >= cfg.baseline_min:
                b_ratio = statistics.median(p.ratio for p in base)
                b_at = base[-1].at
                noise = _noise(base)
                drop = (b_ratio - ratio) * 100.0
                if below > 0 and drop >= max(rule.baseline_drop_pct, NOISE_K * noise * 100.0):
                    by.append("baseline")
            streak = 1 if z <= rule.act_z else 0
            if streak:
                for p in reversed(earlier):
                    if p.z > rule.act_z or streak >= rule.act_consecutive:
                        break
                    streak += 1
            point = Point(s.at, ratio, z, flagged=bool(by))
            out_hist[s.key] = (earlier + (point,))[-cfg.history:]
            if not by:
                continue
            drain = rule.action == "drain" and streak >= rule.act_consecutive
            findings.append(Finding(
                node=s.node, entity=s.entity, metric=s.metric, value=s.value, cohort=cohort, z=z, below_pct=below,
                by="+".join(by), status=Status.FAIL if drain else Status.WARN,
                action=Action.DRAIN if drain else Action.NONE, streak=streak,
                baseline_ratio=b_ratio, baseline_at=b_at, model=s.model))
    return Scored(findings=tuple(findings), cohorts=cohorts, histories=out_hist, z=zs)


def _noise(base: Sequence[Point]) -> float:
    """The entity's own probe-to-probe spread (scaled MAD of its baseline ratios)."""
    if len(base) < 3:
        return 0.0
    med = statistics.median(p.ratio for p in base)
    return statistics.median(abs(p.ratio - med) for p in base) * MAD_SCALE


def _ago(seconds: float) -> str:
    if seconds >= 2 * DAY:
        return f"{seconds / DAY:.0f} days ago"
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} hours ago"
    return f"{max(seconds, 0) / 60:.0f} minutes ago"


def _things(entity: str, model: str, profile: str) -> str:
    """`H100 80GB HBM3 GPUs` (the GPU model without the vendor, for GPUs and their pairs), else the
    profile's: `dgx-h100 HCAs`."""
    kind = "GPU pairs" if "-" in entity else ("GPUs" if entity.startswith("gpu") else "HCAs")
    what = model.removeprefix("NVIDIA ") if model and entity.startswith("gpu") else profile
    return f"{what} {kind}"


def forget(histories: Mapping[Key, Sequence[Point]], keep: Iterable[Key]) -> dict[Key, tuple[Point, ...]]:
    """Histories of the entities still in the fleet only (a node that left takes its points along)."""
    wanted = set(keep)
    return {k: tuple(v) for k, v in histories.items() if k in wanted}
