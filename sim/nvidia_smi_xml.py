"""`nvidia-smi -q -x`: the same facts as the `-q` text, read from nvidia-smi's XML log.

Pure: XML text in, a `nvidia_smi.Capture` out. The element names are nvsmi_device_v11/v12's
(../shared/fixtures/nvidia_smi/nvidia-smi-q-x_*.xml: A100-SXM4 with MIG, A10G, T4, P100), with both
generations of the clocks-reason names (`clocks_throttle_reason_*`, R535+ `clocks_event_reason_*`)
and of the ECC layout (`single_bit/total` before R510, `*_correctable` / `*_uncorrectable` after).
A capture without any `<gpu>` raises ValueError; the parser reads no DTD and resolves no entity.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Mapping

from podhealth.sim.nvidia_smi import REASON_BITS, Capture, CapturedGpu, _bool, _cuda, _float, _int, _na

# <clocks_*_reason_X> -> nvidia-smi's text name for the same reason (REASON_BITS' keys)
_REASONS: Mapping[str, str] = {
    "gpu_idle": "Idle", "applications_clocks_setting": "Applications Clocks Setting",
    "sw_power_cap": "SW Power Cap", "hw_slowdown": "HW Slowdown", "sync_boost": "Sync Boost",
    "sw_thermal_slowdown": "SW Thermal Slowdown", "hw_thermal_slowdown": "HW Thermal Slowdown",
    "hw_power_brake_slowdown": "HW Power Brake Slowdown", "display_clocks_setting": "Display Clock Setting",
}


def _text(el: ET.Element | None, path: str) -> str | None:
    found = el.find(path) if el is not None else None
    return found.text.strip() if found is not None and found.text is not None else None


def _ecc(section: ET.Element | None) -> tuple[int | None, int | None]:
    if section is None:
        return None, None
    if section.find("single_bit") is not None or section.find("double_bit") is not None:
        return _int(_text(section, "single_bit/total")), _int(_text(section, "double_bit/total"))
    sbe = dbe = None
    for c in section:
        n = _int(c.text)
        if n is None:
            continue
        if c.tag.endswith("_uncorrectable"):
            dbe = (dbe or 0) + n
        elif c.tag.endswith("_correctable"):
            sbe = (sbe or 0) + n
    return sbe, dbe


def _reasons(gpu: ET.Element, warnings: list[str], bus: str) -> int | None:
    section = gpu.find("clocks_event_reasons")
    if section is None:
        section = gpu.find("clocks_throttle_reasons")
    if section is None:
        return None
    bits, seen = 0, False
    for c in section:
        key = c.tag.removeprefix("clocks_event_reason_").removeprefix("clocks_throttle_reason_")
        name = _REASONS.get(key)
        if name is None:
            warnings.append(f"GPU {bus}: unknown clocks-event reason {c.tag!r} ignored")
            continue
        seen = True
        if _bool(c.text, ("Active",)):
            bits |= REASON_BITS[name]
    return bits if seen else None


def _remap(gpu: ET.Element) -> tuple[tuple[int, int, bool, bool] | None, tuple[int, int, int, int, int] | None]:
    rows = gpu.find("remapped_rows")
    if rows is None or not len(rows):
        return None, None  # "N/A": no row remapping (pre-Ampere, or a VM that hides it)
    corr, unc = _int(_text(rows, "remapped_row_corr")), _int(_text(rows, "remapped_row_unc"))
    remap = None
    if corr is not None and unc is not None:
        remap = (corr, unc, bool(_bool(_text(rows, "remapped_row_pending"), ("Yes", "Active", "Enabled"))),
                 bool(_bool(_text(rows, "remapped_row_failure"), ("Yes", "Active", "Enabled"))))
    hist = [_int(_text(rows, f"row_remapper_histogram/row_remapper_histogram_{k}"))
            for k in ("max", "high", "partial", "low", "none")]
    return remap, (None if any(v is None for v in hist) else tuple(hist))  # type: ignore[return-value]


def _clocks(el: ET.Element | None) -> tuple[int | None, int | None, int | None, int | None]:
    return (_int(_text(el, "graphics_clock")), _int(_text(el, "sm_clock")), _int(_text(el, "mem_clock")),
            _int(_text(el, "video_clock")))


def _gpu(gpu: ET.Element, warnings: list[str]) -> CapturedGpu:
    bus = (gpu.get("id") or _text(gpu, "pci/pci_bus_id") or "").upper().replace("0X", "0x")
    pci = gpu.find("pci")
    power = gpu.find("gpu_power_readings")
    if power is None:
        power = gpu.find("power_readings")
    temp = gpu.find("temperature")
    ecc = gpu.find("ecc_errors")
    retired = gpu.find("retired_pages")
    remap, hist = _remap(gpu)
    pending = _text(retired, "pending_blacklist") or _text(retired, "pending_retirement")

    def hexid(path: str) -> int | None:
        v = _na(_text(pci, path))
        return int(v, 16) if v and all(ch in "0123456789abcdefABCDEF" for ch in v) else None

    return CapturedGpu(
        pci_bus_id=bus,
        name=_na(_text(gpu, "product_name")),
        architecture=_na(_text(gpu, "product_architecture")),
        uuid=_na(_text(gpu, "uuid")),
        serial=_na(_text(gpu, "serial")),
        vbios=_na(_text(gpu, "vbios_version")),
        persistence_mode=_bool(_text(gpu, "persistence_mode")),
        pci_device_id=hexid("pci_device_id"),
        pci_subsystem_id=hexid("pci_sub_system_id"),
        pcie_gen_max=_int(_text(pci, "pci_gpu_link_info/pcie_gen/max_link_gen")),
        pcie_width_max=_int(_text(pci, "pci_gpu_link_info/link_widths/max_link_width")),
        pcie_replay=_int(_text(pci, "replay_counter")),
        memory_total_mib=_int(_text(gpu, "fb_memory_usage/total")),
        power_limit_w=_float(_text(power, "current_power_limit") or _text(power, "enforced_power_limit")
                             or _text(power, "power_limit")),
        power_draw_w=_float(_text(power, "power_draw")),
        max_clocks=_clocks(gpu.find("max_clocks")),
        clocks=_clocks(gpu.find("clocks")),
        ecc_enabled=_bool(_text(gpu, "ecc_mode/current_ecc")),
        ecc_sbe=(_ecc(ecc.find("volatile") if ecc is not None else None)[0],
                 _ecc(ecc.find("aggregate") if ecc is not None else None)[0]),
        ecc_dbe=(_ecc(ecc.find("volatile") if ecc is not None else None)[1],
                 _ecc(ecc.find("aggregate") if ecc is not None else None)[1]),
        retired_sbe=_int(_text(retired, "multiple_single_bit_retirement/retired_count")),
        retired_dbe=_int(_text(retired, "double_bit_retirement/retired_count")),
        retired_pending=_bool(pending, ("Yes",)) if _na(pending) else None,
        remap=remap,
        remap_histogram=hist,
        clocks_event_reasons=_reasons(gpu, warnings, bus),
        temperature_c=_int(_text(temp, "gpu_temp")),
        mem_temperature_c=_int(_text(temp, "memory_temp")),
        temp_shutdown_c=_int(_text(temp, "gpu_temp_max_threshold")),
        temp_slowdown_c=_int(_text(temp, "gpu_temp_slow_threshold")),
        temp_max_operating_c=_int(_text(temp, "gpu_temp_max_gpu_threshold")),
        mem_temp_max_c=_int(_text(temp, "gpu_temp_max_mem_threshold")),
        t_limit_margin_c=_int(_text(temp, "gpu_temp_tlimit")),
        fabric_state=_text(gpu, "fabric/state"),
    )


def parse(text: str) -> Capture:
    """Parse `nvidia-smi -q -x`. ValueError for XML that is not nvidia-smi's log or holds no GPU."""
    if "<!ENTITY" in text:
        raise ValueError("nvidia-smi -q -x never declares entities: refusing the document")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        raise ValueError(f"not an nvidia-smi -q -x capture: {e}") from None
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"not an nvidia-smi -q -x capture: root element <{root.tag}>")
    warnings: list[str] = []
    gpus = tuple(_gpu(g, warnings) for g in root.findall("gpu"))
    if not gpus:
        raise ValueError("not an nvidia-smi -q -x capture: no <gpu> element found")
    attached = _int(_text(root, "attached_gpus"))
    if attached is not None and attached != len(gpus):
        warnings.append(f"capture lists {attached} attached GPUs but holds {len(gpus)} GPU elements")
    return Capture(driver_version=_na(_text(root, "driver_version")), cuda_version=_cuda(_text(root, "cuda_version")),
                   gpus=gpus, warnings=tuple(warnings), attached=attached)
