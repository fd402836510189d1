"""nvml and nvlink collectors against the real driver, each value compared with nvidia-smi.

On a machine with a GPU: collect (A), run `nvidia-smi -q -x` plus `nvidia-smi nvlink -s / -e`,
collect again (B). A moving value passes when nvidia-smi's reading lies within [min(A,B),
max(A,B)] widened by its tolerance; a static one must match exactly. The diff table is printed
(`pytest -s`) and attached to the failure message.

The nvidia-smi parsers are pure and are also checked here on the real captures in
../shared/fixtures/nvidia_smi (no GPU needed), so they are not untested on machines without one.
"""

from __future__ import annotations

import re
import subprocess
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import pytest

from podhealth.collectors import nvlink, nvml
from podhealth import pci
from podhealth.collectors.nvml_session import NvmlSession
from podhealth.config import Config
from podhealth.vocab import Sample

MIB = float(1 << 20)


def key(name: str, **labels: object) -> str:
    return name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())) + "}" if labels else "")


@dataclass
class SmiGpu:
    pci_bus_id: str
    values: dict[str, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)


# --- pure parsers of nvidia-smi output ----------------------------------------------------------

_NUM = re.compile(r"^\s*(-?[0-9]+(?:\.[0-9]+)?)")


def _num(text: str | None) -> float | None:
    """"27 C", "67.03 W", "16x", "0 %" -> number; "N/A", "[N/A]", "Unknown Error", "" -> None."""
    if text is None:
        return None
    m = _NUM.match(text)
    return float(m.group(1)) if m else None


def _yes(text: str | None) -> float | None:
    t = (text or "").strip().lower()
    return {"yes": 1.0, "no": 0.0, "enabled": 1.0, "disabled": 0.0, "active": 1.0, "not active": 0.0}.get(t)


_FABRIC_STATE = {"not supported": 0.0, "not started": 1.0, "in progress": 2.0, "completed": 3.0}
_REASON_TAGS = {
    "gpu_idle": "gpu_idle", "applications_clocks_setting": "applications_clocks_setting",
    "sw_power_cap": "sw_power_cap", "hw_slowdown": "hw_slowdown", "sync_boost": "sync_boost",
    "sw_thermal_slowdown": "sw_thermal_slowdown", "hw_thermal_slowdown": "hw_thermal_slowdown",
    "hw_power_brake_slowdown": "hw_power_brake_slowdown", "display_clocks_setting": "display_clock_setting",
}


def _child(el: ET.Element, *tags: str) -> ET.Element | None:
    # Not `find(a) or find(b)`: an Element without children is falsy.
    for tag in tags:
        found = el.find(tag)
        if found is not None:
            return found
    return None


