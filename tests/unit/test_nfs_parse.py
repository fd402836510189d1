"""nfs_parse on the project's own DGX-like captures (/home NFSv3 over TCP, /cm/shared NFSv4.1 over
RDMA) and on truncated and malformed variants of them."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.collectors.nfs_parse import (
    EVENT_FIELDS, PROCEDURES, NfsMount, parse_mountstats, parse_operation, parse_rpc_nfs,
    parse_transport, unescape,
)


@pytest.fixture
def mountstats_text(own_fixtures: Path) -> str:
    return (own_fixtures / "nfs" / "mountstats_dgx.txt").read_text()


@pytest.fixture
def rpc_text(own_fixtures: Path) -> str:
    return (own_fixtures / "nfs" / "rpc_nfs_dgx.txt").read_text()


def _mount(mounts: tuple[NfsMount, ...], mp: str) -> NfsMount:
    (m,) = [m for m in mounts if m.mountpoint == mp]
    return m


def test_dgx_mountstats(mountstats_text: str) -> None:
    r = parse_mountstats(mountstats_text)
    assert r.malformed == 0 and r.problems == ()
    assert [m.mountpoint for m in r.mounts] == ["/home", "/cm/shared"]  # sysfs, proc, ext4, vfat skipped
    home, shared = r.mounts
    assert (home.device, home.fstype, home.statvers, home.nfs_version) == ("10.141.255.254:/home", "nfs", "1.1", 3)
    assert home.age_seconds == 1209611 and home.opt("vers") == "3" and home.opt("hard") == ""
    assert home.bytes is not None and (home.bytes.normal_read, home.bytes.normal_write) == (137171591168, 38085361664)
    assert home.bytes.write_pages == 9298211
    assert len(home.events) == 27 and home.events[0] == ("inode_revalidate", 5318823)
    assert home.protocol == "tcp"
    (t,) = home.transports
    assert (t.get("port"), t.get("sends"), t.get("receives"), t.get("bad_xids"), t.get("max_slots"),
            t.get("pending_u")) == (855, 9352345, 9352245, 0, 65, 88211)
    assert [o.name for o in home.operations] == list(PROCEDURES["3"])
    read = next(o for o in home.operations if o.name == "READ")
    assert (read.requests, read.transmissions, read.major_timeouts, read.bytes_sent, read.bytes_received,
            read.queue_ms, read.rtt_ms, read.execute_ms, read.errors) == (
        2093117, 2093190, 2, 301408848, 137177843308, 67113, 2412391, 2514720, 0)
    lookup = next(o for o in home.operations if o.name == "LOOKUP")
    assert lookup.errors == 148230  # ENOENT lookups count as errors

    assert (shared.fstype, shared.nfs_version, shared.opt("vers"), shared.protocol) == ("nfs4", 4, "4.1", "rdma")
    (rt,) = shared.transports
    assert rt.protocol == "rdma" and len(rt.values) == 27
    assert (rt.get("sends"), rt.get("receives"), rt.get("read_chunks"), rt.get("reply_waits_for_send")) == (
        12190882, 12190882, 8122070, 0)
    assert rt.get("max_slots") is None  # rdma prints no slot counts
    assert len(shared.operations) == len(PROCEDURES["4"])
    assert next(o for o in shared.operations if o.name == "READ").bytes_received == 1064700151240


def test_dgx_rpc_nfs(rpc_text: str) -> None:
    r = parse_rpc_nfs(rpc_text)
    assert r.malformed == 0
    assert r.net is not None and (r.net.packets, r.net.tcp_connections) == (0, 0)  # clients keep no net stats
    assert r.rpc is not None and (r.rpc.calls, r.rpc.retransmissions, r.rpc.auth_refreshes) == (21542007, 176, 21542007)
    versions = {p.version: dict(p.counts) for p in r.procedures}
    assert set(versions) == {"2", "3", "4"}
    assert versions["3"]["GETATTR"] == 4182265 and versions["3"]["COMMIT"] == 12033
    assert versions["4"]["READ"] == 8122070 and versions["4"]["GETATTR"] == 2210432
    assert len(versions["4"]) == 69


def test_truncated_mountstats_never_raises(mountstats_text: str) -> None:
    """Every prefix of the file parses; cut lines are counted as malformed, never invented as 0."""
    full = parse_mountstats(mountstats_text)
    for cut in range(0, len(mountstats_text), 97):
        r = parse_mountstats(mountstats_text[:cut])
        assert len(r.mounts) <= len(full.mounts)
        for m in r.mounts:
            for op in m.operations:
                ref = next(o for o in _mount(full.mounts, m.mountpoint).operations if o.name == op.name)
                # a cut operation line either parses to a prefix number or is dropped: it may
                # never claim more than the real value
                assert op.requests <= ref.requests


def test_truncated_mid_number_is_malformed_not_wrong(mountstats_text: str) -> None:
    end = mountstats_text.index("\txprt:\ttcp") + len("\txprt:\ttcp 855 1 3")
    r = parse_mountstats(mountstats_text[:end])
    (home,) = r.mounts
    assert home.transports == () and r.malformed == 1  # 3 numbers < the 10 a tcp xprt line has
    assert home.bytes is not None  # everything before the cut is kept


def test_malformed_lines_are_counted_and_skipped(mountstats_text: str) -> None:
    bad = (mountstats_text
           .replace("\tage:\t1209611", "\tage:\tforever")
           .replace("READLINK: 41 41 0 5904 6724 0 12 13 0", "READLINK: 41 41 x 5904")
           .replace("\tbytes:\t137171591168", "\tbytes:\t-5")
           .replace("device 10.141.255.254:/cm/shared mounted on", "device mounted on"))
    r = parse_mountstats(bad)
    # /cm/shared's device line is broken: its detail lines belong to no mount and are ignored
    assert [m.mountpoint for m in r.mounts] == ["/home"]
    home = r.mounts[0]
    assert home.age_seconds is None and home.bytes is None  # not zeros
    assert "READLINK" not in [o.name for o in home.operations]
    assert len(home.operations) == len(PROCEDURES["3"]) - 1
    assert r.malformed == 4 and len(r.problems) == 4
    assert any("malformed device line" in p for p in r.problems)


def test_garbage_input() -> None:
    r = parse_mountstats("\x00\x01 binary junk\n\n device\nper-op statistics\n")
    assert r.mounts == ()
    r2 = parse_rpc_nfs("net 1 2\nrpc x y z\nproc3 22 1 2 3\nproc4\nwhat 1 2\n")
    assert (r2.net, r2.rpc, r2.procedures) == (None, None, ())
    assert r2.malformed == 4


@pytest.mark.parametrize("line,expected", [
    ("READ: 1298 1298 0 207680 1210292152 6 79386 79407", (1298, None)),  # statvers 1.0 / old kernels
    ("READ: 1298 1298 0 207680 1210292152 6 79386 79407 3", (1298, 3)),  # errors column
])
def test_operation_widths(line: str, expected: tuple[int, int | None]) -> None:
    op = parse_operation(line)
    assert (op.requests, op.errors) == expected


@pytest.mark.parametrize("line", ["READ: 1 2 3", "READ: 1 2 3 4 5 6 7 8 9 10", "READ 1 2 3 4 5 6 7 8",
                                  "READ: a b c d e f g h"])
def test_operation_rejects(line: str) -> None:
    with pytest.raises(ValueError):
        parse_operation(line)


@pytest.mark.parametrize("rest,proto,sends,slots", [
    ("tcp 832 0 1 0 11 6428 6428 0 12154 0 24 26 5726", "tcp", 6428, 24),  # statvers 1.1: 13
    ("tcp 832 0 1 0 11 6428 6428 0 12154 0", "tcp", 6428, None),  # statvers 1.0: 10
    ("udp 832 0 6428 6428 0 12154 0 24 26 5726", "udp", 6428, 24),  # 1.1: 10
    ("udp 832 0 6428 6428 0 12154 0", "udp", 6428, None),  # 1.0: 7
    ("rdma 0 0 1 0 33 100 99 0 5 0 1 2 3 4 5 6 7 8 9 10", "rdma", 100, None),  # 4.2-era: 20
])
def test_transport_widths(rest: str, proto: str, sends: int, slots: int | None) -> None:
    t = parse_transport(rest)
    assert (t.protocol, t.get("sends"), t.get("max_slots")) == (proto, sends, slots)


@pytest.mark.parametrize("rest", ["tcp 1 2 3", "sctp 1 2 3 4 5 6 7 8 9 10", "", "udp 1 2 x 4 5 6 7"])
def test_transport_rejects(rest: str) -> None:
    with pytest.raises(ValueError):
        parse_transport(rest)


def test_events_names() -> None:
    assert len(EVENT_FIELDS) == 27 and EVENT_FIELDS[-1] == "pnfs_write"


def test_escaped_mountpoint() -> None:
    text = ("device srv:/vol\\040a mounted on /mnt/my\\040data with fstype nfs statvers=1.1\n"
            "\tbytes:\t1 2 3 4 5 6 7 8\n")
    (m,) = parse_mountstats(text).mounts
    assert (m.device, m.mountpoint) == ("srv:/vol a", "/mnt/my data")
    assert unescape("a\\011b") == "a\tb"
