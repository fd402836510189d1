"""Pure parsers for /proc/self/mountstats and /proc/net/rpc/nfs: text in, frozen dataclasses out.

Formats are the kernel's (fs/nfs/super.c nfs_show_stats, net/sunrpc/stats.c rpc_clnt_show_stats,
xprtsock.c / xprtrdma transport print_stats). A line that does not parse is counted and skipped;
a field the kernel did not print stays None, never 0.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TypeVar

NFS_FSTYPES = frozenset({"nfs", "nfs4"})
AUTOFS = "autofs"

# bytes: line (include/linux/nfs_iostat.h, enum nfs_stat_bytecounters)
BYTES_FIELDS = ("normal_read", "normal_write", "direct_read", "direct_write",
                "server_read", "server_write", "read_pages", "write_pages")

# events: line (enum nfs_stat_eventcounters); statvers 1.1 prints all 27
EVENT_FIELDS = ("inode_revalidate", "dentry_revalidate", "data_invalidate", "attr_invalidate",
                "vfs_open", "vfs_lookup", "vfs_access", "vfs_update_page", "vfs_read_page",
                "vfs_read_pages", "vfs_write_page", "vfs_write_pages", "vfs_getdents", "vfs_setattr",
                "vfs_flush", "vfs_fsync", "vfs_lock", "vfs_release", "congestion_wait",
                "setattr_trunc", "extend_write", "silly_rename", "short_read", "short_write",
                "delay", "pnfs_read", "pnfs_write")

# xprt: line, per transport. Fields after the first len(...) are newer-kernel additions.
_COMMON_CONN = ("port", "bind_count", "connect_count", "connect_time", "idle_time",
                "sends", "receives", "bad_xids", "req_u", "bklog_u")
_SLOTS = ("max_slots", "sending_u", "pending_u")  # statvers 1.1 for tcp/udp
_RDMA_EXTRA = ("read_chunks", "write_chunks", "reply_chunks", "total_rdma_req", "total_rdma_rep",
               "pullup", "fixup", "hardway", "failed_marshal", "bad_reply", "nomsg_calls",
               "mrs_recycled", "mrs_orphaned", "mrs_allocated", "local_inv_needed",
               "empty_sendctx_q", "reply_waits_for_send")
XPRT_FIELDS: dict[str, tuple[tuple[str, ...], int]] = {  # protocol -> (names, minimum count)
    "tcp": (_COMMON_CONN + _SLOTS, 10),
    "udp": (("port", "bind_count", "sends", "receives", "bad_xids", "req_u", "bklog_u") + _SLOTS, 7),
    "rdma": (_COMMON_CONN + _RDMA_EXTRA, 10),
}

# /proc/net/rpc/nfs procN lines: client procedure tables in kernel order (fs/nfs/nfs{2,3,4}xdr.c).
PROCEDURES: dict[str, tuple[str, ...]] = {
    "2": ("NULL", "GETATTR", "SETATTR", "ROOT", "LOOKUP", "READLINK", "READ", "WRITECACHE", "WRITE",
          "CREATE", "REMOVE", "RENAME", "LINK", "SYMLINK", "MKDIR", "RMDIR", "READDIR", "STATFS"),
    "3": ("NULL", "GETATTR", "SETATTR", "LOOKUP", "ACCESS", "READLINK", "READ", "WRITE", "CREATE",
          "MKDIR", "SYMLINK", "MKNOD", "REMOVE", "RMDIR", "RENAME", "LINK", "READDIR",
          "READDIRPLUS", "FSSTAT", "FSINFO", "PATHCONF", "COMMIT"),
    "4": ("NULL", "READ", "WRITE", "COMMIT", "OPEN", "OPEN_CONFIRM", "OPEN_NOATTR",
          "OPEN_DOWNGRADE", "CLOSE", "SETATTR", "FSINFO", "RENEW", "SETCLIENTID",
          "SETCLIENTID_CONFIRM", "LOCK", "LOCKT", "LOCKU", "ACCESS", "GETATTR", "LOOKUP",
          "LOOKUP_ROOT", "REMOVE", "RENAME", "LINK", "SYMLINK", "CREATE", "PATHCONF", "STATFS",
          "READLINK", "READDIR", "SERVER_CAPS", "DELEGRETURN", "GETACL", "SETACL", "FS_LOCATIONS",
          "RELEASE_LOCKOWNER", "SECINFO", "FSID_PRESENT", "EXCHANGE_ID", "CREATE_SESSION",
          "DESTROY_SESSION", "SEQUENCE", "GET_LEASE_TIME", "RECLAIM_COMPLETE", "LAYOUTGET",
          "GETDEVICEINFO", "LAYOUTCOMMIT", "LAYOUTRETURN", "SECINFO_NO_NAME", "TEST_STATEID",
          "FREE_STATEID", "GETDEVICELIST", "BIND_CONN_TO_SESSION", "DESTROY_CLIENTID", "SEEK",
          "ALLOCATE", "DEALLOCATE", "LAYOUTSTATS", "CLONE", "COPY", "OFFLOAD_CANCEL", "LOOKUPP",
          "LAYOUTERROR", "COPY_NOTIFY", "GETXATTR", "SETXATTR", "LISTXATTRS", "REMOVEXATTR",
          "READ_PLUS"),
}

_DEVICE = re.compile(r"^device (\S+) mounted on (\S+) with fstype (\S+)(?: statvers=(\S+))?\s*$")
_RPC_VERSION = re.compile(r"^RPC iostats version:\s*(\S+)\s+p/v:\s*(\d+)/(\d+)")
_OCTAL = re.compile(r"\\([0-7]{3})")
_T = TypeVar("_T")


def _first(pairs: tuple[tuple[str, _T], ...], key: str) -> _T | None:
    """The value of the first (key, value) pair named `key` (fields and options in kernel order)."""
    for k, v in pairs:
        if k == key:
            return v
    return None


@dataclass(frozen=True, slots=True)
class NfsBytes:
    normal_read: int
    normal_write: int
    direct_read: int | None = None
    direct_write: int | None = None
    server_read: int | None = None
    server_write: int | None = None
    read_pages: int | None = None
    write_pages: int | None = None


@dataclass(frozen=True, slots=True)
class NfsTransport:
    protocol: str
    values: tuple[tuple[str, int], ...]  # named fields in kernel order; absent = older kernel

    def get(self, name: str) -> int | None:
        return _first(self.values, name)


@dataclass(frozen=True, slots=True)
class NfsOperation:
    name: str
    requests: int
    transmissions: int
    major_timeouts: int
    bytes_sent: int
    bytes_received: int
    queue_ms: int
    rtt_ms: int
    execute_ms: int
    errors: int | None = None  # kernels >= 5.x print a 9th field


@dataclass(frozen=True, slots=True)
class NfsMount:
    device: str  # "server:/export"
    mountpoint: str
    fstype: str
    statvers: str | None
    age_seconds: int | None = None
    opts: tuple[tuple[str, str], ...] = ()
    bytes: NfsBytes | None = None
    events: tuple[tuple[str, int], ...] = ()
    rpc_iostats_version: str | None = None
    nfs_version: int | None = None  # from "p/v: 100003/<v>"
    transports: tuple[NfsTransport, ...] = ()  # several with nconnect
    operations: tuple[NfsOperation, ...] = ()

    @property
    def protocol(self) -> str:
        if self.transports:
            return self.transports[0].protocol
        return self.opt("proto") or ""

    def opt(self, key: str) -> str | None:
        return _first(self.opts, key)


@dataclass(frozen=True, slots=True)
class Mountstats:
    mounts: tuple[NfsMount, ...]
    malformed: int
    problems: tuple[str, ...]  # first few malformed lines, for the collector's errors
    # The text ended mid-line (a bounded read, or the file changing under the reader): mounts
    # after the cut are not in `mounts`, so an absent one is not known to be missing.
    truncated: bool = False
    # Mount points of autofs triggers: an automounted NFS mount (`/home` from auto.master) is
    # an autofs line until something walks into it, and an indirect map never mounts NFS at
    # the trigger itself (its mounts sit below, /home/alice).
    autofs: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RpcNet:
    packets: int
    udp_packets: int
    tcp_packets: int
    tcp_connections: int


@dataclass(frozen=True, slots=True)
class RpcCalls:
    calls: int
    retransmissions: int
    auth_refreshes: int


@dataclass(frozen=True, slots=True)
class ProcedureCounts:
    version: str  # "3"
    counts: tuple[tuple[str, int], ...]  # (procedure name, calls), kernel order


@dataclass(frozen=True, slots=True)
class RpcNfs:
    net: RpcNet | None
    rpc: RpcCalls | None
    procedures: tuple[ProcedureCounts, ...]
    malformed: int
    problems: tuple[str, ...]


MAX_PROBLEMS = 8


def unescape(field: str) -> str:
    """Mount paths in /proc are octal-escaped (space = \\040)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _ints(parts: list[str]) -> list[int]:
    try:
        out = list(map(int, parts))  # the common case, without a Python-level loop
    except ValueError:
        out = None
    if out is not None and (not out or min(out) >= 0):
        return out
    for p in parts:  # find the culprit for the message
        try:
            v = int(p, 10)
        except ValueError:
            raise ValueError(f"not a number: {p[:24]!r}") from None
        if v < 0:
            raise ValueError(f"negative counter: {p[:24]!r}")
    raise AssertionError("unreachable")  # pragma: no cover


