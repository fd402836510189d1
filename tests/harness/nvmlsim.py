"""Fixtures shared by the NVML-backed collector tests: a simulated dgx-h100 behind the real pynvml.

Import them into a test module: `from tests.harness.nvmlsim import inject, node, session  # noqa: F401`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.collectors.nvml_session import NvmlSession
from podhealth.sim import faults, nvml_lib
from podhealth.sim.node import SimNode


@pytest.fixture
def node(tmp_path: Path) -> Iterator[SimNode]:
    n = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    nvml_lib.install(n)
    try:
        yield n
    finally:
        nvml_lib.uninstall()


@pytest.fixture
def session(node: SimNode) -> Iterator[NvmlSession]:
    s = NvmlSession()
    try:
        yield s
    finally:
        s.shutdown()


def inject(node: SimNode, *tokens: str) -> None:
    node.inject(faults.parse(list(tokens), time.time()))
