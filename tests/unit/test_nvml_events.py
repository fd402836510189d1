"""NVML's XID event source (collectors/nvml_events.py): against a stand-in pynvml module for the
error paths a simulator cannot produce, and against real pynvml on the simulated NVML library."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from podhealth.collectors.nvml_events import NvmlUnusable, NvmlXid, NvmlXidEvents
from tests.harness.proc import wait_until


# ---- NvmlXidEvents against a stand-in pynvml module ---------------------------------------------


class TimeoutError_(Exception):
    pass


def fake_pynvml(buses: list[str], events: list[tuple[int, int]], refuse: int | None = None) -> Any:
    handles = [object() for _ in buses]
    calls: list[str] = []

    def register(h: object, mask: int, s: object) -> None:
        if refuse is not None and h is handles[refuse]:
            raise RuntimeError("Not Supported")
        calls.append("register")

    def wait(s: object, ms: int) -> Any:
        if not events:
            raise TimeoutError_()
        gpu, code = events.pop(0)
        return SimpleNamespace(device=handles[gpu], eventType=8, eventData=code)

    return SimpleNamespace(
        nvmlLib=object(), nvmlInit=lambda: calls.append("init"), nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlEventSetCreate=lambda: "set", nvmlEventSetFree=lambda s: calls.append("free"),
        nvmlDeviceGetCount=lambda: len(handles), nvmlDeviceGetHandleByIndex=lambda i: handles[i],
        nvmlDeviceGetPciInfo_v3=lambda h: SimpleNamespace(busId=buses[handles.index(h)].encode()),
        nvmlDeviceRegisterEvents=register, nvmlEventSetWait_v2=wait,
        nvmlEventTypeXidCriticalError=8, NVMLError_Timeout=TimeoutError_, calls=calls,
    )


def test_nvml_xid_events_register_poll_and_map_pci() -> None:
    n = fake_pynvml(["00000000:18:00.0", "00000000:2A:00.0"], [(1, 79), (0, 13)], refuse=None)
    src = NvmlXidEvents(n, clock=lambda: 7.0)
    assert src.gpu_index_by_pci() == {"0000:18:00.0": 0, "0000:2a:00.0": 1}
    assert src.poll(10) == [NvmlXid("0000:2a:00.0", 1, 79, 7.0), NvmlXid("0000:18:00.0", 0, 13, 7.0)]
    assert src.poll(10) == []
    src.close()
    assert n.calls[-2:] == ["free", "shutdown"]


def test_nvml_xid_events_one_gpu_refusing_is_a_note_all_refusing_is_unusable() -> None:
    src = NvmlXidEvents(fake_pynvml(["0000:18:00.0", "0000:19:00.0"], [], refuse=1))
    assert src.notes and "GPU 1" in src.notes[0]
    with pytest.raises(NvmlUnusable, match="no GPU accepted"):
        NvmlXidEvents(fake_pynvml(["0000:18:00.0"], [], refuse=0))

    def no_driver() -> None:
        raise RuntimeError("NVML Shared Library Not Found")

    n = fake_pynvml([], [])
    n.nvmlInit = no_driver
    with pytest.raises(NvmlUnusable, match="nvmlInit failed"):
        NvmlXidEvents(n)


# ---- real pynvml on the simulated NVML library -------------------------------------------------


def test_real_pynvml_on_the_simulated_library_delivers_injected_xids(tmp_path: Path) -> None:
    import pynvml

    from podhealth.sim import faults, nvml_lib
    from podhealth.sim.node import SimNode

    node = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    nvml_lib.install(node)
    src: NvmlXidEvents | None = None
    try:
        src = NvmlXidEvents(pynvml, clock=lambda: 7.0)  # its own nvmlInit/nvmlShutdown
        assert src.notes == [] and len(src.gpu_index_by_pci()) == 8
        assert src.gpu_index_by_pci()["0000:5d:00.0"] == 3
        assert src.poll(10) == []  # nothing injected: the 1 ms wait times out
        node.inject(faults.parse(["xid=79", "gpu=3"], time.time()))
        node.inject(faults.parse(["xid=48", "gpu=1"], time.time()))
        got: list[NvmlXid] = []

        def both() -> bool:
            assert src is not None
            got.extend(src.poll(10))
            return len(got) >= 2

        wait_until(both, timeout=10, what="both XIDs from NVML")
        assert got == [NvmlXid("0000:5d:00.0", 3, 79, 7.0), NvmlXid("0000:2a:00.0", 1, 48, 7.0)]
    finally:
        if src is not None:
            src.close()
        nvml_lib.uninstall()
