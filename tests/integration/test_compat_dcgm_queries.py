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
from tests.harness.proc import free_port, http_get, need, service, wait_until
from tests.integration.test_agent_e2e import NODE, fresh_scrape, parse
from tests.integration.test_prometheus_scrape import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
QUERIES = REPO / "tests" / "fixtures" / "compat" / "dcgm_exporter_queries.yaml"
NAME = re.compile(r"\bDCGM_FI_[A-Z0-9_]+")


def used_names() -> tuple[set[str], set[str]]:
    doc = yaml.safe_load(QUERIES.read_text())
    exprs = doc["dashboard_12239"]["variables"] + doc["dashboard_12239"]["panels"] + doc["alerts"]
    names = {n for e in exprs for n in NAME.findall(e)}
    return names, set(doc["needs_dcgm"])


LABEL_VALUES = re.compile(r"^label_values\((.+),\s*(\w+)\)$")


def promql(expr: str) -> str:
    """A dashboard query as Grafana sends it: every variable at All, label_values() as a query."""
    expr = expr.replace("$Hostname", ".*").replace("$gpu", ".*")
    m = LABEL_VALUES.match(expr)
    return f"count by ({m.group(2)}) ({m.group(1)})" if m else expr


def test_every_queried_dcgm_metric_is_exported_in_compat_mode(tmp_path: Path) -> None:
    names, needs_dcgm = used_names()
    assert len(names) >= 20 and needs_dcgm < names
    assert names <= set(compat_dcgm.METRICS), sorted(names - set(compat_dcgm.METRICS))
    prometheus = need("prometheus")
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("collectors:\n  nvml: {interval: 1, timeout: 2}\n  nvlink: {interval: 1, timeout: 2}\n"
                   "  kmsg: {interval: 0.5, timeout: 2}\nexporters:\n  compat: [dcgm-exporter]\n")
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(tmp_path / "sim"),
            "--node", NODE, "--listen", f"127.0.0.1:{port}", "--config", str(cfg)]
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s}\nscrape_configs:\n  - job_name: dcgm\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
    prom = f"http://127.0.0.1:{prom_port}"
    prom_argv = [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{prom_port}"]
    doc = yaml.safe_load(QUERIES.read_text())
    panels = doc["dashboard_12239"]["variables"] + doc["dashboard_12239"]["panels"]
    with service("agent", argv, tmp_path / "logs", port=port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc, \
         service("prometheus", prom_argv, tmp_path / "logs", port=prom_port,
                 ready=lambda: http_get(f"{prom}/-/ready")[0] == 200):
        text = fresh_scrape(svc)
        # Every panel of dashboard 12239 that needs no DCGM shows data; every alert evaluates.
        wanted = [promql(e) for e in panels if not set(NAME.findall(e)) & needs_dcgm]
        wait_until(lambda: all(query(prom, e) for e in wanted), 60, 0.5, "every dashboard 12239 panel with data")
        hosts = {r["metric"]["Hostname"] for r in query(prom, promql(panels[0]))}  # type: ignore[index]
        assert hosts == {NODE}
        assert len(query(prom, promql(panels[1]))) == 8  # the gpu variable lists all eight
        for expr in doc["alerts"]:
            query(prom, expr)  # parses and evaluates (an alert that does not fire is empty)
        # The idle simulated GPUs: no XID, nothing throttled but idle, so those alerts stay quiet.
        assert query(prom, "DCGM_FI_DEV_XID_ERRORS > 0") == []
        assert len(query(prom, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS == 1")) == 8  # gpu_idle only
    # dcgm-exporter types these counters `counter` without a `_total` suffix; prometheus_client's
    # parser then names the samples `..._total`, which Prometheus itself does not: use the
    # exposition's own names.
    raw = {line.split("{", 1)[0].split(" ", 1)[0] for line in text.splitlines() if line and line[0] != "#"}
    series = {(n if n in raw else n.removesuffix("_total"), labels) for n, labels in parse(text)}
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
