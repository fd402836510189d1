"""The host collector: psutil readings, systemd unit states from systemctl or the simulator's file."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from dataclasses import replace
from pathlib import Path

import psutil
import pytest

from podhealth import config
from podhealth.collectors import host

pytestmark = pytest.mark.timeout(60)

UNITS = ("nvidia-fabricmanager.service", "nvidia-persistenced.service", "slurmd.service")


def by_name(samples: tuple[host.Sample, ...], name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {s.labels: s.value for s in samples if s.name == name}


def test_parse_systemctl_show_pairs_values_with_units() -> None:
    # systemctl separates units with a blank line when asked about several.
    assert host.parse_systemctl_show("active\n\nfailed\n\ninactive\n", UNITS) == {
        UNITS[0]: "active", UNITS[1]: "failed", UNITS[2]: "inactive"}
    # A count mismatch cannot be paired safely: all unknown.
    assert host.parse_systemctl_show("active\n", UNITS) == {u: "unknown" for u in UNITS}


def test_parse_units_json() -> None:
    text = json.dumps({UNITS[0]: "active", UNITS[1]: "failed", UNITS[2]: 3})
    assert host.parse_units_json(text, UNITS + ("kubelet.service",)) == {
        UNITS[0]: "active", UNITS[1]: "failed", UNITS[2]: "unknown", "kubelet.service": "inactive"}
    with pytest.raises(ValueError):
        host.parse_units_json("[1, 2]", UNITS)
    with pytest.raises(ValueError):
        host.parse_units_json("{truncated", UNITS)


def test_cpu_ratio() -> None:
    assert host.cpu_ratio(None, host.CpuTimes(busy=25, total=100)) == 0.25
    assert host.cpu_ratio(host.CpuTimes(10, 100), host.CpuTimes(60, 200)) == 0.5
    assert host.cpu_ratio(host.CpuTimes(10, 100), host.CpuTimes(10, 100)) is None


def _cfg(units: tuple[str, ...] = UNITS, disks: tuple[str, ...] = ("/",)) -> config.Config:
    cfg = config.Config()
    return replace(cfg, collectors=replace(cfg.collectors, host=replace(cfg.collectors.host, units=units,
                                                                        disk_paths=disks)))


def test_collect_with_units_file(tmp_path: Path) -> None:
    units = tmp_path / "units.json"
    units.write_text(json.dumps({UNITS[0]: "active", UNITS[1]: "failed"}))
    c = host.create(_cfg(disks=("/", str(tmp_path / "missing"))), units_source=units)
    out = c.collect()
    active = by_name(out.samples, "systemd_unit_active")
    assert active == {(("unit", UNITS[0]),): 1.0, (("unit", UNITS[1]),): 0.0, (("unit", UNITS[2]),): 0.0}
    info = by_name(out.samples, "systemd_unit_state_info")
    assert (("state", "failed"), ("unit", UNITS[1])) in info
    mem = by_name(out.samples, "host_memory_total_bytes")
    assert list(mem.values()) == [float(psutil.virtual_memory().total)]
    disk = by_name(out.samples, "host_disk_total_bytes")
    assert list(disk) == [(("path", "/"),)]
    assert any("missing" in e for e in out.errors)  # one bad path is an error, not a failure
    names = {s.name for s in out.samples}
    assert names <= set(c.metrics) and {"host_cpu_utilization_ratio", "host_load1", "host_uptime_seconds"} <= names
    ratio = by_name(c.collect().samples, "host_cpu_utilization_ratio")
    assert all(0.0 <= v <= 1.0 for v in ratio.values())


def test_malformed_units_file_is_an_error_not_a_crash(tmp_path: Path) -> None:
    units = tmp_path / "units.json"
    units.write_text('{"nvidia-fabricmanager.service": "act')
    out = host.create(_cfg(), units_source=units).collect()
    assert by_name(out.samples, "systemd_unit_active") == {}
    assert {dict(k)["state"] for k in by_name(out.samples, "systemd_unit_state_info")} == {"unknown"}
    assert any("systemd units" in e for e in out.errors)


def _script(tmp_path: Path, body: str) -> str:
    """A stand-in `systemctl` binary: the reader's argv, exit code and timeout are what is tested."""
    p = tmp_path / "systemctl"
    p.write_text("#!/bin/sh\n" + body)
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_systemctl_reader_argv_and_output(tmp_path: Path) -> None:
    argv_log = tmp_path / "argv"
    exe = _script(tmp_path, f'echo "$@" > {argv_log}\nprintf "active\\n\\nfailed\\n\\ninactive\\n"\n')
    read = host.systemctl_reader(exe, booted=lambda: True)
    assert read(UNITS) == {UNITS[0]: "active", UNITS[1]: "failed", UNITS[2]: "inactive"}
    assert argv_log.read_text().split() == ["show", "--property=ActiveState", "--value", "--", *UNITS]


def test_systemctl_reader_failure_and_timeout(tmp_path: Path) -> None:
    failing = host.systemctl_reader(_script(tmp_path, 'echo "Failed to connect to bus" >&2\nexit 1\n'),
                                    booted=lambda: True)
    with pytest.raises(RuntimeError, match="Failed to connect to bus"):
        failing(UNITS)
    (tmp_path / "slow").mkdir()
    slow = host.systemctl_reader(_script(tmp_path / "slow", "exec sleep 5\n"), timeout=0.3, booted=lambda: True)
    with pytest.raises(subprocess.TimeoutExpired):
        slow(UNITS)


def test_without_systemd_as_pid1_units_are_unknown() -> None:
    read = host.systemctl_reader("/nonexistent/systemctl", booted=lambda: False)
    assert read(UNITS) == {u: "unknown" for u in UNITS}


@pytest.mark.skipif(host.systemd_booted(), reason="this machine runs systemd as PID 1")
def test_real_mode_here_reports_unknown() -> None:
    # This CI machine has no systemd as PID 1 (no /run/systemd/system): real mode says "unknown".
    out = host.create(_cfg()).collect()
    assert by_name(out.samples, "systemd_unit_active") == {}
    assert {dict(k)["state"] for k in by_name(out.samples, "systemd_unit_state_info")} == {"unknown"}
    assert not out.errors


def test_load_matches_os() -> None:
    out = host.create(_cfg(units=())).collect()
    load1 = by_name(out.samples, "host_load1")[()]
    assert abs(load1 - os.getloadavg()[0]) < 5
