"""The simulated NVML library's CPU account (sim/nvml_cpu.py), read as bench/agent_overhead.py reads it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import pynvml
import pytest

from podhealth.sim import nvml_cpu, nvml_lib
from podhealth.sim.node import SimNode


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    yield SimNode.create(tmp_path, "dgx01", "dgx-h100")
    nvml_lib.uninstall()
    nvml_cpu.reset_for_tests()


def _collect(rounds: int) -> None:
    """What the NVML collector asks of every GPU, `rounds` times."""
    for _ in range(rounds):
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
            pynvml.nvmlDeviceGetPowerUsage(h)
            pynvml.nvmlDeviceGetMemoryInfo(h)


def test_the_account_grows_when_pynvml_calls_the_simulated_library(node: SimNode, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    account = tmp_path / "nvml-cpu"
    monkeypatch.setenv(nvml_cpu.CPU_FILE_ENV, str(account))
    nvml_cpu.reset_for_tests()
    nvml_lib.install(node)
    pynvml.nvmlInit()
    try:
        first = nvml_cpu.read(account)
        _collect(50)
        second = nvml_cpu.read(account)
        # a second thread gets a slot of its own, and the reader sums them
        t = threading.Thread(target=_collect, args=(50,))
        t.start()
        t.join()
        third = nvml_cpu.read(account)
    finally:
        pynvml.nvmlShutdown()
    assert 0.0 < first[0] < second[0] < third[0]
    # a round: the count, then 8 GPUs x (handle + 3 readings); 50 rounds after the first reading
    assert second[1] - first[1] == third[1] - second[1] == 50 * (1 + 8 * 4)


def test_without_the_variable_nothing_is_counted_or_written(node: SimNode, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(nvml_cpu.CPU_FILE_ENV, raising=False)
    nvml_cpu.reset_for_tests()
    nvml_lib.install(node)
    pynvml.nvmlInit()
    try:
        _collect(5)
    finally:
        pynvml.nvmlShutdown()
    assert nvml_cpu._account is None
    assert list(tmp_path.glob("**/*nvml-cpu*")) == []
    assert nvml_cpu.read(tmp_path / "nvml-cpu") == (0.0, 0)
