"""The simulated node's procfs for NFS: <proc>/self -> <pid>/{mountstats,mountinfo}, net/rpc/nfs.

Formats are the kernel's (5.15, statvers=1.1): `events:` 27 numbers, `bytes:` 8, `xprt: tcp` 13,
per-op lines with 9 numbers (the last is errors). mountinfo lists the same mounts in the same
order, because node_exporter pairs the two files line by line.

Counters are a pure function of (state, now). A missing mount (nfs-missing) is absent from both
files. A hung mount (nfs-hung) stays listed: from the fault on, almost nothing completes, so
per-op counts nearly stop while retransmissions and major timeouts keep growing, and the client's
`rpc` retransmission count with them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from podhealth.collectors.nfs_parse import PROCEDURES
from podhealth.sim.state import NodeState
from podhealth.sim.tree_write import TreeWriter

FAKE_PID = "4242"  # any number: node_exporter resolves <proc>/self to a numeric directory
SERVER = "10.141.255.254"  # the BCM head node's internal address, which exports both on a DGX pod
UPTIME_BEFORE_T0 = 3 * 86400.0
HUNG_TRICKLE = 0.05  # ops/s that still complete (after a retransmission) on a hung mount
HUNG_RETRANS = 0.5  # retransmissions/s while hung (timeo=600: each stuck RPC every 60 s)

# Busy ops per second on a healthy mount; every other op of the version stays at 0.
_RATES_V3 = {"NULL": 0.0, "GETATTR": 60.0, "SETATTR": 1.0, "LOOKUP": 25.0, "ACCESS": 20.0,
             "READLINK": 0.5, "READ": 40.0, "WRITE": 12.0, "CREATE": 0.5, "MKDIR": 0.05,
             "REMOVE": 0.4, "RENAME": 0.1, "READDIRPLUS": 2.0, "FSSTAT": 0.2, "FSINFO": 0.0,
             "PATHCONF": 0.0, "COMMIT": 1.0}
_RATES_V4 = {"READ": 30.0, "WRITE": 8.0, "COMMIT": 0.5, "OPEN": 4.0, "CLOSE": 4.0, "SETATTR": 0.5,
             "LOCK": 0.2, "LOCKU": 0.2, "ACCESS": 10.0, "GETATTR": 40.0, "LOOKUP": 15.0,
             "REMOVE": 0.2, "RENAME": 0.1, "CREATE": 0.1, "READDIR": 1.0, "SEQUENCE": 0.3,
             "FREE_STATEID": 0.1, "TEST_STATEID": 0.01, "DELEGRETURN": 0.5, "STATFS": 0.2}
# (bytes sent, bytes received) per op, RPC headers included; READ/WRITE carry ~64 KiB payloads
_SIZES = {"READ": (140, 65_700), "WRITE": (65_800, 160), "READDIRPLUS": (150, 4_200),
          "READDIR": (180, 4_100)}
_DEFAULT_SIZE = (170, 230)
_RTT_MS = {"READ": 0.9, "WRITE": 1.6, "COMMIT": 4.0}
_DEFAULT_RTT_MS = 0.3


@dataclass(frozen=True)
class MountSpec:
    mountpoint: str
    export: str
    version: str  # "3" or "4.1"
    fstype: str  # nfs or nfs4

    @property
    def opts(self) -> str:
        common = ("rsize=1048576,wsize=1048576,namlen=255,acregmin=3,acregmax=60,acdirmin=30,"
                  "acdirmax=60,hard,proto=tcp,timeo=600,retrans=2,sec=sys")
        if self.version == "3":
            return (f"rw,vers=3,{common},mountaddr={SERVER},mountvers=3,mountport=20048,"
                    "mountproto=udp,local_lock=none")
        return f"rw,vers={self.version},{common},clientaddr=10.141.0.17,local_lock=none"


def mount_spec(index: int, mountpoint: str) -> MountSpec:
    """/home (the first mount) is NFSv3 as BCM exports it; others NFSv4.1. Both over TCP: node
    exporter 1.5, the test oracle, cannot parse an `xprt: rdma` line."""
    export = f"{SERVER}:{'/export' + mountpoint if mountpoint == '/home' else mountpoint}"
    if index == 0:
        return MountSpec(mountpoint, export, "3", "nfs")
    return MountSpec(mountpoint, export, "4.1", "nfs4")


def _jitter(*parts: str) -> float:
    return 0.5 + hashlib.sha256("/".join(parts).encode()).digest()[0] / 256.0


@dataclass(frozen=True)
class _OpTotals:
    requests: int
    trans: int
    timeouts: int
    sent: int
    recv: int
    queue_ms: int
    rtt_ms: int
    exec_ms: int


def _op(name: str, rate: float, healthy_s: float, hung_s: float) -> _OpTotals:
    ok = int(rate * healthy_s)
    late = int(HUNG_TRICKLE * hung_s) if rate > 0 else 0  # answered only after a retransmission
    req = ok + late
    sent_b, recv_b = _SIZES.get(name, _DEFAULT_SIZE)
    rtt = _RTT_MS.get(name, _DEFAULT_RTT_MS)
    rtt_ms = int(ok * rtt) + late * 60_000
    queue_ms = int(ok * 0.02)
    return _OpTotals(req, req + late, late, req * sent_b + late * sent_b, req * recv_b,
                     queue_ms, rtt_ms, rtt_ms + queue_ms + int(ok * 0.05))


def _windows(state: NodeState, mountpoint: str, now: float) -> tuple[float, float]:
    """(seconds healthy, seconds hung) since boot for one mount."""
    hung = [f.injected_at for f in state.faults_of("nfs-hung") if f.mount == mountpoint and f.injected_at <= now]
    start = state.t0 - UPTIME_BEFORE_T0
    if hung:
        at = min(hung)
        return at - start, now - at
    return now - start, 0.0


def _mount_block(spec: MountSpec, state: NodeState, now: float) -> tuple[str, dict[str, _OpTotals], int, int]:
    """(mountstats text, per-op totals, xprt sends, xprt receives) for one mount."""
    healthy, hung = _windows(state, spec.mountpoint, now)
    j = _jitter(state.name, spec.mountpoint)
    v4 = spec.version != "3"
    names = PROCEDURES["4" if v4 else "3"]
    rates = _RATES_V4 if v4 else _RATES_V3
    ops = {n: _op(n, rates.get(n, 0.0) * j, healthy, hung) for n in names}
    ops["NULL"] = _OpTotals(1, 1, 0, 44, 24, 0, 0, 0)  # the mount-time ping
    if v4:
        for n in ("EXCHANGE_ID", "CREATE_SESSION", "RECLAIM_COMPLETE", "SERVER_CAPS", "FSINFO", "PATHCONF"):
            ops[n] = _OpTotals(2, 2, 0, 2 * 230, 2 * 200, 0, 1, 1)
    requests = sum(o.requests for o in ops.values())
    trans = sum(o.trans for o in ops.values())
    retrans_hung = int(HUNG_RETRANS * hung)
    sends = trans + retrans_hung
    receives = requests

    rd = ops["READ"].requests * 65_536  # payload only; per-op bytes include RPC headers
    wr = ops["WRITE"].requests * 65_536
    events = [int(healthy * r * j) for r in
              (30, 25, 0.01, 2, 4, 25, 20, 8, 40, 1, 12, 1, 2, 1, 4, 0.5, 0.2, 4, 0, 0.05, 0.3, 0.001, 0, 0, 0, 0, 0)]
    age = int(now - (state.t0 - UPTIME_BEFORE_T0))
    lines = [
        f"device {spec.export} mounted on {spec.mountpoint} with fstype {spec.fstype} statvers=1.1",
        f"\topts:\t{spec.opts}",
        f"\tage:\t{age}",
    ]
    if v4:
        lines += ["\timpl_id:\tname='',domain='',date='0,0'",
                  "\tcaps:\tcaps=0x3ffbffff,wtmult=512,dtsize=1048576,bsize=0,namlen=255",
                  "\tnfsv4:\tbm0=0xfdffbfff,bm1=0x40f9be3e,bm2=0x60803,acl=0x3,sessions,"
                  "pnfs=not configured,lease_time=90,lease_expired=0"]
    else:
        lines += ["\tcaps:\tcaps=0x3fef,wtmult=4096,dtsize=1048576,bsize=0,namlen=255"]
    lines += [
        "\tsec:\tflavor=1,pseudoflavor=1",
        "\tevents:\t" + "".join(f"{e} " for e in events),
        "\tbytes:\t" + "".join(f"{b} " for b in (rd, wr, 0, 0, rd, wr, rd // 4096, wr // 4096)),
        f"\tRPC iostats version: 1.1  p/v: 100003/{4 if v4 else 3} (nfs)",
        # port bind connect connect_time idle sends recvs bad_xids req_u bklog_u max_slots sending_u pending_u
        f"\txprt:\ttcp 0 0 1 0 0 {sends} {receives} 0 "
        f"{sends * 3} 0 65 {sends * 2} {int(hung * 2)}",
        "\tper-op statistics",
    ]
    for n in names:
        o = ops[n]
        lines.append(f"\t{n:>12}: {o.requests} {o.trans} {o.timeouts} {o.sent} {o.recv} "
                     f"{o.queue_ms} {o.rtt_ms} {o.exec_ms} 0")
    return "\n".join(lines) + "\n\n", ops, sends, receives


def _mountinfo_line(mount_id: int, spec: MountSpec) -> str:
    sb = f"rw,vers={spec.version},rsize=1048576,wsize=1048576,namlen=255,hard,proto=tcp,timeo=600,retrans=2,sec=sys"
    if spec.version == "3":
        sb += f",mountaddr={SERVER},mountvers=3,mountport=20048,mountproto=udp,local_lock=none,addr={SERVER}"
    else:
        sb += f",clientaddr=10.141.0.17,local_lock=none,addr={SERVER}"
    return f"{mount_id} 1 0:{50 + mount_id} / {spec.mountpoint} rw,relatime shared:{mount_id} - {spec.fstype} {spec.export} {sb}"


def present_mounts(state: NodeState) -> list[MountSpec]:
    missing = {f.mount for f in state.faults_of("nfs-missing")}
    return [mount_spec(i, mp) for i, mp in enumerate(state.mounts) if mp not in missing]


def write(state: NodeState, proc_root: Path, now: float) -> None:
    """(Re)write the NFS parts of <proc_root> for `state` at time `now`."""
    w = TreeWriter(proc_root)
    stats = [
        "device rootfs mounted on / with fstype rootfs",
        "device proc mounted on /proc with fstype proc",
        "device sysfs mounted on /sys with fstype sysfs",
        "device /dev/md0 mounted on / with fstype ext4",
    ]
    info = [
        "1 0 0:1 / / rw - rootfs rootfs rw",
        "22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw",
        "23 1 0:22 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw",
        "26 1 9:0 / / rw,relatime shared:1 - ext4 /dev/md0 rw",
    ]
    text = "\n".join(stats) + "\n"
    per_version: dict[str, dict[str, int]] = {"3": {}, "4": {}}
    calls = retrans = 0
    for i, spec in enumerate(present_mounts(state)):
        block, ops, sends, receives = _mount_block(spec, state, now)
        text += block
        info.append(_mountinfo_line(40 + i, spec))
        acc = per_version["4" if spec.version != "3" else "3"]
        for n, o in ops.items():
            acc[n] = acc.get(n, 0) + o.requests
        calls += sum(o.requests for o in ops.values())
        retrans += sends - receives
    # stuck calls on hung mounts were started (counted in rpc calls) but never answered
    for f in state.faults_of("nfs-hung"):
        if f.injected_at <= now and f.mount in state.mounts:
            calls += int(HUNG_TRICKLE * 4 * (now - f.injected_at))

    pid_dir = proc_root / FAKE_PID
    w.put(pid_dir / "mountstats", text)
    w.put(pid_dir / "mountinfo", "\n".join(info) + "\n")
    w.symlink(proc_root / "self", FAKE_PID)

    proc_lines = ["proc2 18 " + " ".join("0" for _ in range(18))]
    for v in ("3", "4"):
        names = PROCEDURES[v]
        proc_lines.append(f"proc{v} {len(names)} " + " ".join(str(per_version[v].get(n, 0)) for n in names))
    packets = calls + retrans
    rpc = (f"net {packets} 0 {packets} {len(present_mounts(state))}\n"
           f"rpc {calls} {retrans} {calls}\n" + "\n".join(proc_lines) + "\n")
    w.put(proc_root / "net" / "rpc" / "nfs", rpc)
