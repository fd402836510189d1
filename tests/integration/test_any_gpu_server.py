"""Any GPU server, not only the four DGX (issue 28 section 1): for EVERY nvidia-smi capture of a
node in ../shared/fixtures (-q, -q -x and the summary table), `podhealth simulate node
--from-nvidia-smi X` picks the profile of what the node is, and `podhealth agent --simulate
<that profile>` runs on it and judges it with no FAIL but the capture's own fault. Captures that
describe no node (`nvlink -e`, `topo -m`, a `--query-gpu` CSV) are refused with exit 64 and a
clear message, changing nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_FIXTURES
from tests.harness.proc import free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CONFIG = """
collectors:
  nvml: {interval: 1, timeout: 5}
  nvlink: {interval: 1, timeout: 5}
  infiniband: {interval: 2, timeout: 5}
  host: {interval: 2, timeout: 5}
  kmsg: {interval: 1, timeout: 5}
  nfs:
    interval: 2
    timeout: 4
    mounts:
      - {path: /home, timeout: 2}
      - {path: /cm/shared, timeout: 2}
checks:
  grace: 0
  damping: {fail_after: 1, recover_after: 1}
"""

CAPTURES = sorted(p.name for p in (SHARED_FIXTURES / "nvidia_smi").glob("nvidia-smi*")
                  if not p.name.endswith(".source.txt")) if (SHARED_FIXTURES / "nvidia_smi").is_dir() else []
# What the node really was, where it was not healthy (INDEX.md and each .source.txt)
FAULTS = {"nvidia-smi-q_a100_remapped_rows_pending_excerpt_stas00.txt": {("row_remap", "gpu0")}}
# Outputs that describe no node's GPUs: nothing to seed a node from
NOT_A_NODE = re.compile(r"nvlink|topo-m|query_gpu")


def _podhealth(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not CAPTURES, reason=f"real-capture corpus not found at {SHARED_FIXTURES}")
@pytest.mark.parametrize("capture", CAPTURES)
def test_simulate_node_from_capture_then_agent(capture: str, tmp_path: Path) -> None:
    path = SHARED_FIXTURES / "nvidia_smi" / capture
    root = tmp_path / "sim"
    made = _podhealth("simulate", "node", "cap01", "--root", str(root), "--from-nvidia-smi", str(path))
    if NOT_A_NODE.search(capture):
        assert made.returncode == 64, made
        assert "not a node's nvidia-smi capture" in made.stderr and made.stdout == ""
        assert not (root / "cap01").exists()
        return
    assert made.returncode == 0, made.stderr
    m = re.search(r"created cap01 \((?P<profile>[\w-]+), (?P<gpus>\d+) GPUs", made.stdout)
    assert m, made.stdout
    profile, gpus = m.group("profile"), int(m.group("gpus"))
    (tmp_path / "agent.yaml").write_text(CONFIG)
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", profile, "--sim-root", str(root),
            "--node", "cap01", "--listen", f"127.0.0.1:{port}", "--config", str(tmp_path / "agent.yaml")]
    with service("agent", argv, tmp_path / "logs", port=port, ready_timeout=60,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200):
        def judged() -> dict[str, object] | None:
            status, body = http_get(f"http://127.0.0.1:{port}/health")
            if status not in (200, 503):
                return None
            h = json.loads(body)
            res = h.get("results", [])
            # every GPU judged from a fresh NVML reading, and the node's mounts and units read
            temps = [r for r in res if r["check"] == "temperature" and r["status"] != "UNKNOWN"]
            return h if len(temps) == gpus and any(r["check"] == "nfs_mount" for r in res) else None

        health = wait_until(judged, 60, 0.25, f"{capture}: every GPU judged")
    assert isinstance(health, dict) and health["profile"] == profile
    fails = {(r["check"], r["entity"]) for r in health["results"] if r["status"] == "FAIL"}  # type: ignore[index]
    assert fails == FAULTS.get(capture, set()), (capture, profile, fails)
