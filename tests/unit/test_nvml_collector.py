"""The nvml collector on the real pynvml, against the NVML simulator (podhealth.sim.nvml_lib)."""

from __future__ import annotations

import re
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator

import pynvml
import pytest

from podhealth.collectors import REGISTRY, factory
from podhealth.collectors.base import Collection
from podhealth.collectors.nvml import CLOCKS_EVENT_REASONS, METRICS, NvmlCollector, create
from podhealth import pci
from podhealth.collectors.nvml_session import NvmlSession, NvmlUnavailable
from podhealth.config import Config
from podhealth.sim import nvml_lib
from podhealth.sim.node import SimNode
from podhealth.sim.state import default_state
from podhealth.vocab import Sample
from tests.harness.nvmlsim import inject, node, session  # noqa: F401 - fixtures
from tests.harness.proc import wait_until

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def collector(session: NvmlSession) -> Iterator[NvmlCollector]:
    c = create(Config(), session=session)
    try:
        yield c
    finally:
        c.close()


def one(col: Collection, name: str, gpu: int | None = None, **labels: str) -> Sample:
    found = find(col, name, gpu, **labels)
    assert len(found) == 1, f"{name} gpu={gpu} {labels}: expected one sample, got {found}"
    return found[0]


def find(col: Collection, name: str, gpu: int | None = None, **labels: str) -> list[Sample]:
    return [s for s in col.samples if s.name == name
            and (gpu is None or s.label("gpu") == str(gpu))
            and all(s.label(k) == v for k, v in labels.items())]


def value(col: Collection, name: str, gpu: int, **labels: str) -> float:
    return one(col, name, gpu, **labels).value


# --- a healthy node -------------------------------------------------------------------------------

# gpu_field_unreadable appears only for a reading NVML refused (tests/unit/test_nvml_variants.py).
PER_GPU_ALWAYS = sorted(set(METRICS) - {"gpu_devices", "gpu_retired_pages", "gpu_retired_pages_pending",
                                        "gpu_field_unreadable",
                                        # a DGX H100's GPUs are in no multi-node NVLink domain, not in
                                        # MIG mode and no vGPU guests: these are absent there
                                        "gpu_fabric_info", "gpu_fabric_degraded_bandwidth",
                                        "gpu_mig_memory_used_bytes", "gpu_mig_memory_total_bytes",
                                        "gpu_vgpu_license_state"})


def test_every_contract_metric_for_all_eight_gpus_with_the_simulators_values(node: SimNode, collector: NvmlCollector) -> None:
    col = collector.collect()
    assert col.errors == ()
    assert value_of(col, "gpu_devices") == 8
    state = node.state
    for g in state.gpus:
        i = g.index
        for name in PER_GPU_ALWAYS:
            assert find(col, name, i), f"gpu {i}: {name} missing"
        labels = dict(one(col, "gpu_up", i).labels)
        assert labels == {"gpu": str(i), "uuid": g.uuid, "pci_bus_id": g.pci_bus_id_short, "model": g.name}
        assert value(col, "gpu_up", i) == 1 and value(col, "gpu_lost", i) == 0
        assert value(col, "gpu_memory_total_bytes", i) == g.memory_total_mib * 2**20
        used, free = value(col, "gpu_memory_used_bytes", i), value(col, "gpu_memory_free_bytes", i)
        assert 0 <= used and 0 < free and used + free <= g.memory_total_mib * 2**20
        assert value(col, "gpu_temperature_celsius", i) == g.temperature_c
        assert value(col, "gpu_memory_temperature_celsius", i) == g.mem_temperature_c
        assert value(col, "gpu_power_watts", i) == pytest.approx(g.power_w)
        assert value(col, "gpu_power_limit_watts", i) == g.power_limit_w
        assert value(col, "gpu_sm_clock_max_hertz", i) == g.max_sm_clock_mhz * 1e6
        assert value(col, "gpu_memory_clock_max_hertz", i) == g.max_mem_clock_mhz * 1e6
        assert 0 < value(col, "gpu_sm_clock_hertz", i) <= g.max_sm_clock_mhz * 1e6
        assert value(col, "gpu_pcie_link_gen", i) == value(col, "gpu_pcie_link_gen_max", i) == g.pcie_gen_max
        assert value(col, "gpu_pcie_link_width", i) == value(col, "gpu_pcie_link_width_max", i) == g.pcie_width_max
        assert value(col, "gpu_pcie_replay", i) == g.pcie_replay
        for kind in ("corrected", "uncorrected"):
            for scope in ("volatile", "aggregate"):
                assert value(col, "gpu_ecc_errors", i, type=kind, scope=scope) == 0
        assert value(col, "gpu_remapped_rows", i, type="correctable") == 0
        assert value(col, "gpu_remapped_rows", i, type="uncorrectable") == 0
        assert value(col, "gpu_remapped_rows_pending", i) == 0 == value(col, "gpu_remapped_rows_failure", i)
        assert value(col, "gpu_persistence_mode", i) == 1
        assert value(col, "gpu_fabric_state", i) == pynvml.NVML_GPU_FABRIC_STATE_COMPLETED
        assert value(col, "gpu_fabric_healthy", i) == 1
        reasons = {s.label("reason"): s.value for s in find(col, "gpu_clocks_event_active", i)}
        assert set(reasons) == {r for r, _ in CLOCKS_EVENT_REASONS}
        assert {r for r, v in reasons.items() if v} == {"gpu_idle"}  # an idle healthy GPU
        info = dict(one(col, "gpu_info", i).labels)
        assert info["driver_version"] == state.driver_version
        assert info["cuda_driver_version"] == f"{state.cuda_version // 1000}.{state.cuda_version % 1000 // 10}"
        assert info["vbios_version"] == g.vbios and info["serial"] == g.serial


