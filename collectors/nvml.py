"""GPU state through NVML (the real pynvml): one set of series per GPU, raw values, SI units.

Static facts (serial, VBIOS, max clocks, max PCIe link, supported clocks-event reasons) are read
once per GPU and NVML generation; each collection re-reads only what moves. A field the GPU does
not support is absent, never 0. A GPU that is lost, times out or errors is reported on its own
(gpu_up 0, gpu_lost, an entry in Collection.errors) and the other GPUs keep flowing.
"""

from __future__ import annotations

import ctypes
import re
import uuid
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping

import pynvml

from podhealth.collectors.base import Collection, specs
from podhealth.collectors.nvml_base import SessionCollector
from podhealth.collectors.nvml_session import (
    SLOW_CALL_S, Device, DeviceCalls, NvmlSession, SystemInfo, error_text, shared,
)
from podhealth.config import Config
from podhealth.vocab import MetricKind, MetricSpec, Sample, labels_of

GPU_LABELS = "labels gpu, uuid, pci_bus_id, model"

# Clocks-event (formerly "throttle") reason bits, nvml.h nvmlClocksEventReason*, by contract name.
CLOCKS_EVENT_REASONS: tuple[tuple[str, int], ...] = (
    ("gpu_idle", pynvml.nvmlClocksEventReasonGpuIdle),
    ("applications_clocks_setting", pynvml.nvmlClocksEventReasonApplicationsClocksSetting),
    ("sw_power_cap", pynvml.nvmlClocksEventReasonSwPowerCap),
    ("hw_slowdown", pynvml.nvmlClocksEventReasonHwSlowdown),
    ("sync_boost", pynvml.nvmlClocksEventReasonSyncBoost),
    ("sw_thermal_slowdown", pynvml.nvmlClocksEventReasonSwThermalSlowdown),
    ("hw_thermal_slowdown", pynvml.nvmlClocksEventReasonHwThermalSlowdown),
    ("hw_power_brake_slowdown", pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown),
    ("display_clock_setting", pynvml.nvmlClocksEventReasonDisplayClockSetting),
)

