"""Hardware tests need a real NVIDIA GPU and nvidia-smi; without them they skip with the reason.

Mark a test `@pytest.mark.hardware`; `real_gpu_reason()` decides once per session.
"""

from __future__ import annotations

import shutil
import subprocess
from functools import lru_cache

import pytest


@lru_cache(maxsize=1)
def real_gpu_reason() -> str | None:
    """None when a real GPU answers nvidia-smi; otherwise why the hardware tests cannot run."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "no nvidia-smi on PATH (no NVIDIA driver on this machine)"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "nvidia-smi -L did not answer within 30 s"
    if out.returncode != 0:
        return f"nvidia-smi -L failed (rc {out.returncode}): {(out.stderr or out.stdout).strip()[:200]}"
    if not any(line.startswith("GPU ") for line in out.stdout.splitlines()):
        return "nvidia-smi -L lists no GPU"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = None
    for item in items:
        if item.get_closest_marker("hardware") is None:
            continue
        if reason is None:
            reason = real_gpu_reason() or ""
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"hardware test: {reason}"))


@pytest.fixture
def nvidia_smi() -> str:
    reason = real_gpu_reason()
    if reason:
        pytest.skip(f"hardware test: {reason}")
    path = shutil.which("nvidia-smi")
    assert path is not None
    return path
