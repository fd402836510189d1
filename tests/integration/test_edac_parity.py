"""node_exporter is the oracle for EDAC: on the same sysfs tree, its node_edac_* values must equal
podhealth's edac_mc_errors / edac_mc_noinfo_errors.

node_exporter 1.5's edac collector (collector/edac_linux.go) reads mcN/{ce,ue}_count into
node_edac_{correctable,uncorrectable}_errors_total{controller="N"} and mcN/{ce,ue}_noinfo_count
into node_edac_csrow_*_errors_total{controller="N",csrow="unknown"}. Trees: the simulated DGX H100
with an edac-ue fault, and node_exporter's own fixture when ../shared/fixtures is present.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from podhealth.collectors.edac import EdacCollector
from podhealth.sim import faults
from podhealth.sim.node import SimNode
from tests.harness.proc import free_port, http_get, need, service

pytestmark = pytest.mark.integration
SHARED = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "host_errors" / "node_exporter_edac_tree" / "sys"


def node_exporter_edac(sys_root: Path, logs: Path) -> dict[tuple[str, str, str], float]:
    binary = need("prometheus-node-exporter")
    port = free_port()
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={sys_root}",
            "--collector.disable-defaults", "--collector.edac"]
    url = f"http://127.0.0.1:{port}/metrics"
    with service("node_exporter", argv, logs, port, ready=lambda: http_get(url, timeout=2)[0] == 200):
        status, body = http_get(url)
    assert status == 200
    out: dict[tuple[str, str, str], float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            if s.name.startswith("node_edac_"):
                out[(s.name, s.labels.get("controller", ""), s.labels.get("csrow", ""))] = float(s.value)
    return out


def ours(sys_root: Path) -> dict[tuple[str, str, str], float]:
    names = {("edac_mc_errors", "ce"): ("node_edac_correctable_errors_total", ""),
             ("edac_mc_errors", "ue"): ("node_edac_uncorrectable_errors_total", ""),
             ("edac_mc_noinfo_errors", "ce"): ("node_edac_csrow_correctable_errors_total", "unknown"),
             ("edac_mc_noinfo_errors", "ue"): ("node_edac_csrow_uncorrectable_errors_total", "unknown")}
    out: dict[tuple[str, str, str], float] = {}
    for s in EdacCollector(sys_root).collect().samples:
        key = names.get((s.name, s.label("type")))
        if key:
            out[(key[0], s.label("mc").removeprefix("mc"), key[1])] = s.value
    return out


def compare(ne: dict[tuple[str, str, str], float], own: dict[tuple[str, str, str], float]) -> None:
    # node_exporter also exports per-csrow totals (csrowN/{ce,ue}_count); podhealth reads DIMMs
    # (and channels) instead: those are the one known difference.
    shared = {k: v for k, v in ne.items() if k[2] in ("", "unknown")}
    assert shared == own and own


def test_simulated_node_matches_node_exporter(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path / "sim", "dgx01", "dgx-h100")
    node.inject(faults.parse(["fault=edac-ue"], node.state.t0 + 1))
    own = ours(node.sys_root)
    assert own[("node_edac_uncorrectable_errors_total", "0", "")] == 1
    compare(node_exporter_edac(node.sys_root, tmp_path / "logs"), own)


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"real fixture not found at {SHARED} (CI has ../shared)")
def test_node_exporter_fixture_matches(tmp_path: Path) -> None:
    own = ours(SHARED)
    assert own[("node_edac_csrow_uncorrectable_errors_total", "0", "unknown")] == 6
    compare(node_exporter_edac(SHARED, tmp_path / "logs"), own)
