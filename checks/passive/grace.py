"""When a grace period for non-fatal conditions is running: after boot, and after a driver change.

Right after boot the node is still settling: nvidia-fabricmanager registers the GPUs with the
NVSwitch fabric, links train, persistenced starts, NFS mounts come up. Verdicts read then are
held (checks/passive/damping.py shows a FAIL as WARN) for `checks.grace` seconds; fatal facts (rules.yaml
`immediate`) are never held.

Boot time: `host_uptime_seconds` from the host collector, which reads `btime` from
<procfs_root>/stat (the reader takes a root, so the simulator can present a recent boot); the
boot is the collection's time minus the uptime. No host data: no boot grace (we cannot tell).

Driver load: the kernel gives no load time for the nvidia module (/sys/module/nvidia has no
timestamp) and NVML has none either. What the agent can tell honestly is a change of the driver
version between two of its own NVML readings: the module was replaced under a running agent (an
upgrade). A reload with the same version, or an agent that starts after the driver was loaded, is
indistinguishable from an NVML hiccup or an agent restart, and holding verdicts on every restart
would delay real failures; at boot the driver loads inside the boot grace anyway.
"""

from __future__ import annotations

from podhealth.checks.passive.damping import Grace
from podhealth.snapshot import Snapshot


class GraceClock:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.boot: float | None = None
        self.driver: str | None = None
        self.driver_changed: tuple[float, str] | None = None   # (when, "driver change A -> B")

    def observe(self, snap: Snapshot, now: float) -> Grace | None:
        """Update from the snapshot; the grace in force at `now`, or None."""
        self._boot(snap)
        self._driver(snap, now)
        if self.seconds <= 0:
            return None
        graces = []
        if self.boot is not None:
            graces.append(Grace(self.boot + self.seconds, "boot"))
        if self.driver_changed is not None:
            graces.append(Grace(self.driver_changed[0] + self.seconds, self.driver_changed[1]))
        live = [g for g in graces if now < g.until]
        return max(live, key=lambda g: g.until) if live else None

    def boot_time(self, snap: Snapshot) -> float | None:
        """The node's boot time as the snapshot shows it (the last one seen when it shows none)."""
        self._boot(snap)
        return self.boot

    def _boot(self, snap: Snapshot) -> None:
        st = snap.collectors.get("host")
        if st is None or st.stale or st.last_success is None:
            return   # keep the last boot time seen: it does not change without a reboot
        for s in st.samples:
            if s.name == "host_uptime_seconds" and s.value >= 0:
                self.boot = st.last_success - s.value
                return

    def _driver(self, snap: Snapshot, now: float) -> None:
        st = snap.collectors.get("nvml")
        if st is None or st.stale:
            return
        versions = sorted({s.label("driver_version") for s in st.samples
                           if s.name == "gpu_info" and s.label("driver_version")})
        if not versions:
            return
        v = versions[0]
        if self.driver is not None and v != self.driver:
            self.driver_changed = (now, f"driver change {self.driver} -> {v}")
        self.driver = v
