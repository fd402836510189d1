"""`--compat dcgm-exporter`: podhealth's GPU samples under dcgm-exporter's names, labels and units.

A pure function of samples (and, for DCGM_FI_DEV_XID_ERRORS, events), so existing Grafana
dashboards and alerts written for dcgm-exporter keep working against the podhealth agent.

Names and types follow dcgm-exporter's etc/default-counters.csv (plus the ECC, retired-page and
NVLink error fields that file lists commented out, which DGX operators commonly enable). Units
are dcgm-exporter's: MHz, %, MiB, mJ; counters carry no `_total` suffix and no `podhealth_`
prefix, so the exporter renders these names as they are.

Labels on every series: gpu, UUID, device ("nvidiaN"), modelName, Hostname (the name is the
caller's: dcgm-exporter's main branch calls it `hostname`), pci_bus_id (DCGM's form
"00000000:18:00.0") and DCGM_FI_DRIVER_VERSION (a "label" field in default-counters.csv); where a
Slurm job holds the GPU (the prolog's job record, the jobs collector's gpu_job_info) `hpc_job`, as
dcgm-exporter's --hpc-job-mapping-dir gives it; where a pod does, pod / namespace / container.
A GPU in MIG mode also gets its framebuffer series per MIG instance, labelled GPU_I_ID and
GPU_I_PROFILE as dcgm-exporter labels them; DCGM_FI_DEV_XID_ERRORS carries err_code and err_msg.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from podhealth import pci
from podhealth.collectors.nvml import CLOCKS_EVENT_REASONS as REASON_BITS
from podhealth.vocab import Event, Labels, MetricKind, MetricSpec, Sample

MIB = float(1 << 20)


@dataclass(frozen=True, slots=True)
class FieldMap:
    """One DCGM field computed from one podhealth metric; matching series of a GPU are summed."""

    field: str
    kind: MetricKind
    help: str
    source: str
    match: Labels = ()  # label values the source sample must carry
    scale: float = 1.0


FIELDS: tuple[FieldMap, ...] = (
    FieldMap("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", "gpu_sm_clock_hertz", scale=1e-6),
    FieldMap("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", "gpu_memory_clock_hertz", scale=1e-6),
    FieldMap("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", "gpu_memory_temperature_celsius"),
    FieldMap("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", "gpu_temperature_celsius"),
    FieldMap("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "gpu_power_watts"),
    FieldMap("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
             "Total energy consumption since boot (in mJ).", "gpu_energy_joules", scale=1e3),
    FieldMap("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", "gpu_pcie_replay"),
    FieldMap("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "gpu_utilization_ratio", scale=100.0),
    FieldMap("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
             "gpu_memory_utilization_ratio", scale=100.0),
    FieldMap("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
             "gpu_encoder_utilization_ratio", scale=100.0),
    FieldMap("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
             "gpu_decoder_utilization_ratio", scale=100.0),
    FieldMap("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "gpu_memory_free_bytes", scale=1 / MIB),
    FieldMap("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "gpu_memory_used_bytes", scale=1 / MIB),
    FieldMap("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter", "Total number of single-bit volatile ECC errors.",
             "gpu_ecc_errors", (("scope", "volatile"), ("type", "corrected"))),
    FieldMap("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total number of double-bit volatile ECC errors.",
             "gpu_ecc_errors", (("scope", "volatile"), ("type", "uncorrected"))),
    FieldMap("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "counter", "Total number of single-bit persistent ECC errors.",
             "gpu_ecc_errors", (("scope", "aggregate"), ("type", "corrected"))),
    FieldMap("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "counter", "Total number of double-bit persistent ECC errors.",
             "gpu_ecc_errors", (("scope", "aggregate"), ("type", "uncorrected"))),
    FieldMap("DCGM_FI_DEV_RETIRED_SBE", "counter", "Total number of retired pages due to single-bit errors.",
             "gpu_retired_pages", (("cause", "sbe"),)),
    FieldMap("DCGM_FI_DEV_RETIRED_DBE", "counter", "Total number of retired pages due to double-bit errors.",
             "gpu_retired_pages", (("cause", "dbe"),)),
    FieldMap("DCGM_FI_DEV_RETIRED_PENDING", "counter", "Total number of pages pending retirement.",
             "gpu_retired_pages_pending"),
    FieldMap("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink flow-control CRC errors.", "nvlink_errors", (("type", "crc_flit"),)),
    FieldMap("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink data CRC errors.", "nvlink_errors", (("type", "crc_data"),)),
    FieldMap("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink retries.", "nvlink_errors", (("type", "replay"),)),
    FieldMap("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter",
             "Total number of NVLink recovery errors.", "nvlink_errors", (("type", "recovery"),)),
    # DCGM's per-link DCGM_FI_DEV_NVLINK_BANDWIDTH_L* count rx + tx bytes, headers included; the
    # total adds every link: NVML's raw throughput fields summed over links, both directions.
    FieldMap("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
             "Total number of NVLink bandwidth counters for all lanes.", "nvlink_transmitted_bytes"),
    FieldMap("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
             "Total number of NVLink bandwidth counters for all lanes.", "nvlink_received_bytes"),
    FieldMap("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
             "Number of remapped rows for uncorrectable errors", "gpu_remapped_rows", (("type", "uncorrectable"),)),
    FieldMap("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
             "Number of remapped rows for correctable errors", "gpu_remapped_rows", (("type", "correctable"),)),
    FieldMap("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
             "gpu_remapped_rows_failure"),
    # Profiling fields come from the optional dcgm collector (ratios stay ratios, as in DCGM):
    # NVML has no equivalent, so without DCGM (bindings + nv-hostengine) they are absent.
    FieldMap("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
             "dcgm_gr_engine_active_ratio"),
    FieldMap("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
             "dcgm_sm_active_ratio"),
    FieldMap("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
             "dcgm_sm_occupancy_ratio"),
    FieldMap("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
             "dcgm_tensor_active_ratio"),
    FieldMap("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
             "Ratio of cycles the device memory interface is active sending or receiving data.",
             "dcgm_dram_active_ratio"),
    FieldMap("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
             "The rate of data transmitted over the PCIe bus - including both protocol headers and data "
             "payloads - in bytes per second.", "dcgm_pcie_tx_bytes_per_second"),
    FieldMap("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
             "The rate of data received over the PCIe bus - including both protocol headers and data "
             "payloads - in bytes per second.", "dcgm_pcie_rx_bytes_per_second"),
    FieldMap("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "The rate of data transmitted over NVLink, in bytes per second.",
             "dcgm_nvlink_tx_bytes_per_second"),
    FieldMap("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "The rate of data received over NVLink, in bytes per second.",
             "dcgm_nvlink_rx_bytes_per_second"),
    FieldMap("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", "vGPU License status", "gpu_vgpu_license_state"),
)

HOSTNAME_LABEL = "Hostname"  # dcgm-exporter 4.x releases; its main branch: "hostname"
HOSTNAME_LABELS = ("Hostname", "hostname")

FB_RESERVED = MetricSpec("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).")
XID_ERRORS = MetricSpec("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.")
# The NVML bitmask (nvmlClocksEventReason*) as DCGM reports it; DCGM 3.3 renamed the field from
# CLOCK_THROTTLE_REASONS to CLOCKS_EVENT_REASONS and dashboards use either, so both are exported.
CLOCKS_EVENT_REASONS = MetricSpec("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
                                  "Current clock event reasons (bitmask of nvmlClocksEventReason*).")
CLOCK_THROTTLE_REASONS = MetricSpec("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "gauge",
                                    "Current clock throttle reasons (bitmask of nvmlClocksThrottleReason*).")

METRICS: Mapping[str, MetricSpec] = {
    **{f.field: MetricSpec(f.field, f.kind, f.help) for f in FIELDS},
    FB_RESERVED.name: FB_RESERVED,
    XID_ERRORS.name: XID_ERRORS,
    CLOCKS_EVENT_REASONS.name: CLOCKS_EVENT_REASONS,
    CLOCK_THROTTLE_REASONS.name: CLOCK_THROTTLE_REASONS,
}


@dataclass(frozen=True, slots=True)
class _Gpu:
    index: str
    uuid: str
    model: str
    pci_bus_id: str
    driver_version: str
    job: Labels = ()

    def labels(self, hostname: str, host_label: str = HOSTNAME_LABEL, **extra: str) -> Labels:
        base = {
            "gpu": self.index,
            "UUID": self.uuid,
            "device": f"nvidia{self.index}",
            "modelName": self.model,
            host_label: hostname,
            "pci_bus_id": pci.dcgm_form(self.pci_bus_id) or "",
            "DCGM_FI_DRIVER_VERSION": self.driver_version,
        }
        base.update(self.job)
        base.update(extra)
        return tuple(sorted(base.items()))


def _gpus(samples: Sequence[Sample]) -> dict[str, _Gpu]:
    """GPU identity by index, from the nvml collector's labelled series (gpu_info first)."""
    found: dict[str, dict[str, str]] = {}
    for s in samples:
        if s.name not in ("gpu_info", "gpu_up"):
            continue
        idx = s.label("gpu")
        if not idx:
            continue
        d = found.setdefault(idx, {})
        for key in ("uuid", "model", "pci_bus_id", "driver_version"):
            if s.label(key) and not d.get(key):
                d[key] = s.label(key)
    return {idx: _Gpu(idx, d.get("uuid", ""), d.get("model", ""), d.get("pci_bus_id", ""),
                      d.get("driver_version", "")) for idx, d in found.items()}