def value_of(col: Collection, name: str) -> float:
    (s,) = [s for s in col.samples if s.name == name]
    return s.value


def test_energy_is_a_counter_in_joules_that_grows(node: SimNode, collector: NvmlCollector) -> None:
    first = value(collector.collect(), "gpu_energy_joules", 0)
    # The simulator integrates power over wall time; poll until it has moved.
    wait_until(lambda: value(collector.collect(), "gpu_energy_joules", 0) > first, timeout=5, what="energy to grow")
    g = node.state.gpu(0)
    assert first <= g.power_w * (time.time() - node.state.t0) + 1


def test_pci_bus_id_is_normalised_to_the_kernels_form() -> None:
    assert pci.normalise("00000000:18:00.0") == "0000:18:00.0"
    assert pci.normalise(b"00000000:DB:00.0\x00") == "0000:db:00.0"
    assert pci.normalise("0001:9A:00.0") == "0001:9a:00.0"
    assert pci.normalise("garbage") is None  # (the GPU is then labelled without an address)


def test_retired_pages_are_absent_where_not_supported_never_zero(collector: NvmlCollector) -> None:
    col = collector.collect()  # H100: page retirement replaced by row remapping -> NOT_SUPPORTED
    assert not find(col, "gpu_retired_pages") and not find(col, "gpu_retired_pages_pending")
    assert col.errors == ()


def test_retired_pages_present_on_a_gpu_that_has_them(tmp_path: Path) -> None:
    base = default_state("dgx02", "dgx-h100")
    gpus = tuple(replace(g, retired_pages_sbe=3, retired_pages_dbe=1, retired_pages_pending=True)
                 if g.index == 2 else replace(g, retired_pages_sbe=0, retired_pages_dbe=0) for g in base.gpus)
    node = SimNode.create(tmp_path, "dgx02", seed=replace(base, gpus=gpus))
    nvml_lib.install(node)
    session = NvmlSession()
    try:
        col = create(Config(), session=session).collect()
    finally:
        session.shutdown()
        nvml_lib.uninstall()
    assert value(col, "gpu_retired_pages", 2, cause="sbe") == 3
    assert value(col, "gpu_retired_pages", 2, cause="dbe") == 1
    assert value(col, "gpu_retired_pages_pending", 2) == 1
    assert value(col, "gpu_retired_pages", 0, cause="dbe") == 0
    assert value(col, "gpu_retired_pages_pending", 0) == 0


# --- injected faults ------------------------------------------------------------------------------

def others_healthy(col: Collection, bad: int) -> None:
    for i in range(8):
        if i != bad:
            assert value(col, "gpu_up", i) == 1, f"gpu {i} should be unaffected"


