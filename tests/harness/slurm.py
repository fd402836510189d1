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

from podhealth.sim.slurmcluster import (  # noqa: F401 - re-exported for tests
    BINARIES, SlurmCluster, SlurmClusterError, free_port, kill_env_holders, kill_pid, missing_binaries, node_names,
)

__all__ = ["BINARIES", "SlurmCluster", "SlurmClusterError", "free_port", "kill_env_holders", "kill_pid",
           "missing_binaries", "node_names", "slurm_cluster", "slurm_fixture"]


@contextlib.contextmanager
def slurm_cluster(**kwargs: Any) -> Iterator[SlurmCluster]:
    with SlurmCluster(**kwargs) as c:
        yield c


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
