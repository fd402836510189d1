"""The leader's epoch in the marks it leaves (fencing/fence.py, slurm.py, kube.py), read back;
marks written before there were epochs stay podhealth's, with epoch 0."""

from __future__ import annotations

import math
from typing import Any

import pytest

from podhealth.fencing import kube
from podhealth.fencing.fence import FenceReason, LeaseExpired, mark_epoch, parse_reason, render_reason, time_left
from podhealth.fencing.slurm import MAX_REASON_CHARS, SlurmNode, _state_of, sanitise_reason

R = FenceReason("xid", "GPU3", "DRAIN", "ev-1", epoch=7)


def test_a_reason_carries_the_epoch_and_an_old_one_parses_as_epoch_0() -> None:
    assert render_reason(R) == "podhealth: xid GPU3 DRAIN [ev-1] e7"
    assert parse_reason(render_reason(R)) == R
    assert parse_reason("podhealth: xid GPU3 DRAIN [ev-1]") == FenceReason("xid", "GPU3", "DRAIN", "ev-1", 0)
    # Slurm appends its own words; the epoch is still read, and text after it is not an epoch
    assert mark_epoch("podhealth: xid GPU3 REBOOT [ev-1] e12 : reboot issued") == 12
    assert mark_epoch("podhealth: xid GPU3 REBOOT [ev-1] : reboot issued") == 0
    assert mark_epoch("bad fan e7") == 0


def test_the_slurm_reason_keeps_the_epoch_whole_when_it_is_cut() -> None:
    long = FenceReason("c" * 100, "e" * 100, "DRAIN", "i" * 100, epoch=123456)
    text = sanitise_reason(long)
    assert len(text) <= MAX_REASON_CHARS and text.endswith(" e123456") and text.startswith("podhealth: ccc")
    assert sanitise_reason(FenceReason("xid", "GPU0", "DRAIN", "ev-1")) == "podhealth: xid GPU0 DRAIN [ev-1]"


def _slurm_node(reason: str) -> SlurmNode:
    from podhealth.fencing.slurm import parse_show_node
    [n] = parse_show_node(f"NodeName=dgx01 Arch=x86_64\n   State=IDLE+DRAIN ThreadsPerCore=1\n   Reason={reason} "
                          "[root@2026-01-01T00:00:00]\n")
    return n


@pytest.mark.parametrize("reason, epoch", [("podhealth: xid GPU3 DRAIN [ev-1] e7", 7),
                                           ("podhealth: xid GPU3 DRAIN [ev-1]", 0)])
def test_a_slurm_state_says_the_mark_s_epoch(reason: str, epoch: int) -> None:
    st = _state_of(_slurm_node(reason), "")
    assert st.ours and st.fenced and st.epoch == epoch


def test_the_taint_value_carries_the_epoch_within_the_label_value_rules() -> None:
    assert kube.taint_value("xid", 7) == "xid.e7" and kube.taint_value("xid") == "xid"
    v = kube.taint_value("x" * 80, 123)
    assert len(v) <= 63 and v.endswith(".e123") and kube.taint_epoch(v) == 123
    assert kube.taint_epoch("xid") == 0 and kube.taint_epoch("ib_port") == 0
    node = {"metadata": {"name": "dgx01"}, "spec": {"unschedulable": True, "taints": [
        {"key": kube.TAINT_KEY, "value": "xid.e9", "effect": "NoSchedule"}]}}
    assert kube.NodeView.of(node).state().epoch == 9  # the annotation lost: the taint still says it
    rec = kube.FenceRecord(why=render_reason(R), when="", id="ev-1", check="xid", cordoned_before=False)
    node["metadata"]["annotations"] = {kube.ANNOTATION: rec.to_json()}  # type: ignore[index]
    assert kube.NodeView.of(node).state().epoch == 7


def test_the_guard_refuses_a_call_once_the_lease_deadline_has_passed() -> None:
    assert time_left(None, "x") == math.inf
    assert time_left(lambda: 1.5, "x") == 1.5
    with pytest.raises(LeaseExpired, match="lease deadline"):
        time_left(lambda: 0.0, "update NodeName=dgx01")


async def test_scontrol_is_not_started_after_the_deadline_and_is_killed_at_it(tmp_path: Any) -> None:
    """A hung scontrol (here a script that records its pid and sleeps) is killed, with what it
    started, when the lease runs out: by `timeout`, which needs nothing of the aggregator (a
    frozen one included). After the deadline nothing is started at all."""
    import asyncio
    import os
    import sys
    import time

    from podhealth.fencing.slurm import SlurmFencer

    pids = tmp_path / "pids"
    script = tmp_path / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport os, subprocess, time\n"
                      f"child = subprocess.Popen(['sleep', '60'])\n"
                      f"open({str(pids)!r}, 'a').write(f'{{os.getpid()}} {{child.pid}}\\n')\n"
                      "time.sleep(60)\n")
    script.chmod(0o755)
    f = SlurmFencer(scontrol=str(script), timeout=30.0)
    deadline = time.monotonic() + 1.0
    f.guard = lambda: deadline - time.monotonic()
    with pytest.raises(LeaseExpired, match="lease deadline"):
        await f.read("dgx01")
    assert time.monotonic() < deadline + 10.0  # not the 30 s of its own timeout
    [line] = pids.read_text().splitlines()

    def gone(pid: int) -> bool:
        try:
            return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
        except OSError:
            return True
    for _ in range(200):  # the kill reaches its children too (the process group)
        if all(gone(int(p)) for p in line.split()):
            break
        await asyncio.sleep(0.05)
    assert all(gone(int(p)) for p in line.split()), line
    os.unlink(pids)
    with pytest.raises(LeaseExpired, match="not started"):
        await f.read("dgx01")  # the deadline has passed: nothing runs
    assert not pids.exists()
