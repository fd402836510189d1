"""NVML's XID event source (collectors/nvml_events.py), with real pynvml: on the simulated NVML
library (events delivered; a GPU that refuses event registration) and with no NVML library at all."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from podhealth.collectors.nvml_events import NvmlUnusable, NvmlXid, NvmlXidEvents
from tests.harness.proc import wait_until


# ---- the error paths, with real pynvml ------------------------------------------------------------


@pytest.fixture
def sim_nvml(tmp_path: Path) -> Iterator[Any]:
    from podhealth.sim import nvml_lib
    from podhealth.sim.node import SimNode

    node = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    nvml_lib.install(node)
    try:
        yield node
    finally:
        nvml_lib.uninstall()


def test_one_gpu_refusing_events_is_a_note_all_refusing_is_unusable(sim_nvml: Any) -> None:
    import pynvml

    from podhealth.sim import faults

    sim_nvml.inject(faults.parse(["fault=nvml-events-unsupported", "gpu=1"], time.time()))
    src = NvmlXidEvents(pynvml)
    try:
        assert len(src.notes) == 1 and "GPU 1" in src.notes[0], src.notes
        assert len(src.gpu_index_by_pci()) == 8
    finally:
        src.close()
    for gpu in range(8):
        sim_nvml.inject(faults.parse(["fault=nvml-events-unsupported", f"gpu={gpu}"], time.time()))
    with pytest.raises(NvmlUnusable, match="no GPU accepted"):
        NvmlXidEvents(pynvml)


def test_no_nvml_library_is_unusable_not_a_crash() -> None:
    import ctypes.util

    import pynvml

    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real NVML library is installed on this machine")
    from podhealth.sim import nvml_lib

    nvml_lib.uninstall()  # pynvml back to "not loaded": nvmlInit looks for libnvidia-ml.so.1
    with pytest.raises(NvmlUnusable, match="nvmlInit failed"):
        NvmlXidEvents(pynvml)


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
