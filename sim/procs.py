"""What /proc says of one process, for the simulator's clean-up of what it started: by pid and
command line, never by name."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/PID/stat after the command name (state, ppid, pgrp, session, ...); None when gone.
    Split after the last ")": a command name may hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def alive(pid: int) -> bool:
    """Running, and not a zombie waiting for its parent to reap it."""
    fields = stat_fields(pid)
    return fields is not None and bool(fields) and fields[0] != "Z"


def cmdline(pid: int) -> str:
    """The command line, arguments joined by spaces; "" when the process is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
