"""The NVML simulator, checked only through plain pynvml calls (the real nvidia-ml-py wrappers)."""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pynvml
import pytest

from podhealth.sim import faults, nvml_lib
from podhealth.sim.node import SimNode
from podhealth.sim.state import default_state
from tests.harness.proc import wait_until

H100_BUS_IDS = ["00000000:18:00.0", "00000000:2A:00.0", "00000000:3A:00.0", "00000000:5D:00.0",
                "00000000:9A:00.0", "00000000:AB:00.0", "00000000:BA:00.0", "00000000:DB:00.0"]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    nvml_lib.install(n)
    pynvml.nvmlInit()
    try:
        yield n
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
        nvml_lib.uninstall()


def inject(node: SimNode, *tokens: str, ago: float = 0.0) -> None:
    node.inject(faults.parse(list(tokens), time.time() - ago))


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except pynvml.NVMLError as e:
        return type(e).__name__


def readings(i: int) -> dict[str, Any]:
    """Every per-GPU reading a collector takes, by plain pynvml calls; errors as exception names.

    Time-driven counters (energy, NVLink traffic) are left out: they move without any fault and
    have their own tests.
    """
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
    except pynvml.NVMLError as e:
        return {"handle": type(e).__name__}
    r: dict[str, Any] = {}
    calls: dict[str, Callable[[], Any]] = {
        "index": lambda: pynvml.nvmlDeviceGetIndex(h),
        "name": lambda: pynvml.nvmlDeviceGetName(h),
        "uuid": lambda: pynvml.nvmlDeviceGetUUID(h),
        "serial": lambda: pynvml.nvmlDeviceGetSerial(h),
        "vbios": lambda: pynvml.nvmlDeviceGetVbiosVersion(h),
        "pci": lambda: (lambda p: (p.busId, p.busIdLegacy, p.pciDeviceId, p.pciSubSystemId))(
            pynvml.nvmlDeviceGetPciInfo(h)),
        "arch": lambda: pynvml.nvmlDeviceGetArchitecture(h),
        "persistence": lambda: pynvml.nvmlDeviceGetPersistenceMode(h),
        "util": lambda: (lambda u: (u.gpu, u.memory))(pynvml.nvmlDeviceGetUtilizationRates(h)),
        "mem": lambda: (lambda m: (m.total, m.used, m.free))(pynvml.nvmlDeviceGetMemoryInfo(h)),
        "mem_v2": lambda: (lambda m: (m.total, m.reserved, m.used, m.free))(
            pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2)),
        "temp": lambda: pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
        "temp_v": lambda: pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU),
        "temp_thresholds": lambda: tuple(pynvml.nvmlDeviceGetTemperatureThreshold(h, t) for t in range(4)),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(h),
        "power_limit": lambda: (pynvml.nvmlDeviceGetEnforcedPowerLimit(h),
                                pynvml.nvmlDeviceGetPowerManagementLimit(h)),
        "clocks": lambda: tuple(pynvml.nvmlDeviceGetClockInfo(h, c) for c in range(4)),
        "max_clocks": lambda: tuple(pynvml.nvmlDeviceGetMaxClockInfo(h, c) for c in range(4)),
        "reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "reasons_old": lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
        "pcie": lambda: (pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h),
                         pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)),
        "pcie_max": lambda: (pynvml.nvmlDeviceGetMaxPcieLinkGeneration(h),
                             pynvml.nvmlDeviceGetMaxPcieLinkWidth(h)),
        "pcie_replay": lambda: pynvml.nvmlDeviceGetPcieReplayCounter(h),
        "ecc_mode": lambda: tuple(pynvml.nvmlDeviceGetEccMode(h)),
        "ecc": lambda: tuple(pynvml.nvmlDeviceGetTotalEccErrors(h, e, c) for e in (0, 1) for c in (0, 1)),
        "ecc_dram": lambda: tuple(pynvml.nvmlDeviceGetMemoryErrorCounter(
            h, e, c, pynvml.NVML_MEMORY_LOCATION_DRAM) for e in (0, 1) for c in (0, 1)),
        "retired_sbe": lambda: pynvml.nvmlDeviceGetRetiredPages(h, 0),
        "retired_pending": lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h),
        "remap": lambda: pynvml.nvmlDeviceGetRemappedRows(h),
        "fabric": lambda: _fabric(h),
        "processes": lambda: len(pynvml.nvmlDeviceGetComputeRunningProcesses(h)),
        "mem_temp_field": lambda: _field(h, pynvml.NVML_FI_DEV_MEMORY_TEMP),
        "link_count_field": lambda: _field(h, pynvml.NVML_FI_DEV_NVLINK_LINK_COUNT),
        "crc_total_field": lambda: _field(h, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL),
    }
    for key, call in calls.items():
        r[key] = _try(call)
    for link in range(18):
        r[f"link{link}_state"] = _try(lambda: pynvml.nvmlDeviceGetNvLinkState(h, link))
        r[f"link{link}_version"] = _try(lambda: pynvml.nvmlDeviceGetNvLinkVersion(h, link))
        for counter in range(5):
            r[f"link{link}_err{counter}"] = _try(lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, link, counter))
    return r