def _matches(s: Sample, match: Labels) -> bool:
    return all(s.label(k) == v for k, v in match)


# What dcgm-exporter adds when it knows the Kubernetes pod using a GPU (its pod-resources mapping).
JOB_LABELS = ("pod", "namespace", "container")


def _slurm_jobs(samples: Sequence[Sample]) -> dict[str, str]:
    """GPU index -> hpc_job: the Slurm job ids holding it (the prolog's records, through the jobs
    collector), comma-joined when a GPU is shared."""
    jobs: dict[str, set[str]] = {}
    for s in samples:
        if s.name == "gpu_job_info" and s.label("scheduler") == "slurm" and s.label("job_id"):
            jobs.setdefault(s.label("gpu"), set()).add(s.label("job_id"))
    return {g: ",".join(sorted(ids, key=lambda j: (len(j), j))) for g, ids in jobs.items()}


def to_dcgm(samples: Iterable[Sample], hostname: str,
            events: Sequence[Event] | None = None,
            jobs: Mapping[str, Mapping[str, str]] | None = None,
            hostname_label: str = HOSTNAME_LABEL,
            xid_texts: Mapping[int, str] | None = None) -> tuple[Sample, ...]:
    """dcgm-exporter-named samples for every GPU the nvml samples identify.

    A source metric that is absent stays absent. Series summed per GPU (NVLink errors over links)
    add up their links. `events=None` (no kernel-log collector) leaves DCGM_FI_DEV_XID_ERRORS out;
    a sequence gives each GPU its most recent XID code, or 0 as dcgm-exporter reports when none.
    `jobs` maps a GPU UUID to the pod / namespace / container using it (a hook: the mapping
    itself comes from the job source, issue 17); a GPU not in it gets none of those labels.
    """
    if hostname_label not in HOSTNAME_LABELS:
        raise ValueError(f"hostname label {hostname_label!r}: expected one of {', '.join(HOSTNAME_LABELS)}")
    items = tuple(samples)
    gpus = _gpus(items)
    hpc = _slurm_jobs(items)
    if jobs or hpc:
        gpus = {idx: replace(g, job=tuple(sorted(
                    [(k, v) for k, v in (jobs or {}).get(g.uuid, {}).items() if k in JOB_LABELS and v]
                    + ([("hpc_job", hpc[idx])] if idx in hpc else []))))
                for idx, g in gpus.items()}
    hl = hostname_label
    totals: dict[tuple[str, str], float] = {}
    by_field: dict[str, list[FieldMap]] = {}
    for f in FIELDS:
        by_field.setdefault(f.source, []).append(f)
    for s in items:
        idx = s.label("gpu")
        if idx not in gpus:
            continue
        for f in by_field.get(s.name, ()):
            if _matches(s, f.match):
                key = (f.field, idx)
                totals[key] = totals.get(key, 0.0) + s.value * f.scale
    out = [Sample(name, value, gpus[idx].labels(hostname, hl)) for (name, idx), value in totals.items()]
    out.extend(_reserved(items, gpus, hostname, hl))
    out.extend(_clock_reasons(items, gpus, hostname, hl))
    out.extend(_mig(items, gpus, hostname, hl))
    if events is not None:
        out.extend(_last_xid(events, gpus, hostname, hl, xid_texts or {}))
    out.sort(key=lambda s: (s.name, int(s.label("gpu")) if s.label("gpu").isdigit() else 0))
    return tuple(out)


