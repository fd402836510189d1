"""Software versions the host collector exports: the running kernel and the OFED (MLNX_OFED /
DOCA-OFED) stack. The checks compare them with a site's golden profile (checks/passive/drift.py).

- kernel: <procfs_root>/sys/kernel/osrelease (what `uname -r` prints).
- OFED: `ofed_info -s` (the installed OFED release, e.g. "MLNX_OFED_LINUX-23.10-1.1.9.0:"), else
  <sysfs_root>/module/mlx5_core/version (set by OFED's mlx5_core; the inbox driver has none).
  ofed_info describes the packages of the machine it runs on, so it is only asked when the agent
  reads the real /sys (not a container's mount elsewhere, not the simulator); it is a package
  query that changes only with an upgrade, so its answer is kept for an hour.

A version that cannot be read is left out (the drift check then says UNKNOWN), never "".
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from typing import Callable

from podhealth.vocab import Sample

OFED_INFO_TIMEOUT = 5.0
OFED_INFO_KEEP_S = 3600.0
REAL_SYSFS = Path("/sys")


def parse_osrelease(text: str) -> str | None:
    release = text.strip()
    return release or None


def parse_ofed_info(text: str) -> str | None:
    """`ofed_info -s` prints one line, "MLNX_OFED_LINUX-23.10-1.1.9.0:" (the colon is part of it)."""
    for line in text.splitlines():
        line = line.strip().rstrip(":").strip()
        if line:
            return line
    return None


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


OfedRunner = Callable[[], str | None]


def ofed_info_runner(argv0: str = "ofed_info", timeout: float = OFED_INFO_TIMEOUT) -> OfedRunner:
    """Runs `ofed_info -s` (no shell, a timeout); None when it is not installed or fails."""
    def run() -> str | None:
        exe = shutil.which(argv0)
        if exe is None:
            return None
        try:
            proc = subprocess.run([exe, "-s"], capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return parse_ofed_info(proc.stdout) if proc.returncode == 0 else None
    return run


class VersionReader:
    """Reads the kernel and OFED versions as samples; the ofed_info answer is kept a while."""

    def __init__(self, procfs_root: Path, sysfs_root: Path, ofed_info: OfedRunner | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.procfs_root = procfs_root
        self.sysfs_root = sysfs_root
        if ofed_info is None and sysfs_root == REAL_SYSFS:
            ofed_info = ofed_info_runner()
        self._ofed_info = ofed_info
        self._clock = clock
        self._ofed_memo: tuple[float, str | None] | None = None

    def _ofed(self) -> tuple[str, str] | None:
        if self._ofed_info is not None:
            now = self._clock()
            if self._ofed_memo is None or now - self._ofed_memo[0] >= OFED_INFO_KEEP_S:
                self._ofed_memo = (now, self._ofed_info())
            if self._ofed_memo[1]:
                return self._ofed_memo[1], "ofed_info"
        text = _read(self.sysfs_root / "module" / "mlx5_core" / "version")
        version = parse_osrelease(text) if text is not None else None
        return (version, "mlx5_core") if version else None

    def samples(self) -> list[Sample]:
        out: list[Sample] = []
        text = _read(self.procfs_root / "sys" / "kernel" / "osrelease")
        release = parse_osrelease(text) if text is not None else None
        if release:
            out.append(Sample.of("host_kernel_info", 1, release=release))
        ofed = self._ofed()
        if ofed is not None:
            out.append(Sample.of("host_ofed_info", 1, version=ofed[0], source=ofed[1]))
        return out