def _fabric(h: Any) -> tuple[int, int]:
    info = pynvml.c_nvmlGpuFabricInfoV_t()
    pynvml.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(info))
    return info.state, info.status


def _field(h: Any, field_id: int, scope: int | None = None) -> Any:
    fv = pynvml.nvmlDeviceGetFieldValues(h, [field_id if scope is None else (field_id, scope)])[0]
    if fv.nvmlReturn != pynvml.NVML_SUCCESS:
        return ("ret", fv.nvmlReturn)
    return fv.value.uiVal if fv.valueType == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT else fv.value.ullVal


def snapshot() -> dict[tuple[int, str], Any]:
    out: dict[tuple[int, str], Any] = {("node", "count"): pynvml.nvmlDeviceGetCount(),  # type: ignore[dict-item]
                                       ("node", "driver"): pynvml.nvmlSystemGetDriverVersion()}  # type: ignore[dict-item]
    for i in range(8):
        for k, v in readings(i).items():
            out[(i, k)] = v
    return out


def diff(before: dict[tuple[int, str], Any], after: dict[tuple[int, str], Any]) -> dict[tuple[int, str], tuple[Any, Any]]:
    keys = set(before) | set(after)
    return {k: (before.get(k), after.get(k)) for k in keys if before.get(k) != after.get(k)}


# --- a healthy DGX H100 -----------------------------------------------------------------------


def test_healthy_dgx_h100_through_plain_pynvml(node: SimNode) -> None:
    assert pynvml.nvmlDeviceGetCount() == 8
    assert pynvml.nvmlSystemGetDriverVersion() == "565.57.01"
    assert pynvml.nvmlSystemGetCudaDriverVersion_v2() == 12070
    assert pynvml.nvmlSystemGetCudaDriverVersion() == 12070
    assert pynvml.nvmlSystemGetNVMLVersion() == "12.565.57.01"
    snap = {i: readings(i) for i in range(8)}
    assert [snap[i]["name"] for i in range(8)] == ["NVIDIA H100 80GB HBM3"] * 8
    assert [snap[i]["pci"][0] for i in range(8)] == H100_BUS_IDS
    assert len({snap[i]["uuid"] for i in range(8)}) == 8
    assert all(snap[i]["uuid"].startswith("GPU-") for i in range(8))
    for i, r in snap.items():
        assert r["index"] == i
        assert r["pci"][1] == H100_BUS_IDS[i][4:]  # legacy busId: 4-digit domain
        assert r["pci"][2] == 0x233010DE
        assert r["arch"] == pynvml.NVML_DEVICE_ARCH_HOPPER
        assert r["mem"][0] == 81559 * 2**20 and r["mem"][1] + r["mem"][2] == r["mem"][0]
        assert r["mem_v2"][0] == 81559 * 2**20
        assert 30 <= r["temp"] <= 40 and r["temp_v"] == r["temp"]
        assert 70_000 <= r["power"] <= 120_000
        assert r["power_limit"] == (700_000, 700_000)
        assert r["max_clocks"] == (1980, 1980, 2619, 1545)
        assert r["clocks"][1] <= r["max_clocks"][1]
        assert r["reasons"] == r["reasons_old"] == pynvml.nvmlClocksEventReasonGpuIdle
        assert r["pcie"] == r["pcie_max"] == (5, 16)
        assert r["ecc_mode"] == (1, 1)
        assert r["ecc"] == (0, 0, 0, 0) and r["ecc_dram"] == (0, 0, 0, 0)
        assert r["remap"] == (0, 0, 0, 0)
        assert r["fabric"] == (pynvml.NVML_GPU_FABRIC_STATE_COMPLETED, pynvml.NVML_SUCCESS)
        assert r["persistence"] == 1
        assert r["processes"] == 0
        assert r["link_count_field"] == 18
        assert all(r[f"link{l}_state"] == 1 for l in range(18))
        assert all(r[f"link{l}_version"] == pynvml.NVML_NVLINK_VERSION_4_0 for l in range(18))
        assert r["crc_total_field"] == 0


