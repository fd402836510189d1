"""`podhealth agent` command line: config errors, argument errors, and a real run on this machine."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.netaddr import parse_listen
from tests.harness.proc import free_port, http_get, service

pytestmark = pytest.mark.timeout(60)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "agent", *args],
                          capture_output=True, text=True, timeout=30)


def test_bad_config_names_file_line_key_and_exits_2(tmp_path: Path) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("collectors:\n  nfs:\n    interval: 10\n    timeout: abc\n")
    p = run_cli("--config", str(cfg))
    assert p.returncode == 2
    assert p.stderr.strip() == 'agent.yaml:4: collectors.nfs.timeout: expected seconds > 0, got "abc"'


def test_bad_arguments_exit_64_usage(tmp_path: Path) -> None:
    # 64 (EX_USAGE), not 2: 2 is "could not decide" / a bad config file
    p = run_cli("--listen", "nonsense")
    assert p.returncode == 64 and "--listen: expected ADDR:PORT" in p.stderr
    p = run_cli("--node", "bad name;rm")
    assert p.returncode == 64 and "invalid node name" in p.stderr
    p = run_cli("--no-such-option")
    assert p.returncode == 64 and "unrecognized arguments: --no-such-option" in p.stderr
    p = run_cli("--sim-no-refresh")  # only means something with --simulate
    assert p.returncode == 64 and "--sim-no-refresh goes with --simulate" in p.stderr


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9410") == ("127.0.0.1", 9410)
    assert parse_listen("[::1]:0") == ("::1", 0)
    for bad in ("9410", ":9410", "host:", "host:70000", "host:x"):
        with pytest.raises(ValueError):
            parse_listen(bad)


def test_real_mode_on_this_machine(tmp_path: Path) -> None:
    """No GPU, no DCGM, no HCA here: those collectors say why they are off; the agent serves anyway."""
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--listen", f"127.0.0.1:{port}", "--node", "ci01"]
    with service("agent", argv, tmp_path, port=port,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc:
        status, body = http_get(svc.url + "/healthz")
        assert json.loads(body)["node"] == "ci01"
        status, body = http_get(svc.url + "/metrics")
        text = body.decode()
        assert status == 200
        assert 'podhealth_collector_enabled{collector="host",node="ci01"} 1.0' in text
        assert 'podhealth_collector_disabled_info{collector="dcgm",node="ci01",reason="DCGM Python bindings not found' in text
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(10) == 0
        # README's Try it: the line names both URLs an operator curls first.
        assert f"podhealth agent serving {svc.url}/metrics and {svc.url}/health (node ci01)" in svc.log.read_text()


def test_a_taken_port_is_said_with_its_holder_and_a_code_that_stops_the_restart_loop(tmp_path: Path) -> None:
    """The real agent, finding its port taken (a user bound it while the agent was down), exited 1
    and systemd restarted it every 5 s forever. Now: who holds it, and 69, which the unit's
    RestartPreventExitStatus= names."""
    import os
    import pwd

    from podhealth.exitcodes import EXIT_CANNOT_BIND
    from tests.harness.fakeagent import Impostor

    env = {**os.environ, "PODHEALTH_SIM_DIR": str(tmp_path / "sim")}
    with Impostor({"status": "OK"}) as imp:
        p = subprocess.run([sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--listen",
                            f"127.0.0.1:{imp.port}", "--sim-root", str(tmp_path / "sim")],
                           capture_output=True, text=True, timeout=60, env=env)
    me = pwd.getpwuid(os.getuid()).pw_name
    assert p.returncode == EXIT_CANNOT_BIND == 69, p.stderr
    assert f"cannot listen on 127.0.0.1:{imp.port}" in p.stderr and f"held by uid {os.getuid()} ({me})" in p.stderr
    unit = (Path(__file__).resolve().parents[2] / "systemd" / "podhealth-agent.service").read_text()
    prevent = next(line for line in unit.splitlines() if line.startswith("RestartPreventExitStatus="))
    assert "69" in prevent.split("=", 1)[1].split()
