"""nfs_parse on the real-capture corpus (../shared/fixtures/nfs), whole and cut short."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.collectors.nfs_parse import parse_mountstats, parse_rpc_nfs

MOUNTSTATS = ("mountstats_nfs4.1_k8s_pod_extended_ops.txt",
              "mountstats_node_exporter_fixture_nfs4_nfs3_udp.txt",
              "mountstats_procfs_fixture_pid26231.txt")
RPC = ("proc_net_rpc_nfs_node_exporter_fixture.txt", "proc_net_rpc_nfs_procfs_fixture.txt")


@pytest.mark.parametrize("name", MOUNTSTATS)
def test_every_mountstats_capture_parses_cleanly(shared_fixtures: Path, name: str) -> None:
    r = parse_mountstats((shared_fixtures / "nfs" / name).read_text())
    assert r.malformed == 0, r.problems
    assert r.mounts
    for m in r.mounts:
        assert m.fstype in ("nfs", "nfs4") and m.bytes is not None and m.transports and m.operations


def test_k8s_nfs41_extended_ops(shared_fixtures: Path) -> None:
    r = parse_mountstats((shared_fixtures / "nfs" / MOUNTSTATS[0]).read_text())
    (m,) = r.mounts
    assert m.device == "fs.example.com:/volume4/apps/home-automation/node-red-data"
    assert m.mountpoint.startswith("/var/lib/kubelet/pods/1c2215a7-")
    assert (m.fstype, m.statvers, m.age_seconds, m.opt("vers")) == ("nfs4", "1.1", 83520, "4.1")
    assert m.bytes is not None and m.bytes.normal_write == 39056395530
    assert len(m.events) == 27 and dict(m.events)["vfs_flush"] == 116581
    (t,) = m.transports
    assert (t.protocol, t.get("sends"), t.get("receives"), t.get("pending_u")) == ("tcp", 938505, 938504, 10823602)
    ops = {o.name: o for o in m.operations}
    assert len(ops) == 63  # mixed tab indentation in the capture does not matter
    assert ops["WRITE"].bytes_sent == 39161277084 and ops["WRITE"].queue_ms == 401718334
    assert ops["OPEN"].errors == 394 and ops["LOOKUP"].errors == 3546 and ops["READ"].errors == 0
    assert ops["LAYOUTERROR"].requests == 0


def test_node_exporter_fixture_udp_and_duplicates(shared_fixtures: Path) -> None:
    r = parse_mountstats((shared_fixtures / "nfs" / MOUNTSTATS[1]).read_text())
    assert [(m.mountpoint, m.fstype, m.protocol) for m in r.mounts] == [
        ("/mnt/nfs/test", "nfs4", "tcp"), ("/mnt/nfs/test-dupe", "nfs4", "tcp"),
        ("/mnt/nfs/test-dupe", "nfs", "udp")]
    udp = r.mounts[2].transports[0]
    assert (udp.get("sends"), udp.get("receives"), udp.get("bad_xids"), udp.get("max_slots")) == (6428, 6428, 0, 24)
    assert r.mounts[0].rpc_iostats_version == "1.0"
    access = next(o for o in r.mounts[1].operations if o.name == "ACCESS")
    assert access.queue_ms == 18446743919241604546  # a counter the kernel let wrap: kept as is
    assert access.errors is None  # 8-number op lines


def test_procfs_fixture(shared_fixtures: Path) -> None:
    (m,) = parse_mountstats((shared_fixtures / "nfs" / MOUNTSTATS[2]).read_text()).mounts
    assert (m.device, m.mountpoint, m.opt("mountaddr")) == ("192.168.1.1:/srv/test", "/mnt/nfs/test", "192.168.1.1")
    assert m.bytes is not None and m.bytes.normal_read == 1207640230


@pytest.mark.parametrize("name,calls,retrans,v3_getattr", [
    (RPC[0], 1218785755, 374636, 1061909262),
    (RPC[1], 4329785, 0, 4084749),
])
def test_rpc_nfs_captures(shared_fixtures: Path, name: str, calls: int, retrans: int, v3_getattr: int) -> None:
    r = parse_rpc_nfs((shared_fixtures / "nfs" / name).read_text())
    assert r.malformed == 0
    assert r.rpc is not None and (r.rpc.calls, r.rpc.retransmissions) == (calls, retrans)
    v3 = {p.version: dict(p.counts) for p in r.procedures}["3"]
    assert v3["GETATTR"] == v3_getattr and len(v3) == 22


@pytest.mark.parametrize("name", MOUNTSTATS + RPC)
def test_truncated_captures(shared_fixtures: Path, name: str) -> None:
    text = (shared_fixtures / "nfs" / name).read_text()
    parse = parse_rpc_nfs if name.startswith("proc_net") else parse_mountstats
    for cut in range(0, len(text), max(1, len(text) // 40)):
        r = parse(text[:cut])  # type: ignore[operator]
        assert r.malformed <= 1  # only the line that was cut can be broken
