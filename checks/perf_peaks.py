"""Each profile's peak figures for the fail-slow probes (checks/data/perf_peaks.yaml).

The probes print their results as a fraction of these; the simulator centres its parts at the
`typical` fraction of them. The fleet's judgement never reads them (it compares with the cohort).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Mapping

from podhealth.yamldata import shipped


@dataclass(frozen=True)
class Peaks:
    dtype: str
    gemm_tflops: float
    hbm_gbs: float
    sm_clock_mhz: float
    nvlink_gbs: float
    pcie_gbs: float
    rdma_gbs: float

    def peak(self, metric: str) -> float:
        """The peak `metric` (a name of config_failslow.METRICS) is a fraction of."""
        return float(getattr(self, "pcie_gbs" if metric.startswith("pcie_") else metric))


@lru_cache(maxsize=1)
def _all() -> tuple[Mapping[str, Peaks], Mapping[str, float]]:
    raw = shipped("perf_peaks.yaml")
    peaks = {name: Peaks(dtype=str(p["dtype"]), **{k: float(v) for k, v in p.items() if k != "dtype"})
             for name, p in raw["profiles"].items()}
    return MappingProxyType(peaks), MappingProxyType({k: float(v) for k, v in raw["typical"].items()})


def peaks(profile: str) -> Peaks | None:
    """The profile's peaks, or None for one without (generic, a site's own): no fraction is shown."""
    return _all()[0].get(profile)


def typical(metric: str) -> float:
    return _all()[1][metric]
