"""SlurmFencer against a real loopback Slurm 22.05 cluster (tests/harness/slurm.py).

One cluster serves the whole module; each test uses its own node, and the test that stops
slurmctld runs last.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from podhealth.fencing.fence import BatchFencer, FenceOutcome, FenceReason, Fencer, Refused, Transient
from podhealth.fencing.slurm import SlurmFencer, SlurmUnavailable, sanitise_reason
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = pytest.mark.integration

slurm = slurm_fixture(nodes=12)  # dgx07..dgx10: the batch test's own; dgx11, dgx12: the site-format test's

XID = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-0001")


def fencer(c: SlurmCluster, **kw: object) -> SlurmFencer:
    # env= is the cluster's, so nothing depends on (or changes) this process's SLURM_CONF.
    return SlurmFencer(slurm_conf=c.conf, env=c.env, timeout=5.0, **kw)  # type: ignore[arg-type]


def sinfo(c: SlurmCluster, node: str) -> tuple[str, str]:
    state, reason = c.run("sinfo", "-N", "-h", "-n", node, "-o", "%T|%E").stdout.strip().split("|", 1)
    return state, reason


def scontrol_field(c: SlurmCluster, node: str, key: str) -> str:
    out = c.run("scontrol", "show", "node", node).stdout
    for line in out.splitlines():
        line = line.strip()
        if key == "Reason" and line.startswith("Reason="):
            return line[len("Reason="):]
        for tok in line.split():
            if tok.startswith(key + "="):
                return tok[len(key) + 1:]
    return ""


def test_is_a_fencer(slurm: SlurmCluster) -> None:
    assert isinstance(fencer(slurm), Fencer)
    assert slurm.started_in < 5.0, f"cluster took {slurm.started_in:.2f}s to start"


async def test_drain_release_round_trip(slurm: SlurmCluster) -> None:
    f = fencer(slurm)
    before = await f.read("dgx01")
    assert before.exists and not before.fenced

    o = await f.fence("dgx01", XID)
    assert o.changed, o
    assert o.command == ("scontrol", "update", "NodeName=dgx01", "State=DRAIN",
                         "Reason=podhealth: xid GPU3 DRAIN [ev-0001]")
    assert sinfo(slurm, "dgx01") == ("drained", "podhealth: xid GPU3 DRAIN [ev-0001]")
    assert scontrol_field(slurm, "dgx01", "State") == "IDLE+DRAIN"
    assert scontrol_field(slurm, "dgx01", "Reason").startswith("podhealth: xid GPU3 DRAIN [ev-0001] [")
    st = await f.read("dgx01")
    assert st.fenced and st.ours and not st.opted_out and st.reason == "podhealth: xid GPU3 DRAIN [ev-0001]"
    assert "dgx01" in await f.list_fenced()

    # Idempotent: the second drain runs no update, so the reason (and its timestamp) is unchanged.
    stamp = scontrol_field(slurm, "dgx01", "Reason")
    again = await f.fence("dgx01", FenceReason("nvlink", "GPU0", "REPLACE", "ev-0002"))
    assert not again.changed and "already drained by podhealth" in again.output
    assert scontrol_field(slurm, "dgx01", "Reason") == stamp

    r = await f.release("dgx01")
    assert r.changed, r
    assert r.command == ("scontrol", "update", "NodeName=dgx01", "State=RESUME")
    state, reason = sinfo(slurm, "dgx01")
    assert state in ("idle", "idle*") and reason == "none"  # idle* for ~1 s until slurmd's next ping
    assert not (await f.read("dgx01")).fenced
    assert "dgx01" not in await f.list_fenced()
    again_r = await f.release("dgx01")
    assert not again_r.changed


async def test_drain_while_a_job_runs_gives_draining(slurm: SlurmCluster) -> None:
    import subprocess

    job = subprocess.Popen(["srun", "-J", "phtest-busy", "-w", "dgx05", "-n1", "-c1", "sleep", "60"], env=slurm.env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 15
        while slurm.node_states().get("dgx05") != "mixed":
            assert job.poll() is None and time.monotonic() < deadline, "job did not start on dgx05"
            time.sleep(0.05)
        f = fencer(slurm)
        o = await f.fence("dgx05", XID)
        assert o.changed, o
        assert scontrol_field(slurm, "dgx05", "State") == "MIXED+DRAIN"
        assert sinfo(slurm, "dgx05")[0] == "draining"
        st = await f.read("dgx05")
        assert st.fenced and st.ours
    finally:
        slurm.run("scancel", "-n", "phtest-busy", check=False)
        try:
            job.wait(15)
        finally:
            job.kill()


async def test_hand_drained_node_is_never_resumed(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "NodeName=dgx02", "State=DRAIN", "Reason=maintenance by hand: DIMM B2")
    stamp = scontrol_field(slurm, "dgx02", "Reason")
    f = fencer(slurm)
    st = await f.read("dgx02")
    assert st.fenced and not st.ours and st.opted_out and st.reason == "maintenance by hand: DIMM B2"

    o = await f.fence("dgx02", XID)
    assert not o.changed and "someone else" in o.output
    with pytest.raises(Refused, match="someone else"):
        await f.release("dgx02")
    assert sinfo(slurm, "dgx02") == ("drained", "maintenance by hand: DIMM B2")
    assert scontrol_field(slurm, "dgx02", "Reason") == stamp
    listed = await f.list_fenced()
    assert listed["dgx02"].opted_out and not listed["dgx02"].ours


async def test_hand_downed_node_is_left_alone(slurm: SlurmCluster) -> None:
    slurm.run("scontrol", "update", "NodeName=dgx06", "State=DOWN", "Reason=bad DIMM slot=3 [ticket 42]")
    f = fencer(slurm)
    o = await f.fence("dgx06", XID)
    assert not o.changed
    assert sinfo(slurm, "dgx06") == ("down", "bad DIMM slot=3 [ticket 42]")
    with pytest.raises(Refused):
        await f.release("dgx06")
    assert sinfo(slurm, "dgx06")[0] == "down"


async def test_site_time_format_and_an_operators_fail(slurm: SlurmCluster) -> None:
    """A site's SLURM_TIME_FORMAT ("%d/%m %H:%M": a space inside [user@time]) in the aggregator's
    environment: the fencer pins its own and reads every reason exactly. A node an operator set to
    FAIL (22.05 shows IDLE+FAIL, no DRAIN flag) is someone else's fence: never drained over or resumed."""
    env = dict(slurm.env, SLURM_TIME_FORMAT="%d/%m %H:%M")
    f = SlurmFencer(slurm_conf=slurm.conf, env=env, timeout=5.0)
    o = await f.fence("dgx11", XID)
    assert o.changed, o
    st = await f.read("dgx11")
    assert st.ours and st.reason == "podhealth: xid GPU3 DRAIN [ev-0001]"
    import re
    import subprocess

    seen = subprocess.run(["scontrol", "show", "node", "-o", "dgx11"], env=env, capture_output=True, text=True,
                          timeout=10).stdout  # what an operator with that profile sees
    assert re.search(r"\[ev-0001\] \[root@\d\d/\d\d \d\d:\d\d\]", seen), seen
    slurm.run("scontrol", "update", "NodeName=dgx12", "State=FAIL", "Reason=ops: PSU fan [INC-9]")
    st = await f.read("dgx12")
    assert st.fenced and not st.ours and st.opted_out and st.reason == "ops: PSU fan [INC-9]"
    assert scontrol_field(slurm, "dgx12", "State") == "IDLE+FAIL"
    again = await f.fence("dgx12", XID)
    assert not again.changed and "someone else" in again.output
    with pytest.raises(Refused):
        await f.release("dgx12")
    assert sinfo(slurm, "dgx12") == ("fail", "ops: PSU fan [INC-9]")
    assert (await f.release("dgx11")).changed