def test_dbe_shows_as_uncorrected_ecc_on_that_gpu_only(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=dbe", "gpu=1")
    col = collector.collect()
    assert value(col, "gpu_ecc_errors", 1, type="uncorrected", scope="volatile") == 1
    assert value(col, "gpu_ecc_errors", 1, type="uncorrected", scope="aggregate") == 1
    assert value(col, "gpu_ecc_errors", 0, type="uncorrected", scope="volatile") == 0
    others_healthy(col, 1)


def test_row_remap_pending_and_failure(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=row-remap-pending", "gpu=2")
    inject(node, "fault=row-remap-failure", "gpu=5")
    col = collector.collect()
    assert value(col, "gpu_remapped_rows_pending", 2) == 1
    assert value(col, "gpu_remapped_rows", 2, type="uncorrectable") == 1
    assert value(col, "gpu_remapped_rows_failure", 2) == 0
    assert value(col, "gpu_remapped_rows_failure", 5) == 1
    assert value(col, "gpu_remapped_rows_pending", 5) == 0


def test_pcie_degraded(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=pcie-degraded", "gpu=3", "gen=4", "width=8")
    col = collector.collect()
    assert (value(col, "gpu_pcie_link_gen", 3), value(col, "gpu_pcie_link_gen_max", 3)) == (4, 5)
    assert (value(col, "gpu_pcie_link_width", 3), value(col, "gpu_pcie_link_width_max", 3)) == (8, 16)
    assert value(col, "gpu_pcie_link_width", 4) == 16


def test_thermal_and_power_brake_decode_into_reasons(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=thermal", "gpu=4")
    inject(node, "fault=power-brake", "gpu=6")
    col = collector.collect()

    def active(i: int) -> set[str]:
        return {s.label("reason") for s in find(col, "gpu_clocks_event_active", i) if s.value == 1}

    assert value(col, "gpu_temperature_celsius", 4) == nvml_lib.THERMAL_FAULT_TEMP_C
    assert {"hw_thermal_slowdown", "sw_thermal_slowdown", "hw_slowdown"} <= active(4)
    assert "gpu_idle" not in active(4)
    assert value(col, "gpu_sm_clock_hertz", 4) < value(col, "gpu_sm_clock_max_hertz", 4)
    assert {"hw_power_brake_slowdown", "hw_slowdown"} <= active(6)
    assert active(0) == {"gpu_idle"}


def test_fallen_off_bus_takes_down_only_that_gpu(node: SimNode, collector: NvmlCollector) -> None:
    healthy = collector.collect()
    inject(node, "fault=fallen-off-bus", "gpu=5")
    col = collector.collect()
    assert value(col, "gpu_up", 5) == 0 and value(col, "gpu_lost", 5) == 1
    # Identity learned before the loss keeps labelling the lost GPU's series.
    assert one(col, "gpu_up", 5).labels == one(healthy, "gpu_up", 5).labels
    assert not find(col, "gpu_temperature_celsius", 5)  # no stale readings for a lost GPU
    assert any(e.startswith("gpu 5:") and "lost" in e.lower() for e in col.errors), col.errors
    assert all(e.startswith("gpu 5:") for e in col.errors)
    others_healthy(col, 5)
    for i in range(8):
        if i != 5:
            assert value(col, "gpu_lost", i) == 0
            assert find(col, "gpu_temperature_celsius", i)


def test_gpu_lost_before_first_collect_still_reported(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=fallen-off-bus", "gpu=0")
    col = collector.collect()
    assert value(col, "gpu_up", 0) == 0 and value(col, "gpu_lost", 0) == 1
    assert value_of(col, "gpu_devices") == 8
    others_healthy(col, 0)


def test_fabric_incomplete(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=fabric-incomplete", "gpu=7")
    col = collector.collect()
    assert value(col, "gpu_fabric_state", 7) == pynvml.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    assert value(col, "gpu_fabric_healthy", 7) == 0
    assert value(col, "gpu_fabric_healthy", 6) == 1


def test_persistence_off(node: SimNode, collector: NvmlCollector) -> None:
    inject(node, "fault=persistence-off", "gpu=0")
    col = collector.collect()
    assert value(col, "gpu_persistence_mode", 0) == 0
    assert value(col, "gpu_persistence_mode", 1) == 1


def test_fabric_absent_where_not_supported(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "a100", "dgx-a100")  # A100: NVML reports no fabric state
    nvml_lib.install(node)
    session = NvmlSession()
    try:
        col = create(Config(), session=session).collect()
    finally:
        session.shutdown()
        nvml_lib.uninstall()
    assert value_of(col, "gpu_devices") == 8
    assert not find(col, "gpu_fabric_state") and not find(col, "gpu_fabric_healthy")
    assert col.errors == ()


# --- the session: re-init, call budget, no lock held during device calls ------------------------

def test_reinitialises_after_nvml_loses_its_state(session: NvmlSession, collector: NvmlCollector) -> None:
    collector.collect()
    gen = session.generation
    # A driver reload behind our back: NVML answers UNINITIALIZED until initialised again.
    pynvml.nvmlShutdown()
    col = collector.collect()
    assert session.generation == gen + 1
    assert value_of(col, "gpu_devices") == 8 and value(col, "gpu_up", 3) == 1


def test_unavailable_library_is_a_clear_error(tmp_path: Path) -> None:
    assert nvml_lib.installed() is None
    session = NvmlSession(library_path=str(tmp_path / "libnvidia-ml.so.1"))
    c = create(Config(), session=session)
    with pytest.raises(NvmlUnavailable, match="libnvidia-ml.so.1"):
        c.collect()
    assert pynvml.nvmlLib is None  # nothing left half-loaded


class CountingLib:
    """Wraps whatever pynvml.nvmlLib is (here: the simulator) and counts calls per C function."""

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fn = getattr(self._lib, name)
        if name == "nvmlErrorString":
            return fn  # type: ignore[no-any-return]  # pynvml sets restype on it

        def call(*args: Any) -> Any:
            self.calls[name] += 1
            return fn(*args)
        return call


@pytest.fixture
def counting(node: SimNode) -> CountingLib:
    lib = CountingLib(pynvml.nvmlLib)
    with pynvml.libLoadLock:
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
    return lib


def test_static_facts_are_read_once_and_steady_state_calls_are_few(counting: CountingLib, collector: NvmlCollector) -> None:
    collector.collect()
    first = sum(counting.calls.values())
    counting.calls.clear()
    collector.collect()
    steady = counting.calls
    for static in ("nvmlDeviceGetSerial", "nvmlDeviceGetVbiosVersion", "nvmlDeviceGetMaxClockInfo",
                   "nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetHandleByIndex_v2",
                   "nvmlSystemGetDriverVersion", "nvmlDeviceGetRetiredPages"):
        assert steady[static] == 0, f"{static} re-read: {steady[static]}"
    per_gpu = sum(steady.values()) / 8
    assert per_gpu <= 25, f"{per_gpu} NVML calls per GPU per collection: {dict(steady)}"
    assert sum(steady.values()) < first


def test_a_hung_gpu_costs_one_slow_call_and_holds_no_session_lock(node: SimNode, session: NvmlSession) -> None:
    collector = create(Config(), session=session, slow_call_s=0.5)
    try:
        collector.collect()  # handles and identities cached
        inject(node, "fault=nvml-hang", "gpu=2", "seconds=1.0")
        result: list[tuple[float, Collection]] = []
        t0 = time.monotonic()

        def run() -> None:
            col = collector.collect()
            result.append((time.monotonic() - t0, col))

        worker = threading.Thread(target=run)
        worker.start()
        answered_while_hung = 0
        try:
            while worker.is_alive():
                s0 = time.monotonic()
                count, _ = session.devices()
                session.system_info()
                if worker.is_alive() and time.monotonic() - s0 < 0.5 and count == 8:
                    answered_while_hung += 1
        finally:
            worker.join(10)
    finally:
        collector.close()
    took, col = result[0]
    # Every call on GPU 2 blocks 1 s; after the first slow one the rest of GPU 2 is skipped.
    assert 1.0 <= took < 3.0, took
    assert answered_while_hung > 0  # the other collector's session calls were never blocked
    assert value(col, "gpu_up", 2) == 0 and value(col, "gpu_lost", 2) == 0
    assert any(e.startswith("gpu 2:") and "answered after" in e for e in col.errors), col.errors
    others_healthy(col, 2)


# --- registry and documentation -------------------------------------------------------------------

def test_registered_and_creation_touches_no_nvml() -> None:
    assert REGISTRY["nvml"] == "podhealth.collectors.nvml:create"
    c = factory("nvml")(Config())
    try:
        assert c.name == "nvml" and c.metrics is METRICS
    finally:
        c.close()


def documented(section: str) -> set[str]:
    text = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    m = re.search(rf"^## {section}\b.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, f"docs/metrics.md has no '## {section}' section"
    names: set[str] = set()
    for line in m.group(1).splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            first = line.split("|")[1]
            names.update(re.findall(r"\b[a-z][a-z0-9_]+\b", first))
    return names


def test_docs_list_every_declared_metric() -> None:
    missing = set(METRICS) - documented("nvml")
    assert not missing, f"docs/metrics.md '## nvml' lacks {sorted(missing)}"
    for spec in METRICS.values():
        assert spec.help and spec.kind in ("gauge", "counter", "info")


def test_unchanged_readings_are_handed_on_as_the_same_objects(
        node: SimNode, collector: NvmlCollector) -> None:
    """collectors/samplecache.py: what held is last cycle's Sample; labels follow the GPU's
    identity (a series is keyed by it, so another GPU at the same index is never handed on)."""
    first = {(s.name, s.labels): s for s in collector.collect().samples}
    second = {(s.name, s.labels): s for s in collector.collect().samples}
    assert second.keys() == first.keys()
    limits = [k for k in first if k[0] == "gpu_power_limit_watts"]
    assert len(limits) == 8 and all(second[k] is first[k] for k in limits)
    ecc = [k for k in first if k[0] == "gpu_ecc_errors"]
    assert ecc and all(second[k] is first[k] for k in ecc)
    for (name, labels), s in second.items():
        assert s.name == name and s.labels == labels
