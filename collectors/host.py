"""Host basics (psutil: CPU, memory, disk, load, uptime) and the state of configured systemd units.

Unit states come from `systemctl show --property=ActiveState --value UNIT...` (one argv, a
timeout, no shell). Where systemd is not PID 1 (containers, CI) every unit is "unknown" and no
`systemd_unit_active` series is emitted: an unknown state is absent, not "inactive". The
simulator hands over a JSON file of unit -> state instead (the `units_source` seam).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, ClassVar, Mapping, Sequence

import psutil

from podhealth.collectors.base import Collection, specs
from podhealth.collectors.host_versions import VersionReader
from podhealth.config import Config, HostConfig
from podhealth.vocab import MetricSpec, Sample

SYSTEMCTL_TIMEOUT = 5.0
UNKNOWN = "unknown"


def systemd_booted(run_dir: Path = Path("/run/systemd/system")) -> bool:
    """sd_booted(3): systemd is PID 1 exactly when this directory exists."""
    return run_dir.is_dir()


def parse_systemctl_show(text: str, units: Sequence[str]) -> dict[str, str]:
    """Map `systemctl show --value` output to units. Values come in argv order; systemctl puts a
    blank line between units, so blank lines are dropped. A count mismatch means the output cannot
    be paired with the units safely: every unit is then unknown."""
    values = [line.strip() for line in text.splitlines() if line.strip()]
    if len(values) != len(units):
        return {u: UNKNOWN for u in units}
    return dict(zip(units, values))


def parse_units_json(text: str, units: Sequence[str]) -> dict[str, str]:
    """The simulator's units file: {"unit": "state"}. Units it does not list are inactive, as
    systemd reports for a unit it has no file for. Raises ValueError on a malformed file."""
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("units file must hold a JSON object of unit -> state")
    out: dict[str, str] = {}
    for u in units:
        state = data.get(u, "inactive")
        out[u] = state if isinstance(state, str) and state else UNKNOWN
    return out


UnitReader = Callable[[Sequence[str]], dict[str, str]]


def systemctl_reader(argv0: str = "systemctl", timeout: float = SYSTEMCTL_TIMEOUT,
                     booted: Callable[[], bool] = systemd_booted) -> UnitReader:
    def read(units: Sequence[str]) -> dict[str, str]:
        if not units:
            return {}
        if not booted():
            return {u: UNKNOWN for u in units}
        proc = subprocess.run([argv0, "show", "--property=ActiveState", "--value", "--", *units],
                              capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"systemctl exited {proc.returncode}: {proc.stderr.strip()[:200]}")
        return parse_systemctl_show(proc.stdout, units)
    return read


def file_reader(path: Path) -> UnitReader:
    def read(units: Sequence[str]) -> dict[str, str]:
        return parse_units_json(path.read_text(encoding="utf-8"), units)
    return read


def parse_btime(text: str) -> float | None:
    """`btime <seconds since the epoch>` from /proc/stat (proc(5)); None when absent or garbled."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "btime" and parts[1].isdigit():
            return float(parts[1])
    return None


@dataclass(frozen=True, slots=True)
class CpuTimes:
    busy: float
    total: float


def cpu_ratio(prev: CpuTimes | None, cur: CpuTimes) -> float | None:
    """Busy share between two readings; since boot on the first one. None if the clock went nowhere."""
    busy, total = (cur.busy - prev.busy, cur.total - prev.total) if prev else (cur.busy, cur.total)
    if total <= 0:
        return None
    return min(1.0, max(0.0, busy / total))


def _cpu_times() -> CpuTimes:
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    # guest time is already counted in user/nice on Linux; adding it would double-count.
    total = sum(getattr(t, f) for f in t._fields if f not in ("guest", "guest_nice"))
    return CpuTimes(busy=total - idle, total=total)


