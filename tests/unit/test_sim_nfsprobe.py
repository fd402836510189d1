"""The simulated NFS probe helper blocks on a hung mount, like statfs would, but never outlives its parent."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from podhealth.sim import faults
from podhealth.sim.node import SimNode
from tests.harness.proc import wait_until


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_hung_probe_exits_when_its_parent_dies(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    node.inject(faults.parse(["fault=nfs-hung", "mount=/home"], time.time()))
    # A parent that starts the helper in its own session (as the collector does), asks, sees no
    # answer for a second (the helper is hung), and then dies without stopping it.
    code = ("import select,subprocess,sys; p=subprocess.Popen(sys.argv[1:], start_new_session=True, "
            "stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL); "
            "assert p.stdout.readline() == b'ready\\n'; p.stdin.write(b'\\n'); p.stdin.flush(); "
            "hung = not select.select([p.stdout], [], [], 1.0)[0]; print(p.pid, hung, flush=True)")
    out = subprocess.run([sys.executable, "-c", code, *node.probe_argv("/home")], capture_output=True, text=True,
                         timeout=30)
    pid_text, hung = out.stdout.split()
    pid = int(pid_text)
    try:
        assert hung == "True"  # it did not answer while its parent lived
        wait_until(lambda: not _alive(pid), timeout=10, what="the orphaned probe helper to exit")
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_healthy_and_missing_mounts_answer_at_once(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01", "dgx-h100")
    r = subprocess.run(node.probe_argv("/home"), input=b"\n\n", capture_output=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, b"ready\nok\nok\n")
    node.inject(faults.parse(["fault=nfs-missing", "mount=/home"], time.time()))
    r = subprocess.run(node.probe_argv("/home"), input=b"\n", capture_output=True, text=False, timeout=30)
    lines = r.stdout.decode().splitlines()
    assert r.returncode == 0 and lines[0] == "ready" and lines[1].startswith("fail ")
    assert "No such file or directory" in lines[1]
