"""Slurm node states podhealth has to read right on clusters it was never tested on.

Compound states and fields of Slurm 21.08 -> 24.11 `scontrol show node -o` (a hand-written fixture in
the format of each version's slurm_sprint_node_table), real loopback 22.05 captures (FAIL, a hand
drain, DOWN with a reason, a missing node, four SLURM_TIME_FORMATs), and sinfo's long and compact
state names. What matters is the fencing decision: someone else's drain is never fenced over or
resumed, a DOWN+NOT_RESPONDING node is never drained again, and a pending reboot is seen.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from podhealth.fencing.fence import FenceOutcome, FenceReason, Refused, Transient
from podhealth.fencing.slurm import (
    SlurmFencer, SlurmNode, _parse_listing, _rebooting, _state_of, parse_show_node, parse_state,
)

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
VERSIONS = OWN / "scontrol_show_node_o_versions_compound_states.txt"
XID = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-9")


def _nodes(path: Path) -> dict[str, SlurmNode]:
    return {n.name: n for n in parse_show_node(path.read_text())}


# name -> (fenced, ours, rebooting); fenced = out of service on purpose (drained/failed, or
# DOWN with a reason), ours = the reason starts with "podhealth:".
EXPECTED = {
    "dgx-h100-001": (True, True, False),     # MIXED+DRAIN: draining, ours
    "dgx-h100-002": (True, False, False),    # ALLOCATED+DRAIN by an operator, Comment/Extra after it
    "dgx-h100-003": (True, False, False),    # DOWN+NOT_RESPONDING "Not responding": Slurm's own, no re-drain
    "dgx-h100-004": (True, True, False),     # DOWN+DRAIN+NOT_RESPONDING with our reason
    "dgx-h100-005": (False, False, False),   # IDLE+CLOUD+POWERED_DOWN: free (a powered-down cloud node)
    "dgx-h100-006": (False, False, False),   # IDLE+PLANNED: free (the backfill scheduler's plan)
    "dgx-h100-007": (True, True, True),      # our reboot, requested
    "dgx-h100-008": (True, True, True),      # our reboot, issued: Slurm appended ": reboot issued"
    "dgx-h100-009": (False, False, True),    # someone's plain `scontrol reboot`, not drained
    "dgx-h100-010": (True, True, False),     # back from our reboot (nextstate=DOWN): ": reboot complete"
    "dgx-h100-011": (False, False, False),   # in a maintenance reservation, not drained
    "dgx-h100-012": (False, False, False),   # a dynamic node
    "dgx-h100-013": (True, False, False),    # INVALID_REG: Slurm's own drain
    "dgx-h100-014": (True, False, False),    # IDLE+FAIL by an operator (22.05 prints no DRAIN with FAIL)
    "dgx-h100-015": (False, False, False),   # MIXED+COMPLETING
    "dgx-h100-016": (True, False, False),    # an operator's reason that mentions podhealth, not ours
    "dgx-h100-017": (True, False, False),    # NHC's drain, brackets and key=value in the reason
    "dgx-h100-018": (True, True, False),     # ours, then POWER_DOWN queued by power saving
    "dgx-h100-019": (False, False, False),   # IDLE+NOT_RESPONDING: not down yet, not fenced
    "dgx-h100-020": (True, False, False),    # DOWN "Node unexpectedly rebooted": Slurm's own
    "dgx-h100-021": (True, False, True),     # someone's reboot issued (DOWN with a reason): theirs
}


EXPECTED_STATES = {n.name: n.state for n in parse_show_node(VERSIONS.read_text())}


def test_every_version_and_compound_state() -> None:
    nodes = _nodes(VERSIONS)
    assert list(nodes) == list(EXPECTED)
    for name, (fenced, ours, rebooting) in EXPECTED.items():
        st = _state_of(nodes[name], VERSIONS.read_text().splitlines()[list(EXPECTED).index(name)])
        assert (st.fenced, st.ours, _rebooting(st)) == (fenced, ours, rebooting), name
        # opted_out (what the aggregator records as "drained by someone else") is exactly the
        # fences that are not ours.
        assert st.opted_out == (fenced and not ours), name
        assert nodes[name].field("CPUTot") == "224", f"{name}: fields after State lost"
        assert nodes[name].partitions == ("gpu", "debug"), name


def test_fields_new_and_old_versions_add() -> None:
    n = _nodes(VERSIONS)
    assert n["dgx-h100-001"].field("ResumeAfterTime") == "None"
    assert n["dgx-h100-001"].field("LastBusyTime") == "2024-12-01T09:10:11"
    assert n["dgx-h100-014"].field("ExtSensorsJoules") == "n/s" and n["dgx-h100-014"].field("CapWatts") == "n/a"
    assert n["dgx-h100-005"].field("InstanceId") == "i-0abc123def4567890"
    assert n["dgx-h100-005"].field("InstanceType") == "p5.48xlarge"
    assert n["dgx-h100-007"].field("NextState") == "DOWN"
    d2 = n["dgx-h100-002"]
    assert d2.reason == "ops: DIMM B2 [INC-4411]" and d2.reason_user == "alice"
    assert d2.field("Comment") == "swap booked, do not resume"
    assert d2.field("Extra") == '{"rack":"r07","slot":3}' and d2.field("ReservationName") == "maint_dec"
    assert n["dgx-h100-008"].reason == "podhealth: xid GPU3 REBOOT [ev-0008] : reboot issued"
    assert n["dgx-h100-017"].reason == "NHC: check_hw_ib: port=1 state Down [ticket=42]"
    assert n["dgx-h100-020"].reason.startswith("Node unexpectedly rebooted boot_time=1733040000")
    assert n["dgx-h100-013"].flags == ("DRAIN", "INVALID_REG")
    assert (n["dgx-h100-005"].base_state, n["dgx-h100-005"].flags) == ("IDLE", ("CLOUD", "POWERED_DOWN"))


@pytest.mark.parametrize(("state", "base", "flags", "drained"), [
    # sinfo %t (compact), lower-cased by sinfo
    ("drain", "DRAIN", (), True), ("drain*", "DRAIN", ("NOT_RESPONDING",), True), ("drng", "DRNG", (), True),
    ("drng@", "DRNG", ("REBOOT_REQUESTED",), True), ("failg", "FAILG", (), True), ("fail", "FAIL", (), True),
    ("alloc+", "ALLOC", ("COMPLETING",), False), ("mix-", "MIX", ("PLANNED",), False),
    ("boot^", "BOOT", ("REBOOT_ISSUED",), False), ("idle%", "IDLE", ("POWERING_DOWN",), False),
    ("idle!", "IDLE", ("POWER_DOWN",), False), ("plnd", "PLND", (), False), ("resv", "RESV", (), False),
    # sinfo %T (long)
    ("drained$", "DRAINED", ("MAINTENANCE",), True), ("draining^", "DRAINING", ("REBOOT_ISSUED",), True),
    ("failing*", "FAILING", ("NOT_RESPONDING",), True), ("allocated+", "ALLOCATED", ("COMPLETING",), False),
    ("reboot^", "REBOOT", ("REBOOT_ISSUED",), False), ("inval", "INVAL", (), False),
    # scontrol
    ("ALLOCATED+DRAIN", "ALLOCATED", ("DRAIN",), True), ("IDLE+FAIL", "IDLE", ("FAIL",), True),
    ("DOWN+DRAIN+NOT_RESPONDING", "DOWN", ("DRAIN", "NOT_RESPONDING"), True),
    ("IDLE+CLOUD+POWERED_DOWN", "IDLE", ("CLOUD", "POWERED_DOWN"), False),
    ("MIXED+COMPLETING", "MIXED", ("COMPLETING",), False),
])
def test_state_names_of_every_tool(state: str, base: str, flags: tuple[str, ...], drained: bool) -> None:
    assert parse_state(state) == (base, flags)
    assert SlurmNode(name="n", state=state, base_state=base, flags=flags).drained is drained


def test_loopback_fail_drain_down_and_sinfo_agree() -> None:
    """Real 22.05: `State=FAIL` shows as IDLE+FAIL (no DRAIN flag), sinfo %t says `drain` for IDLE+DRAIN."""
    nodes = _nodes(OWN / "scontrol_show_node_o_loopback_fail_drain_down.txt")
    assert nodes["dgx01"].state == "IDLE+FAIL" and nodes["dgx01"].drained and nodes["dgx01"].ours
    assert nodes["dgx02"].reason == "hand drain: PSU [ticket 7]" and nodes["dgx02"].fenced
    assert not nodes["dgx02"].ours
    assert nodes["dgx03"].state == "DOWN" and nodes["dgx03"].fenced and not nodes["dgx03"].ours
    assert not nodes["dgx04"].fenced
    for line in (OWN / "sinfo_N_h_o_NtTE_loopback_fail_drain_down.txt").read_text().splitlines():
        name, compact, long, reason = line.split("|", 3)
        if name not in nodes:
            continue
        for form in (compact, long):
            base, flags = parse_state(form)
            sinfo_drained = SlurmNode(name=name, state=form, base_state=base, flags=flags).drained
            assert sinfo_drained == nodes[name].drained, f"{name}: sinfo {form!r}"
        assert nodes[name].reason == ("" if reason == "none" else reason)


def test_real_sinfo_compact_and_long_states_agree(shared_fixtures: Path) -> None:
    """gcm's real `sinfo -o` sample (Slurm 20.11) prints each node's state twice, %t and %T
    (`drain*` / `drained*`, `alloc` / `allocated`): both must mean the same to podhealth."""
    rows = [line.split("|") for line in (shared_fixtures / "slurm" / "sinfo_o_all_fields_pipe_gcm.txt")
            .read_text().splitlines()]
    head = [h.strip() for h in rows[0]]
    compact, long = (i for i, h in enumerate(head) if h == "STATE")
    seen = set()
    for row in rows[1:]:
        pair = []
        for form in (row[compact].strip(), row[long].strip()):
            base, flags = parse_state(form)
            n = SlurmNode(name="n", state=form, base_state=base, flags=flags)
            pair.append((n.drained, n.not_responding))
        assert pair[0] == pair[1], (row[compact], row[long])
        seen.add(pair[0])
    assert seen == {(True, True), (False, False)}  # drain* (not responding) and alloc both occur


@pytest.mark.parametrize("fmt", ["relative", "epoch", "dmy"])
def test_site_time_format_does_not_change_the_reason(fmt: str) -> None:
    """Captured with SLURM_TIME_FORMAT=relative, %s and "%d/%m %H:%M" (a space inside the brackets)."""
    base = _nodes(OWN / "scontrol_show_node_o_loopback_fail_drain_down.txt")
    other = _nodes(OWN / f"scontrol_show_node_o_loopback_time_{fmt}.txt")
    for name, n in other.items():
        assert (n.reason, n.reason_user, n.fenced, n.ours) == (
            base[name].reason, base[name].reason_user, base[name].fenced, base[name].ours), name
        assert n.reason_time and n.reason_time != base[name].reason_time


def test_a_reason_of_two_lines_and_a_comment_after_it() -> None:
    """Real 22.05: `Reason="...mounted\nsee INC-77 Tag=x"` prints its second line 8 spaces on with -o
    (10 in the multi-line form), after the [user@time]; `Comment=` follows the reason. Both forms
    give the same node, and the second line is reason text, not a field."""
    one = _nodes(OWN / "scontrol_show_node_o_loopback_two_line_reason_comment.txt")
    multi = _nodes(OWN / "scontrol_show_node_loopback_two_line_reason_comment.txt")
    assert one == multi
    d1 = one["dgx01"]
    assert d1.reason == "NHC: check_fs_mount: /scratch not mounted\nsee INC-77 Tag=x"
    assert d1.reason_user == "root" and d1.reason_time.startswith("2026-12-02T")
    assert d1.field("Tag") == "" and d1.fenced and not d1.ours
    d2 = one["dgx02"]
    assert d2.reason == "podhealth: xid GPU3 DRAIN [ev-1]" and d2.ours and d2.field("Comment") == "swap booked"


def test_missing_nodes_in_a_listing() -> None:
    """`scontrol show node -o dgx06,nosuch,nosuch2` (22.05): rc 1, the known node, a line per unknown one."""
    found, missing = _parse_listing((OWN / "scontrol_show_node_o_loopback_not_found.txt").read_text())
    assert list(found) == ["dgx06"] and not found["dgx06"].fenced
    assert missing == {"nosuch": "Node nosuch not found", "nosuch2": "Node nosuch2 not found"}


# ---- the fencer's decisions on those states, through a stand-in scontrol ----------------------
#
# The stand-in answers `show node` from the fixture (and `Node X not found`, rc 1, as 22.05 does)
# and records every other call without changing anything, so a test sees exactly which updates
# the fencer asked for. The states themselves come from the fixture, not from the stand-in.

_STANDIN = '''\
import json, os, sys
args = sys.argv[1:]
with open(os.environ["PH_LOG"], "a") as log:
    log.write(json.dumps({"argv": args, "tf": os.environ.get("SLURM_TIME_FORMAT")}) + "\\n")
if args[:2] == ["show", "node"]:
    lines = [l for l in open(os.environ["PH_FIXTURE"]).read().splitlines() if l.startswith("NodeName=")]
    by = {l.split()[0].split("=", 1)[1]: l for l in lines}
    names = [a for a in args[2:] if a != "-o"]
    if not names:
        print("\\n".join(lines)); sys.exit(0)
    rc = 0
    for n in names[0].split(","):
        if n in by:
            print(by[n])
        else:
            print(f"Node {n} not found"); rc = 1
    sys.exit(rc)
sys.exit(0)
'''


@pytest.fixture()
def standin(tmp_path: Path) -> tuple[SlurmFencer, Path]:
    script = tmp_path / "scontrol"
    script.write_text(f"#!{sys.executable}\n{_STANDIN}")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.jsonl"
    log.touch()
    env = {"PATH": os.environ.get("PATH", ""), "PH_LOG": str(log), "PH_FIXTURE": str(VERSIONS),
           "SLURM_TIME_FORMAT": "%d/%m %H:%M"}  # a site's profile.d setting must not reach scontrol
    return SlurmFencer(scontrol=str(script), env=env, timeout=10.0), log


def _writes(log: Path) -> list[list[str]]:
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert all(c["tf"] == "standard" for c in calls), calls
    return [c["argv"] for c in calls if c["argv"][:2] != ["show", "node"]]


@pytest.mark.parametrize("name", [n for n, (fenced, ours, _) in EXPECTED.items() if fenced and not ours])
def test_someone_elses_fence_is_never_touched(standin: tuple[SlurmFencer, Path], name: str) -> None:
    fencer, log = standin

    async def go() -> None:
        st = await fencer.read(name)
        assert st.fenced and not st.ours and st.opted_out
        fenced = await fencer.fence(name, XID)
        assert not fenced.changed and "someone else" in fenced.output
        seen = await fencer.fence_seen(name, XID, st)  # the runner's read standing for fence()'s
        assert not seen.changed and "someone else" in seen.output
        with pytest.raises(Refused, match="does not resume"):
            await fencer.release(name)
        with pytest.raises(Refused, match="not rebooted"):
            await fencer.reboot(name, XID)
        with pytest.raises(Refused, match="left alone"):
            await fencer.remark(name, XID)
        batch = await fencer.fence_many([(name, XID)])
        o = batch[name]
        assert isinstance(o, FenceOutcome) and not o.changed

    asyncio.run(go())
    assert _writes(log) == []  # not one update, reboot or drain session


def test_down_not_responding_is_not_drained_again(standin: tuple[SlurmFencer, Path]) -> None:
    """Slurm's own DOWN ("Not responding") counts as fenced by someone else: every fence is a no-op,
    however often the aggregator asks, and list_fenced reports it once, as not ours."""
    fencer, log = standin

    async def go() -> None:
        for _ in range(3):
            o = await fencer.fence("dgx-h100-003", XID)
            assert not o.changed
        listed = await fencer.list_fenced()
        assert listed["dgx-h100-003"].opted_out and not listed["dgx-h100-003"].ours
        assert {n for n, st in listed.items() if st.ours} == {n for n, v in EXPECTED.items() if v[1]}
        assert set(listed) == {n for n, v in EXPECTED.items() if v[0]}

    asyncio.run(go())
    assert _writes(log) == []


def test_our_fences_are_released_and_reboots_not_asked_twice(standin: tuple[SlurmFencer, Path]) -> None:
    fencer, log = standin

    async def go() -> None:
        for name in ("dgx-h100-007", "dgx-h100-008"):  # a reboot already requested / issued
            o = await fencer.reboot(name, XID)
            assert not o.changed and "already requested" in o.output
        for name in ("dgx-h100-001", "dgx-h100-004", "dgx-h100-010", "dgx-h100-018"):
            with pytest.raises(Transient, match="still fenced"):  # the stand-in changes nothing
                await fencer.release(name)

    asyncio.run(go())
    assert _writes(log) == [["update", f"NodeName={n}", "State=RESUME"]
                            for n in ("dgx-h100-001", "dgx-h100-004", "dgx-h100-010", "dgx-h100-018")]


def test_reboot_slurm_ignores_is_a_clear_refusal(standin: tuple[SlurmFencer, Path]) -> None:
    """scontrol(1): a reboot request is ignored for POWER_DOWN/POWERED_DOWN nodes (rc 0, nothing
    changes): read back, that is an error naming the state, not a reboot the ladder waits for."""
    fencer, log = standin

    async def go() -> None:
        with pytest.raises(Refused) as e:
            await fencer.reboot("dgx-h100-018", XID)
        assert e.value.command[1] == "reboot"
        assert e.value.error == ("after scontrol reboot dgx-h100-018 shows no reboot pending: State=IDLE+DRAIN+POWER_DOWN "
                           "Reason='podhealth: ib_port mlx5_0/1 DRAIN [ev-0018]'")

    asyncio.run(go())
    assert _writes(log) == [["reboot", "ASAP", "nextstate=DOWN", "reason=podhealth: xid GPU3 DRAIN [ev-9]",
                             "dgx-h100-018"]]


def test_free_states_are_drained(standin: tuple[SlurmFencer, Path]) -> None:
    """A powered-down cloud node, a planned one, one in a maintenance reservation, one with a reboot
    pending by someone else, one not responding yet: none is fenced, so fence asks for the drain.
    scontrol's exit 0 says slurmctld applied it: the node is not read back (issue 32 §4; the
    stand-in's state does not change, so a read-back would have said otherwise)."""
    fencer, log = standin
    free = [n for n, (fenced, _, _) in EXPECTED.items() if not fenced]

    async def go() -> None:
        for name in free:
            o = await fencer.fence(name, XID)
            assert o.changed, o

    asyncio.run(go())
    assert [w[:4] for w in _writes(log)] == [["update", f"NodeName={n}", "State=DRAIN",
                                              "Reason=podhealth: xid GPU3 DRAIN [ev-9]"] for n in free]


def test_unknown_node(standin: tuple[SlurmFencer, Path]) -> None:
    fencer, log = standin

    async def go() -> None:
        st = await fencer.read("dgx-h100-999")
        assert not st.exists and st.raw == "Node dgx-h100-999 not found"
        with pytest.raises(Refused) as e:
            await fencer.fence("dgx-h100-999", XID)
        assert e.value.error == "node dgx-h100-999 is not known to Slurm"
        with pytest.raises(Refused, match="not known"):
            await fencer.release("dgx-h100-999")
        many = await fencer.read_many(["dgx-h100-001", "dgx-h100-999"])
        assert many["dgx-h100-001"].ours and not many["dgx-h100-999"].exists

    asyncio.run(go())
    assert _writes(log) == []