def test_handles_by_pci_bus_id_and_uuid(node: SimNode) -> None:
    for i, bus in enumerate(H100_BUS_IDS):
        h = pynvml.nvmlDeviceGetHandleByPciBusId(bus)
        assert pynvml.nvmlDeviceGetIndex(h) == i
        short = pynvml.nvmlDeviceGetHandleByPciBusId(bus[4:].lower())  # "0000:18:00.0" form
        assert pynvml.nvmlDeviceGetIndex(short) == i
        uuid = pynvml.nvmlDeviceGetUUID(h)
        assert pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(uuid)) == i
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByPciBusId("00000000:19:00.0")
    with pytest.raises(pynvml.NVMLError_NotFound):
        pynvml.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")


def test_counters_that_grow_with_time(node: SimNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    e0 = pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
    tx0 = _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)
    wait_until(lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(h) > e0, timeout=5, what="energy grows")
    wait_until(lambda: _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0) > tx0, timeout=5,
               what="nvlink tx grows")
    # All links (scope UINT_MAX) is the sum over links.
    total = _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0xFFFFFFFF)
    assert total >= 18 * tx0


def test_return_codes_uninitialized_invalid_argument_function_not_found(tmp_path: Path) -> None:
    n = SimNode.create(tmp_path, "dgx01")
    nvml_lib.install(n)
    try:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        pynvml.nvmlInit()
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetHandleByIndex(8)
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkState(h, 18)
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 0, 9)
        with pytest.raises(pynvml.NVMLError_FunctionNotFound):
            pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0)
        # Refcounted like the real library: two inits need two shutdowns.
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        assert pynvml.nvmlDeviceGetCount() == 8
        pynvml.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            pynvml.nvmlDeviceGetCount()
        assert "Uninitialized" in str(pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED))
    finally:
        nvml_lib.uninstall()


