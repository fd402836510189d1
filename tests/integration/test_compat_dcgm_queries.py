"""`exporters.compat: [dcgm-exporter]` (config, not only the CLI flag): a simulated agent exports
every metric that dcgm-exporter's Grafana dashboard (id 12239) and the usual GPU Operator alert
expressions query (tests/fixtures/compat/dcgm_exporter_queries.yaml), with dcgm-exporter's labels.
The DCGM profiling fields need DCGM, which the simulator has not: they are asserted absent there
and mapped (tests/unit/test_compat_dcgm.py checks their values from a dcgm sample)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

from podhealth.collectors import compat_dcgm
from tests.harness.proc import free_port, http_get, service
from tests.integration.test_agent_e2e import NODE, fresh_scrape, parse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
QUERIES = REPO / "tests" / "fixtures" / "compat" / "dcgm_exporter_queries.yaml"
NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]+")


def used_names() -> tuple[set[str], set[str]]:
    doc = yaml.safe_load(QUERIES.read_text())
    exprs = doc["dashboard_12239"]["variables"] + doc["dashboard_12239"]["panels"] + doc["alerts"]
    names = {n for e in exprs for n in NAME.findall(e)}
    return names, set(doc["needs_dcgm"])


def test_every_queried_dcgm_metric_is_exported_in_compat_mode(tmp_path: Path) -> None:
    names, needs_dcgm = used_names()
    assert len(names) >= 20 and needs_dcgm < names
    assert names <= set(compat_dcgm.METRICS), sorted(names - set(compat_dcgm.METRICS))
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("collectors:\n  nvml: {interval: 1, timeout: 2}\n  nvlink: {interval: 1, timeout: 2}\n"
                   "  kmsg: {interval: 0.5, timeout: 2}\nexporters:\n  compat: [dcgm-exporter]\n")
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(tmp_path / "sim"),
            "--node", NODE, "--listen", f"127.0.0.1:{port}", "--config", str(cfg)]
    with service("agent", argv, tmp_path / "logs", port=port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc:
        text = fresh_scrape(svc)
    series = parse(text)
    exported = {name for name, _ in series}
    missing = sorted(names - needs_dcgm - exported)
    assert not missing, f"queried by the dashboard / alerts but not exported: {missing}"
    assert not needs_dcgm & exported  # no DCGM on the simulator: omitted, never faked
    for name in names - needs_dcgm:
        gpus = [dict(labels) for n, labels in series if n == name]
        assert sorted(int(g["gpu"]) for g in gpus) == list(range(8)), name
        for g in gpus:
            assert g["Hostname"] == NODE and g["UUID"].startswith("GPU-") and g["device"] == f"nvidia{g['gpu']}"
            assert g["modelName"] == "NVIDIA H100 80GB HBM3"
