"""End to end: `podhealth agent --simulate dgx-h100` as a process, scraped like Prometheus would.

- The exposition matches tests/golden/agent_dgx_h100.prom: the same series (names + labels, and
  their types), and the same values for every series that does not move with time. Volatile
  values (host readings, traffic counters, energy, timings) are stored as NaN in the golden
  file. `PODHEALTH_UPDATE_GOLDEN=1` rewrites it from the current run.
- `promtool check metrics` on the live scrape.
- Faults injected with `podhealth simulate inject` show in the metrics; a hung NVML call and a
  hung NFS mount leave /metrics answering in under 100 ms with that collector marked stale.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.proc import Service, free_port, http_get, need, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "agent_dgx_h100.prom"
NODE = "dgx01"

# Short intervals so the test is quick. The NFS probe timeout must stay below the nfs collector's
# (config validation): a hung mount is then reported as hung (nfs_probe_ok 0), not as stale.
CONFIG = """
collectors:
  nvml: {interval: 1, timeout: 2}
  nvlink: {interval: 1, timeout: 2}
  infiniband: {interval: 1, timeout: 2}
  host: {interval: 1, timeout: 2}
  kmsg: {interval: 0.5, timeout: 2}
  nfs:
    interval: 1
    timeout: 3
    mounts:
      - {path: /home, timeout: 1}
      - {path: /cm/shared, timeout: 1}
