"""`--compat dcgm-exporter`: the GPU series again under dcgm-exporter's DCGM_FI_* names and labels.

Existing Grafana dashboards built on dcgm-exporter keep working. Values are converted to
dcgm-exporter's units (percent, MiB, MHz, millijoules). dcgm-exporter declares a few of these
counters without a `_total` suffix; they are typed gauge here so the names stay exactly what the
dashboards query. dcgm-exporter's label names (UUID, modelName, Hostname) are camelCase, which
`promtool check metrics` flags; that is the price of compatibility and only applies in this mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from podhealth.agent.family import Family, MetricSource
from podhealth.snapshot import Snapshot
from podhealth.vocab import MetricSpec, Sample, labels_of

MODES = ("dcgm-exporter",)


@dataclass(frozen=True, slots=True)
class Mapped:
    target: str
    help: str
    scale: float = 1.0
    match: tuple[tuple[str, str], ...] = ()  # extra label values the source sample must have


MIB = 1.0 / (1024 * 1024)

MAP: Mapping[str, tuple[Mapped, ...]] = {
    "gpu_utilization_ratio": (Mapped("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", 100.0),),
    "gpu_memory_utilization_ratio": (Mapped("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", 100.0),),
    "gpu_memory_used_bytes": (Mapped("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", MIB),),
    "gpu_memory_free_bytes": (Mapped("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", MIB),),
    "gpu_temperature_celsius": (Mapped("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C)."),),
    "gpu_memory_temperature_celsius": (Mapped("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C)."),),
    "gpu_power_watts": (Mapped("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W)."),),
    "gpu_energy_joules": (Mapped("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
                                 "Total energy consumption since boot (in mJ).", 1000.0),),
    "gpu_sm_clock_hertz": (Mapped("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 1e-6),),
    "gpu_memory_clock_hertz": (Mapped("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", 1e-6),),
    "gpu_pcie_replay": (Mapped("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries."),),
    "gpu_remapped_rows": (
        Mapped("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors.",
               match=(("type", "correctable"),)),
        Mapped("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors.",
               match=(("type", "uncorrectable"),)),
    ),
    "gpu_remapped_rows_failure": (Mapped("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed."),),
    "dcgm_sm_active_ratio": (Mapped("DCGM_FI_PROF_SM_ACTIVE", "The ratio of cycles an SM has at least 1 warp assigned."),),
    "dcgm_sm_occupancy_ratio": (Mapped("DCGM_FI_PROF_SM_OCCUPANCY", "The ratio of warps resident on an SM."),),
    "dcgm_tensor_active_ratio": (Mapped("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Ratio of cycles the tensor pipe is active."),),
    "dcgm_dram_active_ratio": (Mapped("DCGM_FI_PROF_DRAM_ACTIVE", "Ratio of cycles the device memory interface is active."),),
    "dcgm_nvlink_tx_bytes_per_second": (Mapped("DCGM_FI_PROF_NVLINK_TX_BYTES", "NVLink transmit bytes per second."),),
    "dcgm_nvlink_rx_bytes_per_second": (Mapped("DCGM_FI_PROF_NVLINK_RX_BYTES", "NVLink receive bytes per second."),),
    "dcgm_pcie_tx_bytes_per_second": (Mapped("DCGM_FI_PROF_PCIE_TX_BYTES", "PCIe transmit bytes per second."),),
    "dcgm_pcie_rx_bytes_per_second": (Mapped("DCGM_FI_PROF_PCIE_RX_BYTES", "PCIe receive bytes per second."),),
}
XID_NAME = "DCGM_FI_DEV_XID_ERRORS"


def _labels(s: Sample, host: str) -> tuple[tuple[str, str], ...]:
    gpu = s.label("gpu")
    return labels_of(gpu=gpu, UUID=s.label("uuid"), pci_bus_id=s.label("pci_bus_id"),
                     device=f"nvidia{gpu}", modelName=s.label("model"), Hostname=host)


def dcgm_exporter_families(snapshot: Snapshot, host: str) -> list[Family]:
    out: dict[str, tuple[MetricSpec, list[Sample]]] = {}
    gpu_labels: dict[str, tuple[tuple[str, str], ...]] = {}
    for s in snapshot.samples():
        targets = MAP.get(s.name)
        if not targets or not s.label("gpu"):
            continue
        lab = _labels(s, host)
        gpu_labels.setdefault(s.label("gpu"), lab)
        for m in targets:
            if any(s.label(k) != v for k, v in m.match):
                continue
            spec, samples = out.setdefault(m.target, (MetricSpec(m.target, "gauge", m.help), []))
            samples.append(Sample(m.target, s.value * m.scale, lab))
    # dcgm-exporter's XID gauge holds the last XID code seen on each GPU.
    last_xid: dict[str, float] = {}
    for ev in snapshot.events:
        if ev.kind == "xid" and ev.gpu is not None:
            last_xid[str(ev.gpu)] = float(ev.code)
    if last_xid:
        xs = [Sample(XID_NAME, code, gpu_labels.get(g, labels_of(gpu=g, device=f"nvidia{g}", Hostname=host)))
              for g, code in sorted(last_xid.items())]
        out[XID_NAME] = (MetricSpec(XID_NAME, "gauge", "Value of the last XID error encountered."), xs)
    return [Family(spec, tuple(samples), prefixed=False) for spec, samples in out.values()]


def source(mode: str, host: str) -> MetricSource:
    if mode not in MODES:
        raise ValueError(f"unknown compat mode {mode!r} (known: {', '.join(MODES)})")

    def families(snapshot: Snapshot) -> Iterable[Family]:
        return dcgm_exporter_families(snapshot, host)
    return families