ECC_KINDS: tuple[tuple[str, int], ...] = (
    ("corrected", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED),
    ("uncorrected", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
)
ECC_SCOPES: tuple[tuple[str, int], ...] = (
    ("volatile", pynvml.NVML_VOLATILE_ECC),
    ("aggregate", pynvml.NVML_AGGREGATE_ECC),
)
RETIREMENT_CAUSES: tuple[tuple[str, int], ...] = (
    ("sbe", pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS),
    ("dbe", pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR),
)

# A driver older than the binding lacks the newer call (FUNCTION_NOT_FOUND) or knows only an older
# version of its struct (ARGUMENT_VERSION_MISMATCH): the older call answers the same reading.
_FALLBACK = frozenset({pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_NOT_SUPPORTED,
                       pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH})


def _spec(name: str, kind: MetricKind, help: str, unit: str = "") -> MetricSpec:
    return MetricSpec(name, kind, help, unit)


METRICS: Mapping[str, MetricSpec] = specs(
    _spec("gpu_devices", "gauge", "Number of GPUs NVML reports on this node."),
    _spec("gpu_up", "gauge", f"1 when the GPU answered NVML, 0 when lost, timed out or refusing every call ({GPU_LABELS})."),
    _spec("gpu_lost", "gauge", "1 when NVML says the GPU is lost (GPU_IS_LOST, fallen off the bus)."),
    _spec("gpu_field_unreadable", "gauge",
          "1 for a reading NVML refused with an error (not NOT_SUPPORTED) this collection; label `field` "
          "names it (ecc_uncorrected_volatile, remapped_rows, temperature, ...). Checks needing it say UNKNOWN."),
    _spec("gpu_utilization_ratio", "gauge", "Fraction of the last sample period a kernel was running (0..1).", "ratio"),
    _spec("gpu_memory_utilization_ratio", "gauge", "Fraction of the last sample period the memory controller was busy (0..1).", "ratio"),
    _spec("gpu_encoder_utilization_ratio", "gauge", "Fraction of the last sample period the video encoder was busy (0..1).", "ratio"),
    _spec("gpu_decoder_utilization_ratio", "gauge", "Fraction of the last sample period the video decoder was busy (0..1).", "ratio"),
    _spec("gpu_memory_used_bytes", "gauge", "Framebuffer memory in use.", "bytes"),
    _spec("gpu_memory_free_bytes", "gauge", "Framebuffer memory free.", "bytes"),
    _spec("gpu_memory_total_bytes", "gauge", "Framebuffer memory installed.", "bytes"),
    _spec("gpu_temperature_celsius", "gauge", "GPU core temperature.", "celsius"),
    _spec("gpu_memory_temperature_celsius", "gauge", "HBM temperature (NVML field NVML_FI_DEV_MEMORY_TEMP).", "celsius"),
    _spec("gpu_thermal_margin_celsius", "gauge",
          "Degrees below T.Limit, the GPU's max operating temperature (nvidia-smi 'GPU T.Limit Temp'; "
          "nvmlDeviceGetMarginTemperature, else the GPU_MAX threshold minus the temperature). Negative: above it.",
          "celsius"),
    _spec("gpu_power_watts", "gauge", "Power draw.", "watts"),
    _spec("gpu_power_limit_watts", "gauge", "Power limit the driver enforces.", "watts"),
    _spec("gpu_energy_joules", "counter", "Energy consumed since the driver was loaded.", "joules"),
    _spec("gpu_sm_clock_hertz", "gauge", "Current SM clock.", "hertz"),
    _spec("gpu_sm_clock_max_hertz", "gauge", "Maximum SM clock.", "hertz"),
    _spec("gpu_memory_clock_hertz", "gauge", "Current memory clock.", "hertz"),
    _spec("gpu_memory_clock_max_hertz", "gauge", "Maximum memory clock.", "hertz"),
    _spec("gpu_clocks_event_active", "gauge", "1 while the clocks-event reason in label `reason` holds clocks down, else 0."),
    _spec("gpu_pcie_link_gen", "gauge", "Current PCIe link generation."),
    _spec("gpu_pcie_link_gen_max", "gauge", "Maximum PCIe link generation of GPU and host."),
    _spec("gpu_pcie_link_width", "gauge", "Current PCIe link width (lanes)."),
    _spec("gpu_pcie_link_width_max", "gauge", "Maximum PCIe link width (lanes)."),
    _spec("gpu_pcie_replay", "counter", "PCIe replay counter."),
    _spec("gpu_ecc_errors", "counter", "ECC errors by `type` (corrected, uncorrected) and `scope` (volatile, aggregate)."),
    _spec("gpu_retired_pages", "gauge", "Retired framebuffer pages by `cause` (sbe, dbe); pre-Ampere GPUs only."),
    _spec("gpu_retired_pages_pending", "gauge", "1 when a page retirement waits for the next driver reload."),
    _spec("gpu_remapped_rows", "gauge", "Remapped HBM rows by `type` (correctable, uncorrectable)."),
    _spec("gpu_remapped_rows_pending", "gauge", "1 when a row remap waits for a GPU reset."),
    _spec("gpu_remapped_rows_failure", "gauge", "1 when row remapping failed (bank out of spare rows)."),
    _spec("gpu_row_remap_banks", "gauge",
          "Memory banks by spare-row `availability` (max, high, partial, low, none): "
          "nvmlDeviceGetRowRemapperHistogram, nvidia-smi's 'Bank Remap Availability Histogram'."),
    _spec("gpu_persistence_mode", "gauge", "1 when persistence mode is enabled."),
    _spec("gpu_mig_mode", "gauge", "1 when MIG mode is enabled (current mode), 0 when disabled; absent where MIG is not supported."),
    _spec("gpu_mig_memory_used_bytes", "gauge", "Framebuffer in use on one MIG instance (labels gpu_instance, "
                                                "compute_instance, mig_profile, mig_uuid beside the parent GPU's).", "bytes"),
    _spec("gpu_mig_memory_total_bytes", "gauge", "Framebuffer of one MIG instance.", "bytes"),
    _spec("gpu_vgpu_license_state", "gauge", "vGPU license state of a guest GPU (NVML_GRID_LICENSE_STATE_*: 5 licensed, "
                                             "2-4 unlicensed); absent where NVML has no vGPU licensing."),
    _spec("gpu_fabric_state", "gauge", "NVSwitch fabric state: 0 not supported, 1 not started, 2 in progress, 3 completed."),
    _spec("gpu_fabric_healthy", "gauge", "1 when fabric registration completed with status NVML_SUCCESS."),
    _spec("gpu_fabric_info", "info", "The multi-node NVLink domain the GPU registered in (labels cluster_uuid, "
                                     "clique_id); absent where the cluster UUID is zero (an 8-GPU board)."),
    _spec("gpu_fabric_degraded_bandwidth", "gauge", "1 when the fabric health mask says NVLink bandwidth is degraded "
                                                    "(GpuFabricInfoV healthMask); absent where not reported."),
    _spec("gpu_info", "info", "GPU and driver identity: driver_version, cuda_driver_version, vbios_version, serial."),
)


@dataclass(frozen=True, slots=True)
class StaticInfo:
    """What does not change while the driver stays loaded; None = not supported."""

    serial: str | None
    vbios: str | None
    sm_clock_max_mhz: int | None
    mem_clock_max_mhz: int | None
    pcie_gen_max: int | None
    pcie_width_max: int | None
    supported_reasons: int | None
    # T.Limit (the max operating temperature, C): fixed per GPU, so the margin NVML reports is
    # read once and every later margin is T.Limit minus the temperature (no extra call per cycle)
    t_limit_c: int | None = None


# nvmlRowRemapperHistogramValues_t's members: banks by how many spare rows they have left
REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")


@dataclass
class _DeviceState:
    generation: int
    unsupported: set[str] = field(default_factory=set)
    static: StaticInfo | None = None
    remap_seen: object = None  # the remapped-rows reading the histogram below was read at
    remap_hist: tuple[int, ...] | None = None


_MIG_NAME = re.compile(r"\bMIG\s+(\S+)$")


def _mig_samples(calls: DeviceCalls, h: object, labels: Mapping[str, str]) -> list[Sample]:
    """One memory pair per MIG instance (dcgm-exporter's per-instance series read these): NVML
    enumerates the physical GPU once; its instances only through their own handles."""
    out: list[Sample] = []
    count = calls.get("mig_count", lambda: pynvml.nvmlDeviceGetMaxMigDeviceCount(h)) or 0
    for i in range(min(int(count), 16)):
        try:
            mh = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
        except pynvml.NVMLError as e:
            if e.value in (pynvml.NVML_ERROR_NOT_FOUND, pynvml.NVML_ERROR_INVALID_ARGUMENT):
                continue  # no instance in this slot
            calls.note("mig_devices", e)
            break
        gi = calls.get(f"mig{i}_gi", lambda: pynvml.nvmlDeviceGetGpuInstanceId(mh))
        ci = calls.get(f"mig{i}_ci", lambda: pynvml.nvmlDeviceGetComputeInstanceId(mh))
        name = calls.get(f"mig{i}_name", lambda: pynvml.nvmlDeviceGetName(mh))
        uuid_ = calls.get(f"mig{i}_uuid", lambda: pynvml.nvmlDeviceGetUUID(mh))
        mem = calls.get(f"mig{i}_memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(mh))
        if gi is None or mem is None:
            continue
        m = _MIG_NAME.search(str(name or ""))
        extra = {"gpu_instance": str(gi), "compute_instance": "" if ci is None else str(ci),
                 "mig_profile": m.group(1) if m else "", "mig_uuid": str(uuid_ or "")}
        out.append(Sample.of("gpu_mig_memory_used_bytes", mem.used, **labels, **extra))
        out.append(Sample.of("gpu_mig_memory_total_bytes", mem.total, **labels, **extra))
    return out


def _temperature(h: object) -> int:
    return int(_first(  # type: ignore[call-overload]
        lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)))


def _t_limit(h: object) -> int:
    """T.Limit in C: temperature + the margin R530+ drivers report (nvidia-smi "GPU T.Limit Temp"),
    else the GPU_MAX threshold older ones give (the same temperature: "GPU Max Operating Temp")."""
    try:
        margin = pynvml.nvmlDeviceGetMarginTemperature(h)
    except pynvml.NVMLError as e:
        if e.value not in _FALLBACK:
            raise
        return int(pynvml.nvmlDeviceGetTemperatureThreshold(h, pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX))
    return _temperature(h) + int(margin)


_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(v: pynvml.c_nvmlFieldValue_t) -> float:
    """The number in an nvmlFieldValue_t, read through the union member its valueType names."""
    member = _VALUE_MEMBER.get(int(v.valueType))
    if member is None:
        raise ValueError(f"unknown NVML value type {v.valueType}")
    return float(getattr(v.value, member))


def _first(*fns: Callable[[], object]) -> object:
    """Call the newest API first; fall back when this driver lacks it (FUNCTION_NOT_FOUND)."""
    for fn in fns[:-1]:
        try:
            return fn()
        except pynvml.NVMLError as e:
            if e.value not in _FALLBACK:
                raise
    return fns[-1]()


class NvmlCollector(SessionCollector[_DeviceState]):
    name: ClassVar[str] = "nvml"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, session: NvmlSession, slow_call_s: float = SLOW_CALL_S) -> None:
        super().__init__(session, _DeviceState, slow_call_s)

    def _collect_once(self) -> Collection:
        count, devices = self._session.devices()
        system = self._session.system_info()
        self._next_run()
        samples: list[Sample] = [Sample.of("gpu_devices", count)]
        errors: list[str] = []
        for dev in devices:
            s, e = self._gpu(dev, system)
            samples.extend(s)
            errors.extend(e)
        return Collection(samples=tuple(samples), errors=tuple(errors))

    def _gpu(self, dev: Device, system: SystemInfo) -> tuple[list[Sample], list[str]]:
        labels = dev.identity.labels()
        if dev.handle is None:
            err = dev.error
            lost = err is not None and err.value == pynvml.NVML_ERROR_GPU_IS_LOST
            why = error_text(err) if err is not None else "no handle"
            return ([Sample.of("gpu_up", 0, **labels), Sample.of("gpu_lost", int(lost), **labels)],
                    [f"gpu {dev.index}: nvmlDeviceGetHandleByIndex: {why}"])
        st = self._state(dev)
        calls = DeviceCalls(dev, st.unsupported, self._slow_s)
        h = dev.handle
        out: list[Sample] = []

        ident, cache = dev.identity, self._cache

        def put(name: str, value: float | None, **extra: str | None) -> None:
            # Sample.of(name, value, **labels, **extra); an unchanged reading is last cycle's object
            if value is not None:
                out.append(cache.one((ident, name, *extra.values()), name, value,
                                     lambda: labels_of(**labels, **extra)))

        static = st.static
        if static is None:
            static = self._read_static(calls, h)
            if calls.up and not calls.errors:
                st.static = static  # cache only a complete read

        util = calls.get("utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(h))
        if util is not None:
            put("gpu_utilization_ratio", util.gpu / 100.0)
            put("gpu_memory_utilization_ratio", util.memory / 100.0)
        for engine, fn in (("encoder", pynvml.nvmlDeviceGetEncoderUtilization),
                           ("decoder", pynvml.nvmlDeviceGetDecoderUtilization)):
            # [percent, sampling period in µs]; NOT_SUPPORTED on parts without the engine.
            pct = calls.get(f"{engine}_utilization", lambda f=fn: f(h))
            if isinstance(pct, list) and pct:
                put(f"gpu_{engine}_utilization_ratio", pct[0] / 100.0)
        mem = calls.get("memory", lambda: _first(
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2),
            lambda: pynvml.nvmlDeviceGetMemoryInfo(h)))
        if mem is not None:
            put("gpu_memory_used_bytes", mem.used)
            put("gpu_memory_free_bytes", mem.free)
            put("gpu_memory_total_bytes", mem.total)
        temp = calls.get("temperature", lambda: _temperature(h))
        put("gpu_temperature_celsius", temp)
        if temp is not None and static.t_limit_c is not None:
            put("gpu_thermal_margin_celsius", static.t_limit_c - temp)
        put("gpu_memory_temperature_celsius", self._field(calls, h, "memory_temperature",
                                                          pynvml.NVML_FI_DEV_MEMORY_TEMP))
        power = calls.get("power", lambda: pynvml.nvmlDeviceGetPowerUsage(h))
        put("gpu_power_watts", None if power is None else power / 1000.0)
        limit = calls.get("power_limit", lambda: pynvml.nvmlDeviceGetEnforcedPowerLimit(h))
        put("gpu_power_limit_watts", None if limit is None else limit / 1000.0)
        energy = calls.get("energy", lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h))
        put("gpu_energy_joules", None if energy is None else energy / 1000.0)

        sm = calls.get("sm_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM))
        put("gpu_sm_clock_hertz", None if sm is None else sm * 1e6)
        mclk = calls.get("mem_clock", lambda: pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM))
        put("gpu_memory_clock_hertz", None if mclk is None else mclk * 1e6)
        if static.sm_clock_max_mhz is not None:
            put("gpu_sm_clock_max_hertz", static.sm_clock_max_mhz * 1e6)
        if static.mem_clock_max_mhz is not None:
            put("gpu_memory_clock_max_hertz", static.mem_clock_max_mhz * 1e6)

        reasons = calls.get("clocks_event_reasons", lambda: _first(
            lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
            lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)))
        if isinstance(reasons, int):
            supported = static.supported_reasons
            for reason, bit in CLOCKS_EVENT_REASONS:
                if supported is None or supported & bit:
                    put("gpu_clocks_event_active", 1 if reasons & bit else 0, reason=reason)

        put("gpu_pcie_link_gen", calls.get("pcie_gen", lambda: pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)))
        put("gpu_pcie_link_width", calls.get("pcie_width", lambda: pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)))
        put("gpu_pcie_link_gen_max", static.pcie_gen_max)
        put("gpu_pcie_link_width_max", static.pcie_width_max)
        put("gpu_pcie_replay", calls.get("pcie_replay", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h)))

        for kind, etype in ECC_KINDS:
            for scope, ctype in ECC_SCOPES:
                put("gpu_ecc_errors", calls.get(
                    f"ecc_{kind}_{scope}",
                    lambda e=etype, c=ctype: pynvml.nvmlDeviceGetTotalEccErrors(h, e, c)),
                    type=kind, scope=scope)

        for cause, ccode in RETIREMENT_CAUSES:
            pages = calls.get(f"retired_{cause}",
                              lambda c=ccode: pynvml.nvmlDeviceGetRetiredPages(h, c))
            put("gpu_retired_pages", None if pages is None else len(pages), cause=cause)
        put("gpu_retired_pages_pending", calls.get(
            "retired_pending", lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)))

        rows = calls.get("remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(h))
        if rows is not None:
            corr, unc, pending, failure = rows
            put("gpu_remapped_rows", corr, type="correctable")
            put("gpu_remapped_rows", unc, type="uncorrectable")
            put("gpu_remapped_rows_pending", 1 if pending else 0)
            put("gpu_remapped_rows_failure", 1 if failure else 0)
            # The histogram moves only when a row is remapped: read again only when the counts do.
            if st.remap_seen != rows:
                got = calls.get("row_remap_histogram", lambda: pynvml.nvmlDeviceGetRowRemapperHistogram(h))
                st.remap_hist = None if got is None else tuple(
                    int(getattr(got, a)) for a in REMAP_AVAILABILITY)
                st.remap_seen = rows if got is not None or "row_remap_histogram" in st.unsupported else None
            for avail, banks in zip(REMAP_AVAILABILITY, st.remap_hist or ()):
                put("gpu_row_remap_banks", banks, availability=avail)

        pm = calls.get("persistence_mode", lambda: pynvml.nvmlDeviceGetPersistenceMode(h))
        put("gpu_persistence_mode", None if pm is None else int(pm == pynvml.NVML_FEATURE_ENABLED))

        # MIG can be switched on while the driver stays loaded (Hopper needs no GPU reset for it).
        mig = calls.get("mig_mode", lambda: pynvml.nvmlDeviceGetMigMode(h))
        if isinstance(mig, (list, tuple)) and mig:
            put("gpu_mig_mode", int(mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE))
            if mig[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
                out.extend(_mig_samples(calls, h, labels))

        lic = calls.get("vgpu_license", lambda: pynvml.nvmlDeviceGetGridLicensableFeatures_v4(h))
        if lic is not None and lic.isGridLicenseSupported and lic.licensableFeaturesCount:
            put("gpu_vgpu_license_state", int(lic.gridLicensableFeatures[0].featureState))

        fabric = calls.get("fabric", lambda: self._fabric(h))
        if fabric is not None:
            state, status, cluster, clique, mask = fabric
            put("gpu_fabric_state", state)
            if state != pynvml.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED:
                put("gpu_fabric_healthy", int(status == pynvml.NVML_SUCCESS
                                              and state == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED))
            if cluster:
                # a multi-node NVLink domain (GB200 NVL72): which one, and which partition in it.
                # An 8-GPU HGX/DGX reports the zero UUID: no series there.
                put("gpu_fabric_info", 1, cluster_uuid=cluster, clique_id=str(clique))
            bw = (mask >> pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW) \
                & pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW if mask is not None else 0
            if bw != pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_NOT_SUPPORTED:
                put("gpu_fabric_degraded_bandwidth", int(bw == pynvml.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE))

        put("gpu_info", 1, driver_version=system.driver_version,
            cuda_driver_version=system.cuda_driver_version,
            vbios_version=static.vbios, serial=static.serial)
        if not calls.down:
            for key in calls.unreadable:
                out.append(Sample.of("gpu_field_unreadable", 1, **labels, field=key))
        out.append(Sample.of("gpu_up", int(calls.up), **labels))
        out.append(Sample.of("gpu_lost", int(calls.lost), **labels))
        return out, calls.errors

    @staticmethod
    def _read_static(calls: DeviceCalls, h: object) -> StaticInfo:
        def num(key: str, fn: Callable[[], object]) -> int | None:
            v = calls.get(key, fn)
            return int(v) if isinstance(v, int) else None

        def text(key: str, fn: Callable[[], object]) -> str | None:
            v = calls.get(key, fn)
            return str(v) if v is not None else None

        return StaticInfo(
            serial=text("serial", lambda: pynvml.nvmlDeviceGetSerial(h)),
            vbios=text("vbios", lambda: pynvml.nvmlDeviceGetVbiosVersion(h)),
            sm_clock_max_mhz=num("sm_clock_max", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM)),
            mem_clock_max_mhz=num("mem_clock_max", lambda: pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            pcie_gen_max=num("pcie_gen_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h)),
            pcie_width_max=num("pcie_width_max", lambda: pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
            supported_reasons=num("supported_reasons", lambda: _first(
                lambda: pynvml.nvmlDeviceGetSupportedClocksEventReasons(h),
                lambda: pynvml.nvmlDeviceGetSupportedClocksThrottleReasons(h))),
            t_limit_c=num("t_limit", lambda: _t_limit(h)),
        )

    @staticmethod
    def _field(calls: DeviceCalls, h: object, key: str, field_id: int) -> float | None:
        values = calls.get(key, lambda: pynvml.nvmlDeviceGetFieldValues(h, [field_id]))
        if values is None:
            return None
        v = values[0]
        if v.nvmlReturn != pynvml.NVML_SUCCESS:
            # Each field carries its own return code; sort it like a call's.
            calls.note(key, pynvml.NVMLError(v.nvmlReturn))
            return None
        return field_value(v)

    @staticmethod
    def _fabric(h: object) -> tuple[int, int, str, int, int | None]:
        """(state, status, cluster UUID or "" when zero, clique id, health mask or None). The
        versioned call first; drivers before 550 only have the plain one (no health mask)."""
        mask: int | None = None
        try:
            info = pynvml.c_nvmlGpuFabricInfoV_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
            mask = int(info.healthMask)
        except pynvml.NVMLError as e:
            if e.value not in (pynvml.NVML_ERROR_FUNCTION_NOT_FOUND, pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH):
                raise
            info = pynvml.c_nvmlGpuFabricInfo_t()
            pynvml.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        raw = bytes(info.clusterUuid)
        cluster = str(uuid.UUID(bytes=raw)) if any(raw) else ""
        return int(info.state), int(info.status), cluster, int(info.cliqueId), mask


def create(cfg: Config, *, session: NvmlSession | None = None, slow_call_s: float = SLOW_CALL_S) -> NvmlCollector:
    """The agent's nvml collector. Seams: `session` (default: the process-wide one shared with
    nvlink) and `slow_call_s` (one NVML call slower than this takes its GPU down for the round)."""
    return NvmlCollector(session if session is not None else shared(cfg.paths.nvml_library), slow_call_s)
