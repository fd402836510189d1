"""A site golden profile end to end: captured from a simulated DGX H100 by the CLI, edited as an
operator would, loaded by a real agent through `checks.profile_file`, and judged by the drift check
(/health), with `podhealth profile diff --url` against that agent."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness.proc import free_port, http_get, service, wait_until

pytestmark = pytest.mark.timeout(180)


def podhealth(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", *args], capture_output=True, text=True, timeout=90,
                          env=env)


def drift_results(port: int) -> dict[str, dict[str, Any]] | None:
    code, body = http_get(f"http://127.0.0.1:{port}/health")
    if code != 200:
        return None
    report = json.loads(body)
    got = {r["entity"]: {**r, "profile": report.get("profile")} for r in report["results"] if r["check"] == "drift"}
    return got if len(got) == 5 else None


def test_agent_judges_drift_against_a_captured_site_profile(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    cap = podhealth("profile", "capture", "--simulate", "dgx-h100", "--sim-root", str(sim))
    assert cap.returncode == 0, cap.stderr
    captured = cap.stdout
    driver = re.search(r"^  driver: (\S+)", captured, re.M)
    assert driver, captured
    # the operator's fleet standard differs from this node's driver, and states an OFED the
    # simulator cannot show; both fields are set to FAIL
    site = tmp_path / "site-profile.yaml"
    site.write_text(captured
                    .replace(f"  driver: {driver.group(1)}", "  driver: 550.54.15  # fleet standard", 1)
                    .replace("  # ofed: not readable on this node, not stated", '  ofed: "MLNX_OFED_LINUX-23.10-1.1.9.0"', 1)
                    .replace("drift: {driver: WARN,", "drift: {driver: FAIL,", 1)
                    .replace("ofed: WARN,", "ofed: FAIL,", 1))
    assert 'ofed: "MLNX_OFED' in site.read_text() and "ofed: FAIL," in site.read_text(), site.read_text()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"checks:\n  profile_file: {site}\n  grace: 0\n  damping: {{fail_after: 1, recover_after: 1}}\n"
                   "collectors:\n  nvml: {interval: 1}\n  nvlink: {interval: 1}\n  infiniband: {interval: 1}\n"
                   "  host: {interval: 1}\n")
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
            "--sim-root", str(sim), "--listen", f"127.0.0.1:{port}"]
    with service("agent", argv, tmp_path / "logs", port, ready=lambda: drift_results(port), ready_timeout=60):
        got: dict[str, dict[str, Any]] = wait_until(  # type: ignore[assignment]
            lambda: (r := drift_results(port)) and r["driver"]["status"] == "FAIL" and r, 30, what="drift FAIL")
        assert got["driver"]["profile"] == "dgx-h100-site"
        assert got["driver"]["action"] == "DRAIN"
        assert got["driver"]["evidence"]["expected"] == "550.54.15"
        assert got["driver"]["evidence"]["observed"] == driver.group(1)
        # stated but unreadable here: UNKNOWN even though the profile says FAIL
        assert got["ofed"]["status"] == "UNKNOWN" and got["ofed"]["action"] == "NONE"
        assert got["vbios"]["status"] == "OK" and got["hca_fw"]["status"] == "OK"
        diff = podhealth("profile", "diff", str(site), "--url", f"http://127.0.0.1:{port}", "--format", "json")
        # a stated value it cannot read (OFED) makes it "cannot tell" (2); the driver row still differs
        assert diff.returncode == 2, diff.stdout + diff.stderr
        rows = {r["key"]: r["status"] for r in json.loads(diff.stdout)["rows"]}
        assert rows["versions.driver"] == "differs" and rows["versions.ofed"] == "unknown"
        assert rows["versions.kernel"] == "same"  # the simulated node's own kernel, as captured
        assert rows["gpu_count"] == "same" and rows["network.roles.compute"] == "same"
    # a broken site profile stops the agent with file, line and key (exit 2)
    site.write_text("extends: dgx-h100\nversions:\n  driver: 550\n  bios: x\n")
    bad = podhealth("agent", "--config", str(cfg), "--simulate", "dgx-h100", "--sim-root", str(sim),
                    "--listen", "127.0.0.1:0")
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "site-profile.yaml:4: versions.bios: unknown key" in bad.stderr
