"""`podhealth simulate` for more than one user on a machine, and what `clear` says about XIDs:
per-user default root, a root someone else owns, the XID window after `clear`, and a port in
use naming the option to change (never a traceback)."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.cli import main
from podhealth.sim import fleet
from podhealth.sim.cmd import xid_holds
from podhealth.sim.node import default_root, root_problem
from podhealth.sim.state import Fault

pytestmark = pytest.mark.timeout(60)


def run(root: Path, *args: str) -> int:
    return main(["simulate", *args, "--root", str(root)])


# ---- per-user defaults ----------------------------------------------------------------------------


def test_default_root_is_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODHEALTH_SIM_DIR", raising=False)
    assert default_root() == Path(f"/tmp/podhealth-sim-{os.getuid()}")
    monkeypatch.setattr(os, "getuid", lambda: 4242)
    assert default_root() == Path("/tmp/podhealth-sim-4242")  # another user, another root


def test_a_root_owned_by_someone_else_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / "sim"
    mine.mkdir()
    assert root_problem(mine) is None
    assert root_problem(tmp_path / "not-yet") is None  # created as ours when needed
    monkeypatch.setenv("PODHEALTH_SIM_DIR", str(mine))
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + 1)  # as seen by another user
    problem = root_problem(mine)
    assert problem is not None and f"belongs to uid {me}" in problem and "--root" in problem
    before = sorted(p.name for p in mine.iterdir())
    assert main(["simulate", "node", "dgx01"]) == 64
    err = capsys.readouterr().err
    assert "belongs to uid" in err and "--root DIR or set $PODHEALTH_SIM_DIR" in err
    assert sorted(p.name for p in mine.iterdir()) == before  # nothing written


# ---- clear and the XID window ------------------------------------------------------------------------


def test_xid_holds() -> None:
    now = 10_000.0
    xid = lambda code, gpu, at: Fault(kind="xid", injected_at=at, code=code, gpu=gpu)  # noqa: E731
    faults = [xid(79, 3, now - 100), xid(79, 3, now - 50), xid(48, 1, now - 400),
              Fault(kind="nvlink-crc", injected_at=now - 10, gpu=0, link=5, rate=5.0)]
    lines = xid_holds(faults, now, 300.0)
    assert len(lines) == 1  # XID 48 is past the window; the link fault is not an XID
    until = time.strftime("%H:%M:%S %Z", time.localtime(now - 50 + 300))  # from the LAST XID 79 on gpu3
    assert lines[0] == f"XID 79 on gpu3 keeps the xid check FAIL until {until} (window 300 s)"
    assert xid_holds(faults, now + 300, 300.0) == []


def test_clear_says_how_long_the_xid_verdict_holds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(tmp_path, "node", "dgx01") == 0
    assert run(tmp_path, "inject", "dgx01", "xid=79", "gpu=3") == 0
    assert run(tmp_path, "inject", "dgx01", "fault=nvlink-crc", "gpu=0", "link=5", "rate=50") == 0
    capsys.readouterr()
    t0 = time.time()
    assert run(tmp_path, "clear", "dgx01", "nvlink-crc") == 0
    assert "XID" not in capsys.readouterr().out  # the XID was not cleared: nothing to say about it
    assert run(tmp_path, "clear", "dgx01") == 0
    out = capsys.readouterr().out
    assert "dgx01: cleared 1 fault(s)" in out
    m = re.search(r"dgx01: XID 79 on gpu3 keeps the xid check FAIL until (\d\d:\d\d:\d\d) \S+ \(window 300 s\)", out)
    assert m, out
    expected = {time.strftime("%H:%M:%S", time.localtime(t + 300)) for t in (t0 - 60 + i for i in range(62))}
    assert m.group(1) in expected


def test_clear_reads_the_window_from_the_fleets_agent_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agents = tmp_path / "_fleet" / "agents"
    agents.mkdir(parents=True)
    (agents / "dgx01.yml").write_text("checks:\n  rate_window: 900\n")
    assert run(tmp_path, "node", "dgx01") == 0
    assert run(tmp_path, "inject", "dgx01", "xid=79", "gpu=3") == 0
    assert run(tmp_path, "clear", "dgx01", "xid") == 0
    assert "(window 900 s)" in capsys.readouterr().out


# ---- ports ------------------------------------------------------------------------------------------------


@pytest.fixture
def held_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_base_port_in_use_names_the_option(tmp_path: Path, held_port: int) -> None:
    out = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "fleet", "--nodes", "2", "--no-slurm",
                          "--base-port", str(held_port), "--root", str(tmp_path)],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 64, out
    assert "Traceback" not in out.stderr
    # The held port is named first; a neighbour of it that another process on the machine holds
    # right now is rightly named too (the pod needs a run of ports from --base-port).
    assert re.search(rf"--base-port {held_port}: port\(s\) {held_port}(, \d+)* already in use", out.stderr), out.stderr
    assert "choose another --base-port" in out.stderr


def test_an_agent_whose_port_is_taken_says_which_option(tmp_path: Path, held_port: int) -> None:
    """`podhealth agent --simulate` run a second time: the port is taken; the error says how to
    choose another, and the exit is 69 (EX_UNAVAILABLE: the unit's RestartPreventExitStatus stops
    a restart loop against a port another process holds)."""
    out = subprocess.run([sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100",
                          "--sim-root", str(tmp_path), "--listen", f"127.0.0.1:{held_port}"],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert out.returncode == 69, out
    assert "cannot start the HTTP server" in out.stderr and "--listen ADDR:PORT" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def _dead_child(tmp_path: Path, name: str, log_text: str) -> fleet.Child:
    log = tmp_path / f"{name}.log"
    log.write_text(log_text)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(1)"])
    proc.wait(timeout=30)
    return fleet.Child(name, proc, log, tmp_path / f"{name}.pid")


BIND_ERROR = ('{"error": "[Errno 98] error while attempting to bind on address (\'127.0.0.1\', 9421): '
              'address already in use", "event": "cannot start the HTTP server", "level": "error"}\n')


@pytest.mark.parametrize("base_port", [None, 20000])
def test_a_child_that_lost_its_port_says_which_option(tmp_path: Path, base_port: int | None) -> None:
    opts = fleet.FleetOptions(nodes=2, profile="dgx-h100", root=tmp_path, base_port=None, slurm=False,
                              cluster="simpod", partition="gpu")
    f = fleet.Fleet(opts)
    f.plan = fleet.make_plan(opts)
    f.opts = fleet.FleetOptions(**{**opts.__dict__, "base_port": base_port})
    agent = f.plan.agents[1]
    child = _dead_child(tmp_path, f"agent-{agent.node}", "starting\n" + BIND_ERROR)
    with pytest.raises(fleet.FleetError) as e:
        f._wait_ready("agents", [child], lambda c: False, timeout=5)
    msg = str(e.value)
    assert f"agent-{agent.node}: port {agent.port}" in msg and "--base-port" in msg
    assert "Traceback" not in msg and "Errno" not in msg
    if base_port:
        assert "choose another --base-port" in msg
    else:
        assert "run again" in msg
    other = _dead_child(tmp_path, "aggregator", "Traceback (most recent call last):\nValueError: boom\n")
    with pytest.raises(fleet.FleetError) as e:
        f._wait_ready("aggregator", [other], lambda c: False, timeout=5)
    assert "exited with code 1" in str(e.value) and "boom" in str(e.value)  # any other death: its log
