"""DCGM profiling fields NVML does not have: SM/tensor/DRAM activity, NVLink and PCIe bandwidth.

DCGM's Python bindings (pydcgm, dcgm_fields, dcgm_structs) are not on PyPI: they ship with the
datacenter-gpu-manager package under a versioned directory, which `paths.dcgm_bindings` names.
They are imported from there when present and the collector talks to nv-hostengine at
`collectors.dcgm.hostengine`. Without the bindings, or without a hostengine answering, the
factory raises CollectorDisabled with the reason and the agent runs on without it.

The bindings are used only through the small surface below (DcgmHandle, DcgmGroup,
DcgmFieldGroup, samples.WatchFields/GetLatest, discovery of GPU attributes), so the tests can
stand a minimal module in for them.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar, Mapping

from podhealth.collectors.base import Collection, CollectorDisabled, specs
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

CONNECT_TIMEOUT_MS = 3000
_GPU_LABELS = "GPU labels gpu, uuid, pci_bus_id, model."

# dcgm_fields constant -> sample name. DCGM reports the ratios as 0..1 doubles and the *_BYTES
# profiling fields as bytes per second over its sampling window (not cumulative counters).
FIELDS: Mapping[str, str] = {
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "dcgm_gr_engine_active_ratio",
    "DCGM_FI_PROF_SM_ACTIVE": "dcgm_sm_active_ratio",
    "DCGM_FI_PROF_SM_OCCUPANCY": "dcgm_sm_occupancy_ratio",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "dcgm_tensor_active_ratio",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dcgm_dram_active_ratio",
    "DCGM_FI_PROF_NVLINK_TX_BYTES": "dcgm_nvlink_tx_bytes_per_second",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "dcgm_nvlink_rx_bytes_per_second",
    "DCGM_FI_PROF_PCIE_TX_BYTES": "dcgm_pcie_tx_bytes_per_second",
    "DCGM_FI_PROF_PCIE_RX_BYTES": "dcgm_pcie_rx_bytes_per_second",
}

# Serialises sys.path insertion and import: two agents in one process (tests) must not race.
_import_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class Bindings:
    pydcgm: ModuleType
    fields: ModuleType
    structs: ModuleType


def load_bindings(path: Path) -> Bindings:
    """Import DCGM's bindings from `path` (added to sys.path); CollectorDisabled if they are not there."""
    if not (path / "pydcgm.py").is_file() and not (path / "pydcgm").is_dir():
        raise CollectorDisabled(f"DCGM Python bindings not found at {path} (install datacenter-gpu-manager)")
    with _import_lock:
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
        try:
            return Bindings(importlib.import_module("pydcgm"), importlib.import_module("dcgm_fields"),
                            importlib.import_module("dcgm_structs"))
        except Exception as e:  # noqa: BLE001 - the bindings load libdcgm.so with ctypes; anything can fail
            raise CollectorDisabled(f"cannot import DCGM bindings from {path}: {type(e).__name__}: {e}") from None


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class DcgmCollector:
    name: ClassVar[str] = "dcgm"
    # Its own thread: nv-hostengine is a separate service that can stall on its own.
    own_worker: ClassVar[bool] = True
    metrics: ClassVar[Mapping[str, MetricSpec]] = specs(
        MetricSpec("dcgm_gr_engine_active_ratio", "gauge", "Share of time the graphics/compute engine was busy (DCGM_FI_PROF_GR_ENGINE_ACTIVE). " + _GPU_LABELS),
        MetricSpec("dcgm_sm_active_ratio", "gauge", "Share of time at least one warp was active on an SM (DCGM_FI_PROF_SM_ACTIVE). " + _GPU_LABELS),
        MetricSpec("dcgm_sm_occupancy_ratio", "gauge", "Resident warps over the SM maximum (DCGM_FI_PROF_SM_OCCUPANCY). " + _GPU_LABELS),
        MetricSpec("dcgm_tensor_active_ratio", "gauge", "Share of cycles the tensor pipes were active (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE). " + _GPU_LABELS),
        MetricSpec("dcgm_dram_active_ratio", "gauge", "Share of cycles device memory was busy (DCGM_FI_PROF_DRAM_ACTIVE). " + _GPU_LABELS),
        MetricSpec("dcgm_nvlink_tx_bytes_per_second", "gauge", "NVLink transmit bandwidth (DCGM_FI_PROF_NVLINK_TX_BYTES). " + _GPU_LABELS),
        MetricSpec("dcgm_nvlink_rx_bytes_per_second", "gauge", "NVLink receive bandwidth (DCGM_FI_PROF_NVLINK_RX_BYTES). " + _GPU_LABELS),
        MetricSpec("dcgm_pcie_tx_bytes_per_second", "gauge", "PCIe transmit bandwidth (DCGM_FI_PROF_PCIE_TX_BYTES). " + _GPU_LABELS),
        MetricSpec("dcgm_pcie_rx_bytes_per_second", "gauge", "PCIe receive bandwidth (DCGM_FI_PROF_PCIE_RX_BYTES). " + _GPU_LABELS),
    )

    def __init__(self, b: Bindings, hostengine: str, interval: float) -> None:
        self._b = b
        try:
            self._handle = b.pydcgm.DcgmHandle(ipAddress=hostengine, timeoutMs=CONNECT_TIMEOUT_MS)
        except Exception as e:  # noqa: BLE001 - DCGMError_ConnectionNotValid and friends
            raise CollectorDisabled(f"nv-hostengine at {hostengine} not reachable: {type(e).__name__}: {e}") from None
        try:
            self._field_ids: dict[int, str] = {}
            for const, sample in FIELDS.items():
                fid = getattr(b.fields, const, None)
                if fid is not None:
                    self._field_ids[int(fid)] = sample
            if not self._field_ids:
                raise CollectorDisabled("these DCGM bindings define none of the profiling fields")
            system = self._handle.GetSystem()
            gpu_ids = list(system.discovery.GetAllSupportedGpuIds())
            if not gpu_ids:
                raise CollectorDisabled("DCGM sees no supported GPUs")
            self._labels = {gid: self._gpu_labels(system, gid) for gid in gpu_ids}
            self._group = b.pydcgm.DcgmGroup(self._handle, groupName="podhealth",
                                             groupType=b.structs.DCGM_GROUP_DEFAULT)
            self._fgroup = b.pydcgm.DcgmFieldGroup(self._handle, name="podhealth-prof",
                                                   fieldIds=list(self._field_ids))
            # Sample as often as we read; keep two intervals of history so a late read still finds data.
            usec = max(100_000, int(interval * 1e6))
            self._group.samples.WatchFields(self._fgroup, usec, max(1.0, interval * 2), 0)
        except CollectorDisabled:
            self.close()
            raise
        except Exception as e:  # noqa: BLE001 - e.g. profiling not supported on this GPU/driver
            self.close()
            raise CollectorDisabled(f"cannot watch DCGM profiling fields: {type(e).__name__}: {e}") from None

    @staticmethod
    def _gpu_labels(system: Any, gid: int) -> dict[str, str]:
        ident = system.discovery.GetGpuAttributes(gid).identifiers
        return {"gpu": str(gid), "uuid": _text(ident.uuid), "pci_bus_id": _text(ident.pciBusId),
                "model": _text(ident.deviceName)}

    def collect(self) -> Collection:
        latest = self._group.samples.GetLatest(self._fgroup)
        samples: list[Sample] = []
        for gid, by_field in latest.values.items():
            labels = self._labels.get(gid, {"gpu": str(gid)})
            for fid, series in by_field.items():
                name = self._field_ids.get(int(fid))
                values = getattr(series, "values", series)
                if name is None or not values:
                    continue
                v = values[-1]
                # Blank values are DCGM's "not supported / no data yet": absent, never 0.
                if getattr(v, "isBlank", False) or v.value is None:
                    continue
                samples.append(Sample.of(name, float(v.value), **labels))
        return Collection(tuple(samples))

    def close(self) -> None:
        handle = getattr(self, "_handle", None)
        if handle is not None:
            try:
                handle.Shutdown()
            except Exception:  # noqa: BLE001 - the connection may already be gone
                pass
            self._handle = None


def create(cfg: Config, unavailable: str = "") -> DcgmCollector:
    """`unavailable`: a seam for a node that has no DCGM by construction (`agent --simulate`: the
    simulator has no nv-hostengine), said instead of the install hint that would mislead there."""
    if unavailable:
        raise CollectorDisabled(unavailable)
    b = load_bindings(cfg.paths.dcgm_bindings)
    return DcgmCollector(b, cfg.collectors.dcgm.hostengine, cfg.collectors.dcgm.interval)
