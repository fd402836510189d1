"""Real Prometheus (on loopback) scrapes `podhealth agent --simulate dgx-h100`; PromQL sees the node.

Prometheus negotiates OpenMetrics by default, so this also proves that rendering end to end.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from tests.harness.proc import free_port, http_get, need, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

NODE = "dgx01"
MOUNTS = ("/home", "/cm/shared")
AGENT_CONFIG = """
collectors:
  nvml: {interval: 1, timeout: 2}
  nvlink: {interval: 1, timeout: 2}
  infiniband: {interval: 1, timeout: 2}
  host: {interval: 1, timeout: 2}
  nfs:
    interval: 1
    timeout: 3
    mounts: [{path: /home, timeout: 1}, {path: /cm/shared, timeout: 1}]
"""


def query(prom: str, expr: str) -> list[dict[str, object]]:
    status, body = http_get(f"{prom}/api/v1/query?query={urllib.parse.quote(expr)}")
    assert status == 200, body[:500]
    doc = json.loads(body)
    assert doc["status"] == "success", doc
    return doc["data"]["result"]  # type: ignore[no-any-return]


def scalar(prom: str, expr: str) -> float | None:
    r = query(prom, expr)
    return float(r[0]["value"][1]) if len(r) == 1 else None  # type: ignore[index]


def test_prometheus_scrapes_gpu_nvlink_ib_and_nfs(tmp_path: Path) -> None:
    prometheus = need("prometheus")
    agent_port, prom_port = free_port(), free_port()
    (tmp_path / "agent.yaml").write_text(AGENT_CONFIG)
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        "  - job_name: podhealth\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{agent_port}']}}]\n")
    agent_argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100",
                  "--sim-root", str(tmp_path / "sim"), "--node", NODE, "--listen", f"127.0.0.1:{agent_port}",
                  "--config", str(tmp_path / "agent.yaml")]
    prom_argv = [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                 f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"]
    prom = f"http://127.0.0.1:{prom_port}"
    with service("agent", agent_argv, tmp_path / "logs", port=agent_port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{agent_port}/healthz")[0] == 200), \
         service("prometheus", prom_argv, tmp_path / "logs", port=prom_port,
                 ready=lambda: http_get(f"{prom}/-/ready")[0] == 200):
        checks = {
            "GPUs": (f'count(podhealth_gpu_up{{node="{NODE}"}} == 1)', 8.0),
            "GPU temperatures": ("count(podhealth_gpu_temperature_celsius)", 8.0),
            "GPUs with NVLink up": ("count(podhealth_nvlink_links_up >= 18)", 8.0),  # per-link only when down (detail: basic)
            "IB ports": ("count(podhealth_infiniband_port_state)", 9.0),  # 8 rails + mlx5_bond_0
            "IB ports active": ("count(podhealth_infiniband_port_state == 4)", 9.0),
            "NFS mounts present": ("count(podhealth_nfs_mount_present == 1)", float(len(MOUNTS))),
            "scrape up": ('up{job="podhealth"}', 1.0),
        }

        def all_there() -> bool:
            return all(scalar(prom, expr) == want for expr, want in checks.values())
        try:
            wait_until(all_there, 60, 0.5, "GPU, NVLink, IB and NFS series in Prometheus")
        except AssertionError:
            got = {k: scalar(prom, e) for k, (e, _) in checks.items()}
            raise AssertionError(f"PromQL results: {got}") from None
        mounts = {r["metric"]["mountpoint"] for r in query(prom, "podhealth_nfs_mount_present")}  # type: ignore[index]
        assert mounts == set(MOUNTS)
        # Counters arrive as counters: rate() over them works.
        wait_until(lambda: len(query(prom, "rate(podhealth_infiniband_port_data_received_bytes_total[10s])")) == 9,
                   30, 0.5, "rate() over the IB data counters")

        # A fault injected into the running node reaches PromQL.
        p = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "--root",
                            str(tmp_path / "sim"), NODE, "fault=ib-down", "device=mlx5_5"],
                           capture_output=True, text=True, timeout=30)
        assert p.returncode == 0, p.stderr
        wait_until(lambda: scalar(prom, 'podhealth_infiniband_port_state{device="mlx5_5"}') not in (None, 4.0),
                   30, 0.5, "ib-down in PromQL")
        assert scalar(prom, "count(podhealth_infiniband_port_state == 4)") == 8.0  # 8 rails + the bond, one down
