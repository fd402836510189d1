"""The simulated node's performance: what a fail-slow probe measures, and what a running job looks like.

Real parts differ: two H100s of one SKU sustain GEMM rates ~1-2% apart for their whole lives
(binning, HBM stacks, the airflow in their slot), and the same GPU measured twice differs by a few
tenths of a percent. The model has both, seeded deterministically from (seed, node, entity,
metric) so every reader in every process sees the same fleet:

    value = peak * typical * (1 + part offset) * node thermal factor * (1 + run noise) * faults

The run noise is keyed by the probe's time bucket, so probing twice at the same moment agrees.
Faults (podhealth.sim.faults) that slow one part by `pct` percent:
    slow-gpu gpu=G pct=P        GEMM of G
    slow-hbm gpu=G pct=P        device-memory copy of G
    slow-nvlink gpu=G [link=L] pct=P   P2P of every pair with G (through NVSwitch, every link carries every pair)
    slow-hca device=D pct=P     RDMA of D
    thermal-throttle-intermittent [gpu=G] [pct=P] [period=S]   G (every GPU when unset) throttles
        for the first half of every `period` s: SM clock and GEMM down, thermal throttle reasons on
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Sequence

from podhealth.checks import perf_peaks
from podhealth.sim.state import Fault, NodeState

# Natural spread of parts (the sigma of the per-part offset) and of repeated runs, per metric.
SPREAD = {"gemm_tflops": 0.012, "hbm_gbs": 0.010, "sm_clock_mhz": 0.003, "nvlink_gbs": 0.008,
          "pcie_h2d_gbs": 0.010, "pcie_d2h_gbs": 0.010, "rdma_gbs": 0.005}
RUN_NOISE = {"gemm_tflops": 0.004, "hbm_gbs": 0.003, "sm_clock_mhz": 0.002, "nvlink_gbs": 0.003,
             "pcie_h2d_gbs": 0.004, "pcie_d2h_gbs": 0.004, "rdma_gbs": 0.003}
NODE_THERMAL = 0.004  # per-node thermal difference: SM clock (and so GEMM) under load
SLOW_PCT = {"slow-gpu": 10.0, "slow-hbm": 10.0, "slow-nvlink": 20.0, "slow-hca": 20.0,
            "thermal-throttle-intermittent": 15.0}
THROTTLE_PERIOD_S = 600.0
NOISE_BUCKET_S = 1.0
GPU_METRICS = ("gemm_tflops", "hbm_gbs", "sm_clock_mhz", "pcie_h2d_gbs", "pcie_d2h_gbs")
LOAD_POWER_SHARE = 0.92  # of the power limit, a GEMM-bound training step
TRAIN_IB_GBS = 35.0  # per compute HCA during an all-reduce-heavy step


@dataclass(frozen=True, slots=True)
class Reading:
    """One probe result as a simulated agent would send it."""

    entity: str
    metric: str
    value: float
    firmware: str


def _gauss(sigma: float, *parts: object) -> float:
    """A normal draw seeded by `parts`, cut at 3 sigma: parts further out fail the vendor's binning
    and never ship, so the natural spread has no 5-sigma part (that one is a fault)."""
    h = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    rng = random.Random(int.from_bytes(h[:8], "big"))
    while True:
        v = rng.gauss(0.0, sigma)
        if abs(v) <= 3 * sigma:
            return v


def _pct(f: Fault) -> float:
    return f.pct if f.pct is not None else SLOW_PCT.get(f.kind, 0.0)


def throttled(state: NodeState, gpu: int, at: float) -> float:
    """The fraction an intermittent thermal throttle takes off GPU `gpu` at `at` (0 when not)."""
    for f in state.faults:
        if f.kind != "thermal-throttle-intermittent" or f.gpu not in (None, gpu) or at < f.injected_at:
            continue
        period = f.period or THROTTLE_PERIOD_S
        if (at - f.injected_at) % period < period / 2:
            return _pct(f) / 100.0
    return 0.0


def _slow(state: NodeState, kind: str, at: float, *, gpu: int | None = None, device: str | None = None) -> float:
    factor = 1.0
    for f in state.faults:
        if f.kind == kind and at >= f.injected_at and (gpu is None or f.gpu == gpu) \
                and (device is None or f.device == device):
            factor *= 1.0 - _pct(f) / 100.0
    return factor


def _part(seed: int, state: NodeState, entity: str, metric: str, at: float) -> float:
    return ((1.0 + _gauss(SPREAD[metric], seed, "part", state.name, entity, metric))
            * (1.0 + _gauss(RUN_NOISE[metric], seed, "run", state.name, entity, metric, int(at // NOISE_BUCKET_S))))


def node_thermal(seed: int, state: NodeState) -> float:
    return 1.0 + min(0.0, _gauss(NODE_THERMAL, seed, "thermal", state.name))


def fingerprint(state: NodeState, seed: int, at: float) -> list[Reading]:
    """Every probe of one round on `state` at time `at`: per GPU, per NVLink pair, per compute HCA."""
    pk = perf_peaks.peaks(state.profile)
    if pk is None or not state.gpus:
        return []
    thermal = node_thermal(seed, state)
    out: list[Reading] = []
    link_factor: dict[int, float] = {}
    for g in state.gpus:
        i, fw = g.index, g.vbios
        hot = throttled(state, i, at)
        base = {m: pk.peak(m) * perf_peaks.typical(m) * _part(seed, state, f"gpu{i}", m, at) for m in GPU_METRICS}
        base["sm_clock_mhz"] *= thermal * (1.0 - hot)
        base["gemm_tflops"] *= thermal * (1.0 - hot) * _slow(state, "slow-gpu", at, gpu=i)
        base["hbm_gbs"] *= _slow(state, "slow-hbm", at, gpu=i)
        out += [Reading(f"gpu{i}", m, base[m], fw) for m in GPU_METRICS]
        link_factor[i] = (1.0 + _gauss(SPREAD["nvlink_gbs"], seed, "links", state.name, i)) \
            * _slow(state, "slow-nvlink", at, gpu=i)
    if state.gpus[0].nvlink_count:
        for a in state.gpus:
            for b in state.gpus:
                if b.index <= a.index:
                    continue
                ent = f"gpu{a.index}-gpu{b.index}"
                v = (pk.nvlink_gbs * perf_peaks.typical("nvlink_gbs") * min(link_factor[a.index], link_factor[b.index])
                     * (1.0 + _gauss(RUN_NOISE["nvlink_gbs"], seed, "run", state.name, ent, int(at // NOISE_BUCKET_S))))
                out.append(Reading(ent, "nvlink_gbs", v, a.vbios))
    for dev, fw in _compute_hcas(state):
        v = pk.rdma_gbs * perf_peaks.typical("rdma_gbs") * _part(seed, state, dev, "rdma_gbs", at) \
            * _slow(state, "slow-hca", at, device=dev)
        out.append(Reading(dev, "rdma_gbs", v, fw))
    return out


def _compute_hcas(state: NodeState) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for h in state.hcas:
        if h.role == "compute":
            seen.setdefault(h.device, h.fw_ver)
    return sorted(seen.items())


@dataclass(frozen=True, slots=True)
class GpuWindow:
    """One GPU's summary over one collection window while a job runs (what the collectors see)."""

    node: str
    gpu: int
    sm_active: float  # 0..1 (DCGM PROF_SM_ACTIVE)
    power_w: float
    sm_clock_mhz: float
    throttle: tuple[str, ...]  # throttle reasons active in the window: thermal, power, ...
    nvlink_gbs: float
    ib_gbs: float  # the node's compute HCAs together, per GPU


