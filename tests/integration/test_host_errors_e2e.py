"""End to end: a simulated DGX H100 agent as a process; host-error faults injected with
`podhealth simulate inject` reach /metrics, the node verdict, and the BCM health check.

- fault=pcie-aer-fatal gpu=1 -> pcie_aer_fatal gpu1 FAIL (DRAIN), `podhealth-bcm-healthcheck` FAIL;
- fault=edac-ue -> edac_ue mc0 FAIL naming the DIMM, and kernel_ras FAIL from the kernel line;
- fault=nvme-critical -> nvme nvme0 FAIL;
- before any fault the BCM answer is PASS (the simulated node is healthy).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
NODE = "dgx01"
CONFIG = """
node: {{name: dgx01}}  # the BCM check asks this node's agent, and proves its answer with dgx01's key
listen: {{port: {port}}}
collectors:
  nvml: {{interval: 1, timeout: 2}}
  nvlink: {{interval: 1, timeout: 2}}
  infiniband: {{interval: 1, timeout: 2}}
  host: {{interval: 1, timeout: 2}}
  kmsg: {{interval: 0.5, timeout: 2}}
  pcie_aer: {{interval: 1, timeout: 2}}
  edac: {{interval: 1, timeout: 2}}
  nvme: {{interval: 1, timeout: 2}}
  nfs:
    interval: 1
    timeout: 3
    mounts:
      - {{path: /home, timeout: 1}}
checks:
  grace: 0
"""


def health(svc: Service) -> dict[str, Any]:
    status, body = http_get(svc.url + "/health")
    assert status in (200, 503), status
    return json.loads(body)  # type: ignore[no-any-return]


def result(rep: dict[str, Any], check: str, entity: str) -> dict[str, Any] | None:
    for r in rep["results"]:
        if r["check"] == check and r["entity"] == entity:
            return r  # type: ignore[no-any-return]
    return None


def bcm(cfg: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "check", "--format", "bcm", "--config", str(cfg),
                           "--info-fd", "stderr"], capture_output=True, text=True, timeout=30)


def test_host_error_faults_reach_verdict_and_bcm(tmp_path: Path) -> None:
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(CONFIG.format(port=port))
    root = tmp_path / "sim"
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(root),
            "--node", NODE, "--listen", f"127.0.0.1:{port}", "--config", str(cfg)]
    with service("agent", argv, tmp_path / "logs", port=port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc:
        def settled_ok() -> bool:
            rep = health(svc)
            r = result(rep, "pcie_aer_fatal", "node")
            return r is not None and r["status"] == "OK" and rep["status"] in ("OK", "WARN")
        wait_until(settled_ok, 60, 0.3, "healthy host-error verdicts")
        ok = bcm(cfg)
        assert ok.stdout == "PASS\n", ok.stderr

        for tokens in (["fault=pcie-aer-fatal", "gpu=1"], ["fault=edac-ue"], ["fault=nvme-critical"]):
            p = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "--root", str(root), NODE,
                                *tokens], capture_output=True, text=True, timeout=30)
            assert p.returncode == 0, p.stderr

        def all_failed() -> bool:
            rep = health(svc)
            want = [("pcie_aer_fatal", "gpu1"), ("kernel_aer", "gpu1"), ("edac_ue", "mc0"), ("kernel_ras", "node"),
                    ("nvme", "nvme0")]
            return all((r := result(rep, c, e)) is not None and r["status"] == "FAIL" for c, e in want)
        wait_until(all_failed, 60, 0.3, "every host-error fault judged FAIL")
        rep = health(svc)
        aer = result(rep, "pcie_aer_fatal", "gpu1")
        assert aer is not None and aer["action"] == "DRAIN" and aer["evidence"]["errors"] == "CmpltTO=1 SDES=1"
        ue = result(rep, "edac_ue", "mc0")
        assert ue is not None and "CPU_SrcID#0_MC#0_Chan#1_DIMM#0=1" in ue["evidence"]["dimms"]
        status, body = http_get(svc.url + "/metrics")
        text = body.decode()
        assert 'podhealth_pcie_aer_errors_total{' in text and 'podhealth_nvme_critical_warning{controller="nvme0",node="dgx01"} 4.0' in text
        failed = bcm(cfg)
        assert failed.stdout == "FAIL\n"
        assert "pcie_aer_fatal gpu1" in failed.stderr and "[DRAIN]" in failed.stderr