class HostCollector:
    name: ClassVar[str] = "host"
    metrics: ClassVar[Mapping[str, MetricSpec]] = specs(
        MetricSpec("host_cpu_utilization_ratio", "gauge", "CPU busy share 0..1 since the previous collection."),
        MetricSpec("host_memory_used_bytes", "gauge", "Memory in use (total minus available).", "bytes"),
        MetricSpec("host_memory_total_bytes", "gauge", "Physical memory.", "bytes"),
        MetricSpec("host_load1", "gauge", "1-minute load average."),
        MetricSpec("host_load5", "gauge", "5-minute load average."),
        MetricSpec("host_load15", "gauge", "15-minute load average."),
        MetricSpec("host_uptime_seconds", "gauge", "Seconds since boot.", "seconds"),
        MetricSpec("host_disk_used_bytes", "gauge", "Used bytes of a configured filesystem.", "bytes"),
        MetricSpec("host_disk_total_bytes", "gauge", "Size of a configured filesystem.", "bytes"),
        MetricSpec("systemd_unit_active", "gauge", "1 when the unit's ActiveState is active, else 0."),
        MetricSpec("systemd_unit_state_info", "info", "The unit's ActiveState (unknown where systemd is not PID 1)."),
        MetricSpec("host_kernel_info", "info", "Running kernel release (label release, as uname -r)."),
        MetricSpec("host_ofed_info", "info", "OFED stack version (label version; source ofed_info or mlx5_core)."),
    )

    def __init__(self, cfg: HostConfig, units: UnitReader, versions: VersionReader | None = None,
                 procfs_root: Path = Path("/proc")) -> None:
        self.cfg = cfg
        self.procfs_root = procfs_root
        self._units = units
        self._versions = versions
        self._prev_cpu: CpuTimes | None = None

    def collect(self) -> Collection:
        samples: list[Sample] = []
        errors: list[str] = []
        cur = _cpu_times()
        ratio = cpu_ratio(self._prev_cpu, cur)
        self._prev_cpu = cur
        if ratio is not None:
            samples.append(Sample.of("host_cpu_utilization_ratio", ratio))
        mem = psutil.virtual_memory()
        samples.append(Sample.of("host_memory_used_bytes", mem.total - mem.available))
        samples.append(Sample.of("host_memory_total_bytes", mem.total))
        l1, l5, l15 = os.getloadavg()
        samples += [Sample.of("host_load1", l1), Sample.of("host_load5", l5), Sample.of("host_load15", l15)]
        # Uptime from <procfs_root>/stat btime (not psutil, which always reads the real /proc):
        # the boot grace (checks/passive/grace.py) must follow the node the agent is pointed at.
        try:
            btime = parse_btime((self.procfs_root / "stat").read_text(encoding="ascii", errors="replace"))
        except OSError as e:
            btime = None
            errors.append(f"boot time: {e.strerror or e} ({self.procfs_root}/stat)")
        if btime is not None:
            samples.append(Sample.of("host_uptime_seconds", max(0.0, time.time() - btime)))
        for path in self.cfg.disk_paths:
            try:
                du = psutil.disk_usage(path)
            except OSError as e:
                errors.append(f"disk {path}: {e.strerror or e}")
                continue
            samples.append(Sample.of("host_disk_used_bytes", du.used, path=path))
            samples.append(Sample.of("host_disk_total_bytes", du.total, path=path))
        try:
            states = self._units(self.cfg.units)
        except (OSError, ValueError, RuntimeError, subprocess.TimeoutExpired) as e:
            errors.append(f"systemd units: {type(e).__name__}: {e}"[:300])
            states = {u: UNKNOWN for u in self.cfg.units}
        for unit, state in states.items():
            samples.append(Sample.of("systemd_unit_state_info", 1, unit=unit, state=state))
            if state != UNKNOWN:
                samples.append(Sample.of("systemd_unit_active", 1 if state == "active" else 0, unit=unit))
        if self._versions is not None:
            samples.extend(self._versions.samples())
        return Collection(tuple(samples), errors=tuple(errors))

    def close(self) -> None:
        pass


def create(cfg: Config, units_source: Path | None = None, extra_units: Sequence[str] = ()) -> HostCollector:
    """`units_source`: a JSON file unit -> state (the simulator's) instead of asking systemd.
    `extra_units`: units the node's hardware profile needs (checks/profiles.collector_seams), read
    beside the configured ones."""
    reader = file_reader(units_source) if units_source is not None else systemctl_reader()
    host = cfg.collectors.host
    if extra_units:
        host = replace(host, units=tuple(dict.fromkeys([*host.units, *extra_units])))
    return HostCollector(host, reader, VersionReader(cfg.paths.procfs_root, cfg.paths.sysfs_root),
                         procfs_root=cfg.paths.procfs_root)
