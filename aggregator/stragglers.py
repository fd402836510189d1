"""Stragglers inside a running job, from what is collected anyway. Pure.

In data-parallel work every GPU of a job runs the same step, so its peers should look alike: the
same SM clock, the same NVLink and InfiniBand throughput. `flag(window)` compares one collection
window of a job's GPUs with each other (median of the job, never a constant):

- a GPU whose SM clock is `clock_below_pct` below the job's median while a throttle reason is
  active is named with that reason (thermal, power, ...); without any reason it must be twice as
  far below (reason "clock"), since a clock alone can be the job's own phase;
- a node whose InfiniBand throughput is `ib_below_pct` below the job's median node, or a GPU whose
  NVLink throughput is that far below the job's median GPU, is named (reason "ib" / "nvlink").

`judge(windows)` names a suspect seen in `windows` of the last `of` windows, so one odd window
names nobody and a throttled node is named by its second. The verdict is WARN only: podhealth
never kills or moves a job for it (the aggregator shows it, exports it and alerts on it).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from podhealth.config_failslow import StragglerConfig

IB_FLOOR_GBS = 1.0  # a job that barely uses the fabric has no IB peers to compare
THROTTLE_ORDER = ("thermal", "power", "hw_slowdown", "sync_boost")


@dataclass(frozen=True, slots=True)
class GpuObs:
    """One GPU of a job over one collection window (means over the window)."""

    node: str
    gpu: int
    sm_active: float
    power_w: float
    sm_clock_mhz: float
    throttle: tuple[str, ...]
    nvlink_gbs: float
    ib_gbs: float | None  # the node's compute HCAs over the window, divided among its GPUs; None: not known


@dataclass(frozen=True)
class JobWindow:
    job: str
    owner: str
    at: float  # the aggregator's clock
    gpus: tuple[GpuObs, ...]


@dataclass(frozen=True, slots=True, order=True)
class Suspect:
    node: str
    gpu: int | None  # None: the node (its IB)
    reason: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Straggler:
    job: str
    owner: str
    node: str
    gpu: int | None
    reason: str
    windows: int
    detail: str

    @property
    def gpu_label(self) -> str:
        return "" if self.gpu is None else str(self.gpu)

    def text(self) -> str:
        what = f"{self.node}" + ("" if self.gpu is None else f" gpu{self.gpu}")
        return f"job {self.job} ({self.owner or 'unknown owner'}): {what} is the likely straggler ({self.reason}): {self.detail}"

    def to_json(self) -> dict[str, object]:
        return {"job": self.job, "owner": self.owner, "node": self.node, "gpu": self.gpu, "reason": self.reason,
                "windows": self.windows, "detail": self.detail, "summary": self.text()}


def flag(window: JobWindow, cfg: StragglerConfig) -> list[Suspect]:
    gpus = window.gpus
    if len(gpus) < cfg.min_peers:
        return []
    out: list[Suspect] = []
    clock = statistics.median(g.sm_clock_mhz for g in gpus)
    if clock > 0:
        for g in gpus:
            below = (1.0 - g.sm_clock_mhz / clock) * 100.0
            reason = next((r for r in THROTTLE_ORDER if r in g.throttle), g.throttle[0] if g.throttle else "")
            need = cfg.clock_below_pct if reason else 2 * cfg.clock_below_pct
            if below >= need:
                out.append(Suspect(g.node, g.gpu, reason or "clock",
                                   f"SM clock {g.sm_clock_mhz:.0f} MHz, {below:.0f}% below the job's median "
                                   f"{clock:.0f} MHz" + (f" ({reason} throttle)" if reason else "")))
    nvl = statistics.median(g.nvlink_gbs for g in gpus)
    if nvl > IB_FLOOR_GBS:
        for g in gpus:
            below = (1.0 - g.nvlink_gbs / nvl) * 100.0
            if below >= cfg.ib_below_pct:
                out.append(Suspect(g.node, g.gpu, "nvlink", f"NVLink {g.nvlink_gbs:.0f} GB/s, {below:.0f}% below "
                                                           f"the job's median {nvl:.0f} GB/s"))
    per_node: dict[str, list[float]] = {}
    for g in gpus:
        if g.ib_gbs is not None:  # a node whose throughput is not known yet is not compared
            per_node.setdefault(g.node, []).append(g.ib_gbs)
    if len(per_node) >= 2:
        node_ib = {n: sum(v) for n, v in per_node.items()}
        med = statistics.median(node_ib.values())
        if med > IB_FLOOR_GBS:
            for n, v in sorted(node_ib.items()):
                below = (1.0 - v / med) * 100.0
                if below >= cfg.ib_below_pct:
                    out.append(Suspect(n, None, "ib", f"InfiniBand {v:.0f} GB/s, {below:.0f}% below the job's "
                                                      f"median node {med:.0f} GB/s"))
    return sorted(out)


def judge(windows: Sequence[JobWindow], cfg: StragglerConfig) -> list[Straggler]:
    """The job's stragglers from its windows (oldest first): a (node, gpu, reason) flagged in at
    least `cfg.windows` of the last `cfg.of` windows."""
    if not windows:
        return []
    recent = list(windows)[-cfg.of:]
    seen: dict[tuple[str, int | None, str], list[Suspect]] = {}
    for w in recent:
        for s in flag(w, cfg):
            seen.setdefault((s.node, s.gpu, s.reason), []).append(s)
    last = recent[-1]
    out = [Straggler(last.job, last.owner, node, gpu, reason, len(hits), hits[-1].detail)
           for (node, gpu, reason), hits in seen.items() if len(hits) >= cfg.windows]
    return sorted(out, key=lambda s: (s.node, -1 if s.gpu is None else s.gpu, s.reason))


def named_nodes(stragglers: Iterable[Straggler]) -> set[str]:
    return {s.node for s in stragglers}
