"""Stand-in for the statfs probe helper against a simulated node (collectors/probe.py's protocol).

    python -m podhealth.sim.nfsprobe <node dir> <mount>

Writes `ready`, then answers each newline on stdin with one line, reading the node's state
each time: `ok` at once for a healthy mount; `fail ...` for a missing one; for a hung one, no
answer until the fault is cleared -- exactly what a statfs on a dead hard NFS mount does, which
is why the collector runs its probe in a killable child with a timeout. Exits at EOF on stdin.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from podhealth.sim.state import NodeState

_HUNG_POLL_S = 0.5


def _state(node_dir: Path) -> NodeState:
    return NodeState.loads((node_dir / "state.json").read_text(encoding="utf-8"))


def _die_with_parent() -> int:
    """Have the kernel kill us when the process that started us goes away, and say who that was.

    The helper runs in its own session (so the collector can kill its whole group), which also
    means the agent's own stop never reaches it: a simulated hang must not outlive the agent.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass  # not Linux: the ppid poll below still catches it
    return os.getppid()


def answer(node_dir: Path, mount: str, parent: int) -> bytes | None:
    """The line for one probe; None when orphaned while hung (then exit)."""
    while True:
        try:
            state = _state(node_dir)
        except (OSError, ValueError, KeyError) as e:
            return f"fail cannot read simulated node at {node_dir}: {e}\n".encode()
        if mount not in state.mounts or any(f.mount == mount for f in state.faults_of("nfs-missing")):
            return f"fail cannot statfs '{mount}': No such file or directory\n".encode()
        if not any(f.mount == mount for f in state.faults_of("nfs-hung")):
            return b"ok\n"
        # Like a hard mount whose server is gone: no answer (the caller kills us), but recover
        # when the fault is cleared, as a mount does when the server comes back.
        time.sleep(_HUNG_POLL_S)
        if os.getppid() != parent or parent == 1:
            return None  # orphaned (the parent died before PR_SET_PDEATHSIG was set)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m podhealth.sim.nfsprobe NODE_DIR MOUNT", file=sys.stderr)
        return 2
    node_dir, mount = Path(argv[0]), argv[1].rstrip("/") or "/"
    parent = _die_with_parent()
    os.write(1, b"ready\n")
    while True:
        req = os.read(0, 64)
        if not req:
            return 0
        for _ in range(req.count(b"\n")):
            line = answer(node_dir, mount, parent)
            if line is None:
                return 3
            os.write(1, line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
