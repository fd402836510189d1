"""Boot grace end to end: `podhealth agent --simulate dgx-h100` on a node that has just rebooted
(`fault=reboot` writes the simulated <proc>/stat btime) holds a non-fatal FAIL as WARN, while a GPU
that fell off the bus (XID 79, NVML GPU_IS_LOST) still fails at once; when the grace ends the held
FAIL shows."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from typing import Any, Iterator

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

GRACE = 30
CONFIG = f"""
checks:
  damping: {{fail_after: 2, recover_after: 2}}
  grace: {GRACE}
  rate_window: 20
collectors:
  nvml: {{interval: 1, timeout: 2}}
  nvlink: {{interval: 1, timeout: 2}}
  infiniband: {{interval: 1, timeout: 2}}
  host: {{interval: 1, timeout: 2}}
  kmsg: {{interval: 0.5, timeout: 2}}
  nfs:
    interval: 1
    timeout: 3
    mounts:
      - {{path: /home, timeout: 1}}
      - {{path: /cm/shared, timeout: 1}}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("grace")
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"],
                 tmp, port=port, ready=lambda: _status(port) == "OK", ready_timeout=60) as svc:
        svc.extra["root"] = tmp / "sim"
        yield svc


def _status(port: int) -> str:
    code, body = http_get(f"http://127.0.0.1:{port}/health")
    return str(json.loads(body)["status"]) if code == 200 else ""


def _health(svc: Service) -> dict[tuple[str, str], dict[str, Any]]:
    code, body = http_get(f"{svc.url}/health")
    assert code == 200
    return {(r["check"], r["entity"]): r for r in json.loads(body)["results"]}


def _sim(svc: Service, verb: str, *tokens: str) -> None:
    r = subprocess.run([sys.executable, "-m", "podhealth", "simulate", verb, "dgx01", *tokens,
                        "--root", str(svc.extra["root"])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def _wait(svc: Service, want: dict[tuple[str, str], tuple[str, str]], timeout: float) -> dict[tuple[str, str], dict[str, Any]]:
    def ok() -> dict[tuple[str, str], dict[str, Any]] | None:
        h = _health(svc)
        good = all(k in h and (h[k]["status"], h[k]["action"]) == v for k, v in want.items())
        return h if good else None
    try:
        return wait_until(ok, timeout, 0.25, f"/health to show {want}")  # type: ignore[return-value]
    except AssertionError:
        h = _health(svc)
        raise AssertionError(f"wanted {want}\ngot {({k: (h[k]['status'], h[k]['action']) if k in h else None for k in want})}") from None


def test_recent_boot_holds_non_fatal_fail_while_xid79_fences_at_once(agent: Service) -> None:
    rebooted = time.time()
    _sim(agent, "inject", "fault=reboot")
    _sim(agent, "inject", "fault=nvlink-down", "gpu=0", "link=5")
    h = _wait(agent, {("nvlink", "gpu0"): ("WARN", "NONE")}, timeout=GRACE - 8)
    ev = h[("nvlink", "gpu0")]["evidence"]
    assert ev["grace"].startswith("in boot grace until") and ev["held"] == "FAIL REBOOT", ev

    _sim(agent, "inject", "fault=fallen-off-bus", "gpu=3")
    h = _wait(agent, {("xid", "gpu3"): ("FAIL", "REBOOT"), ("gpu_lost", "gpu3"): ("FAIL", "REBOOT")}, timeout=10)
    assert time.time() < rebooted + GRACE, "the fatal fence had to come inside the grace for this test to mean anything"
    assert h[("nvlink", "gpu0")]["status"] == "WARN"        # still held: only fatal facts skip the grace
    assert "grace" not in h[("xid", "gpu3")]["evidence"]
    rep = json.loads(http_get(f"{agent.url}/health")[1])
    assert rep["status"] == "FAIL" and rep["action"] == "REBOOT"

    # The grace ends: the held condition, still there, shows as the FAIL it is.
    h = _wait(agent, {("nvlink", "gpu0"): ("FAIL", "REBOOT")}, timeout=GRACE + 20)
    assert time.time() >= rebooted + GRACE
    assert "grace" not in h[("nvlink", "gpu0")]["evidence"]
    _sim(agent, "clear")
