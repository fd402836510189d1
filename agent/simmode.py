"""`--simulate`: the seam through which the simulator points the agent at a simulated node.

The agent stands below the simulator: nothing here or in the collectors imports it. The CLI
registers `podhealth agent` and `podhealth profile` through `sim/cmd_agent.py` and
`sim/cmd_profile.py`, which hand the agent's commands a `Simulator` (`sim/agentnode.py`): it
offers the `--simulate` profiles, creates or reopens the node, and gives the agent the config and
collector seams that point at it (its trees as `paths.sysfs_root`/`procfs_root`/`kmsg`, pynvml
routed to the simulated NVML library). Without one, the commands have no `--simulate`.

`podhealth simulate inject` in another process changes the node; `refresher` rewrites its trees
every second so the collectors see the change.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Callable, Protocol

from podhealth import log
from podhealth.config import Config
from podhealth.worker import Worker

_log = log.get("podhealth.agent.sim")

REFRESH_INTERVAL = 1.0


class SimulatedNode(Protocol):
    """A simulated node set up for the agent's collectors."""

    @property
    def cfg(self) -> Config:
        """The agent's config pointed at the node (paths, node name and profile, job records)."""

    @property
    def seams(self) -> dict[str, dict[str, Any]]:
        """The collector seams (by collector name) for the sources a directory cannot stand in for."""

    @property
    def dir(self) -> Path:
        """The node's own directory (the publisher's spool goes beside its tree)."""

    def refresh(self) -> None:
        """Rewrite the node's trees from its state once (blocking)."""


class Simulator(Protocol):
    """What the simulator gives the agent's commands for `--simulate`."""

    def profiles(self) -> tuple[str, ...]:
        """The profiles a node can be simulated as: the choices of `--simulate`."""

    def default_root(self) -> Path:
        """The directory of simulated nodes when `--sim-root` is not given."""

    def setup(self, cfg: Config, profile: str, root: Path, name: str) -> SimulatedNode:
        """Create or reopen node `name` under `root` and install it (ValueError, OSError: cannot)."""


async def refresher(refresh: Callable[[], None], interval: float = REFRESH_INTERVAL) -> None:
    """Call `refresh` every `interval` s, off the loop, never two at once (until cancelled)."""
    worker: Worker[None] = Worker("sim-refresh")
    failing = False
    fut: asyncio.Future[None] | None = None
    try:
        while True:
            try:
                if fut is None or fut.done():
                    fut = worker.submit(refresh)
                await asyncio.wait_for(asyncio.shield(fut), interval * 10)
                if failing:
                    _log.info("simulated node refresh works again")
                failing = False
            except Exception as e:  # noqa: BLE001 - a broken refresh must not stop the agent
                if not failing:
                    _log.warning("simulated node refresh failed", error=f"{type(e).__name__}: {e}")
                failing = True
            await asyncio.sleep(interval)
    finally:
        worker.close()
