"""Seeding a simulated node from `nvidia-smi -q` captures, checked through plain pynvml."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pynvml
import pytest

from podhealth.sim import nvidia_smi, nvml_lib
from podhealth.sim.node import SimNode

SAMPLE = "nvidia_smi/nvidia-smi-q_2gpu_sample.txt"


@pytest.fixture
def sample(own_fixtures: Path) -> str:
    return (own_fixtures / SAMPLE).read_text()


@pytest.fixture
def nvml_for(tmp_path: Path) -> Iterator[object]:
    """Install a node seeded from a capture; yields a function text -> SimNode."""
    installed: list[SimNode] = []

    def make(text: str, name: str = "seed01") -> SimNode:
        node = SimNode.create(tmp_path, name, seed=nvidia_smi.to_state(nvidia_smi.parse(text), name))
        nvml_lib.install(node)
        pynvml.nvmlInit()
        installed.append(node)
        return node

    try:
        yield make
    finally:
        if installed:
            try:
                pynvml.nvmlShutdown()
            except pynvml.NVMLError:
                pass
            nvml_lib.uninstall()


def test_parse_own_sample(sample: str) -> None:
    cap = nvidia_smi.parse(sample)
    assert cap.driver_version == "550.54.15" and cap.cuda_version == 12040
    assert cap.warnings == ()
    g0, g1 = cap.gpus
    assert g0.pci_bus_id == "00000000:18:00.0" and g1.pci_bus_id == "00000000:2A:00.0"
    assert g0.uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert g0.ecc_sbe == (3, 13) and g0.ecc_dbe == (1, 2)  # SRAM + DRAM
    assert g0.remap == (3, 2, True, False)
    assert g0.clocks_event_reasons == 0x4 | 0x8 | 0x80
    assert g0.power_limit_w == 650.0 and g0.pcie_replay == 12
    assert g0.fabric_state == "In Progress"
    # Second GPU: pre-R510 ECC layout, the older "Throttle" section name, absolute thresholds.
    assert g1.ecc_sbe == (5, 7) and g1.ecc_dbe == (0, 1)
    assert g1.clocks_event_reasons == 0x1
    assert g1.persistence_mode is False
    assert (g1.temp_shutdown_c, g1.temp_slowdown_c, g1.temp_max_operating_c, g1.mem_temp_max_c) == (92, 89, 87, 95)
    assert g1.mem_temperature_c is None and g1.remap is None and g1.fabric_state is None


def test_seeded_node_through_pynvml(sample: str, nvml_for) -> None:  # type: ignore[no-untyped-def]
    node = nvml_for(sample)
    # two H100 SXM: not an 8-GPU DGX/HGX build, never guessed from the model alone (issue 28)
    assert node.state.profile == "generic"
    assert pynvml.nvmlDeviceGetCount() == 2
    assert pynvml.nvmlSystemGetDriverVersion() == "550.54.15"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12040
    h0, h1 = (pynvml.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert pynvml.nvmlDeviceGetUUID(h0) == "GPU-11111111-2222-3333-4444-555555555555"
    assert pynvml.nvmlDeviceGetSerial(h1) == "1650000000002"
    assert pynvml.nvmlDeviceGetVbiosVersion(h0) == "96.00.99.00.01"
    assert pynvml.nvmlDeviceGetPciInfo(h1).busId == "00000000:2A:00.0"
    assert pynvml.nvmlDeviceGetTotalEccErrors(h0, 0, 1) == 13
    assert pynvml.nvmlDeviceGetTotalEccErrors(h0, 1, 0) == 1
    assert pynvml.nvmlDeviceGetRemappedRows(h0) == (3, 2, 1, 0)
    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h0) == 0x8C
    assert pynvml.nvmlDeviceGetEnforcedPowerLimit(h0) == 650_000
    assert pynvml.nvmlDeviceGetPowerUsage(h0) == 113_500
    assert pynvml.nvmlDeviceGetTemperature(h0, 0) == 41
    assert pynvml.nvmlDeviceGetPcieReplayCounter(h0) == 12
    assert pynvml.nvmlDeviceGetPersistenceMode(h1) == 0
    assert pynvml.nvmlDeviceGetTemperatureThreshold(h1, pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN) == 92
    # What a capture cannot show comes from the profile: 18 NVLink links on an H100.
    assert pynvml.nvmlDeviceGetNvLinkState(h0, 17) == 1


@pytest.mark.parametrize("cut", range(0, 200, 3))
def test_truncated_capture_never_crashes(sample: str, cut: int) -> None:
    lines = sample.splitlines(keepends=True)
    text = "".join(lines[:cut]) + (lines[cut][: len(lines[cut]) // 2] if cut < len(lines) else "")
    if "\nGPU 0000" not in "\n" + text:
        with pytest.raises(ValueError, match="no 'GPU <bus id>' section"):
            nvidia_smi.parse(text)
        return
    cap = nvidia_smi.parse(text)
    state = nvidia_smi.to_state(cap, "trunc")
    assert len(state.gpus) == len(cap.gpus) >= 1


@pytest.mark.parametrize("text", ["", "garbage\n\x00\xff", "Driver Version : 550.1\n", "GPU\n    Product Name : X\n"])
def test_no_gpu_section_is_a_clear_error(text: str) -> None:
    with pytest.raises(ValueError, match="no 'GPU <bus id>' section found"):
        nvidia_smi.parse(text)


def test_malformed_values_are_skipped(sample: str) -> None:
    broken = sample.replace("Total                             : 81559 MiB", "Total : lots") \
                   .replace("DRAM Correctable              : 2", "DRAM Correctable : [Unknown Error]")
    cap = nvidia_smi.parse(broken)
    assert cap.gpus[0].memory_total_mib is None and cap.gpus[0].ecc_sbe == (1, 13)
    state = nvidia_smi.to_state(cap, "x")
    assert state.gpus[0].memory_total_mib == 81559  # from the profile


def _captures(shared: Path) -> list[Path]:
    return sorted(p for p in (shared / "nvidia_smi").glob("nvidia-smi-q_*.txt") if not p.name.endswith(".source.txt"))


def test_seed_from_every_shared_capture(shared_fixtures: Path, tmp_path: Path) -> None:
    captures = _captures(shared_fixtures)
    assert len(captures) >= 6
    for i, path in enumerate(captures):
        text = path.read_text(errors="replace")
        # Independent of the parser: what a grep of the capture says.
        uuids = re.findall(r"^\s+GPU UUID\s+: (GPU-[0-9a-f-]+)\s*$", text, re.M)
        bus_ids = re.findall(r"^GPU ([0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F])\s*$", text, re.M)
        names = re.findall(r"^\s+Product Name\s+: (.+?)\s*$", text, re.M)
        node = SimNode.create(tmp_path, f"seed{i}", seed=nvidia_smi.to_state(nvidia_smi.parse(text), f"seed{i}"))
        nvml_lib.install(node)
        try:
            pynvml.nvmlInit()
            n = pynvml.nvmlDeviceGetCount()
            assert n == len(bus_ids), path.name
            handles = [pynvml.nvmlDeviceGetHandleByIndex(k) for k in range(n)]
            assert [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles] == bus_ids, path.name
            assert [pynvml.nvmlDeviceGetName(h) for h in handles] == names, path.name
            got_uuids = [pynvml.nvmlDeviceGetUUID(h) for h in handles]
            if len(uuids) == n:
                assert got_uuids == uuids, path.name
            driver = re.search(r"^Driver Version\s+: (\S+)", text, re.M)
            assert driver and pynvml.nvmlSystemGetDriverVersion() == driver.group(1)
            pynvml.nvmlShutdown()
        finally:
            nvml_lib.uninstall()


def test_shared_capture_facts(shared_fixtures: Path) -> None:
    d = shared_fixtures / "nvidia_smi"
    h100 = nvidia_smi.parse((d / "nvidia-smi-q_h100_sxm_8gpu_565.57.01_thamada.txt").read_text())
    assert len(h100.gpus) == 8 and h100.cuda_version == 12070
    assert h100.gpus[0].uuid == "GPU-b42dd28e-ffdd-8720-1df0-98bd8cdc05b1"
    assert h100.gpus[0].pcie_replay == 7 and h100.gpus[0].clocks_event_reasons == 0x1
    assert nvidia_smi.guess_profile(h100) == "dgx-h100"

    a100 = nvidia_smi.parse((d / "nvidia-smi-q_a100_remapped_rows_pending_excerpt_stas00.txt").read_text())
    assert a100.gpus[0].remap == (1, 0, True, False) and a100.gpus[0].ecc_sbe == (177, 177)
    assert any("8 attached GPUs" in w for w in a100.warnings)
    assert nvidia_smi.to_state(a100, "a").gpus[0].remap_pending

    gh200 = nvidia_smi.parse((d / "nvidia-smi-q_gh200_480gb_550.127.05_thamada.txt").read_text())
    g = gh200.gpus[0]
    assert g.ecc_dbe == (0, 1) and g.remap == (0, 1, False, False) and g.fabric_state == "N/A"
    assert not nvidia_smi.to_state(gh200, "g").gpus[0].has_fabric

    invalid = nvidia_smi.parse((d / "nvidia-smi-q_h100_8gpu_gpud_535.183.01.out.0.invalid.txt").read_text())
    assert len(invalid.gpus) == 1
    assert any("Invalid HW Slowdown" in w for w in invalid.warnings)

    h200 = nvidia_smi.parse((d / "nvidia-smi-q_h200_1gpu_vm_passthrough_550.90.12_thamada.txt").read_text())
    # one H200 in a VM: not the 8-GPU DGX / HGX build, so no shipped profile is guessed (issue 28)
    g = nvidia_smi.guess(h200)
    assert g.profile == "generic" and not g.exact and "profile capture" in g.why and "dgx-h200 (8 GPUs)" in g.why
    assert h200.gpus[0].memory_total_mib == 143771


# nvidia-smi's reason names -> pynvml's own constants (an independent mapping from the parser's)
_PYNVML_REASON = {
    "Idle": "nvmlClocksThrottleReasonGpuIdle",
    "Applications Clocks Setting": "nvmlClocksThrottleReasonApplicationsClocksSetting",
    "SW Power Cap": "nvmlClocksThrottleReasonSwPowerCap",
    "HW Slowdown": "nvmlClocksThrottleReasonHwSlowdown",
    "Sync Boost": "nvmlClocksThrottleReasonSyncBoost",
    "SW Thermal Slowdown": "nvmlClocksThrottleReasonSwThermalSlowdown",
    "HW Thermal Slowdown": "nvmlClocksThrottleReasonHwThermalSlowdown",
    "HW Power Brake Slowdown": "nvmlClocksThrottleReasonHwPowerBrakeSlowdown",
    "Display Clock Setting": "nvmlClocksThrottleReasonDisplayClockSetting",
}


def _grep_clocks(section: str) -> tuple[tuple[int, ...] | None, int | None]:
    """(graphics, SM, memory, video) MHz under `    Clocks`, and the active reasons as pynvml bits."""
    m = re.search(r"^    Clocks\n((?:        .*\n)+)", section, re.M)
    clocks = None
    if m:
        mhz = dict(re.findall(r"^\s+(Graphics|SM|Memory|Video)\s+: (\d+) MHz", m.group(1), re.M))
        clocks = tuple(int(mhz[k]) for k in ("Graphics", "SM", "Memory", "Video"))
    m = re.search(r"^    Clocks (?:Event|Throttle) Reasons\n((?:        .*\n)+)", section, re.M)
    bits = None
    if m:
        bits = 0
        for name, state in re.findall(r"^\s+(\S.*?)\s+: (Active|Not Active)\s*$", m.group(1), re.M):
            if state == "Active":
                bits |= getattr(pynvml, _PYNVML_REASON[name])
    return clocks, bits


def test_clocks_and_throttle_reasons_answer_as_captured(shared_fixtures: Path, tmp_path: Path) -> None:
    """pynvml's current clocks and clocks-event (throttle) reasons on a node seeded from every
    shared nvidia-smi -q capture are what the capture's Clocks / Clocks Event Reasons show."""
    checked_reasons = checked_clocks = 0
    for i, path in enumerate(_captures(shared_fixtures)):
        text = path.read_text(errors="replace")
        sections = re.split(r"^GPU [0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-9A-F]\s*$", text, flags=re.M)[1:]
        node = SimNode.create(tmp_path, f"clk{i}", seed=nvidia_smi.to_state(nvidia_smi.parse(text), f"clk{i}"))
        nvml_lib.install(node)
        try:
            pynvml.nvmlInit()
            for k, section in enumerate(sections):
                h = pynvml.nvmlDeviceGetHandleByIndex(k)
                clocks, bits = _grep_clocks(section + "\n")
                if bits is not None:
                    assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(h) == bits, (path.name, k)
                    assert pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h) == bits, (path.name, k)
                    checked_reasons += 1
                if clocks is not None:
                    got = tuple(pynvml.nvmlDeviceGetClockInfo(h, c) for c in (
                        pynvml.NVML_CLOCK_GRAPHICS, pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM, pynvml.NVML_CLOCK_VIDEO))
                    assert got == clocks, (path.name, k)
                    checked_clocks += 1
        finally:
            pynvml.nvmlShutdown()
            nvml_lib.uninstall()
    assert checked_reasons >= 10 and checked_clocks >= 10