def job_window(state: NodeState, seed: int, at: float) -> list[GpuWindow]:
    """The node's GPUs during a data-parallel training step: peers look alike within ~1%; a
    throttled GPU runs a lower clock (and the whole job waits for it, so its SM activity stays high
    while its peers' drops a little)."""
    thermal = node_thermal(seed, state)
    hcas = _compute_hcas(state)
    ib = sum(TRAIN_IB_GBS * _slow(state, "slow-hca", at, device=d) for d, _ in hcas) / max(1, len(state.gpus))
    out = []
    for g in state.gpus:
        i = g.index
        kinds = {f.kind for f in state.faults if f.gpu in (None, i) and at >= f.injected_at}
        hot = throttled(state, i, at)
        reasons: list[str] = []
        if hot or "thermal" in kinds:
            reasons.append("thermal")
            hot = hot or 0.5
        if "power-brake" in kinds:
            reasons.append("power")
            hot = max(hot, 0.3)
        noise = _gauss(0.003, seed, "win", state.name, i, int(at))
        out.append(GpuWindow(
            node=state.name, gpu=i, sm_active=min(1.0, 0.93 + noise), power_w=g.power_limit_w * LOAD_POWER_SHARE
            * (1.0 - hot / 2) * (1.0 + noise), sm_clock_mhz=g.max_sm_clock_mhz * thermal * (1.0 - hot) * (1 + noise / 3),
            throttle=tuple(reasons), nvlink_gbs=120.0 * (1.0 + noise) * _slow(state, "slow-nvlink", at, gpu=i),
            ib_gbs=ib * (1.0 + noise)))
    return out


def describe_fault(f: Fault) -> Sequence[tuple[str, str]]:
    """(entity, metric) pairs a fault slows: what the bench counts as found."""
    if f.kind == "slow-gpu":
        return [(f"gpu{f.gpu}", "gemm_tflops")]
    if f.kind == "slow-hbm":
        return [(f"gpu{f.gpu}", "hbm_gbs")]
    if f.kind == "slow-hca":
        return [(str(f.device), "rdma_gbs")]
    if f.kind == "slow-nvlink":
        return [(f"gpu{f.gpu}", "nvlink_gbs")]
    if f.kind == "thermal-throttle-intermittent":
        return [(f"gpu{f.gpu}", "sm_clock_mhz"), (f"gpu{f.gpu}", "gemm_tflops")]
    return []