def test_not_supported_fields_raise_not_supported(node: SimNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    # Hopper replaced page retirement with row remapping.
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages(h, pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPages_v2(h, 0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        pynvml.nvmlDeviceGetMemoryErrorCounter(h, 0, 0, pynvml.NVML_MEMORY_LOCATION_L1_CACHE)
    fv = pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP, 9999])
    assert fv[0].nvmlReturn == pynvml.NVML_SUCCESS and fv[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED


def test_pre_ampere_gpu_has_retired_pages_and_no_row_remapping(tmp_path: Path) -> None:
    base = default_state("v100node", "dgx-a100")
    volta = tuple(replace(g, architecture="volta", remap_correctable=None, remap_uncorrectable=None,
                          retired_pages_sbe=2, retired_pages_dbe=1) for g in base.gpus)
    n = SimNode.create(tmp_path, "v100node", seed=replace(base, gpus=volta))
    nvml_lib.install(n)
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        with pytest.raises(pynvml.NVMLError_NotSupported):
            pynvml.nvmlDeviceGetRemappedRows(h)
        assert len(pynvml.nvmlDeviceGetRetiredPages(h, 0)) == 2
        pages = pynvml.nvmlDeviceGetRetiredPages_v2(h, 1)
        assert len(pages) == 1 and pages[0]["timestamp"] > 0
        assert pynvml.nvmlDeviceGetRetiredPagesPendingStatus(h) == 0
        pynvml.nvmlShutdown()
    finally:
        nvml_lib.uninstall()


# --- every fault changes exactly what it should ------------------------------------------------

LOST = "NVMLError_GpuIsLost"


def _expect_lost(before: dict[tuple[int, str], Any], gpu: int) -> dict[tuple[int, str], Any]:
    # The handle itself cannot be had for a lost GPU: every reading collapses into that one error.
    out: dict[tuple[int, str], Any] = {k: None for k in before if k[0] == gpu}
    out[(gpu, "handle")] = LOST
    return out


CASES: list[tuple[list[str], Callable[[dict[tuple[int, str], Any]], dict[tuple[int, str], Any]]]] = [
    (["xid=13", "gpu=2"], lambda b: {}),
    (["xid=79", "gpu=3"], lambda b: {}),
    (["fault=fallen-off-bus", "gpu=3"], lambda b: _expect_lost(b, 3)),
    (["fault=dbe", "gpu=1"], lambda b: {(1, "ecc"): (0, 0, 1, 1), (1, "ecc_dram"): (0, 0, 1, 1)}),
    (["fault=row-remap-pending", "gpu=2"], lambda b: {(2, "remap"): (0, 1, 1, 0)}),
    (["fault=row-remap-failure", "gpu=2"], lambda b: {(2, "remap"): (0, 0, 0, 1)}),
    (["fault=nvlink-down", "gpu=0", "link=5"], lambda b: {(0, "link5_state"): 0}),
    (["fault=pcie-degraded", "gpu=4", "width=8", "gen=4"], lambda b: {(4, "pcie"): (4, 8)}),
    (["fault=pcie-degraded", "gpu=4", "width=4"], lambda b: {(4, "pcie"): (4, 4)}),
    (["fault=thermal", "gpu=6"], lambda b: {
        (6, "temp"): 92, (6, "temp_v"): 92,
        (6, "reasons"): 0x8 | 0x20 | 0x40, (6, "reasons_old"): 0x8 | 0x20 | 0x40,
        (6, "clocks"): (990, 990, b[(6, "clocks")][2], b[(6, "clocks")][3])}),
    (["fault=power-brake", "gpu=6"], lambda b: {(6, "reasons"): 0x1 | 0x8 | 0x80,
                                                (6, "reasons_old"): 0x1 | 0x8 | 0x80}),
    (["fault=fabric-incomplete", "gpu=2"], lambda b: {
        (2, "fabric"): (pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS, pynvml.NVML_SUCCESS)}),
    (["fault=persistence-off", "gpu=1"], lambda b: {(1, "persistence"): 0}),
    # Faults outside NVML's view leave every NVML reading alone.
    (["fault=ib-down", "device=mlx5_5"], lambda b: {}),
    (["fault=ib-rate", "device=mlx5_5", "rate=200"], lambda b: {}),
    (["fault=ib-symbol-errors", "device=mlx5_5", "rate=20"], lambda b: {}),
    (["fault=nfs-missing", "mount=/home"], lambda b: {}),
    (["fault=nfs-hung", "mount=/home"], lambda b: {}),
    (["fault=unit-down", "unit=nvidia-fabricmanager.service"], lambda b: {}),
]


@pytest.mark.parametrize("tokens,expected", CASES, ids=[" ".join(c[0]) for c in CASES])
def test_fault_changes_exactly_what_nvml_shows(node: SimNode, tokens: list[str],
                                               expected: Callable[[dict[tuple[int, str], Any]], dict[tuple[int, str], Any]]) -> None:
    before = snapshot()
    inject(node, *tokens)
    after = snapshot()
    want = expected(before)
    assert {k: v[1] for k, v in diff(before, after).items()} == want
    # Clearing restores every reading.
    node.clear()
    assert diff(before, snapshot()) == {}


def test_nvlink_crc_errors_climb_at_the_injected_rate(node: SimNode) -> None:
    before = snapshot()
    inject(node, "fault=nvlink-crc", "gpu=0", "link=5", "rate=50", ago=10.0)
    after = snapshot()
    changed = diff(before, after)
    assert set(changed) == {(0, f"link5_err{pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT}"), (0, "crc_total_field")}
    first = after[(0, f"link5_err{pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT}")]
    assert 500 <= first <= 50 * 12  # 10 s ago at 50/s, plus the time this test took
    # The summed field is read a moment apart from the per-link counter: same window, same rate.
    assert 500 <= after[(0, "crc_total_field")] <= 50 * 12
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    wait_until(lambda: pynvml.nvmlDeviceGetNvLinkErrorCounter(h, 5, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT) > first,
               timeout=5, what="CRC counter grows")
    assert _field(h, pynvml.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_L5) > first
    assert _field(h, pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 5) > first


def test_nvlink_down_freezes_that_links_traffic(node: SimNode) -> None:
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    inject(node, "fault=nvlink-down", "gpu=0", "link=5")
    frozen = _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 5)
    live = _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 4)
    wait_until(lambda: _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 4) > live, timeout=5,
               what="link 4 traffic")
    assert _field(h, pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 5) == frozen


