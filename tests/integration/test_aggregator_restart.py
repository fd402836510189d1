"""Restart safety: the aggregator is SIGKILLed between deciding to fence and finishing the fence;
on restart it completes the pending action without fencing the node a second time.

Uses the TEST-ONLY file fencer (fencing/filefence.py): its state file lives outside the
process, counts every fence it makes, and a gate file makes a fence call wait so the test can
kill the process at a known point."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.agg import post
from tests.harness.proc import free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _config(tmp: Path, port: int, gate_after: bool) -> Path:
    p = tmp / "podhealth.yaml"
    p.write_text(f"""\
aggregator:
  listen: {{address: 127.0.0.1, port: {port}}}
  db: {tmp}/agg.db
  auth: {{node_tokens: {{dgx01: n1tok}}, admin_token: atok}}
  fencers:
    file: {{enabled: true, path: {tmp}/fence.json, gate: {tmp}/gate, gate_after: {str(gate_after).lower()}}}
  nodes: [{{name: dgx01}}, {{name: dgx02}}, {{name: dgx03}}, {{name: dgx04}}]
""")
    return p


def _fence_file(tmp: Path) -> dict[str, Any]:
    try:
        return json.loads((tmp / "fence.json").read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def _node(port: int) -> dict[str, Any]:
    status, body = http_get(f"http://127.0.0.1:{port}/api/v1/nodes/dgx01", timeout=2)
    assert status == 200
    return json.loads(body)  # type: ignore[no-any-return]


@pytest.mark.parametrize("gate_after", [False, True], ids=["killed-before-the-fence", "killed-after-the-fence"])
def test_sigkill_between_decide_and_fence_never_fences_twice(tmp_path: Path, gate_after: bool) -> None:
    port = free_port()
    cfg = _config(tmp_path, port, gate_after)
    argv = [sys.executable, "-m", "podhealth", "aggregator", "--config", str(cfg)]
    ready = lambda: http_get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] == 200  # noqa: E731
    gate = tmp_path / "gate"
    gate.touch()
    report = {"node": "dgx01", "time": 1000.0, "results": [
        {"check": "xid", "entity": "GPU4", "status": "FAIL", "action": "RESET_GPU", "since": 995.0}]}

    with service("aggregator-1", argv, tmp_path / "logs", port, ready=ready) as first:
        assert post(f"http://127.0.0.1:{port}/v1/reports", report, "n1tok")[0] == 200
        # the fence is recorded as pending and the fencer has been called: now it waits on the gate
        wait_until(lambda: _fence_file(tmp_path).get("calls", {}).get("dgx01") == 1, what="the fence call")
        wait_until(lambda: _node(port)["pending_actions"], what="a pending action")
        assert _node(port)["fence"] == "fencing"
        os.killpg(first.proc.pid, signal.SIGKILL)
        first.proc.wait(10)
    fences_at_kill = _fence_file(tmp_path).get("fences", {}).get("dgx01", 0)
    assert fences_at_kill == (1 if gate_after else 0)
    gate.unlink()

    with service("aggregator-2", argv, tmp_path / "logs", port, ready=ready):
        wait_until(lambda: _node(port)["fence"] == "fenced" and not _node(port)["pending_actions"],
                   what="the pending fence to complete")
        state = _fence_file(tmp_path)
        assert state["fences"]["dgx01"] == 1  # fenced once, never twice
        assert state["calls"]["dgx01"] == (1 if gate_after else 2)  # after the fact, only a read
        assert state["nodes"]["dgx01"]["reason"].startswith("podhealth: xid GPU4 RESET_GPU [")
        status, body = http_get(f"http://127.0.0.1:{port}/api/v1/nodes/dgx01/history")
        audit = [i for i in json.loads(body)["items"] if i["type"] == "audit"]
        whats = [i["what"] for i in audit]
        assert whats.count("fence requested") == 1 and whats.count("fence done") == 1
        # the same failure reported again after the restart changes nothing
        runs = _decisions(port)
        report["time"] = 2000.0
        assert post(f"http://127.0.0.1:{port}/v1/reports", report, "n1tok")[0] == 200
        wait_until(lambda: _decisions(port) >= runs + 3, what="the policy to run again")
        assert _fence_file(tmp_path)["fences"]["dgx01"] == 1


def _decisions(port: int) -> float:
    _, body = http_get(f"http://127.0.0.1:{port}/metrics")
    for line in body.decode().splitlines():
        if line.startswith("podhealth_aggregator_decisions_total "):
            return float(line.split()[1])
    return 0.0