def test_throttled_gpu_of_the_h100_capture(shared_fixtures: Path, tmp_path: Path) -> None:
    path = shared_fixtures / "nvidia_smi" / "nvidia-smi-q_h100_8gpu_gpud_535.183.01.out.0.valid.txt"
    if not path.is_file():
        pytest.skip(f"{path} absent (the real-capture corpus lives in ../shared/fixtures)")
    node = SimNode.create(tmp_path, "thr", seed=nvidia_smi.to_state(nvidia_smi.parse(path.read_text()), "thr"))
    nvml_lib.install(node)
    try:
        pynvml.nvmlInit()
        busy = pynvml.nvmlDeviceGetHandleByIndex(2)  # 00000000:75:00.0, at full clocks and capped
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(busy) == (
            pynvml.nvmlClocksThrottleReasonSwPowerCap | pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
            | pynvml.nvmlClocksThrottleReasonHwPowerBrakeSlowdown)
        assert pynvml.nvmlDeviceGetClockInfo(busy, pynvml.NVML_CLOCK_SM) == 1980
        idle = pynvml.nvmlDeviceGetHandleByIndex(0)
        assert pynvml.nvmlDeviceGetCurrentClocksEventReasons(idle) == pynvml.nvmlClocksThrottleReasonGpuIdle
        assert pynvml.nvmlDeviceGetClockInfo(idle, pynvml.NVML_CLOCK_VIDEO) == 765
    finally:
        pynvml.nvmlShutdown()
        nvml_lib.uninstall()