def _opts(text: str) -> tuple[tuple[str, str], ...]:
    out = []
    for item in text.split(","):
        k, _, v = item.partition("=")
        if k:
            out.append((k.strip(), v.strip()))
    return tuple(out)


class _MountBuilder:
    """Accumulates one mount's lines; frozen into an NfsMount at the next `device` line."""

    def __init__(self, device: str, mountpoint: str, fstype: str, statvers: str | None) -> None:
        self.device, self.mountpoint, self.fstype, self.statvers = device, mountpoint, fstype, statvers
        self.age: int | None = None
        self.opts: tuple[tuple[str, str], ...] = ()
        self.bytes: NfsBytes | None = None
        self.events: tuple[tuple[str, int], ...] = ()
        self.rpc_version: str | None = None
        self.nfs_version: int | None = None
        self.transports: list[NfsTransport] = []
        self.ops: list[NfsOperation] = []
        self.in_ops = False

    def line(self, s: str) -> None:
        """One stripped line inside this mount; raises ValueError when it is malformed."""
        if self.in_ops:
            self.ops.append(parse_operation(s))
            return
        key, sep, rest = s.partition(":")
        if s == "per-op statistics":
            self.in_ops = True
        elif not sep:
            raise ValueError("no 'key:'")
        elif key == "opts":
            self.opts = _opts(rest.strip())
        elif key == "age":
            self.age = _ints(rest.split())[0]
        elif key == "events":
            vals = _ints(rest.split())
            if not vals or len(vals) > len(EVENT_FIELDS):
                raise ValueError(f"events: {len(vals)} numbers")
            self.events = tuple(zip(EVENT_FIELDS, vals))
        elif key == "bytes":
            vals = _ints(rest.split())
            if len(vals) < 2 or len(vals) > len(BYTES_FIELDS):
                raise ValueError(f"bytes: {len(vals)} numbers")
            self.bytes = NfsBytes(*vals)
        elif key == "xprt":
            self.transports.append(parse_transport(rest))
        elif s.startswith("RPC iostats version"):
            m = _RPC_VERSION.match(s)
            if not m:
                raise ValueError("bad RPC iostats line")
            self.rpc_version, self.nfs_version = m.group(1), int(m.group(3))
        # opts/caps/nfsv4/sec/impl_id/fsc and future keys: not needed, not malformed

    def build(self) -> NfsMount:
        return NfsMount(
            device=self.device, mountpoint=self.mountpoint, fstype=self.fstype,
            statvers=self.statvers, age_seconds=self.age, opts=self.opts, bytes=self.bytes,
            events=self.events, rpc_iostats_version=self.rpc_version, nfs_version=self.nfs_version,
            transports=tuple(self.transports), operations=tuple(self.ops),
        )