async def test_bad_names_never_reach_scontrol(slurm: SlurmCluster) -> None:
    f = fencer(slurm)
    for bad in ("dgx[03-04]", "dgx03,dgx04", "dgx03 State=RESUME", "ALL", ""):
        with pytest.raises(Refused) as e:
            await f.fence(bad, XID)
        assert e.value.command == () and e.value.error, bad
        with pytest.raises(Refused):
            await f.release(bad)
    with pytest.raises(ValueError):
        await f.read("dgx[03-04]")
    assert sinfo(slurm, "dgx03")[0] == "idle" and sinfo(slurm, "dgx04")[0] == "idle"


async def test_unknown_node(slurm: SlurmCluster) -> None:
    f = fencer(slurm)
    st = await f.read("nosuch01")
    assert not st.exists and not st.fenced
    with pytest.raises(Refused, match="not known"):
        await f.fence("nosuch01", XID)


async def test_reason_is_sanitised_end_to_end(slurm: SlurmCluster) -> None:
    nasty = FenceReason(check='xid"\nState=RESUME', entity="GPU 0 [uuid]", action="DRAIN", id="e'1")
    f = fencer(slurm)
    o = await f.fence("dgx03", nasty)
    assert o.changed
    want = sanitise_reason(nasty)
    assert sinfo(slurm, "dgx03") == ("drained", want)
    assert (await f.read("dgx03")).ours
    assert (await f.release("dgx03")).changed


