"""The simulated node an agent runs on: what fills the agent's `--simulate` seam (agent/simmode.py).

`podhealth agent --simulate PROFILE` and `podhealth profile ... --simulate PROFILE` point the real
agent's collectors at a simulated DGX node. Nothing in the agent or the collectors knows about
the simulator: the node's directories become `paths.sysfs_root`/`procfs_root`/`kmsg`, pynvml is
routed to the simulated NVML library, and the collectors whose sources cannot be pointed at a
directory get their seams (the NFS probe's argv, the host collector's units file).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podhealth import log
from podhealth.config import Config

if TYPE_CHECKING:
    from podhealth.sim.node import SimNode

_log = log.get("podhealth.agent.sim")


@dataclass(frozen=True)
class SimSetup:
    """The node and what the agent needs to read it (agent/simmode.py SimulatedNode)."""

    node: "SimNode"
    cfg: Config
    seams: dict[str, dict[str, Any]]

    @property
    def dir(self) -> Path:
        return self.node.dir

    def refresh(self) -> None:
        self.node.refresh()


class AgentSimulator:
    """The agent's commands' `Simulator` (agent/simmode.py)."""

    def profiles(self) -> tuple[str, ...]:
        from podhealth.sim.state import simulated_profiles

        return simulated_profiles()

    def default_root(self) -> Path:
        from podhealth.sim.node import default_root

        return default_root()

    def setup(self, cfg: Config, profile: str, root: Path, name: str) -> SimSetup:
        return setup(cfg, profile, root, name)


SIMULATOR = AgentSimulator()


def open_or_create(root: Path, name: str, profile: str) -> "SimNode":
    from podhealth.sim.node import SimNode

    try:
        node = SimNode.open(root, name)
    except FileNotFoundError:
        node = SimNode.create(root, name, profile)
        _log.info("created simulated node", node=name, profile=profile, dir=str(node.dir))
        return node
    if node.state.profile != profile:
        raise ValueError(f"simulated node {name!r} under {root} is a {node.state.profile}, not {profile} "
                         f"(use another --node or --sim-root)")
    _log.info("reusing simulated node", node=name, profile=profile, dir=str(node.dir))
    return node


def _job_dir(cfg: Config, node_dir: Path) -> Path:
    from podhealth.config import JobsConfig
    from podhealth.sim.cmd_job import state_dir_of

    configured = cfg.collectors.jobs.state_dir
    if configured != JobsConfig().state_dir:
        return configured
    # The simulated node has the prolog installed: its record directory exists before the first
    # job, so "no job" is known (what lets the fail-slow probes run on an idle node).
    state_dir_of(node_dir).mkdir(parents=True, exist_ok=True)
    return state_dir_of(node_dir)


def setup(cfg: Config, profile: str, root: Path, name: str) -> SimSetup:
    """Create or reopen the node, install the NVML simulator, and derive the agent's config and seams."""
    from podhealth.sim import nvml_lib

    node = open_or_create(root, name, profile)
    nvml_lib.install(node)
    kmsg_reader = _kmsg_reader(node, cfg.collectors.kmsg.from_start)
    cfg = replace(
        cfg,
        node=replace(cfg.node, name=name, profile=profile),  # type: ignore[arg-type]
        paths=replace(cfg.paths, sysfs_root=node.sys_root, procfs_root=node.proc_root, kmsg=node.kmsg_stream),
        # `podhealth simulate job start` records jobs beside the node's tree; a state_dir set in the
        # config (shared with a real prolog under the loopback Slurm) is kept.
        collectors=replace(cfg.collectors, jobs=replace(cfg.collectors.jobs, state_dir=_job_dir(cfg, node.dir))),
        # POST /v1/gpu-reset resets the simulated GPU (podhealth.sim.cmd gpu-reset), not a real one
        gpu_reset=replace(cfg.gpu_reset, command=(sys.executable, "-m", "podhealth", "simulate", "gpu-reset",
                                                  "--root", str(root), name, "{gpu}")),
    )
    seams: dict[str, dict[str, Any]] = {
        "nfs": {"probe_argv": node.probe_argv},
        "host": {"units_source": node.units_path},
        # The kernel's sysfs has no SMART log: the node's nvme-cli JSON files stand in for `nvme smart-log`.
        "nvme": {"smart_source": node.dir / "nvme-smart"},
        # The simulated kernel stamps its records against the simulated node's boot (its t0),
        # not this machine's: without this, every simulated XID would look an hour old.
        "kmsg": {"boot_time": lambda: node.state.t0, "reader": kmsg_reader},
        # No nv-hostengine behind the simulated GPUs: said as that, not as "install DCGM".
        "dcgm": {"unavailable": "DCGM is not simulated: its profiling fields (DCGM_FI_PROF_*) stay absent "
                                "under --simulate"},
        # The evidence bundle's dmesg part: the simulated node's kernel log, not this machine's.
        "bundle": {"dmesg": lambda: (dmesg_text(node.kmsg_path), "")},
        # The fail-slow probes read the node's performance model (spread, slow-* faults).
        "failslow": {"probe": lambda: _fingerprint(node)},
    }
    from podhealth.checks import profiles

    if profiles.load(profile).nvlink_domain.imex:
        # a GB200 tray's IMEX service answers from the node's files (sim/tree_imex.py)
        seams["imex"] = {"status_source": node.dir / "imex"}
    return SimSetup(node, cfg, seams)


def dmesg_text(kmsg_log: Path, limit: int = 4 << 20) -> bytes:
    """The node's kernel log as `dmesg` prints it ("[  123.456789] text"), from its /dev/kmsg
    records ("pri,seq,usec,flags;text"): the last `limit` bytes of the log, whole records only."""
    try:
        with open(kmsg_log, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - limit))
            data = f.read()
    except FileNotFoundError:
        return b""
    if size > limit:
        data = data.split(b"\n", 1)[-1]
    out = []
    for raw in data.splitlines():
        head, sep, text = raw.partition(b";")
        fields = head.split(b",")
        if not sep or len(fields) < 3 or not fields[2].isdigit():
            continue
        usec = int(fields[2])
        out.append(b"[%5d.%06d] %s\n" % (usec // 1_000_000, usec % 1_000_000, text))
    return b"".join(out)


def _fingerprint(node: "SimNode") -> list[tuple[str, str, float, str]]:
    import time

    from podhealth.sim import perfmodel

    return [(r.entity, r.metric, r.value, r.firmware) for r in perfmodel.fingerprint(node.state, 0, time.time())]


def _kmsg_reader(node: "SimNode", from_start: bool) -> Any:
    """The kmsg collector's reader on the node's kernel-log FIFO: the /dev/kmsg reader (so the
    agent is woken by the record, as on a real node). Its first open attaches it to the node
    (with `from_start`, the newest records logged before are replayed into it, as a new /dev/kmsg
    reader sees the ring buffer), so a command that sets the simulator up without reading the
    kernel log (`profile capture --simulate`) neither takes records from a running agent nor
    replays old ones into its stream."""
    from podhealth.collectors.kmsg_reader import KmsgDeviceReader

    class NodeStream(KmsgDeviceReader):
        attached = False

        def open(self) -> str:
            if self.attached:
                return super().open()  # reopened after an error: no replay; the gap counts as lost
            err = node.attach_kmsg_reader(super().open, from_start)
            self.attached = not err
            return err

    return NodeStream(node.kmsg_stream, from_start, fifo=True)
