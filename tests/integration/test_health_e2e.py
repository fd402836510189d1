"""Verdicts end to end: faults injected into `podhealth agent --simulate dgx-h100` show on /health
with the right check, entity and action within one interval plus damping, and clear again.

Also `podhealth check --url/--node` against the running agent (table, json, junit; exit codes
0/1/2; a wrong token is a clear error) and `--slurm-health`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TOKEN = "s3cret-handover-token"
CONFIG = """
auth: {token: %s}
checks:
  damping: {fail_after: 2, recover_after: 2}
  rate_window: 20
  required_units: [nvidia-fabricmanager.service]
  # a port down longer than this drains (the shipped 240 s waits out a retrain or an SM sweep),
  # and a down/up cycle is a flap WARN for this long (shipped: 12 h) before all is OK again
  overrides: {network.down_max_s: 2, network.flap_window_s: 5}
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
""" % TOKEN


def _podhealth(*args: str, timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", *args], capture_output=True, text=True,
                          timeout=timeout, **kw)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("health")
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"],
                 tmp, port=port, ready=lambda: _health_ok(port), ready_timeout=60) as svc:
        svc.extra["root"] = tmp / "sim"
        yield svc


def _health_ok(port: int) -> bool:
    code, body = http_get(f"http://127.0.0.1:{port}/health")
    return code == 200 and json.loads(body)["status"] == "OK"


def health(svc: Service) -> dict[tuple[str, str], dict[str, Any]]:
    code, body = http_get(f"{svc.url}/health")
    assert code == 200
    return {(r["check"], r["entity"]): r for r in json.loads(body)["results"]}


def inject(svc: Service, *tokens: str) -> None:
    r = _podhealth("simulate", "inject", "dgx01", *tokens, "--root", str(svc.extra["root"]))
    assert r.returncode == 0, r.stderr


def clear(svc: Service) -> None:
    r = _podhealth("simulate", "clear", "dgx01", "--root", str(svc.extra["root"]))
    assert r.returncode == 0, r.stderr


def expect(svc: Service, want: dict[tuple[str, str], tuple[str, str]], timeout: float = 30) -> dict[tuple[str, str], dict[str, Any]]:
    def ok() -> dict[tuple[str, str], dict[str, Any]] | None:
        h = health(svc)
        for key, (status, action) in want.items():
            r = h.get(key)
            if r is None or r["status"] != status or (action and r["action"] != action):
                return None
        return h
    try:
        return wait_until(ok, timeout, 0.25, f"/health to show {want}")  # type: ignore[return-value]
    except AssertionError:
        h = health(svc)
        got = {k: (h[k]["status"], h[k]["action"]) if k in h else None for k in want}
        raise AssertionError(f"wanted {want}\ngot {got}") from None


def all_ok(svc: Service, timeout: float = 40) -> None:
    def ok() -> bool:
        return all(r["status"] == "OK" for r in health(svc).values())
    try:
        wait_until(ok, timeout, 0.25, "every check back to OK")
    except AssertionError:
        bad = {k: (r["status"], r["summary"]) for k, r in health(svc).items() if r["status"] != "OK"}
        raise AssertionError(f"not recovered: {bad}") from None


def test_healthy_node_passes_handover(agent: Service) -> None:
    r = _podhealth("check", "--url", agent.url, "--token", TOKEN)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dgx01: PASS" in r.stdout
    assert "gpu0 … gpu7 (8)" in r.stdout


def test_hardware_faults_each_named_with_entity_and_action(agent: Service) -> None:
    inject(agent, "fault=dbe", "gpu=1")
    inject(agent, "fault=row-remap-pending", "gpu=2")
    inject(agent, "fault=pcie-degraded", "gpu=4", "width=8", "gen=4")
    inject(agent, "fault=thermal", "gpu=6")
    inject(agent, "fault=nvlink-down", "gpu=0", "link=5")
    inject(agent, "fault=fabric-incomplete", "gpu=5")
    inject(agent, "fault=persistence-off", "gpu=7")
    inject(agent, "fault=ib-down", "device=mlx5_5")
    inject(agent, "fault=nfs-missing", "mount=/home")
    inject(agent, "fault=unit-down", "unit=nvidia-fabricmanager.service")
    h = expect(agent, {
        ("ecc", "gpu1"): ("FAIL", "RESET_GPU"),
        ("row_remap", "gpu2"): ("FAIL", "RESET_GPU"),
        ("pcie", "gpu4"): ("FAIL", "DRAIN"),
        ("clocks", "node"): ("FAIL", "DRAIN"),       # one node-level finding naming GPU 6
        ("temperature", "gpu6"): ("FAIL", "DRAIN"),
        ("nvlink", "gpu0"): ("FAIL", "REBOOT"),
        ("fabric", "gpu5"): ("FAIL", "REBOOT"),
        ("persistence", "gpu7"): ("WARN", "NONE"),
        ("ib_port", "mlx5_5/1"): ("FAIL", "DRAIN"),
        ("nfs_mount", "/home"): ("FAIL", "DRAIN"),
        ("systemd_unit", "nvidia-fabricmanager.service"): ("FAIL", "REBOOT"),
    })
    assert "x8" in h[("pcie", "gpu4")]["summary"] and h[("nvlink", "gpu0")]["evidence"]["down"] == "5"
    assert h[("clocks", "node")]["evidence"]["gpus"] == "6"
    # Nothing else on the node was blamed: the other GPUs and ports stay OK.
    assert h[("ecc", "gpu0")]["status"] == "OK" and h[("ib_port", "mlx5_bond_0/1")]["status"] == "OK"
    rep = json.loads(http_get(f"{agent.url}/health")[1])
    assert rep["status"] == "FAIL" and rep["action"] == "REBOOT"
    code, metrics = http_get(f"{agent.url}/metrics")
    assert b'podhealth_check_status{action="RESET_GPU",check="ecc",entity="gpu1",node="dgx01"} 2' in metrics
    assert b'podhealth_node_health{action="REBOOT",node="dgx01"} 2' in metrics
    clear(agent)
    all_ok(agent)


def test_degradations_warn_and_hangs(agent: Service) -> None:
    inject(agent, "fault=row-remap-failure", "gpu=2")
    inject(agent, "fault=power-brake", "gpu=6")
    inject(agent, "fault=ib-rate", "device=mlx5_4", "rate=200")
    inject(agent, "fault=ib-symbol-errors", "device=mlx5_6", "rate=20")
    inject(agent, "fault=nvlink-crc", "gpu=0", "link=2", "rate=50")
    inject(agent, "fault=nfs-hung", "mount=/cm/shared")
    h = expect(agent, {
        ("row_remap", "gpu2"): ("FAIL", "REPLACE"),
        ("clocks", "node"): ("WARN", "NONE"),        # power brake: PSU/BMC/rack power, not a drain
        ("ib_port", "mlx5_4/1"): ("FAIL", "DRAIN"),
        ("ib_errors", "mlx5_6/1"): ("WARN", "NONE"),
        ("nvlink", "gpu0"): ("WARN", "NONE"),
        ("nfs_mount", "/cm/shared"): ("FAIL", "DRAIN"),
    })
    assert "hung" in h[("nfs_mount", "/cm/shared")]["summary"]
    assert h[("clocks", "node")]["evidence"]["hw_power_brake_slowdown"] == "6"
    assert "symbol_error" in h[("ib_errors", "mlx5_6/1")]["evidence"]["counters"]
    clear(agent)
    all_ok(agent)


def test_hung_nvml_makes_gpu_checks_unknown_not_ok(agent: Service) -> None:
    inject(agent, "fault=nvml-hang", "seconds=8")
    h = expect(agent, {("gpu_count", "node"): ("UNKNOWN", "NONE"), ("ecc", "node"): ("UNKNOWN", "NONE")})
    assert "nvml" in h[("ecc", "node")]["summary"]
    r = _podhealth("check", "--url", agent.url, "--token", TOKEN, "--format", "json", timeout=90)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr  # could not decide
    clear(agent)
    all_ok(agent, timeout=60)


def test_xid_fails_then_ages_out(agent: Service) -> None:
    t0 = time.time()
    inject(agent, "xid=79", "gpu=3")
    h = expect(agent, {("xid", "gpu3"): ("FAIL", "REBOOT")}, timeout=20)
    assert "79" in h[("xid", "gpu3")]["summary"]
    # The kernel record's own timestamp (simulated boot + usec) dates the failure, not a later read.
    assert t0 - 1 <= h[("xid", "gpu3")]["since"] <= time.time()
    clear(agent)
    all_ok(agent, timeout=60)  # the 20 s window passes, the XID ages out


def test_check_outputs_and_exit_codes(agent: Service, tmp_path: Path) -> None:
    inject(agent, "fault=dbe", "gpu=1")
    expect(agent, {("ecc", "gpu1"): ("FAIL", "RESET_GPU")})
    r = _podhealth("check", "--url", agent.url, "--token", TOKEN)
    assert r.returncode == 1 and "FAIL" in r.stdout and "RESET_GPU" in r.stdout and "ecc" in r.stdout
    j = _podhealth("check", "--url", agent.url, "--token", TOKEN, "--format", "json")
    rep = json.loads(j.stdout)
    assert j.returncode == 1 and rep["status"] == "FAIL" and rep["exit_code"] == 1
    assert any(x["check"] == "ecc" and x["entity"] == "gpu1" and x["status"] == "FAIL" for x in rep["results"])
    x = _podhealth("check", "--url", agent.url, "--token", TOKEN, "--format", "junit")
    suite = ET.fromstring(x.stdout)
    assert x.returncode == 1 and int(suite.get("failures", "0")) >= 1
    assert any(c.get("classname") == "dgx01.ecc" and c.get("name") == "gpu1" and c.find("failure") is not None
               for c in suite.iter("testcase"))
    # --node resolves through config (checks.agents) like an operator's site config would.
    site = tmp_path / "site.yaml"
    site.write_text(f"checks:\n  agents: {{dgx01: '{agent.url}'}}\n")
    n = _podhealth("check", "--node", "dgx01", "--config", str(site), "--token", TOKEN, "--format", "json")
    assert n.returncode == 1 and json.loads(n.stdout)["node"] == "dgx01"
    bad = _podhealth("check", "--node", "dgx01", "--config", str(site), "--token", "wrong")
    assert bad.returncode == 2 and "HTTP 401" in bad.stderr and "token derive --agent" in bad.stderr
    gone = _podhealth("check", "--url", f"http://127.0.0.1:{free_port()}", "--token", TOKEN)
    assert gone.returncode == 2 and "cannot reach the agent" in gone.stderr
    clear(agent)
    all_ok(agent)
    ok = _podhealth("check", "--url", agent.url, "--token", TOKEN, "--format", "json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["status"] in ("OK", "WARN")


def test_slurm_health_mode_reads_the_local_agent(agent: Service, tmp_path: Path) -> None:
    cfg = tmp_path / "local.yaml"
    # the node's own config: its name and its agent key, with which the agent proves its answers
    cfg.write_text(f"node: {{name: dgx01}}\nlisten: {{port: {agent.port}}}\nauth: {{token: {TOKEN}}}\n")
    ok = _podhealth("check", "--slurm-health", "--config", str(cfg), timeout=20)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: podhealth:"), ok.stdout + ok.stderr
    inject(agent, "fault=ib-down", "device=mlx5_1")
    expect(agent, {("ib_port", "mlx5_1/1"): ("FAIL", "DRAIN")})
    bad = _podhealth("check", "--slurm-health", "--config", str(cfg), timeout=20)
    assert bad.returncode == 1
    assert "ERROR: podhealth: ib_port mlx5_1/1:" in bad.stdout and "[DRAIN]" in bad.stdout
    clear(agent)
    all_ok(agent)


def test_preflight_judges_only_the_pods_gpus(agent: Service, tmp_path: Path) -> None:
    # a Kubernetes init container: `podhealth check --preflight --gpus $NVIDIA_VISIBLE_DEVICES`
    inject(agent, "fault=dbe", "gpu=1")
    report = expect(agent, {("ecc", "gpu1"): ("FAIL", "RESET_GPU")})
    uuid = report[("ecc", "gpu1")]["evidence"]["uuid"]
    base = ["check", "--preflight", "--url", agent.url, "--format", "json"]
    other = _podhealth(*base, "--gpus", "0,2")  # another pod's GPUs: this one starts
    assert other.returncode == 0, other.stderr
    assert not any(r["entity"] == "gpu1" for r in json.loads(other.stdout)["results"])
    for sel in ("1", uuid):  # the broken GPU, by index or as the NVIDIA runtime names it
        mine = _podhealth(*base, "--gpus", sel)
        assert mine.returncode == 1 and "ecc gpu1" in mine.stderr, mine.stderr
        assert {r["entity"] for r in json.loads(mine.stdout)["results"] if r["entity"].startswith("gpu")} == {"gpu1"}
    # no agent: undecided, the pod may start (as the Slurm prolog lets a job run)
    gone = _podhealth("check", "--preflight", "--url", f"http://127.0.0.1:{free_port()}", "--gpus", "1")
    assert gone.returncode == 0 and "undecided" in gone.stderr
    assert _podhealth("check", "--preflight", "--gpus", "gpu1").returncode == 64
    clear(agent)
    all_ok(agent)
