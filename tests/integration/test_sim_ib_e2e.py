"""The simulator's InfiniBand faults end to end: `podhealth agent --simulate dgx-h100` (the real
DGX topology: 8 NDR rails + the bonded RoCE storage pair `mlx5_bond_0`) judges a link flap and
a saturated error counter injected with `podhealth simulate inject`, and a healthy node of each
documented storage build is OK."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONFIG = """
checks:
  damping: {fail_after: 1, recover_after: 1}
  rate_window: 20
  overrides: {network.flap_count: 3, network.flap_window_s: 600, network.down_max_s: 600}
collectors:
  nvml: {interval: 1, timeout: 2}
  nvlink: {interval: 1, timeout: 2}
  infiniband: {interval: 0.5, timeout: 2}
  host: {interval: 1, timeout: 2}
  kmsg: {interval: 1, timeout: 2}
  nfs:
    interval: 1
    timeout: 3
    mounts:
      - {path: /home, timeout: 1}
"""


def _podhealth(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", *args], capture_output=True, text=True, timeout=60)


def _health(port: int) -> dict[tuple[str, str], dict[str, Any]]:
    code, body = http_get(f"http://127.0.0.1:{port}/health")
    assert code == 200
    return {(r["check"], r["entity"]): r for r in json.loads(body)["results"]}


def _ib_ok(port: int) -> bool:
    try:
        h = _health(port)
    except (OSError, AssertionError, ValueError):
        return False
    ib = {k: r for k, r in h.items() if k[0].startswith("ib_")}
    return bool(ib) and all(r["status"] == "OK" for r in ib.values())


@pytest.fixture
def agent(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Service]:
    storage = getattr(request, "param", None)
    root = tmp_path / "sim"
    if storage is not None:
        r = _podhealth("simulate", "node", "dgx01", "--storage", storage, "--root", str(root))
        assert r.returncode == 0, r.stderr
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(root), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"],
                 tmp_path, port=port, ready=lambda: _ib_ok(port), ready_timeout=90) as svc:
        svc.extra["root"] = root
        yield svc


def _inject(svc: Service, *tokens: str) -> None:
    r = _podhealth("simulate", "inject", "dgx01", *tokens, "--root", str(svc.extra["root"]))
    assert r.returncode == 0, r.stderr


def _wait_for(svc: Service, key: tuple[str, str], status: str, timeout: float = 60) -> dict[str, Any]:
    def got() -> dict[str, Any] | None:
        r = _health(svc.port).get(key)
        return r if r is not None and r["status"] == status else None
    try:
        return wait_until(got, timeout, 0.25, f"{key} {status}")  # type: ignore[return-value]
    except AssertionError:
        raise AssertionError(f"wanted {key} {status}, got {_health(svc.port).get(key)}") from None


@pytest.mark.parametrize("agent", [None, "ethernet", "ib"], indirect=True, ids=["bond", "ethernet", "ib"])
def test_every_storage_build_is_healthy(agent: Service) -> None:
    h = _health(agent.port)
    bad = {k: (r["status"], r["summary"]) for k, r in h.items() if k[0].startswith("ib_") and r["status"] != "OK"}
    assert bad == {}
    ports = {k[1] for k in h if k[0] == "ib_port"}
    assert {"mlx5_0/1", "mlx5_9/1"} <= ports


def test_link_flap_drains_and_saturated_counter_warns(agent: Service) -> None:
    _inject(agent, "fault=ib-flap", "device=mlx5_4", "count=3", "period=4")
    _inject(agent, "fault=ib-counter-saturated", "device=mlx5_6", "counter=symbol_error")
    flap = _wait_for(agent, ("ib_flap", "mlx5_4/1"), "FAIL")
    assert flap["action"] == "DRAIN" and "FLAPPING" in flap["summary"]
    sat = _wait_for(agent, ("ib_errors", "mlx5_6/1"), "WARN")
    assert "symbol_error" in sat["summary"] and "symbol_error" in sat["evidence"]["saturated"]
    h = _health(agent.port)
    assert h[("ib_port", "mlx5_6/1")]["status"] == "OK"  # the port itself still works
    assert h[("ib_flap", "mlx5_5/1")]["status"] == "OK"