"""

# Values that move with time (or with the machine running the test): compared by presence only.
VOLATILE = {
    "podhealth_collector_duration_seconds", "podhealth_collector_last_success_timestamp_seconds",
    "podhealth_collector_overruns_total",
    "podhealth_host_cpu_utilization_ratio", "podhealth_host_memory_used_bytes", "podhealth_host_memory_total_bytes",
    "podhealth_host_load1", "podhealth_host_load5", "podhealth_host_load15", "podhealth_host_uptime_seconds",
    "podhealth_host_disk_used_bytes", "podhealth_host_disk_total_bytes",
    "podhealth_gpu_energy_joules_total", "podhealth_nfs_probe_seconds",
    "podhealth_infiniband_port_data_received_bytes_total", "podhealth_infiniband_port_data_transmitted_bytes_total",
    "podhealth_infiniband_port_packets_received_total", "podhealth_infiniband_port_packets_transmitted_total",
    "podhealth_kmsg_lines_total",
    "podhealth_nvlink_transmitted_bytes_total", "podhealth_nvlink_received_bytes_total",
}
# Traffic counters among the IB port counters the simulator advances with time.
VOLATILE_COUNTER = re.compile(r"(packets|requests|data)$")
# NFS traffic counters advance with time too; error counters must stay put.
STABLE_NFS_COUNTER = re.compile(r"(timeouts|bad_xids|retransmissions)_total$")

Key = tuple[str, tuple[tuple[str, str], ...]]


def volatile(name: str, labels: dict[str, str]) -> bool:
    if name in VOLATILE:
        return True
    if name.startswith("podhealth_nfs_") and name.endswith("_total") and not STABLE_NFS_COUNTER.search(name):
        return True
    return name.startswith("podhealth_infiniband_port_") and bool(VOLATILE_COUNTER.search(labels.get("counter", "")))


def parse(text: str) -> dict[Key, tuple[str, float]]:
    out: dict[Key, tuple[str, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = (fam.type, s.value)
    return out


def normalise(text: str) -> str:
    """The exposition with volatile values replaced by NaN (still valid exposition format)."""
    lines = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, _value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', series))
            if volatile(name, labels):
                line = f"{series} NaN"
        lines.append(line)
    return "\n".join(lines) + "\n"


def promtool_problems(text: str) -> list[str]:
    p = subprocess.run([need("promtool"), "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    problems = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.strip()]
    assert (p.returncode == 0) == (not problems), (p.returncode, problems)
    return problems


@contextlib.contextmanager
def sim_agent(tmp_path: Path) -> Iterator[tuple[Service, Path]]:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(CONFIG)
    root = tmp_path / "sim"
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(root),
            "--node", NODE, "--listen", f"127.0.0.1:{port}", "--config", str(cfg)]
    with service("agent", argv, tmp_path / "logs", port=port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc:
        yield svc, root


def scrape(svc: Service) -> tuple[float, str]:
    t0 = time.perf_counter()
    status, body = http_get(svc.url + "/metrics")
    elapsed = time.perf_counter() - t0
    assert status == 200
    return elapsed, body.decode()


def value(text: str, name: str, **labels: str) -> list[float]:
    out = []
    for (n, lab), (_, v) in parse(text).items():
        d = dict(lab)
        if n == name and all(d.get(k) == v2 for k, v2 in labels.items()):
            out.append(v)
    return out


def all_fresh(text: str) -> bool:
    """Every enabled collector has succeeded and is fresh, and all 8 GPUs are there."""
    enabled = {dict(k[1])["collector"] for k, (_, v) in parse(text).items()
               if k[0] == "podhealth_collector_enabled" and v == 1.0}
    ok = {dict(k[1])["collector"] for k, (_, v) in parse(text).items()
          if k[0] == "podhealth_collector_success" and v == 1.0}
    fresh = {dict(k[1])["collector"] for k, (_, v) in parse(text).items()
             if k[0] == "podhealth_collector_stale" and v == 0.0}
    return bool(enabled) and enabled <= ok and enabled <= fresh and len(value(text, "podhealth_gpu_up")) == 8


def fresh_scrape(svc: Service) -> str:
    box: list[str] = []

    def ready() -> bool:
        box[:] = [scrape(svc)[1]]
        return all_fresh(box[0])
    wait_until(ready, 60, 0.2, "every collector fresh")
    return box[0]


def inject(root: Path, *tokens: str) -> None:
    p = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "--root", str(root), NODE, *tokens],
                       capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr


def test_exposition_matches_golden_and_lints(tmp_path: Path) -> None:
    with sim_agent(tmp_path) as (svc, _root):
        text = fresh_scrape(svc)
    normal = normalise(text)
    if os.environ.get("PODHEALTH_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(normal)
    golden = parse(GOLDEN.read_text())
    got = parse(normal)
    missing = sorted(set(golden) - set(got))
    extra = sorted(set(got) - set(golden))
    assert not missing and not extra, f"series differ from {GOLDEN.name}:\nmissing {missing[:20]}\nextra {extra[:20]}"
    diffs = []
    for key, (typ, v) in got.items():
        gtyp, gv = golden[key]
        if typ != gtyp:
            diffs.append((key, f"type {typ} != {gtyp}"))
        elif not (math.isnan(v) and math.isnan(gv)) and v != gv:
            diffs.append((key, f"{v} != {gv}"))
    assert not diffs, f"values differ from {GOLDEN.name} (PODHEALTH_UPDATE_GOLDEN=1 rewrites it):\n" + \
        "\n".join(f"{k}: {d}" for k, d in diffs[:30])
    assert {k[0] for k in got if k[0].startswith("podhealth_nvlink_")} and \
        len(value(text, "podhealth_infiniband_port_state")) == 9  # 8 rails + mlx5_bond_0


KNOWN_CONTRACT_LINT: set[str] = set()  # the contract is promtool-clean; keep it that way


def test_live_scrape_is_promtool_clean(tmp_path: Path) -> None:
    with sim_agent(tmp_path) as (svc, _root):
        text = fresh_scrape(svc)
    problems = set(promtool_problems(text))
    assert problems <= KNOWN_CONTRACT_LINT, sorted(problems - KNOWN_CONTRACT_LINT)


def test_injected_faults_show_in_metrics(tmp_path: Path) -> None:
    with sim_agent(tmp_path) as (svc, root):
        fresh_scrape(svc)
        inject(root, "xid=79", "gpu=3")
        inject(root, "fault=ib-down", "device=mlx5_0")
        inject(root, "fault=unit-down", "unit=nvidia-fabricmanager.service")
        inject(root, "fault=nfs-missing", "mount=/cm/shared")

        def shown() -> bool:
            t = scrape(svc)[1]
            return (sum(value(t, "podhealth_xid_events_total", gpu="3", code="79")) >= 1
                    and value(t, "podhealth_infiniband_port_state", device="mlx5_0") not in ([], [4.0])
                    and value(t, "podhealth_systemd_unit_active", unit="nvidia-fabricmanager.service") == [0.0]
                    and value(t, "podhealth_nfs_mount_present", mountpoint="/cm/shared") == [0.0])
        wait_until(shown, 30, 0.2, "the injected faults in /metrics")
        text = scrape(svc)[1]
        # The others are untouched.
        assert value(text, "podhealth_infiniband_port_state", device="mlx5_1") == [4.0]
        assert value(text, "podhealth_nfs_mount_present", mountpoint="/home") == [1.0]


def test_nvml_hang_goes_stale_and_metrics_stay_fast(tmp_path: Path) -> None:
    with sim_agent(tmp_path) as (svc, root):
        fresh_scrape(svc)
        inject(root, "fault=nvml-hang", "seconds=30")

        def stale() -> bool:
            return value(scrape(svc)[1], "podhealth_collector_stale", collector="nvml") == [1.0]
        wait_until(stale, 30, 0.2, "nvml stale")
        latencies = [scrape(svc)[0] for _ in range(20)]
        assert max(latencies) < 0.100, f"/metrics latencies while NVML hangs: {latencies}"
        text = scrape(svc)[1]
        assert value(text, "podhealth_gpu_up") == []  # stale data is not served as fresh
        # Sources that do not use NVML keep serving.
        for c in ("infiniband", "nfs", "host"):
            assert value(text, "podhealth_collector_stale", collector=c) == [0.0], c
        assert len(value(text, "podhealth_infiniband_port_state")) == 9  # 8 rails + mlx5_bond_0


def test_hung_nfs_mount_is_reported_and_metrics_stay_fast(tmp_path: Path) -> None:
    """The probe (1 s) fits inside the nfs collection (3 s): the hang is data, not staleness."""
    with sim_agent(tmp_path) as (svc, root):
        fresh_scrape(svc)
        inject(root, "fault=nfs-hung", "mount=/home")

        def hung() -> bool:
            return value(scrape(svc)[1], "podhealth_nfs_probe_ok", mountpoint="/home") == [0.0]
        wait_until(hung, 30, 0.2, "nfs_probe_ok 0 for /home")
        latencies = [scrape(svc)[0] for _ in range(20)]
        assert max(latencies) < 0.100, f"/metrics latencies with a hung mount: {latencies}"
        text = scrape(svc)[1]
        assert value(text, "podhealth_nfs_probe_ok", mountpoint="/cm/shared") == [1.0]
        assert value(text, "podhealth_collector_stale", collector="nfs") == [0.0]
        assert value(text, "podhealth_collector_stale", collector="nvml") == [0.0]