def parse_smi_xml(text: str) -> dict[str, SmiGpu]:
    """`nvidia-smi -q -x` -> per normalised PCI bus id, values keyed like the collector's samples."""
    root = ET.fromstring(text)
    driver = (root.findtext("driver_version") or "").strip()
    cuda = (root.findtext("cuda_version") or "").strip()
    out: dict[str, SmiGpu] = {}
    for g in root.findall("gpu"):
        bus = pci.normalise(g.findtext("pci/pci_bus_id") or g.get("id") or "") or ""
        gpu = SmiGpu(bus)
        v = gpu.values

        def put(name: str, value: float | None, **labels: object) -> None:
            if value is not None:
                v[key(name, **labels)] = value

        for tag, info in (("product_name", "model"), ("uuid", "uuid"), ("serial", "serial"),
                          ("vbios_version", "vbios_version")):
            t = (g.findtext(tag) or "").strip()
            if t and t != "N/A":
                gpu.info[info] = t
        gpu.info["driver_version"] = driver
        gpu.info["cuda_driver_version"] = cuda
        put("gpu_persistence_mode", _yes(g.findtext("persistence_mode")))
        put("gpu_temperature_celsius", _num(g.findtext("temperature/gpu_temp")))
        put("gpu_memory_temperature_celsius", _num(g.findtext("temperature/memory_temp")))
        power = _child(g, "gpu_power_readings", "power_readings")
        if power is not None:
            put("gpu_power_watts", _num(power.findtext("power_draw")) or _num(power.findtext("instant_power_draw"))
                or _num(power.findtext("average_power_draw")))
            put("gpu_power_limit_watts", _num(power.findtext("enforced_power_limit"))
                or _num(power.findtext("current_power_limit")))
        for part in ("total", "used", "free"):
            mib = _num(g.findtext(f"fb_memory_usage/{part}"))
            put(f"gpu_memory_{part}_bytes", None if mib is None else mib * MIB)
        util = _num(g.findtext("utilization/gpu_util"))
        put("gpu_utilization_ratio", None if util is None else util / 100)
        mutil = _num(g.findtext("utilization/memory_util"))
        put("gpu_memory_utilization_ratio", None if mutil is None else mutil / 100)
        for tag, name in (("clocks/sm_clock", "gpu_sm_clock_hertz"), ("clocks/mem_clock", "gpu_memory_clock_hertz"),
                          ("max_clocks/sm_clock", "gpu_sm_clock_max_hertz"),
                          ("max_clocks/mem_clock", "gpu_memory_clock_max_hertz")):
            mhz = _num(g.findtext(tag))
            put(name, None if mhz is None else mhz * 1e6)
        link = "pci/pci_gpu_link_info/"
        put("gpu_pcie_link_gen", _num(g.findtext(link + "pcie_gen/current_link_gen")))
        put("gpu_pcie_link_gen_max", _num(g.findtext(link + "pcie_gen/max_link_gen")))
        put("gpu_pcie_link_width", _num(g.findtext(link + "link_widths/current_link_width")))
        put("gpu_pcie_link_width_max", _num(g.findtext(link + "link_widths/max_link_width")))
        put("gpu_pcie_replay", _num(g.findtext("pci/replay_counter")))
        reasons = _child(g, "clocks_event_reasons", "clocks_throttle_reasons")
        if reasons is not None:
            for r in reasons:
                tag = r.tag.replace("clocks_event_reason_", "").replace("clocks_throttle_reason_", "")
                if tag in _REASON_TAGS:
                    put("gpu_clocks_event_active", _yes(r.text), reason=_REASON_TAGS[tag])
        for scope in ("volatile", "aggregate"):
            el = g.find(f"ecc_errors/{scope}")
            if el is None:
                continue
            if el.find("single_bit") is not None:  # drivers before 525
                put("gpu_ecc_errors", _num(el.findtext("single_bit/total")), type="corrected", scope=scope)
                put("gpu_ecc_errors", _num(el.findtext("double_bit/total")), type="uncorrected", scope=scope)
                continue
            for kind, suffix in (("corrected", "_correctable"), ("uncorrected", "_uncorrectable")):
                parts = [_num(c.text) for c in el if c.tag.endswith(suffix) or c.tag.startswith(
                    f"sram{suffix}_") or c.tag.startswith(f"dram{suffix}_")]
                nums = [p for p in parts if p is not None]
                if nums:
                    put("gpu_ecc_errors", sum(nums), type=kind, scope=scope)
        put("gpu_retired_pages", _num(g.findtext("retired_pages/multiple_single_bit_retirement/retired_count")),
            cause="sbe")
        put("gpu_retired_pages", _num(g.findtext("retired_pages/double_bit_retirement/retired_count")), cause="dbe")
        put("gpu_retired_pages_pending", _yes(g.findtext("retired_pages/pending_retirement")))
        put("gpu_remapped_rows", _num(g.findtext("remapped_rows/remapped_row_corr")), type="correctable")
        put("gpu_remapped_rows", _num(g.findtext("remapped_rows/remapped_row_unc")), type="uncorrectable")
        put("gpu_remapped_rows_pending", _yes(g.findtext("remapped_rows/remapped_row_pending")))
        put("gpu_remapped_rows_failure", _yes(g.findtext("remapped_rows/remapped_row_failure")))
        state = (g.findtext("fabric/state") or "").strip().lower()
        put("gpu_fabric_state", _FABRIC_STATE.get(state))
        out[bus] = gpu
    return out


_GPU_HEAD = re.compile(r"^GPU (\d+): .*\(UUID: (\S+?)\)\s*$")
_LINK = re.compile(r"^\s*Link (\d+): (.*)$")


def parse_nvlink_status(text: str) -> dict[str, dict[int, float]]:
    """`nvidia-smi nvlink -s` -> uuid -> link -> 1 (a speed) / 0 (<inactive>)."""
    out: dict[str, dict[int, float]] = {}
    cur: dict[int, float] | None = None
    for line in text.splitlines():
        if m := _GPU_HEAD.match(line):
            cur = out.setdefault(m.group(2), {})
        elif (m := _LINK.match(line)) and cur is not None:
            cur[int(m.group(1))] = 0.0 if "inactive" in m.group(2).lower() else 1.0
    return out


_ERR = re.compile(r"^\s*([A-Za-z -]+?) Errors:\s*(\d+)\s*$")


