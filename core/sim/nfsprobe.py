"""Stand-in for `stat <mount>` against a simulated node, run by the NFS collector as a subprocess.

    python -m podhealth.sim.nfsprobe <node dir> <mount>

Exit 0 at once for a healthy mount; exit 1 with a message for a missing one; for a hung one,
block until killed -- exactly what a stat on a dead hard NFS mount does, which is why the real
collector runs its probe in a killable subprocess with a timeout.
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

    The probe runs in its own session (so the collector can kill its whole group), which also
    means the agent's own stop never reaches it: a simulated hang must not outlive the agent.
    """
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
    except (OSError, AttributeError):
        pass  # not Linux: the ppid poll below still catches it
    return os.getppid()


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m podhealth.sim.nfsprobe NODE_DIR MOUNT", file=sys.stderr)
        return 2
    node_dir, mount = Path(argv[0]), argv[1].rstrip("/") or "/"
    try:
        state = _state(node_dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"nfsprobe: cannot read simulated node at {node_dir}: {e}", file=sys.stderr)
        return 2
    if mount not in state.mounts or any(f.mount == mount for f in state.faults_of("nfs-missing")):
        print(f"stat: cannot statx '{mount}': No such file or directory", file=sys.stderr)
        return 1
    parent = _die_with_parent()
    while any(f.mount == mount for f in state.faults_of("nfs-hung")):
        # Like a hard mount whose server is gone: wait forever (the caller kills us), but
        # recover if the fault is cleared, as a mount does when the server comes back.
        time.sleep(_HUNG_POLL_S)
        if os.getppid() != parent or parent == 1:
            return 3  # orphaned (the parent died before PR_SET_PDEATHSIG was set)
        try:
            state = _state(node_dir)
        except (OSError, ValueError, KeyError):
            continue
    print(f"  File: {mount}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