def test_nvlink_state_and_speed_fields_per_link(node: SimNode) -> None:
    """NVML_FI_DEV_NVLINK_GET_STATE / GET_SPEED take the link as scopeId, as
    nvmlDeviceGetNvLinkState does; each field of one call answers with its own nvmlReturn."""
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    inject(node, "fault=nvlink-down", "gpu=2", "link=9")
    st, sp = pynvml.NVML_FI_DEV_NVLINK_GET_STATE, pynvml.NVML_FI_DEV_NVLINK_GET_SPEED
    assert [_field(h, st, n) for n in (0, 9, 17)] == [1, 0, 1]
    assert [_field(h, st, n) for n in range(18)] == [int(pynvml.nvmlDeviceGetNvLinkState(h, n)) for n in range(18)]
    assert _field(h, sp, 0) == 26562 and _field(h, sp, 9) == 0  # nvidia-smi: "Link 0: 26.562 GB/s"
    mixed = pynvml.nvmlDeviceGetFieldValues(h, [(st, 3), (st, 18), (pynvml.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 17), 9999])
    assert [int(f.nvmlReturn) for f in mixed] == [pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_INVALID_ARGUMENT,
                                                   pynvml.NVML_SUCCESS, pynvml.NVML_ERROR_NOT_SUPPORTED]


def test_fallen_off_bus_gpu_is_still_counted_and_lost_on_every_call(node: SimNode) -> None:
    h3 = pynvml.nvmlDeviceGetHandleByIndex(3)  # taken before the fault, as a running agent holds it
    inject(node, "fault=fallen-off-bus", "gpu=3")
    assert pynvml.nvmlDeviceGetCount() == 8
    for call in (pynvml.nvmlDeviceGetName, pynvml.nvmlDeviceGetUUID, pynvml.nvmlDeviceGetPowerUsage,
                 pynvml.nvmlDeviceGetMemoryInfo, pynvml.nvmlDeviceGetRemappedRows,
                 lambda h: pynvml.nvmlDeviceGetTemperature(h, 0),
                 lambda h: pynvml.nvmlDeviceGetFieldValues(h, [pynvml.NVML_FI_DEV_MEMORY_TEMP])):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            call(h3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByIndex(3)
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        pynvml.nvmlDeviceGetHandleByPciBusId(H100_BUS_IDS[3])
    assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(4)) == "NVIDIA H100 80GB HBM3"


# --- events -------------------------------------------------------------------------------------


def test_event_set_delivers_each_injected_xid_once_then_times_out(node: SimNode) -> None:
    es = pynvml.nvmlEventSetCreate()
    try:
        for i in range(8):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            assert pynvml.nvmlDeviceGetSupportedEventTypes(h) & pynvml.nvmlEventTypeXidCriticalError
            pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
        started = time.monotonic()
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(es, 200)
        assert time.monotonic() - started >= 0.19  # the timeout is honoured, not skipped
        inject(node, "xid=79", "gpu=3")
        inject(node, "xid=48", "gpu=1")
        got = []
        for _ in range(2):
            e = pynvml.nvmlEventSetWait_v2(es, 2000)
            assert e.eventType == pynvml.nvmlEventTypeXidCriticalError
            got.append((pynvml.nvmlDeviceGetIndex(e.device), e.eventData))
        assert got == [(3, 79), (1, 48)]
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait(es, 50)
    finally:
        pynvml.nvmlEventSetFree(es)


def test_event_wait_wakes_for_an_xid_injected_while_waiting(node: SimNode) -> None:
    es = pynvml.nvmlEventSetCreate()
    h = pynvml.nvmlDeviceGetHandleByIndex(2)
    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    result: list[Any] = []
    t = threading.Thread(target=lambda: result.append(_try(lambda: pynvml.nvmlEventSetWait_v2(es, 10_000).eventData)))
    t.start()
    inject(node, "xid=94", "gpu=2")
    t.join(timeout=10)
    assert not t.is_alive() and result == [94]
    pynvml.nvmlEventSetFree(es)