def parse_nvlink_errors(text: str) -> dict[str, dict[int, dict[str, float]]]:
    """`nvidia-smi nvlink -e` -> uuid -> link -> {"replay", "recovery", "crc", "crc-flit", ...}."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    cur: dict[int, dict[str, float]] | None = None
    for line in text.splitlines():
        if m := _GPU_HEAD.match(line):
            cur = out.setdefault(m.group(2), {})
        elif (m := _LINK.match(line)) and cur is not None and (e := _ERR.match(m.group(2))):
            cur.setdefault(int(m.group(1)), {})[e.group(1).strip().lower().replace(" ", "-")] = float(e.group(2))
    return out


# --- the parsers on real captures (no GPU needed) ------------------------------------------------

def test_xml_parser_on_real_captures(shared_fixtures: Path) -> None:
    d = shared_fixtures / "nvidia_smi"
    a100 = parse_smi_xml((d / "nvidia-smi-q-x_telegraf_a100-sxm4-v12.xml").read_text())
    g = a100["0000:01:00.0"]
    assert g.info["uuid"] == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert g.info["driver_version"] == "535.54.03" and g.info["cuda_driver_version"] == "12.2"
    assert g.values["gpu_temperature_celsius"] == 27 and g.values["gpu_memory_temperature_celsius"] == 44
    assert g.values["gpu_power_watts"] == 67.03 and g.values["gpu_power_limit_watts"] == 500
    assert g.values["gpu_memory_total_bytes"] == 81920 * MIB
    assert g.values["gpu_sm_clock_max_hertz"] == 1410e6
    assert g.values["gpu_pcie_link_width_max"] == 16 and g.values["gpu_pcie_link_gen"] == 4
    assert g.values[key("gpu_ecc_errors", type="corrected", scope="volatile")] == 0
    assert g.values[key("gpu_clocks_event_active", reason="display_clock_setting")] == 0
    assert "gpu_utilization_ratio" not in g.values  # N/A under MIG -> absent, not 0
    assert key("gpu_retired_pages", cause="sbe") not in g.values
    p100 = parse_smi_xml((d / "nvidia-smi-q-x_netdata_tesla-p100.xml").read_text())
    (p,) = p100.values()
    assert p.values[key("gpu_retired_pages", cause="dbe")] == 0 and p.values["gpu_retired_pages_pending"] == 0
    assert p.values[key("gpu_clocks_event_active", reason="gpu_idle")] == 1
    assert p.values[key("gpu_ecc_errors", type="uncorrected", scope="aggregate")] >= 0
    a10g = parse_smi_xml((d / "nvidia-smi-q-x_telegraf_a10g.xml").read_text())
    (r,) = a10g.values()
    assert r.values[key("gpu_remapped_rows", type="uncorrectable")] == 0 and r.values["gpu_remapped_rows_failure"] == 0


def test_nvlink_text_parsers_on_real_captures(shared_fixtures: Path) -> None:
    d = shared_fixtures / "nvidia_smi"
    status = parse_nvlink_status((d / "nvidia-smi-nvlink-status_a100_8gpu_gpud.txt").read_text())
    assert len(status) == 8 and all(len(links) == 12 and set(links.values()) == {1.0} for links in status.values())
    errors = parse_nvlink_errors((d / "nvidia-smi-nvlink-e_h100_excerpt_stas00.txt").read_text())
    (links,) = errors.values()
    assert links[17] == {"replay": 0, "recovery": 0, "crc": 0}


# --- the comparison on a real GPU ----------------------------------------------------------------

# name -> (absolute, relative) slack for values that move between reads; absent = must match.
MOVING: Mapping[str, tuple[float, float]] = {
    "gpu_temperature_celsius": (3, 0), "gpu_memory_temperature_celsius": (3, 0),
    "gpu_power_watts": (25, 0.2), "gpu_utilization_ratio": (0.2, 0), "gpu_memory_utilization_ratio": (0.2, 0),
    "gpu_memory_used_bytes": (64 * MIB, 0.01), "gpu_memory_free_bytes": (64 * MIB, 0.01),
    "gpu_memory_total_bytes": (1 * MIB, 0), "gpu_sm_clock_hertz": (50e6, 0.1), "gpu_memory_clock_hertz": (50e6, 0.1),
    "gpu_power_limit_watts": (1, 0),
}


@dataclass(frozen=True)
class Row:
    gpu: str
    metric: str
    ours: str
    smi: str
    ok: bool


def _ours(samples: tuple[Sample, ...], bus: str) -> dict[str, float]:
    out = {}
    for s in samples:
        if s.label("pci_bus_id") == bus:
            extra = {k: v for k, v in s.labels if k not in ("gpu", "uuid", "pci_bus_id", "model")}
            if s.name != "gpu_info":
                out[key(s.name, **extra)] = s.value
    return out


def _compare(a: dict[str, float], b: dict[str, float], smi: dict[str, float], gpu: str) -> Iterator[Row]:
    for k in sorted(set(smi) | (set(a) & set(b))):
        name = k.split("{")[0]
        if name in ("gpu_up", "gpu_lost", "gpu_devices", "gpu_energy_joules", "gpu_fabric_healthy"):
            continue  # nvidia-smi -q -x does not print these
        if k not in smi:
            yield Row(gpu, k, f"{a[k]:g}", "(not printed)", True)
            continue
        if k not in a or k not in b:
            yield Row(gpu, k, "(absent)", f"{smi[k]:g}", False)
            continue
        absolute, relative = MOVING.get(name, (0.0, 0.0))
        lo, hi = min(a[k], b[k]), max(a[k], b[k])
        slack = absolute + relative * hi
        ok = lo - slack <= smi[k] <= hi + slack
        yield Row(gpu, k, f"{a[k]:g}" if a[k] == b[k] else f"{a[k]:g}..{b[k]:g}", f"{smi[k]:g}", ok)


def _table(rows: list[Row]) -> str:
    lines = [f"{'gpu':<14} {'metric':<58} {'podhealth':>22} {'nvidia-smi':>16}  ok"]
    lines += [f"{r.gpu:<14} {r.metric:<58} {r.ours:>22} {r.smi:>16}  {'ok' if r.ok else 'DIFF'}" for r in rows]
    return "\n".join(lines)


def _smi(smi: str, *args: str) -> str:
    return subprocess.run([smi, *args], capture_output=True, text=True, timeout=120, check=True).stdout


@pytest.mark.hardware
def test_collectors_agree_with_nvidia_smi(nvidia_smi: str) -> None:
    session = NvmlSession()
    nv = nvml.create(Config(), session=session)
    link = nvlink.create(Config(), links_expected=18, session=session)
    try:
        a, la = nv.collect(), link.collect()
        xml = _smi(nvidia_smi, "-q", "-x")
        status, errors = _smi(nvidia_smi, "nvlink", "-s"), _smi(nvidia_smi, "nvlink", "-e")
        b, lb = nv.collect(), link.collect()
    finally:
        nv.close()
        link.close()
        session.shutdown()
    smi = parse_smi_xml(xml)
    rows: list[Row] = []
    assert {s.label("pci_bus_id") for s in b.samples if s.name == "gpu_up"} == set(smi), "GPU sets differ"
    for bus, g in sorted(smi.items()):
        rows += _compare(_ours(a.samples, bus), _ours(b.samples, bus), g.values, bus)
        (info,) = [s for s in b.samples if s.name == "gpu_info" and s.label("pci_bus_id") == bus]
        ours_info = {k: info.label(k) for k in ("uuid", "model", "serial", "vbios_version", "driver_version",
                                                "cuda_driver_version")}
        for k, v in g.info.items():
            rows.append(Row(bus, f"gpu_info.{k}", ours_info.get(k, ""), v, ours_info.get(k, "") == v))
    rows += _compare_nvlink(la, lb, parse_nvlink_status(status), parse_nvlink_errors(errors))
    table = _table(rows)
    print("\n" + table)
    bad = [r for r in rows if not r.ok]
    assert not bad, f"{len(bad)} values differ from nvidia-smi:\n{_table(bad)}"


def _compare_nvlink(a: object, b: object, status: dict[str, dict[int, float]],
                    errors: dict[str, dict[int, dict[str, float]]]) -> Iterator[Row]:
    def by_link(col: object) -> dict[tuple[str, int, str], float]:
        out: dict[tuple[str, int, str], float] = {}
        for s in col.samples:  # type: ignore[attr-defined]
            if s.name == "nvlink_up":
                out[(s.label("uuid"), int(s.label("link")), "up")] = s.value
            elif s.name == "nvlink_errors":
                out[(s.label("uuid"), int(s.label("link")), s.label("type"))] = s.value
        return out

    ra, rb = by_link(a), by_link(b)
    for uuid, links in sorted(status.items()):
        for n, up in sorted(links.items()):
            ours = rb.get((uuid, n, "up"))
            yield Row(uuid[:13], f"nvlink_up{{link={n}}}", "(absent)" if ours is None else f"{ours:g}", f"{up:g}",
                      ours == up)
    for uuid, per_link in sorted(errors.items()):
        for n, counts in sorted(per_link.items()):
            for label, v in counts.items():
                # Newer drivers print one "CRC" count per link; older ones split flit and data.
                types = {"crc": ("crc_flit", "crc_data"), "crc-flit": ("crc_flit",), "crc-data": ("crc_data",),
                         "replay": ("replay",), "recovery": ("recovery",)}.get(label)
                if types is None:
                    continue
                lo = sum(ra.get((uuid, n, t), 0.0) for t in types)
                hi = sum(rb.get((uuid, n, t), 0.0) for t in types)
                yield Row(uuid[:13], f"nvlink_errors{{link={n},type={'+'.join(types)}}}", f"{lo:g}..{hi:g}",
                          f"{v:g}", lo <= v <= hi)
