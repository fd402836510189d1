"""NFS client mounts of every shape a fleet shows: NFSv3, v4.0, v4.1, v4.2; `xprt: tcp` (10 or
13 numbers, several lines with nconnect), `xprt: rdma` (27), `xprt: udp` (7); statvers 1.0 and
1.1; per-op lines with 8 and 9 numbers; a mount with no RPC statistics yet; other filesystems
in between; and a mount table cut short. Through the parser, the real collector and the checks:
nothing here may FAIL a healthy mount or raise.

tests/fixtures/nfs/mountstats_variants.txt is the project's own file in the kernel's layout
(fs/nfs/super.c nfs_show_stats). A hung mount's probe is covered in test_nfs_collector.py
(`test_hung_probe_reports_timeout`, and three hung mounts costing one timeout).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive import nfs
from podhealth.checks.passive.context import Context, observe_counters
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors.nfs import NfsCollector
from podhealth.collectors.nfs_parse import parse_mountstats
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Sample, Status

OK = ["/bin/sh", "-c", "echo ready; while read _; do echo ok; done"]
MOUNTS = ("/home", "/datasets", "/projects", "/scratch", "/opt/tools", "/mnt/fresh")
T0 = 1_700_000_000.0
_COUNTERS = frozenset({"nfs_operation_rtt_seconds", "nfs_operation_requests", "nfs_operation_transmissions"})


@pytest.fixture
def variants(own_fixtures: Path) -> str:
    return (own_fixtures / "nfs" / "mountstats_variants.txt").read_text()


def _proc(root: Path, mountstats: str) -> Path:
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "self" / "mountstats").write_text(mountstats)
    (root / "net" / "rpc").mkdir(parents=True, exist_ok=True)
    (root / "net" / "rpc" / "nfs").write_text("net 0 0 0 0\nrpc 52000 1 52000\n")
    return root


def _collect(proc: Path) -> tuple[tuple[Sample, ...], tuple[str, ...]]:
    col = NfsCollector(proc, [(m, 5.0) for m in MOUNTS], probe_argv=lambda mp: OK)
    try:
        r = col.collect()
    finally:
        col.close()
    return r.samples, r.errors


def _judge(steps: list[tuple[float, tuple[Sample, ...]]]) -> dict[tuple[str, str], CheckResult]:
    rates = RateTracker(300)
    out: list[CheckResult] = []
    for t, samples in steps:
        observe_counters(rates, samples, t, _COUNTERS)
        st = CollectorState("nfs", samples=samples, stale=False, last_success=t, last_attempt=t)
        ctx = Context(snapshot=Snapshot(t, {"nfs": st}), profile=profiles.load("dgx-h100"), now=t, rates=rates,
                      required_mounts=MOUNTS, window=300.0)
        out = nfs.nfs_mount(ctx) + nfs.nfs_latency(ctx)
    return {(r.check, r.entity): r for r in out}


def test_every_version_and_transport_parses(variants: str) -> None:
    st = parse_mountstats(variants)
    assert (st.malformed, st.problems, st.truncated) == (0, (), False)
    got = {m.mountpoint: m for m in st.mounts}
    assert list(got) == list(MOUNTS)  # rootfs, ext4, tmpfs, autofs, cgroup2 lines skipped
    shape = {mp: (m.fstype, m.statvers, m.opt("vers"), m.nfs_version, m.protocol,
                  tuple(len(t.values) for t in m.transports)) for mp, m in got.items()}
    assert shape == {
        "/home": ("nfs", "1.1", "3", 3, "tcp", (13, 13)),  # nconnect=2: two xprt lines
        "/datasets": ("nfs4", "1.0", "4.0", 4, "tcp", (10,)),
        "/projects": ("nfs4", "1.1", "4.1", 4, "tcp", (13,)),
        "/scratch": ("nfs4", "1.1", "4.2", 4, "rdma", (27,)),
        "/opt/tools": ("nfs", "1.0", "3", 3, "udp", (7,)),
        "/mnt/fresh": ("nfs4", "1.1", "4.2", None, "tcp", ()),  # no RPC statistics yet
    }
    # 9 numbers (statvers 1.1 kernels: errors) vs 8 (older): errors None, never 0
    assert {o.name: o.errors for o in got["/home"].operations}["WRITE"] == 1
    assert all(o.errors is None for o in got["/datasets"].operations + got["/opt/tools"].operations)
    assert got["/scratch"].transports[0].get("mrs_allocated") == 48
    assert got["/opt/tools"].transports[0].get("max_slots") is None  # 1.0 udp: no slot table
    assert len(got["/datasets"].events) == 25 and got["/mnt/fresh"].operations == ()


def test_collector_and_checks_on_every_variant(variants: str, tmp_path: Path) -> None:
    samples, errors = _collect(_proc(tmp_path / "a", variants))
    assert errors == ()
    present = {s.label("mountpoint"): s.value for s in samples if s.name == "nfs_mount_present"}
    assert present == {m: 1.0 for m in MOUNTS}
    sends = {(s.label("mountpoint"), s.label("protocol")): s.value for s in samples if s.name == "nfs_transport_sends"}
    assert sends == {("/home", "tcp"): 80200, ("/datasets", "tcp"): 900, ("/projects", "tcp"): 2000,
                     ("/scratch", "rdma"): 9000, ("/opt/tools", "udp"): 640}
    assert not [s for s in samples if s.label("mountpoint") == "/mnt/fresh" and s.name.startswith("nfs_operation")]
    # a minute later every counter has grown a little: healthy, no WARN
    later = re.sub(r"GETATTR: (\d+) (\d+)", lambda m: f"GETATTR: {int(m[1]) + 60} {int(m[2]) + 60}", variants)
    samples2, _ = _collect(_proc(tmp_path / "b", later))
    res = _judge([(T0, samples), (T0 + 60, samples2)])
    assert {k: r.status for k, r in res.items() if r.status is not Status.OK} == {}
    assert ("nfs_latency", "/mnt/fresh") not in res  # no operations: nothing to judge, no verdict


def test_a_remount_resets_counters_without_a_negative_rate(variants: str, tmp_path: Path) -> None:
    """Unmount and mount again (or a client reboot between looks): every counter starts over.
    The rate history restarts; no negative RTT or retransmission rate, no WARN."""
    samples, _ = _collect(_proc(tmp_path / "a", variants))
    fresh = re.sub(r"(GETATTR|READ|WRITE): [0-9 ]+", lambda m: f"{m[1]}: 1 1 0 100 100 0 1 1 0", variants)
    samples2, errors = _collect(_proc(tmp_path / "b", fresh))
    assert errors == ()
    res = _judge([(T0, samples), (T0 + 60, samples2)])
    for m in MOUNTS[:-1]:
        ev = dict(res[("nfs_latency", m)].evidence)
        assert res[("nfs_latency", m)].status is Status.OK and float(ev["retrans_per_min"]) >= 0
        assert float(ev["avg_rtt_ms"]) >= 0


def test_a_mount_table_cut_short_does_not_call_later_mounts_missing(variants: str, tmp_path: Path) -> None:
    """Read while the mount table changes (or stopped by the size bound): the text ends mid-line.
    Mounts before the cut are present; mounts after it are not known, so nfs_mount says UNKNOWN
    for them, never FAIL 'NFS mount missing' (before: nfs_mount_present 0 -> FAIL, DRAIN)."""
    cut = variants.index("device 192.168.100.10:/scratch") + 40  # inside the /scratch device line
    samples, errors = _collect(_proc(tmp_path, variants[:cut]))
    assert any("cut short" in e for e in errors)
    present = {s.label("mountpoint"): s.value for s in samples if s.name == "nfs_mount_present"}
    assert present == {"/home": 1.0, "/datasets": 1.0, "/projects": 1.0}
    res = _judge([(T0, samples)])
    assert [k for k, r in res.items() if r.status is Status.FAIL] == []
    for m in ("/scratch", "/opt/tools", "/mnt/fresh"):
        assert res[("nfs_mount", m)].status is Status.UNKNOWN


@pytest.mark.parametrize("cut", range(0, 4000, 97))
def test_any_cut_never_raises_and_never_fails_a_mount(variants: str, tmp_path: Path, cut: int) -> None:
    text = variants[:cut]
    st = parse_mountstats(text)
    assert st.truncated == (bool(text) and not text.endswith("\n"))
    samples, _ = _collect(_proc(tmp_path, text))
    res = _judge([(T0, samples)])
    missing = {m for m in MOUNTS if m not in {x.mountpoint for x in st.mounts}}
    for m in MOUNTS:
        r = res[("nfs_mount", m)]
        if m in missing and st.truncated:
            assert r.status is Status.UNKNOWN, (m, r)
        elif m in missing:  # the text ends on a whole line: a complete (shorter) table
            assert r.status is Status.FAIL and r.summary == "NFS mount missing"
        else:
            assert r.status is Status.OK


def test_a_complete_table_without_the_mount_still_fails_it(variants: str, tmp_path: Path) -> None:
    """The fix above must not blind the check: a whole table that lacks /scratch is a missing mount."""
    start = variants.index("device 192.168.100.10:/scratch")
    end = variants.index("device oldfiler:/tools")
    samples, errors = _collect(_proc(tmp_path, variants[:start] + variants[end:]))
    assert errors == ()
    res = _judge([(T0, samples)])
    assert res[("nfs_mount", "/scratch")].status is Status.FAIL


# --- autofs: mounted on demand ------------------------------------------------------------------

FAIL_PROBE = ["/bin/sh", "-c", "echo ready; while read _; do echo 'fail No such device: /misc'; done"]
_INDIRECT = ("device auto.home mounted on /home with fstype autofs\n"
             "device 10.10.0.5:/export/home/alice mounted on /home/alice with fstype nfs4 statvers=1.1\n"
             "\topts:\trw,vers=4.2,proto=tcp\n\tage:\t10\n")


def _automount(proc: Path, mounts: tuple[str, ...], argv: list[str]) -> tuple[tuple[Sample, ...], dict[str, CheckResult]]:
    col = NfsCollector(proc, [(m, 5.0) for m in mounts], probe_argv=lambda mp: argv)
    try:
        samples = col.collect().samples
    finally:
        col.close()
    st = CollectorState("nfs", samples=samples, stale=False, last_success=T0, last_attempt=T0)
    ctx = Context(snapshot=Snapshot(T0, {"nfs": st}), profile=profiles.load("dgx-h100"), now=T0,
                  rates=RateTracker(300), required_mounts=mounts)
    return samples, {r.entity: r for r in nfs.nfs_mount(ctx)}


def test_an_autofs_trigger_is_mounted_on_demand_not_missing(variants: str, tmp_path: Path) -> None:
    """/misc is an autofs line and no NFS mount (a direct map nobody walked into yet): before,
    nfs_mount_present 0 -> FAIL 'NFS mount missing' (DRAIN) on every node of that build."""
    samples, res = _automount(_proc(tmp_path, variants), ("/misc", "/home"), OK)
    assert {(s.name, s.label("mountpoint")): s.value for s in samples if s.name.startswith("nfs_mount_")} == {
        ("nfs_mount_automount", "/misc"): 1.0, ("nfs_mount_present", "/home"): 1.0}
    assert res["/misc"].status is Status.OK and dict(res["/misc"].evidence)["automount"] == "true"


def test_an_indirect_map_root_is_mounted_on_demand(tmp_path: Path) -> None:
    """/home from auto.home (indirect): NFS mounts sit below it (/home/alice), never on it."""
    samples, res = _automount(_proc(tmp_path, _INDIRECT), ("/home",), OK)
    assert [(s.name, s.value) for s in samples if s.name.startswith("nfs_mount_")] == [("nfs_mount_automount", 1.0)]
    assert res["/home"].status is Status.OK


def test_an_automount_that_does_not_answer_fails_like_a_hung_mount(variants: str, tmp_path: Path) -> None:
    _, res = _automount(_proc(tmp_path, variants), ("/misc",), FAIL_PROBE)
    assert res["/misc"].status is Status.FAIL and "automount" in res["/misc"].summary


def test_an_nfs_mount_stacked_on_its_autofs_trigger_is_present(variants: str, tmp_path: Path) -> None:
    """A direct map once mounted: the autofs line and the NFS line share the mount point."""
    stacked = variants + ("device nas03:/misc mounted on /misc with fstype nfs4 statvers=1.1\n"
                          "\topts:\trw,vers=4.1,proto=tcp\n\tage:\t1\n")
    samples, res = _automount(_proc(tmp_path, stacked), ("/misc",), OK)
    assert [(s.name, s.value) for s in samples if s.name.startswith("nfs_mount_")] == [("nfs_mount_present", 1.0)]
    assert res["/misc"].status is Status.OK and "automount" not in dict(res["/misc"].evidence)
