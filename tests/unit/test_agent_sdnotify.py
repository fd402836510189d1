"""sd_notify over a real AF_UNIX datagram socket: READY after listening, STATUS, WATCHDOG from the loop."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from podhealth import config
from podhealth.agent.agent import Agent
from podhealth.agent.sdnotify import Notifier, watchdog, watchdog_interval
from podhealth.collectors.base import Collection

pytestmark = pytest.mark.timeout(60)


class Receiver:
    """What systemd does: a bound datagram socket; records (time, message) from a thread."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            self.messages.append((time.monotonic(), data.decode()))

    def lines(self) -> list[str]:
        return [line for _, m in self.messages for line in m.splitlines()]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def receiver(tmp_path: Path):  # type: ignore[no-untyped-def]
    r = Receiver(str(tmp_path / "notify.sock"))
    yield r
    r.close()


def test_notifier_sends_to_a_path_socket(receiver: Receiver, tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    assert n.enabled and n.ready("starting") and n.status("3 collectors fresh")
    deadline = time.monotonic() + 5
    while len(receiver.messages) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [m for _, m in receiver.messages] == ["READY=1\nSTATUS=starting", "STATUS=3 collectors fresh"]
    n.close()


def test_notifier_abstract_socket_name() -> None:
    name = f"podhealth-test-{uuid.uuid4().hex}"
    r = Receiver("\0" + name)
    try:
        n = Notifier({"NOTIFY_SOCKET": "@" + name})
        assert n.send("WATCHDOG=1")
        deadline = time.monotonic() + 5
        while not r.messages and time.monotonic() < deadline:
            time.sleep(0.01)
        assert r.lines() == ["WATCHDOG=1"]
        n.close()
    finally:
        r.close()


def test_notifier_without_socket_or_with_a_dead_one(tmp_path: Path) -> None:
    assert not Notifier({}).enabled and not Notifier({}).send("READY=1")
    dead = Notifier({"NOTIFY_SOCKET": str(tmp_path / "nobody-listens")})
    assert dead.send("READY=1") is False  # logged once, never raised


def test_watchdog_interval_from_env() -> None:
    assert watchdog_interval({}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "20000000"}) == 10.0
    assert watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": str(os.getpid())}) == 10.0
    assert watchdog_interval({"WATCHDOG_USEC": "20000000", "WATCHDOG_PID": "1"}, pid=2) is None
    assert watchdog_interval({"WATCHDOG_USEC": "junk"}) is None
    assert watchdog_interval({"WATCHDOG_USEC": "0"}) is None


async def test_no_watchdog_while_the_loop_is_blocked(receiver: Receiver, tmp_path: Path) -> None:
    n = Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
    task = asyncio.get_running_loop().create_task(watchdog(n, 0.05))
    try:
        await asyncio.sleep(0.5)
        before = len(receiver.messages)
        assert before >= 4
        blocked_from = time.monotonic()
        time.sleep(0.6)  # deliberately block the event loop, as a hung handler would
        blocked_to = time.monotonic()
        await asyncio.sleep(0.3)
    finally:
        task.cancel()
        n.close()
    times = [t for t, m in receiver.messages if m == "WATCHDOG=1"]
    # The receiver thread stamps arrival; allow the one ping sent just before the block to land late.
    during = [t for t in times if blocked_from + 0.02 < t < blocked_to]
    assert during == [], f"pings arrived while the loop was blocked: {during}"
    assert any(t > blocked_to for t in times), "pings resumed after the loop was unblocked"


class _Quick:
    name = "nvml"
    metrics: dict[str, object] = {}

    def collect(self) -> Collection:
        return Collection(())

    def close(self) -> None:
        pass


async def test_agent_ready_after_listening_then_watchdog(receiver: Receiver, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    cfg = config.loads("listen: {address: 127.0.0.1, port: 0}\ncollectors: {nvml: {interval: 0.1, timeout: 1}}\n")
    agent = Agent(cfg, node="n1", factories={"nvml": lambda c: _Quick()},
                  notifier=Notifier({"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}))
    ready_seen_port_open: list[bool] = []

    def probe() -> None:
        # When READY arrives, the port must already accept connections.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any("READY=1" in m for _, m in receiver.messages):
                with socket.socket() as s:
                    ready_seen_port_open.append(s.connect_ex(("127.0.0.1", agent.port)) == 0)
                return
            time.sleep(0.001)

    t = threading.Thread(target=probe)
    t.start()
    await agent.start()
    try:
        await asyncio.to_thread(t.join, 10)
        for _ in range(100):
            if receiver.lines().count("WATCHDOG=1") >= 3:
                break
            await asyncio.sleep(0.05)
    finally:
        await agent.stop()
    # The receiver reads on its own thread: wait until it has STOPPING=1 (datagrams keep their
    # order, so everything sent before it is in too), then check nothing came after it.
    for _ in range(200):
        if "STOPPING=1" in receiver.lines():
            break
        await asyncio.sleep(0.01)
    lines = receiver.lines()
    assert ready_seen_port_open == [True]
    assert lines[0] == "READY=1" and lines[1].startswith("STATUS=")
    assert lines.count("WATCHDOG=1") >= 3
    assert lines[-1] == "STOPPING=1"