def test_events_only_for_registered_gpus(node: SimNode) -> None:
    es = pynvml.nvmlEventSetCreate()
    pynvml.nvmlDeviceRegisterEvents(pynvml.nvmlDeviceGetHandleByIndex(0), pynvml.nvmlEventTypeXidCriticalError, es)
    inject(node, "xid=13", "gpu=5")
    with pytest.raises(pynvml.NVMLError_Timeout):
        pynvml.nvmlEventSetWait_v2(es, 100)
    inject(node, "fault=fallen-off-bus", "gpu=0")  # the driver reports a lost GPU as XID 79
    assert pynvml.nvmlEventSetWait_v2(es, 2000).eventData == 79
    pynvml.nvmlEventSetFree(es)


# --- a hung driver ------------------------------------------------------------------------------


def test_nvml_hang_blocks_the_calling_thread(node: SimNode) -> None:
    h5 = pynvml.nvmlDeviceGetHandleByIndex(5)
    inject(node, "fault=nvml-hang", "seconds=5", "gpu=5")
    done = threading.Event()
    t = threading.Thread(target=lambda: (pynvml.nvmlDeviceGetPowerUsage(h5), done.set()), daemon=True)
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive() and not done.is_set(), "a call on the hung GPU returned"
    # Other GPUs answer: the hang is in GPU 5's calls, not a global lock.
    other = threading.Thread(target=lambda: pynvml.nvmlDeviceGetPowerUsage(pynvml.nvmlDeviceGetHandleByIndex(4)),
                             daemon=True)
    other.start()
    other.join(timeout=5.0)
    assert not other.is_alive()


def test_nvml_hang_without_gpu_blocks_device_enumeration_for_n_seconds(node: SimNode) -> None:
    inject(node, "fault=nvml-hang", "seconds=0.3")
    t = threading.Thread(target=pynvml.nvmlDeviceGetCount, daemon=True)
    started = time.monotonic()
    t.start()
    t.join(timeout=0.1)
    assert t.is_alive()
    t.join(timeout=5.0)
    assert not t.is_alive() and time.monotonic() - started >= 0.3


# --- install / uninstall hygiene ----------------------------------------------------------------


def test_uninstall_leaves_pynvml_unloaded(tmp_path: Path) -> None:
    n = SimNode.create(tmp_path, "dgx01")
    nvml_lib.install(n)
    pynvml.nvmlInit()
    pynvml.nvmlDeviceGetCount()
    assert pynvml._nvmlGetFunctionPointer_cache
    nvml_lib.uninstall()
    assert pynvml.nvmlLib is None and not pynvml._nvmlGetFunctionPointer_cache
    assert nvml_lib.installed() is None
    nvml_lib.uninstall()  # idempotent
    # A second node installed afterwards answers for itself, not through stale cached pointers.
    other = SimNode.create(tmp_path, "a100", "dgx-a100")
    nvml_lib.install(other)
    try:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0)) == "NVIDIA A100-SXM4-80GB"
        assert pynvml.nvmlDeviceGetNvLinkVersion(pynvml.nvmlDeviceGetHandleByIndex(0), 0) == \
            pynvml.NVML_NVLINK_VERSION_3_0
        with pytest.raises(pynvml.NVMLError_NotSupported):
            info = pynvml.c_nvmlGpuFabricInfoV_t()
            pynvml.nvmlDeviceGetGpuFabricInfoV(pynvml.nvmlDeviceGetHandleByIndex(0), ctypes.byref(info))
    finally:
        nvml_lib.uninstall()


@pytest.mark.parametrize("profile,count,name,mem", [
    ("dgx-h200", 8, "NVIDIA H200", 143771),
    ("dgx-b200", 8, "NVIDIA B200", 183359),
    ("dgx-a100", 8, "NVIDIA A100-SXM4-80GB", 81920),
    ("generic", 0, None, None),
])
def test_other_profiles(tmp_path: Path, profile: str, count: int, name: str | None, mem: int | None) -> None:
    nvml_lib.install(SimNode.create(tmp_path, "n1", profile))
    try:
        pynvml.nvmlInit()
        assert pynvml.nvmlDeviceGetCount() == count
        if count:
            h = pynvml.nvmlDeviceGetHandleByIndex(count - 1)
            assert pynvml.nvmlDeviceGetName(h) == name
            assert pynvml.nvmlDeviceGetMemoryInfo(h).total == mem * 2**20  # type: ignore[operator]
        pynvml.nvmlShutdown()
    finally:
        nvml_lib.uninstall()