def test_a_4_gpu_a100_is_not_guessed_as_the_8_gpu_dgx(shared_fixtures: Path, tmp_path: Path) -> None:
    """Issue 28: a 4-GPU A100 server was guessed as dgx-a100 and failed gpu_count with REBOOT. The
    capture here is the real A100-SXM4-80GB `-q -x` (telegraf's fixture, which lists 4 attached
    GPUs but holds one <gpu>), its GPU element repeated for four bus ids as nvidia-smi prints them."""
    import re as _re

    text = (shared_fixtures / "nvidia_smi" / "nvidia-smi-q-x_telegraf_a100-sxm4-v12.xml").read_text()
    head, gpu, tail = _re.match(r"(?s)(.*?)(<gpu id=.*?</gpu>)(.*)", text).groups()  # type: ignore[union-attr]
    gpus = "".join(gpu.replace("00000000:00:1E.0", f"00000000:{bus:02X}:00.0").replace(
        "GPU-", f"GPU-{i}") for i, bus in enumerate((0x07, 0x0F, 0x47, 0x4E)))
    cap = nvidia_smi.parse(head + gpus + tail)
    assert len(cap.gpus) == 4 and cap.model == "NVIDIA A100-SXM4-80GB"
    g = nvidia_smi.guess(cap)
    assert g.profile == "generic" and not g.exact and "dgx-a100 (8 GPUs)" in g.why and "profile capture" in g.why
    state = nvidia_smi.to_state(cap, "a4")
    assert state.profile == "generic" and len(state.gpus) == 4
    assert {x.nvlink_count for x in state.gpus} == {12}  # the A100 SXM's own facts fill the gaps
    from podhealth.checks import profiles
    from podhealth.checks.passive.gpu import gpu_count
    from podhealth.checks.passive.context import Context
    from podhealth.checks.passive.rates import RateTracker
    from podhealth.snapshot import CollectorState, Snapshot
    from podhealth.vocab import Sample, Status

    st = CollectorState("nvml", samples=(Sample.of("gpu_devices", 4),), stale=False, last_success=1.0, last_attempt=1.0)
    ctx = Context(snapshot=Snapshot(1.0, {"nvml": st}), profile=profiles.load(state.profile), now=1.0,
                  rates=RateTracker(60))
    assert [r.status for r in gpu_count(ctx)] == [Status.OK]  # judged as what it is: no REBOOT
