"""The loopback Slurm cluster for tests: podhealth.sim.slurmcluster plus a pytest fixture.

The cluster itself lives in the package (`podhealth simulate fleet` and bench/ start one too);
this module re-exports it under the old names and adds `slurm_fixture()`, which imports pytest
only when called.

    with SlurmCluster(nodes=4) as c:
        subprocess.run(["sinfo"], env=c.env, timeout=10)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any, Literal

import contextlib
import signal
import time
from pathlib import Path

from podhealth.sim.slurmcluster import (  # noqa: F401 - re-exported for tests
    BINARIES, SlurmClusterError, free_port, kill_pid, missing_binaries, node_names,
)
from podhealth.sim.slurmcluster import SlurmCluster as _BaseCluster

__all__ = ["BINARIES", "SlurmCluster", "SlurmClusterError", "free_port", "kill_env_holders", "kill_pid",
           "missing_binaries", "node_names", "slurm_cluster", "slurm_fixture"]


class SlurmCluster(_BaseCluster):
    """The package's cluster, plus a sweep for job-step processes its stop() can miss.

    slurmstepd calls setsid() (so it is not in slurmd's session) and blocks SIGTERM, and job
    tasks live in the stepd's session: after the daemons stop, every process still carrying this
    cluster's SLURM_CONF in its environment is one of ours and gets SIGKILL.
    """

    def stop(self, failed: bool = False) -> None:
        conf = self.conf
        try:
            super().stop(failed)
        finally:
            if conf != Path():
                kill_env_holders(b"SLURM_CONF=" + bytes(conf))


@contextlib.contextmanager
def slurm_cluster(**kwargs: Any) -> Iterator[SlurmCluster]:
    with SlurmCluster(**kwargs) as c:
        yield c


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _ancestors() -> set[int]:
    out: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in out:
        out.add(pid)
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
    return out


def kill_env_holders(entry: bytes, timeout: float = 5.0) -> list[int]:
    """SIGKILL live processes whose environment holds `entry` exactly (never us or our parents)."""
    skip = _ancestors()
    pids: list[int] = []
    for d in os.scandir("/proc"):
        if not d.name.isdigit() or int(d.name) in skip:
            continue
        try:
            with open(f"/proc/{d.name}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if entry in env and _alive(int(d.name)):
            pids.append(int(d.name))
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    return pids


def slurm_fixture(scope: Literal["session", "package", "module", "class", "function"] = "module",
                  **kwargs: Any) -> Any:
    """A pytest fixture yielding a started SlurmCluster; skips clearly when Slurm is not installed.

    In a test module: `slurm = slurm_fixture(nodes=4)` then take `slurm` as an argument.
    """
    import pytest  # only here: the harness itself must import without pytest

    @pytest.fixture(scope=scope)
    def _fixture() -> Iterator[SlurmCluster]:
        missing = missing_binaries()
        if missing:
            pytest.skip(f"loopback Slurm needs {', '.join(missing)} (apt-get install slurmctld slurmd "
                        "slurm-client munge)")
        if os.geteuid() != 0:
            pytest.skip("the loopback Slurm harness is only supported as root (munged, slurmd)")
        with SlurmCluster(**kwargs) as cluster:
            yield cluster

    return _fixture