def _mig(samples: Sequence[Sample], gpus: Mapping[str, _Gpu], hostname: str, hl: str) -> list[Sample]:
    """FB_USED / FB_FREE per MIG instance, as dcgm-exporter serves a MIG GPU: the parent's labels
    plus GPU_I_ID and GPU_I_PROFILE."""
    inst: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in samples:
        if s.name in ("gpu_mig_memory_used_bytes", "gpu_mig_memory_total_bytes") and s.label("gpu") in gpus:
            key = (s.label("gpu"), s.label("gpu_instance"), s.label("mig_profile"))
            inst.setdefault(key, {})[s.name] = s.value
    out = []
    for (idx, gi, prof), m in sorted(inst.items()):
        labels = gpus[idx].labels(hostname, hl, GPU_I_ID=gi, GPU_I_PROFILE=prof)
        if "gpu_mig_memory_used_bytes" in m:
            out.append(Sample("DCGM_FI_DEV_FB_USED", m["gpu_mig_memory_used_bytes"] / MIB, labels))
            if "gpu_mig_memory_total_bytes" in m:
                free = m["gpu_mig_memory_total_bytes"] - m["gpu_mig_memory_used_bytes"]
                out.append(Sample("DCGM_FI_DEV_FB_FREE", max(0.0, free) / MIB, labels))
    return out