async def test_batch_read_and_fence_answer_per_node_like_the_single_calls(slurm: SlurmCluster) -> None:
    f = fencer(slurm)
    assert isinstance(f, BatchFencer)
    slurm.run("scontrol", "update", "NodeName=dgx09", "State=DRAIN", "Reason=hand drain: PSU")
    assert (await f.fence("dgx10", XID)).changed
    nodes = ["dgx07", "dgx08", "dgx09", "dgx10", "nosuch01", "dgx[07-08]"]
    read = await f.read_many(nodes)
    assert "dgx[07-08]" not in read  # left for read(), which says why
    for n in nodes[:5]:
        single = await f.read(n)
        assert (read[n].exists, read[n].fenced, read[n].ours, read[n].reason) == (
            single.exists, single.fenced, single.ours, single.reason), n
    reasons = {n: FenceReason("xid", "GPU3", "REBOOT", f"ev-{n}") for n in nodes}
    out = await f.fence_many(list(reasons.items()))
    for n in ("dgx07", "dgx08"):  # drained, each with its own reason, the audit naming the single command
        o = out[n]
        assert isinstance(o, FenceOutcome) and o.changed, o
        assert o.command == ("scontrol", "update", f"NodeName={n}", "State=DRAIN",
                                  f"Reason=podhealth: xid GPU3 REBOOT [ev-{n}]")
        assert sinfo(slurm, n) == ("drained", f"podhealth: xid GPU3 REBOOT [ev-{n}]")
    o = out["dgx09"]
    assert isinstance(o, FenceOutcome) and not o.changed and "someone else" in o.output
    assert sinfo(slurm, "dgx09") == ("drained", "hand drain: PSU")
    o = out["dgx10"]
    assert isinstance(o, FenceOutcome) and not o.changed and "already drained by podhealth" in o.output
    assert sinfo(slurm, "dgx10")[1] == "podhealth: xid GPU3 DRAIN [ev-0001]"  # not overwritten
    e = out["nosuch01"]
    assert isinstance(e, Refused) and "not known" in e.error
    e = out["dgx[07-08]"]
    assert isinstance(e, Refused) and e.command == ()
    again = (await f.fence_many([("dgx07", reasons["dgx07"])]))["dgx07"]  # idempotent
    assert isinstance(again, FenceOutcome) and not again.changed
    for n in ("dgx07", "dgx08", "dgx10"):
        assert (await f.release(n)).changed
    with pytest.raises(Refused):
        await f.release("dgx09")


async def test_scontrol_timeout_kills_it(tmp_path: Path) -> None:
    # A hung scontrol (slurmctld wedged) must be killed, not waited on.
    pidfile = tmp_path / "pid"
    fake = tmp_path / "scontrol"
    fake.write_text(f"#!/bin/sh\necho $$ > {pidfile}\nexec sleep 30\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    f = SlurmFencer(scontrol=str(fake), timeout=0.5)
    t0 = time.monotonic()
    with pytest.raises(Transient, match="timed out"):
        await f.fence("dgx01", XID)
    assert time.monotonic() - t0 < 3.0
    pid = int(pidfile.read_text())
    assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    with pytest.raises(SlurmUnavailable, match="timed out"):
        await f.read("dgx01")
    t0 = time.monotonic()
    many = await f.fence_many([("dgx01", XID), ("dgx02", XID)])
    assert time.monotonic() - t0 < 3.0
    assert all(isinstance(o, Transient) and "timed out" in o.error for o in many.values()) and len(many) == 2


async def test_missing_scontrol_is_unavailable() -> None:
    f = SlurmFencer(scontrol="/nonexistent/scontrol", timeout=1.0)
    with pytest.raises(SlurmUnavailable, match="cannot run"):
        await f.list_fenced()
    with pytest.raises(Transient, match="cannot run"):
        await f.fence("dgx01", XID)


async def test_controller_down_then_back(slurm: SlurmCluster) -> None:
    """Last in the module: it restarts slurmctld."""
    f = fencer(slurm)  # one scontrol run per call: the action runner is the one retrier
    slurm.stop_ctld()
    try:
        t0 = time.monotonic()
        with pytest.raises(Transient, match="Unable to contact slurm controller"):
            await f.fence("dgx04", XID)
        took = time.monotonic() - t0
        assert took < f.budget + 1.0
        once = fencer(slurm)
        with pytest.raises(SlurmUnavailable):
            await once.read("dgx04")
        with pytest.raises(SlurmUnavailable):
            await once.list_fenced()
        with pytest.raises(Transient):
            await once.release("dgx05")
    finally:
        slurm.start_ctld()
    # The caller kept the action pending; its retry now drains the node.
    o = await f.fence("dgx04", XID)
    assert o.changed, o
    assert sinfo(slurm, "dgx04")[1] == "podhealth: xid GPU3 DRAIN [ev-0001]"
    assert sinfo(slurm, "dgx04")[0].startswith("drain")
    # Fences made before the restart survive it (StateSaveLocation), including the hand drain.
    listed = await f.list_fenced()
    assert listed["dgx05"].ours and listed["dgx02"].opted_out
    assert os.environ.get("SLURM_CONF") != str(slurm.conf)  # the harness never touched our environment
