"""sd_notify(3) over $NOTIFY_SOCKET with the stdlib, for a Type=notify unit with WatchdogSec=.

The protocol is one datagram of newline-separated KEY=VALUE lines to an AF_UNIX socket; a path
starting with '@' names an abstract socket (a leading NUL byte). The watchdog ping is sent by a
task on the event loop, not a thread: if the loop is blocked, no ping goes out and systemd
restarts the agent, which is the point.
"""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Mapping

from podhealth import log

_log = log.get("podhealth.agent.sdnotify")


def watchdog_interval(env: Mapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """Seconds between WATCHDOG=1 pings (half of WATCHDOG_USEC), or None when no watchdog applies to us."""
    usec = env.get("WATCHDOG_USEC", "")
    if not usec:
        return None
    wpid = env.get("WATCHDOG_PID", "")
    if wpid and wpid.strip() != str(pid if pid is not None else os.getpid()):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return value / 2 / 1e6 if value > 0 else None


class Notifier:
    """Sends sd_notify messages; a no-op without $NOTIFY_SOCKET. Never raises into the agent."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        path = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + path[1:] if path.startswith("@") else path
        self._sock: socket.socket | None = None
        self._failed = False
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return bool(self.address)

    def send(self, *lines: str) -> bool:
        if not self.address:
            return False
        msg = "\n".join(lines).encode("utf-8", "replace")
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
                # A datagram to a live receiver does not block; a full receive queue would, so bound it.
                self._sock.settimeout(1.0)
                self._sock.connect(self.address)
            self._sock.send(msg)
        except OSError as e:
            self.close()
            if not self._failed:
                _log.warning("sd_notify failed", socket=self.address.replace("\0", "@"), error=str(e))
            self._failed = True
            return False
        if self._failed:
            _log.info("sd_notify works again")
        self._failed = False
        self.sent += 1
        return True

    def ready(self, status: str = "") -> bool:
        return self.send("READY=1", *([f"STATUS={status}"] if status else []))

    def status(self, text: str) -> bool:
        return self.send(f"STATUS={text}")

    def stopping(self) -> bool:
        return self.send("STOPPING=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


async def watchdog(notifier: Notifier, interval: float) -> None:
    """Ping WATCHDOG=1 every `interval` seconds from the event loop until cancelled."""
    while True:
        notifier.send("WATCHDOG=1")
        await asyncio.sleep(interval)
