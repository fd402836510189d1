"""The order of what the agent says, in a form the aggregator can trust more than a wall clock.

Every report, lease and spooled record carries `boot_id` and `seq`. The aggregator orders a
node's records by them (a new boot_id starts a new epoch) and treats the wall-clock `time` as a
claim: an NTP step or a wrong RTC must not make later reports look older than earlier ones.

`boot_id` is the kernel's (<procfs_root>/sys/kernel/random/boot_id): it changes on every boot and
only then. `seq` is CLOCK_MONOTONIC in nanoseconds, made strictly increasing within the process.
That clock is system-wide and never steps back within a boot, so an agent that restarts (even
with a wiped spool) continues above every seq it sent before, with nothing persisted and no
fsync per record; after a reboot the new boot_id makes the restart from zero a new epoch. Where
the kernel file cannot be read (an unusual container), the epoch is one per agent process
("proc-<random>"): ordering still holds within it, and a restart is a new epoch.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any, Callable

from podhealth import log as plog

log = plog.get("podhealth.sequence")
BOOT_ID = Path("sys/kernel/random/boot_id")
MAX_BOOT_ID = 64


def read_boot_id(procfs_root: Path) -> str | None:
    """The kernel's boot id under `procfs_root`, or None when it cannot be read (or is not one)."""
    try:
        text = (procfs_root / BOOT_ID).read_text(encoding="ascii", errors="replace").strip()
    except OSError:
        return None
    return text if 0 < len(text) <= MAX_BOOT_ID and text.isprintable() else None


class Sequencer:
    """Stamps (boot_id, seq) on outgoing records; one per agent process, shared by its senders."""

    def __init__(self, procfs_root: Path = Path("/proc"), clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        boot = read_boot_id(procfs_root)
        if boot is None:
            boot = f"proc-{uuid.uuid4().hex}"
            log.warning("no kernel boot id: ordering restarts with this process", path=str(procfs_root / BOOT_ID),
                        epoch=boot)
        self.boot_id = boot
        self._clock_ns = clock_ns
        self._last = 0

    def next(self) -> int:
        """A seq above every one this process (or an earlier agent in this boot) handed out."""
        self._last = max(self._last + 1, self._clock_ns())
        return self._last

    def stamp(self, body: dict[str, Any]) -> dict[str, Any]:
        """`body` with boot_id and a fresh seq added (in place; returned for chaining)."""
        body["boot_id"] = self.boot_id
        body["seq"] = self.next()
        return body