def _reserved(samples: Sequence[Sample], gpus: Mapping[str, _Gpu], hostname: str, hl: str) -> list[Sample]:
    # DCGM reports reserved framebuffer separately; NVML v2 memory info leaves it out of used+free.
    mem: dict[str, dict[str, float]] = {}
    for s in samples:
        if s.name in ("gpu_memory_total_bytes", "gpu_memory_used_bytes", "gpu_memory_free_bytes"):
            mem.setdefault(s.label("gpu"), {})[s.name] = s.value
    out = []
    for idx, m in mem.items():
        if idx in gpus and len(m) == 3:
            reserved = m["gpu_memory_total_bytes"] - m["gpu_memory_used_bytes"] - m["gpu_memory_free_bytes"]
            out.append(Sample(FB_RESERVED.name, max(0.0, reserved) / MIB, gpus[idx].labels(hostname, hl)))
    return out


def _clock_reasons(samples: Sequence[Sample], gpus: Mapping[str, _Gpu], hostname: str, hl: str) -> list[Sample]:
    """The NVML bitmask again, from the per-reason series (only GPUs that reported reasons)."""
    bits = dict(REASON_BITS)
    mask: dict[str, int] = {}
    for s in samples:
        if s.name == "gpu_clocks_event_active" and s.label("gpu") in gpus:
            idx = s.label("gpu")
            mask[idx] = mask.get(idx, 0) | (bits.get(s.label("reason"), 0) if s.value else 0)
    return [Sample(spec.name, float(m), gpus[idx].labels(hostname, hl))
            for idx, m in mask.items() for spec in (CLOCKS_EVENT_REASONS, CLOCK_THROTTLE_REASONS)]


def _last_xid(events: Sequence[Event], gpus: Mapping[str, _Gpu], hostname: str, hl: str,
              texts: Mapping[int, str]) -> list[Sample]:
    by_bus = {pci.normalise(g.pci_bus_id): idx for idx, g in gpus.items() if g.pci_bus_id}
    last: dict[str, Event] = {}
    for e in events:
        if e.kind != "xid":
            continue
        idx = str(e.gpu) if e.gpu is not None else by_bus.get(pci.normalise(e.pci_bus_id) or "", "")
        if idx in gpus and (idx not in last or e.time >= last[idx].time):
            last[idx] = e
    out = []
    for idx, g in gpus.items():
        code = last[idx].code if idx in last else 0
        # err_code / err_msg as dcgm-exporter labels the XID series: the code and its text
        out.append(Sample(XID_ERRORS.name, float(code), g.labels(
            hostname, hl, err_code=str(code), err_msg=texts.get(code, "") if code else "")))
    return out
