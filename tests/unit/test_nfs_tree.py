"""podhealth.sim.tree_nfs: the simulated node's NFS procfs, in the kernel's strict formats."""

from __future__ import annotations

import os
from pathlib import Path

from podhealth.collectors.nfs import NfsCollector
from podhealth.collectors.nfs_parse import NfsMount, parse_mountstats, parse_rpc_nfs
from podhealth.sim import tree_nfs
from podhealth.sim.state import Fault, NodeState, default_state

T0 = 1_700_000_000.0


def _state() -> NodeState:
    return default_state("dgx01", "dgx-h100", now=T0)


def _mounts(proc: Path) -> dict[str, NfsMount]:
    r = parse_mountstats((proc / "self" / "mountstats").read_text())
    assert r.malformed == 0, r.problems
    return {m.mountpoint: m for m in r.mounts}


def _op(m: NfsMount, name: str) -> tuple[int, int, int]:
    o = next(o for o in m.operations if o.name == name)
    return o.requests, o.transmissions, o.major_timeouts


def test_layout_and_strict_formats(tmp_path: Path) -> None:
    st = _state()
    tree_nfs.write(st, tmp_path, T0 + 30)
    assert os.readlink(tmp_path / "self") == tree_nfs.FAKE_PID and tree_nfs.FAKE_PID.isdigit()
    stats = (tmp_path / "self" / "mountstats").read_text()
    info = (tmp_path / "self" / "mountinfo").read_text().splitlines()
    devices = [ln for ln in stats.splitlines() if ln.startswith("device ")]
    # node_exporter pairs the two files line by line: same mounts, same order
    assert len(devices) == len(info)
    for dev, inf in zip(devices, info):
        assert dev.split()[4] == inf.split()[4]  # mount point
    for line in stats.splitlines():
        s = line.strip()
        if s.startswith("events:"):
            assert len(s.split()[1:]) == 27
        elif s.startswith("bytes:"):
            assert len(s.split()[1:]) == 8
        elif s.startswith("xprt:"):
            assert s.split()[1] == "tcp" and len(s.split()[2:]) == 13
    mounts = _mounts(tmp_path)
    assert set(mounts) == set(st.mounts) == {"/home", "/cm/shared"}
    assert (mounts["/home"].fstype, mounts["/home"].opt("vers")) == ("nfs", "3")
    assert (mounts["/cm/shared"].fstype, mounts["/cm/shared"].opt("vers")) == ("nfs4", "4.1")
    for m in mounts.values():
        assert all(o.errors is not None for o in m.operations)  # 9-number op lines (5.x kernels)
    rpc = parse_rpc_nfs((tmp_path / "net" / "rpc" / "nfs").read_text())
    assert rpc.malformed == 0 and rpc.rpc is not None and rpc.rpc.calls > 0
    assert {p.version for p in rpc.procedures} == {"2", "3", "4"}


def test_counters_grow_with_time(tmp_path: Path) -> None:
    st = _state()
    tree_nfs.write(st, tmp_path, T0 + 10)
    a = _mounts(tmp_path)
    rpc_a = parse_rpc_nfs((tmp_path / "net/rpc/nfs").read_text()).rpc
    tree_nfs.write(st, tmp_path, T0 + 70)
    b = _mounts(tmp_path)
    rpc_b = parse_rpc_nfs((tmp_path / "net/rpc/nfs").read_text()).rpc
    for mp in ("/home", "/cm/shared"):
        assert _op(b[mp], "GETATTR")[0] > _op(a[mp], "GETATTR")[0]
        assert b[mp].bytes.normal_read > a[mp].bytes.normal_read  # type: ignore[union-attr]
        assert b[mp].age_seconds == a[mp].age_seconds + 60  # type: ignore[operator]
    assert rpc_a is not None and rpc_b is not None and rpc_b.calls > rpc_a.calls
    assert rpc_b.retransmissions == rpc_a.retransmissions == 0  # a healthy mount does not retransmit


def test_missing_mount_is_absent(tmp_path: Path) -> None:
    st = _state().with_fault(Fault("nfs-missing", T0 + 5, mount="/cm/shared"))
    tree_nfs.write(st, tmp_path, T0 + 10)
    assert set(_mounts(tmp_path)) == {"/home"}
    assert "/cm/shared" not in (tmp_path / "self" / "mountinfo").read_text()
    col = NfsCollector(tmp_path, [("/home", 5.0), ("/cm/shared", 5.0)], probe_argv=lambda mp: ["/bin/sh", "-c", "echo ready; while read _; do echo ok; done"])
    r = col.collect()
    col.close()
    present = {s.label("mountpoint"): s.value for s in r.samples if s.name == "nfs_mount_present"}
    assert present == {"/home": 1.0, "/cm/shared": 0.0}


def test_hung_mount_stays_listed_and_retransmits(tmp_path: Path) -> None:
    st = _state().with_fault(Fault("nfs-hung", T0 + 100, mount="/cm/shared"))
    tree_nfs.write(st, tmp_path, T0 + 100)
    a = _mounts(tmp_path)
    rpc_a = parse_rpc_nfs((tmp_path / "net/rpc/nfs").read_text()).rpc
    tree_nfs.write(st, tmp_path, T0 + 400)
    b = _mounts(tmp_path)
    rpc_b = parse_rpc_nfs((tmp_path / "net/rpc/nfs").read_text()).rpc
    assert "/cm/shared" in b
    req_a, trans_a, to_a = _op(a["/cm/shared"], "GETATTR")
    req_b, trans_b, to_b = _op(b["/cm/shared"], "GETATTR")
    assert req_b - req_a < 60  # nearly nothing completes (healthy: ~40/s x 300 s)
    assert trans_b - req_b > trans_a - req_a  # retransmissions grow
    assert to_b > to_a  # and major timeouts
    assert rpc_a is not None and rpc_b is not None and rpc_b.retransmissions > rpc_a.retransmissions
    xa, xb = a["/cm/shared"].transports[0], b["/cm/shared"].transports[0]
    assert xb.get("receives") - xa.get("receives") < 60 * len(b["/cm/shared"].operations)  # type: ignore[operator]
    assert xb.get("sends") > xa.get("sends")  # type: ignore[operator]
    # the healthy mount carries on
    assert _op(b["/home"], "GETATTR")[0] - _op(a["/home"], "GETATTR")[0] > 1000


def test_self_symlink_survives_rewrites(tmp_path: Path) -> None:
    st = _state()
    for t in (1, 2, 3):
        tree_nfs.write(st, tmp_path, T0 + t)
    assert os.readlink(tmp_path / "self") == tree_nfs.FAKE_PID
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [tree_nfs.FAKE_PID, "net", "self"]