def parse_transport(rest: str) -> NfsTransport:
    """The part of an `xprt:` line after the colon, e.g. 'tcp 832 1 2 0 11 6428 ...'."""
    parts = rest.split()
    if not parts:
        raise ValueError("empty xprt line")
    proto = parts[0]
    if proto not in XPRT_FIELDS:
        raise ValueError(f"unknown transport {proto[:16]!r}")
    names, minimum = XPRT_FIELDS[proto]
    vals = _ints(parts[1:])
    if len(vals) < minimum:
        raise ValueError(f"xprt {proto}: {len(vals)} numbers, expected at least {minimum}")
    return NfsTransport(proto, tuple(zip(names, vals)))


# A mount lists every operation of its NFS version and most of them sit idle, so most per-op
# lines are the same text as in the previous read: the parse of each is kept (it is pure and the
# result immutable), which makes a re-read cost a lookup per idle operation.
@functools.lru_cache(maxsize=2048)
def parse_operation(s: str) -> NfsOperation:
    """'READ: 1298 1298 0 207680 1210292152 6 79386 79407 [errors]'."""
    name, sep, rest = s.partition(":")
    if not sep or not name or " " in name.strip():
        raise ValueError("expected 'OP: numbers'")
    vals = _ints(rest.split())
    if len(vals) not in (8, 9):
        raise ValueError(f"{name}: {len(vals)} numbers, expected 8 or 9")
    req, trans, timeouts, sent, recv, queue, rtt, execute = vals[:8]
    return NfsOperation(name.strip(), req, trans, timeouts, sent, recv, queue, rtt, execute,
                        errors=vals[8] if len(vals) == 9 else None)


