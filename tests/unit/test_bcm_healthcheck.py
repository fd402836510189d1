"""`podhealth-bcm-healthcheck` / `podhealth check --format bcm`: BCM's health-check response.

BCM 11 Administrator Manual 10.2.4: the response is PASS, FAIL or UNKNOWN, optionally followed by a
severity ("FAIL 40", "UNKNOWN 10"); the information text rides on fd 3 (G.2, InfoMessages) or, by
hand, on stderr. Every verdict, the agent away, a garbled agent and a slow agent are tested
through the real command, each within a time budget.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from podhealth import nodeproof
from podhealth.checks.cli.bcm import answer
from podhealth.vocab import Action, CheckResult, NodeReport, Status

# BCM's grammar for a standalone health check's stdout (10.2.4): the word, an optional severity.
RESPONSE = re.compile(r"^(PASS|FAIL|UNKNOWN)(?: (\d{1,3}))?\n$")
REPO = Path(__file__).resolve().parents[2]


def report(*statuses: Status) -> NodeReport:
    results = [CheckResult("ok_check", Status.OK, "node")]
    for i, s in enumerate(statuses):
        action = Action.DRAIN if s is Status.FAIL else Action.NONE
        results.append(CheckResult(f"check{i}", s, f"gpu{i}", (), action, summary=f"{s.value.lower()} thing {i}"))
    return NodeReport("dgx01", "1.0", "dgx-h100", tuple(results))


@pytest.mark.parametrize("statuses,word", [
    ((), "PASS"), ((Status.WARN,), "PASS"), ((Status.FAIL, Status.WARN), "FAIL"),
    ((Status.UNKNOWN, Status.WARN), "UNKNOWN"), ((Status.FAIL, Status.UNKNOWN), "FAIL"),
])
def test_each_verdict_maps_to_the_manuals_words(statuses: tuple[Status, ...], word: str) -> None:
    a = answer(report(*statuses))
    assert RESPONSE.match(a.line + "\n") and a.line == word
    assert "\n" not in a.info and len(a.info) <= 1024


def test_information_text_names_what_matters() -> None:
    a = answer(report(Status.FAIL, Status.WARN))
    assert a.info.startswith("podhealth dgx01: FAIL (action DRAIN): check0 gpu0: fail thing 0 [DRAIN]")
    assert "warn thing" not in a.info  # a FAIL's text lists the failures
    w = answer(report(Status.WARN))
    assert "warnings only, not failing" in w.info and "check0 gpu0: warn thing 0" in w.info
    assert answer(report()).info == "podhealth dgx01: OK: 1 checks passed"


def test_severity_override_follows_the_word() -> None:
    assert answer(report(Status.FAIL), fail_severity=40).line == "FAIL 40"
    assert answer(report(Status.UNKNOWN), unknown_severity=10).line == "UNKNOWN 10"
    assert answer(report(Status.WARN), fail_severity=40).line == "PASS"
    assert answer(None, "refused", unknown_severity=20).line == "UNKNOWN 20"


def test_long_information_is_bounded() -> None:
    a = answer(report(*([Status.FAIL] * 200)))
    assert len(a.info) == 1024 and a.line == "FAIL"


# ---- through the command, against agents on loopback -------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


KEY = "b" * 64  # the node's agent key: the config names it, the stand-in agent proves with it


class _Agent(BaseHTTPRequestHandler):
    body = b""
    key = KEY

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        nonce = nodeproof.nonce_of(self.headers)  # type: ignore[arg-type]
        if self.key and nonce:
            for k, v in nodeproof.prove(self.key, "dgx01", "GET", self.path, nonce, 200, self.body, time.time()).items():
                self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def agent() -> Iterator[tuple[int, type[_Agent]]]:
    handler = type("H", (_Agent,), {})
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1], handler
    finally:
        srv.shutdown()
        srv.server_close()


def run(port: int, tmp: Path, *args: str, via: str = "script", timeout: float = 20.0) -> tuple[subprocess.CompletedProcess[str], float]:
    cfg = tmp / "podhealth.yaml"
    cfg.write_text(f"node:\n  name: dgx01\nlisten:\n  port: {port}\nauth:\n  token: {KEY}\n")
    if via == "script":
        argv = [sys.executable, "-c", "import sys; from podhealth.checks.cli.bcm import main; sys.exit(main())",
                "--config", str(cfg), *args]
    else:
        argv = [sys.executable, "-m", "podhealth", "check", "--format", "bcm", "--config", str(cfg), *args]
    t0 = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=tmp)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("via", ["script", "check"])
@pytest.mark.parametrize("statuses,word", [((), "PASS"), ((Status.WARN,), "PASS"), ((Status.FAIL,), "FAIL"),
                                           ((Status.UNKNOWN,), "UNKNOWN")])
def test_command_answers_each_verdict(agent: tuple[int, type[_Agent]], tmp_path: Path, via: str,
                                      statuses: tuple[Status, ...], word: str) -> None:
    port, handler = agent
    handler.body = json.dumps(report(*statuses).to_json()).encode()
    proc, _ = run(port, tmp_path, via=via)
    assert proc.returncode == 0 and proc.stdout == word + "\n"
    assert RESPONSE.match(proc.stdout)
    assert proc.stderr.startswith("podhealth dgx01: ")


def test_agent_away_is_unknown(tmp_path: Path) -> None:
    proc, took = run(free_port(), tmp_path, "--unknown-severity", "10")
    assert proc.stdout == "UNKNOWN 10\n" and proc.returncode == 0
    assert "no verdict from the local agent" in proc.stderr and "refused" in proc.stderr.lower()


def test_garbled_agent_is_unknown(agent: tuple[int, type[_Agent]], tmp_path: Path) -> None:
    port, handler = agent
    handler.body = b"<html>not podhealth</html>"
    proc, _ = run(port, tmp_path)
    assert proc.stdout == "UNKNOWN\n"


@pytest.mark.parametrize("verdict", [(), (Status.FAIL,)], ids=["forged-ok", "forged-fail"])
def test_an_impostor_on_the_port_is_unknown(agent: tuple[int, type[_Agent]], tmp_path: Path,
                                            verdict: tuple[Status, ...]) -> None:
    """Whatever took the agent's port while it was down holds no key: its verdict is not believed."""
    port, handler = agent
    handler.key = ""  # answers like the agent, proves nothing
    handler.body = json.dumps(report(*verdict).to_json()).encode()
    proc, _ = run(port, tmp_path)
    assert proc.stdout == "UNKNOWN\n" and "not proven" in proc.stderr
    handler.key = "c" * 64  # an agent with another node's key
    proc, _ = run(port, tmp_path)
    assert proc.stdout == "UNKNOWN\n" and "not proven" in proc.stderr


