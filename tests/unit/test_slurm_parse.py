"""The pure `scontrol show node` parser and the reason sanitiser, on real captures and edge cases."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.fencing.fence import FenceReason
from podhealth.fencing.slurm import (
    MAX_REASON_CHARS,
    SlurmNode,
    parse_show_node,
    parse_state,
    sanitise_reason,
)

OWN = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"


def _by_name(nodes: list[SlurmNode]) -> dict[str, SlurmNode]:
    return {n.name: n for n in nodes}


@pytest.mark.parametrize(("state", "base", "flags"), [
    ("IDLE", "IDLE", ()),
    ("IDLE+DRAIN", "IDLE", ("DRAIN",)),
    ("MIXED+DRAIN", "MIXED", ("DRAIN",)),
    ("DOWN+NOT_RESPONDING", "DOWN", ("NOT_RESPONDING",)),
    ("DOWN*+NOT_RESPONDING", "DOWN", ("NOT_RESPONDING",)),
    ("IDLE+DRAIN+MAINTENANCE+RESERVED", "IDLE", ("DRAIN", "MAINTENANCE", "RESERVED")),
    ("down*", "DOWN", ("NOT_RESPONDING",)),
    ("idle~", "IDLE", ("POWERED_DOWN",)),
    ("drained", "DRAINED", ()),
    ("", "", ()),
])
def test_parse_state(state: str, base: str, flags: tuple[str, ...]) -> None:
    assert parse_state(state) == (base, flags)


def test_loopback_one_line_capture() -> None:
    nodes = _by_name(parse_show_node((OWN / "scontrol_show_node_o_loopback_drain_mixed_down.txt").read_text()))
    assert list(nodes) == ["dgx01", "dgx02", "dgx03", "dgx04", "dgx05"]
    d1 = nodes["dgx01"]
    assert (d1.base_state, d1.flags) == ("MIXED", ("DRAIN",))
    assert d1.reason == "podhealth: xid GPU3 DRAIN [ev-0001]"
    assert (d1.reason_user, d1.reason_time) == ("root", "2026-11-29T23:17:30")
    assert d1.drained and d1.fenced and d1.ours
    assert d1.field("AllocTRES") == "cpu=1"
    assert d1.field("OS") == "Linux 6.18.44-fc-v669 #1 SMP PREEMPT_DYNAMIC @0"
    assert d1.field("CfgTRES") == "cpu=2,mem=1000M,billing=2"
    assert d1.partitions == ("gpu",)
    assert nodes["dgx02"].ours and nodes["dgx02"].state == "IDLE+DRAIN"
    d3 = nodes["dgx03"]
    assert d3.reason == "bad DIMM slot=3 [ticket 42] ask ops"
    assert d3.down and not d3.drained and d3.fenced and not d3.ours
    d4 = nodes["dgx04"]
    assert d4.reason == "maintenance by hand" and d4.fenced and not d4.ours
    d5 = nodes["dgx05"]
    assert d5.state == "IDLE" and d5.reason == "" and not d5.fenced and d5.field("AllocTRES") == ""


def test_multi_line_capture_means_the_same() -> None:
    one = parse_show_node((OWN / "scontrol_show_node_o_loopback_drain_mixed_down.txt").read_text())
    multi = parse_show_node((OWN / "scontrol_show_node_loopback_drain_mixed_down.txt").read_text())
    assert one == multi


def test_after_controller_restart() -> None:
    nodes = _by_name(parse_show_node((OWN / "scontrol_show_node_o_loopback_after_ctld_restart.txt").read_text()))
    assert (nodes["dgx02"].base_state, nodes["dgx02"].flags) == ("UNKNOWN", ("DRAIN",))
    assert nodes["dgx02"].ours
    assert nodes["dgx04"].fenced and not nodes["dgx04"].ours
    assert nodes["dgx05"].state == "UNKNOWN" and not nodes["dgx05"].fenced
    assert nodes["dgx05"].field("CPULoad") == "N/A" and nodes["dgx05"].field("OS") == ""


def test_sinfo_agrees_with_scontrol_on_reasons() -> None:
    nodes = _by_name(parse_show_node((OWN / "scontrol_show_node_o_loopback_drain_mixed_down.txt").read_text()))
    for line in (OWN / "sinfo_N_h_o_NTE_loopback.txt").read_text().splitlines():
        name, state, reason = line.split("|", 2)
        assert nodes[name].reason == ("" if reason == "none" else reason)
        assert nodes[name].drained == (state in ("drained", "draining"))


def test_shared_corpus(shared_fixtures: Path) -> None:
    files = sorted((shared_fixtures / "slurm").glob("scontrol_show_node_*.txt"))
    files = [f for f in files if not f.name.endswith(".source.txt")]
    assert files, "no scontrol_show_node_*.txt in the corpus"
    seen: dict[str, SlurmNode] = {}
    for f in files:
        nodes = parse_show_node(f.read_text())
        assert nodes, f"{f.name}: nothing parsed"
        for n in nodes:
            assert n.state and n.base_state, f"{f.name}: {n.name} has no state"
            assert n.field("CPUTot").isdigit(), f"{f.name}: {n.name} lost CPUTot"
            assert not n.ours, f"{f.name}: {n.name} cannot be podhealth's"
        seen.update(_by_name(nodes))
    # Facts from the captures (see their .source.txt files).
    if "rtx6000-ada" in seen:
        n = seen["rtx6000-ada"]
        assert (n.base_state, n.flags) == ("DOWN", ("NOT_RESPONDING",))
        assert n.reason == "Not responding" and n.reason_user == "root" and n.fenced
        assert n.field("Gres") == "gpu:8(S:0-1)"
    if "cluster-h100-9-78" in seen:
        n = seen["cluster-h100-9-78"]
        assert n.flags == ("DRAIN", "MAINTENANCE", "RESERVED")
        assert n.reason == "Prolog error: 571 xid 13 errors" and n.reason_time == "2023-12-24T06:51:08"
        assert n.field("ReservationName") == "example" and n.partitions == ("low", "general", "high")
        assert n.field("OS") == "Linux 5.15.133+ #1 SMP Wed Nov 8 17:30:28 UTC 2023"
        assert not seen["cluster-h100-9-69"].fenced and seen["cluster-h100-9-69"].reason == ""
    if "yigou-dev-102-68" in seen:
        n = seen["yigou-dev-102-68"]
        assert n.state == "IDLE+DRAIN" and n.reason_user == "slurm"
        assert n.reason == "gres/gpu count reported lower than configured (0 < 1)"


def test_corpus_records_reparse_as_one_line(shared_fixtures: Path) -> None:
    """Folding a multi-line record into scontrol's -o form must not change what we parse."""
    files = [f for f in sorted((shared_fixtures / "slurm").glob("scontrol_show_node_*.txt"))
             if not f.name.endswith(".source.txt")]
    assert files
    for f in files:
        multi = parse_show_node(f.read_text())
        one_line = "\n".join(" ".join(ln.strip() for ln in block.splitlines() if ln.strip())
                             for block in f.read_text().split("\n\n") if block.strip())
        assert parse_show_node(one_line) == multi, f.name