def _complete_lines(text: str, source: str, problems: list[str]) -> tuple[list[str], int]:
    """The file's lines, minus a last line with no newline: the kernel ends every line with one,
    so that line was cut short (a bounded read) and its last number may be a prefix. Such a line
    counts as malformed (the count is returned) and is said in `problems` as `source:N`."""
    lines = text.split("\n")
    tail = lines.pop()  # "" when the text ends with a newline
    if not tail.strip():
        return lines, 0
    problems.append(f"{source}:{len(lines) + 1}: cut short (no newline)")
    return lines, 1


def parse_mountstats(text: str) -> Mountstats:
    mounts: list[NfsMount] = []
    autofs: list[str] = []
    problems: list[str] = []
    cur: _MountBuilder | None = None
    lines, malformed = _complete_lines(text, "mountstats", problems)
    text_cut = text != "" and not text.endswith("\n")  # even a cut inside the indentation
    for lineno, raw in enumerate(lines, 1):
        s = raw.strip()
        if not s:
            continue
        if s.startswith("device "):
            if cur is not None:
                mounts.append(cur.build())
                cur = None
            m = _DEVICE.match(s)
            if not m:
                malformed += 1
                if len(problems) < MAX_PROBLEMS:
                    problems.append(f"mountstats:{lineno}: malformed device line")
                continue
            if m.group(3) in NFS_FSTYPES:
                cur = _MountBuilder(unescape(m.group(1)), unescape(m.group(2)), m.group(3), m.group(4))
            elif m.group(3) == AUTOFS:
                autofs.append(unescape(m.group(2)))
            continue
        if cur is None:
            continue  # detail lines of a non-NFS mount (none today) or of a skipped device line
        try:
            cur.line(s)
        except (ValueError, IndexError) as e:
            malformed += 1
            if len(problems) < MAX_PROBLEMS:
                key = s.split(":", 1)[0][:24]
                problems.append(f"mountstats:{lineno}: {cur.mountpoint}: {key}: {e}")
    if cur is not None:
        mounts.append(cur.build())
    return Mountstats(tuple(mounts), malformed, tuple(problems), truncated=text_cut, autofs=tuple(autofs))


def parse_rpc_nfs(text: str) -> RpcNfs:
    net: RpcNet | None = None
    rpc: RpcCalls | None = None
    procs: list[ProcedureCounts] = []
    problems: list[str] = []
    lines, malformed = _complete_lines(text, "rpc/nfs", problems)
    for lineno, raw in enumerate(lines, 1):
        parts = raw.split()
        if not parts:
            continue
        key = parts[0]
        try:
            vals = _ints(parts[1:])
            if key == "net":
                if len(vals) != 4:
                    raise ValueError(f"net: {len(vals)} numbers, expected 4")
                net = RpcNet(*vals)
            elif key == "rpc":
                if len(vals) != 3:
                    raise ValueError(f"rpc: {len(vals)} numbers, expected 3")
                rpc = RpcCalls(*vals)
            elif key.startswith("proc") and key[4:].isdigit():
                if not vals or vals[0] != len(vals) - 1:
                    raise ValueError(f"{key}: count {vals[0] if vals else '-'} but {max(len(vals) - 1, 0)} values")
                version = key[4:]
                names = PROCEDURES.get(version, ())
                counts = tuple(
                    (names[i] if i < len(names) else f"PROC{i}", v) for i, v in enumerate(vals[1:]))
                procs.append(ProcedureCounts(version, counts))
            # other keys: ignored (none in current kernels)
        except ValueError as e:
            malformed += 1
            if len(problems) < MAX_PROBLEMS:
                problems.append(f"rpc/nfs:{lineno}: {e}")
    return RpcNfs(net, rpc, tuple(procs), malformed, tuple(problems))