def test_bad_config_is_unknown(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("listen:\n  prot: 1\n")
    for argv in ([sys.executable, "-c", "import sys; from podhealth.checks.cli.bcm import main; sys.exit(main())"],
                 [sys.executable, "-m", "podhealth", "check", "--format", "bcm"]):
        proc = subprocess.run([*argv, "--config", str(cfg)], capture_output=True, text=True, timeout=20)
        assert proc.stdout == "UNKNOWN\n" and "prot" in proc.stderr


@pytest.mark.parametrize("via", ["script", "check"])
def test_silent_agent_never_stretches_the_budget(tmp_path: Path, via: str) -> None:
    """An agent that accepts the connection and never answers (a hung event loop)."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        lsock.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(lsock.accept()[0])
            except OSError:
                continue
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        budget = 1.0
        proc, took = run(lsock.getsockname()[1], tmp_path, "--budget", str(budget), via=via)
    finally:
        stop.set()
        t.join(5)
        for c in held:
            c.close()
        lsock.close()
    assert proc.stdout == "UNKNOWN\n"
    assert "no complete answer within 1s" in proc.stderr or "timed out" in proc.stderr
    assert held, "the command never connected: the test would prove nothing"
    # The budget plus interpreter start-up (imports take ~1 s on this shared machine).
    assert took < budget + 4.0, took


def test_trickling_agent_is_cut_at_the_budget(tmp_path: Path) -> None:
    """Bytes every 0.3 s keep each socket read under its timeout; the budget still holds."""
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(4)
    stop = threading.Event()

    def serve() -> None:
        lsock.settimeout(5)
        try:
            c, _ = lsock.accept()
        except OSError:
            return
        with c:
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            while not stop.wait(0.3):
                try:
                    c.sendall(b" ")
                except OSError:
                    return
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        proc, took = run(lsock.getsockname()[1], tmp_path, "--budget", "1.5")
    finally:
        stop.set()
        t.join(5)
        lsock.close()
    assert proc.stdout == "UNKNOWN\n" and "no complete answer within 1.5s" in proc.stderr
    assert took < 1.5 + 4.0, took


def test_information_goes_to_fd3_when_bcm_opens_a_pipe(agent: tuple[int, type[_Agent]], tmp_path: Path) -> None:
    port, handler = agent
    handler.body = json.dumps(report(Status.FAIL).to_json()).encode()
    cfg = tmp_path / "podhealth.yaml"
    cfg.write_text(f"node:\n  name: dgx01\nlisten:\n  port: {port}\nauth:\n  token: {KEY}\n")
    code = ("import os, sys\n"
            "r, w = os.pipe()\n"
            "r = os.dup(r) if r == 3 else r  # dup2 onto 3 must not close our read end\n"
            "os.dup2(w, 3); os.close(w)\n"
            "from podhealth.checks.cli.bcm import main\n"
            f"rc = main(['--config', {str(cfg)!r}, '--fail-severity', '40'])\n"
            "os.close(3)\n"
            "sys.stdout.flush()\n"
            "print('FD3:' + os.read(r, 65536).decode(), file=sys.stderr)\n"
            "sys.exit(rc)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert proc.stdout == "FAIL 40\n"
    assert proc.stderr.startswith("FD3:podhealth dgx01: FAIL (action DRAIN): check0 gpu0: fail thing 0 [DRAIN]")


def test_fd3_that_is_a_file_is_left_alone(agent: tuple[int, type[_Agent]], tmp_path: Path) -> None:
    port, handler = agent
    handler.body = json.dumps(report().to_json()).encode()
    cfg = tmp_path / "podhealth.yaml"
    cfg.write_text(f"node:\n  name: dgx01\nlisten:\n  port: {port}\nauth:\n  token: {KEY}\n")
    victim = tmp_path / "inherited.log"
    victim.write_text("keep me\n")
    code = ("import os, sys\n"
            f"fd = os.open({str(victim)!r}, os.O_WRONLY | os.O_APPEND)\n"
            "os.dup2(fd, 3)\n"
            "from podhealth.checks.cli.bcm import main\n"
            f"sys.exit(main(['--config', {str(cfg)!r}]))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20)
    assert proc.stdout == "PASS\n" and victim.read_text() == "keep me\n"
    assert "checks passed" in proc.stderr


def test_console_script_is_declared() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'podhealth-bcm-healthcheck = "podhealth.checks.cli.bcm:main"' in text
    assert os.path.exists(REPO / "docs" / "bcm.md")