def test_one_line_reason_followed_by_more_fields() -> None:
    # Slurm 23.11 prints ReservationName after Reason; the reason itself holds "key=value" text.
    text = ("NodeName=n1 State=DOWN*+NOT_RESPONDING Partitions=gpu "
            "Reason=bad cable port=7 [x] [admin@2024-01-02T03:04:05] ReservationName=maint Comment=(null)\n")
    (n,) = parse_show_node(text)
    assert n.reason == "bad cable port=7 [x]"
    assert (n.reason_user, n.reason_time) == ("admin", "2024-01-02T03:04:05")
    assert n.field("ReservationName") == "maint" and n.field("Comment") == "(null)"
    assert (n.base_state, n.flags) == ("DOWN", ("NOT_RESPONDING",))


def test_reason_without_user_and_time_runs_to_end_of_line() -> None:
    (n,) = parse_show_node("NodeName=n1 State=IDLE+DRAIN Reason=cpu count X=1 Y=2\n")
    assert n.reason == "cpu count X=1 Y=2" and n.reason_user == ""
    assert n.field("X") == ""  # not mistaken for a field


def test_garbage_and_truncation_do_not_crash() -> None:
    assert parse_show_node("") == []
    assert parse_show_node("Node nosuch not found\n") == []
    assert parse_show_node("slurm_load_node error: Unable to contact slurm controller\n") == []
    full = (OWN / "scontrol_show_node_loopback_drain_mixed_down.txt").read_text()
    cut = full[: full.index("NodeName=dgx03") + 200]
    nodes = parse_show_node(cut)
    assert [n.name for n in nodes] == ["dgx01", "dgx02", "dgx03"]
    assert nodes[2].reason == ""  # its Reason line was cut off
    assert parse_show_node("NodeName= State=IDLE\n") == []


def test_sanitise_reason() -> None:
    r = sanitise_reason(FenceReason(check="xid", entity="GPU0", action="DRAIN", id="ev-1"))
    assert r == "podhealth: xid GPU0 DRAIN [ev-1]"
    nasty = FenceReason(check='x"id\nState=RESUME', entity="GPU 0 [uuid]", action="", id="a]b'c\\d")
    r = sanitise_reason(nasty)
    assert r == "podhealth: x_id_State=RESUME GPU_0_uuid - [a_b_c_d]"
    assert not any(c in r for c in "\"'\n\\")
    long = sanitise_reason(FenceReason(check="c" * 500, entity="e" * 500, action="a" * 500, id="i" * 500))
    assert len(long) <= MAX_REASON_CHARS and long.startswith("podhealth: ccc")
    uni = sanitise_reason(FenceReason(check="t\u00e9mp\u2028", entity="GPU0", action="DRAIN", id="1"))
    assert uni.isascii() and "\u2028" not in uni
