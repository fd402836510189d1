"""The simulated node's <proc>/stat: the boot time (`btime`) the host collector reads.

The node has been up UPTIME_BEFORE_T0 when the simulation starts (as the IB and NFS trees
assume), unless a `fault=reboot` says it booted later: then btime is the latest reboot's time, so
a test can put the agent in its boot grace (checks/passive/grace.py) on demand. Format per proc(5); the
cpu lines are a plausible idle node's, only `btime` is read.
"""

from __future__ import annotations

from pathlib import Path

from podhealth.sim.state import NodeState
from podhealth.sim.tree_write import TreeWriter

UPTIME_BEFORE_T0 = 3 * 86400.0
# What `uname -r` says on the simulated node (a DGX OS 6 kernel): <proc>/sys/kernel/osrelease, read
# by the host collector (the drift check's `kernel`) and the evidence bundle, never this machine's.
KERNEL_RELEASE = "5.15.0-1053-nvidia"


def boot_time(state: NodeState) -> float:
    reboots = [f.injected_at for f in state.faults if f.kind == "reboot"]
    return max(reboots) if reboots else state.t0 - UPTIME_BEFORE_T0


def write(state: NodeState, proc_root: Path, now: float) -> None:
    btime = int(boot_time(state))
    up = max(0, int(now) - btime)
    ticks = up * 100   # USER_HZ
    text = (f"cpu  {ticks * 2} 0 {ticks} {ticks * 220} {ticks // 50} 0 {ticks // 100} 0 0 0\n"
            f"intr {ticks * 40}\nctxt {ticks * 90}\nbtime {btime}\n"
            f"processes {up * 3 + 1000}\nprocs_running 1\nprocs_blocked 0\n")
    w = TreeWriter(proc_root)
    w.put(proc_root / "stat", text)
    w.put(proc_root / "sys" / "kernel" / "osrelease", KERNEL_RELEASE + "\n")
