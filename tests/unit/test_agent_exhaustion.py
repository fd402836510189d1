"""Resource exhaustion never becomes a verdict: a collector that cannot read for a local reason
(EMFILE, ENOMEM, ...) makes its checks UNKNOWN, never FAIL ("0 of 10 InfiniBand ports present",
"NFS mount missing"), and the same source read normally afterwards judges as before.

The fd exhaustion is real: a child process lowers its own RLIMIT_NOFILE and opens /dev/null
until open() fails with EMFILE, then runs the real scheduler, collectors and check engine over a
simulated DGX H100 tree (setrlimit is process-wide, so never in the test session itself).
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.collectors.base import Collection, SourceUnreadable, local_fault, raise_if_local
from podhealth.config import ChecksConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Sample, Status

_CHILD = r"""
import asyncio, json, os, resource, sys
from pathlib import Path
from podhealth.agent.scheduler import Scheduler
from podhealth.agent.store import SnapshotStore
from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.collectors.nfs import NfsCollector
from podhealth.config import ChecksConfig
from podhealth.sim import tree_ib, tree_nfs
from podhealth.sim.state import default_state

root = Path(sys.argv[1])
T0 = 1_700_000_000.0
st = default_state("dgx01", "dgx-h100", now=T0)
tree_ib.write(st, root / "sys", T0 + 60)
tree_nfs.write(st, root / "proc", T0 + 60)
OK_PROBE = [sys.executable, "-I", "-S", "-c",
            "import os\nos.write(1, b'ready\\n')\nwhile os.read(0, 64): os.write(1, b'ok\\n')\n"]

def verdicts(ev, snap, now):
    return {f"{r.check}:{r.entity}": [r.status.value, r.action.value, r.summary]
            for r in ev.evaluate(snap, now, damped=False) if r.check in ("ib_port", "nfs_mount")}

async def main():
    store = SnapshotStore()
    sched = Scheduler(store, stale_after=1000.0)
    sched.add("infiniband", InfinibandCollector(root / "sys"), 3600.0, 5.0)
    sched.add("nfs", NfsCollector(root / "proc", [("/home", 2.0)], probe_argv=lambda mp: OK_PROBE), 3600.0, 5.0)
    sched.start()
    ev = Evaluator(profiles.load("dgx-h100"), ChecksConfig(), mounts=["/home"])
    out = {"before": verdicts(ev, await sched.collect_now(), T0 + 61)}
    # The nfs probe helper is already running; exhaust what is left.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
    fds = []
    try:
        while True:
            fds.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as e:
        out["exhausted"] = e.errno
    snap = await sched.collect_now()
    out["during"] = verdicts(ev, snap, T0 + 62)
    out["errors"] = {n: list(snap.collectors[n].errors) for n in ("infiniband", "nfs")}
    for fd in fds:
        os.close(fd)
    out["after"] = verdicts(ev, await sched.collect_now(), T0 + 63)
    await sched.stop()
    print(json.dumps(out))

asyncio.run(main())
"""


def test_fd_exhaustion_makes_ib_and_nfs_unknown_never_fail(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["exhausted"] == errno.EMFILE
    before, during, after = out["before"], out["during"], out["after"]
    # Read normally, every port is judged on its own (whatever the rule says of it) before and after.
    assert sum(k.startswith("ib_port:mlx5") for k in before) >= 8 and "nfs_mount:/home" in before, before
    assert after == before
    assert "Too many open files" in out["errors"]["infiniband"][0], out["errors"]
    assert during, during
    for key, (status, action, summary) in during.items():
        assert status == "UNKNOWN" and action == "NONE", (key, status, summary)
    assert "Too many open files" in during["ib_port:node"][2]


@pytest.mark.parametrize("err, local", [
    (OSError(errno.EMFILE, "Too many open files"), True),
    (OSError(errno.ENFILE, "Too many open files in system"), True),
    (OSError(errno.ENOMEM, "Cannot allocate memory"), True),
    (OSError(errno.EACCES, "Permission denied"), True),
    (OSError(errno.EPERM, "Operation not permitted"), True),
    (TimeoutError("timed out"), True),
    (MemoryError(), True),
    (OSError(errno.ENOENT, "No such file or directory"), False),  # absent: a real "missing"
    (OSError(errno.EINVAL, "Invalid argument"), False),  # a counter the firmware refuses
    (OSError(errno.ENODEV, "No such device"), False),
])
def test_local_faults_are_told_from_absence(err: BaseException, local: bool) -> None:
    assert local_fault(err) is local
    if local:
        with pytest.raises(SourceUnreadable, match="mlx5_0"):
            raise_if_local(err, "mlx5_0")
    else:
        raise_if_local(err, "mlx5_0")  # returns: the caller records that one entity's problem


def _snap(nfs: CollectorState) -> Snapshot:
    return Snapshot(time=100.0, collectors={"nfs": nfs})


def _eval(snap: Snapshot) -> dict[str, Status]:
    ev = Evaluator(profiles.load("dgx-h100"), ChecksConfig(), mounts=["/home"], enabled=["nfs"])
    return {r.entity: r.status for r in ev.evaluate(snap, 100.0, damped=False) if r.check == "nfs_mount"}


def test_a_failed_run_is_unknown_even_before_the_data_ages() -> None:
    # The last success is recent (not stale by age) but the last attempt failed: no samples left,
    # and judging that empty set would say "NFS mount missing".
    failed = CollectorState(name="nfs", samples=(), errors=("SourceUnreadable: mountstats: Too many open files",),
                            last_success=99.0, last_attempt=99.5, stale=False)
    res = _eval(_snap(failed))
    assert res and set(res.values()) == {Status.UNKNOWN}


def test_mount_missing_needs_the_mount_table_read() -> None:
    ok_run = dict(last_success=99.0, last_attempt=99.0, stale=False)
    unread = CollectorState(name="nfs", samples=(Sample.of("nfs_probe_ok", 1, mountpoint="/home"),), **ok_run)
    assert _eval(_snap(unread)) == {"/home": Status.UNKNOWN}
    absent = CollectorState(name="nfs", samples=(Sample.of("nfs_mount_present", 0, mountpoint="/home"),), **ok_run)
    assert _eval(_snap(absent)) == {"/home": Status.FAIL}
    assert Collection(()).errors == ()
