"""NFS client mounts: <procfs_root>/self/mountstats, <procfs_root>/net/rpc/nfs, and a stat probe.

Counters come from the kernel's own bookkeeping (reading them never touches the server). Whether
a configured mount still answers is a separate question, asked by a stat of the mount point in a
killable child process per mount, all mounts at once, so one hung mount costs its own timeout
and nothing else.
"""

from __future__ import annotations

import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Mapping, Sequence

from podhealth.collectors.base import Collection, specs
from podhealth.collectors.nfs_parse import (
    Mountstats, NfsMount, RpcNfs, parse_mountstats, parse_rpc_nfs,
)
from podhealth.collectors.probe import Probe
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

ProbeArgv = Callable[[str], Sequence[str]]
_MAX_READ = 16 * 1024 * 1024  # mountstats on a node with hundreds of mounts is a few MB at most

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("nfs_mount_present", "gauge", "1 when a configured NFS mount is listed in mountstats."),
    MetricSpec("nfs_probe_ok", "gauge", "1 when stat of the mount point answered in time."),
    MetricSpec("nfs_probe_seconds", "gauge", "Latency of the last probe (its timeout when it hung).", "seconds"),
    MetricSpec("nfs_read_bytes", "counter", "Bytes read through read(2) (mountstats bytes: normal read).", "bytes"),
    MetricSpec("nfs_write_bytes", "counter", "Bytes written through write(2) (mountstats bytes: normal write).", "bytes"),
    MetricSpec("nfs_operation_requests", "counter", "RPC requests per NFS operation."),
    MetricSpec("nfs_operation_transmissions", "counter", "RPC transmissions per operation (more than requests = retransmissions)."),
    MetricSpec("nfs_operation_major_timeouts", "counter", "Major timeouts per operation."),
    MetricSpec("nfs_operation_sent_bytes", "counter", "Bytes sent per operation, RPC headers included.", "bytes"),
    MetricSpec("nfs_operation_received_bytes", "counter", "Bytes received per operation, RPC headers included.", "bytes"),
    MetricSpec("nfs_operation_queue_seconds", "counter", "Cumulative time requests waited to be sent.", "seconds"),
    MetricSpec("nfs_operation_rtt_seconds", "counter", "Cumulative round-trip time to the server.", "seconds"),
    MetricSpec("nfs_operation_execute_seconds", "counter", "Cumulative time from queueing to completion.", "seconds"),
    MetricSpec("nfs_transport_sends", "counter", "RPC sends on the mount's transport(s)."),
    MetricSpec("nfs_transport_receives", "counter", "RPC replies received on the mount's transport(s)."),
    MetricSpec("nfs_transport_bad_xids", "counter", "Replies with an unknown transaction id."),
    MetricSpec("nfs_rpc_calls", "counter", "Client RPC calls (/proc/net/rpc/nfs rpc line)."),
    MetricSpec("nfs_rpc_retransmissions", "counter", "Client RPC retransmissions."),
    MetricSpec("nfs_rpc_auth_refreshes", "counter", "Client RPC credential refreshes."),
    MetricSpec("nfs_rpc_procedure_requests", "counter", "Client calls per NFS version and procedure."),
    MetricSpec("nfs_net_packets", "counter", "Network packets of the NFS client, label protocol (udp, tcp)."),
    MetricSpec("nfs_net_tcp_connections", "counter", "TCP connections made by the NFS client."),
)


def _stat_argv() -> ProbeArgv:
    # statfs (stat -f) always asks the server (FSSTAT); a plain stat of the mount root can be
    # answered from the attribute cache for up to acdirmax seconds and miss a dead server.
    stat = shutil.which("stat")
    if stat is not None:
        return lambda mp: [stat, "-f", "--", mp]
    return lambda mp: [sys.executable, "-c", "import os,sys; os.statvfs(sys.argv[1])", mp]


def default_probe_argv(mountpoint: str) -> list[str]:
    return list(_stat_argv()(mountpoint))


def read_text(path: Path) -> str:
    with open(path, "rb") as f:
        return f.read(_MAX_READ).decode("utf-8", "replace")


def mount_samples(mounts: Iterable[NfsMount]) -> list[Sample]:
    """Counter series per NFS mount. Two entries for the same (mountpoint, export) (stacked
    mounts) would make duplicate series: the later one, the one on top and visible, wins."""
    latest: dict[tuple[str, str], NfsMount] = {}
    for m in mounts:
        latest[(m.mountpoint, m.device)] = m
    out: list[Sample] = []
    add = out.append
    for (mp, export), m in sorted(latest.items()):
        lab = {"mountpoint": mp, "export": export}
        if m.bytes is not None:
            add(Sample.of("nfs_read_bytes", m.bytes.normal_read, **lab))
            add(Sample.of("nfs_write_bytes", m.bytes.normal_write, **lab))
        for op in m.operations:
            ol = {**lab, "operation": op.name}
            add(Sample.of("nfs_operation_requests", op.requests, **ol))
            add(Sample.of("nfs_operation_transmissions", op.transmissions, **ol))
            add(Sample.of("nfs_operation_major_timeouts", op.major_timeouts, **ol))
            add(Sample.of("nfs_operation_sent_bytes", op.bytes_sent, **ol))
            add(Sample.of("nfs_operation_received_bytes", op.bytes_received, **ol))
            add(Sample.of("nfs_operation_queue_seconds", op.queue_ms / 1000.0, **ol))
            add(Sample.of("nfs_operation_rtt_seconds", op.rtt_ms / 1000.0, **ol))
            add(Sample.of("nfs_operation_execute_seconds", op.execute_ms / 1000.0, **ol))
        # nconnect=N prints N xprt lines of one protocol: one series per protocol, summed.
        sums: dict[str, dict[str, int]] = {}
        for t in m.transports:
            acc = sums.setdefault(t.protocol, {})
            for field in ("sends", "receives", "bad_xids"):
                v = t.get(field)
                if v is not None:
                    acc[field] = acc.get(field, 0) + v
        for proto, acc in sorted(sums.items()):
            for field, metric in (("sends", "nfs_transport_sends"), ("receives", "nfs_transport_receives"),
                                  ("bad_xids", "nfs_transport_bad_xids")):
                if field in acc:
                    add(Sample.of(metric, acc[field], protocol=proto, **lab))
    return out


def rpc_samples(rpc: RpcNfs) -> list[Sample]:
    out: list[Sample] = []
    if rpc.rpc is not None:
        out.append(Sample.of("nfs_rpc_calls", rpc.rpc.calls))
        out.append(Sample.of("nfs_rpc_retransmissions", rpc.rpc.retransmissions))
        out.append(Sample.of("nfs_rpc_auth_refreshes", rpc.rpc.auth_refreshes))
    if rpc.net is not None:
        out.append(Sample.of("nfs_net_packets", rpc.net.udp_packets, protocol="udp"))
        out.append(Sample.of("nfs_net_packets", rpc.net.tcp_packets, protocol="tcp"))
        out.append(Sample.of("nfs_net_tcp_connections", rpc.net.tcp_connections))
    for pc in rpc.procedures:
        for name, v in pc.counts:
            out.append(Sample.of("nfs_rpc_procedure_requests", v, version=pc.version, procedure=name))
    return out


class NfsCollector:
    name: ClassVar[str] = "nfs"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, procfs_root: Path, mounts: Sequence[tuple[str, float]],
                 probe_argv: ProbeArgv | None = None) -> None:
        """mounts: (mount point, probe timeout seconds) of every configured mount.

        A collection lasts as long as the slowest probe (at most its mount's timeout). When that
        exceeds the collector's own timeout, the agent abandons the collection and the whole
        collector goes stale instead of reporting nfs_probe_ok 0: give the nfs collector a
        timeout above its mounts' timeouts when the verdict "hung" is wanted."""
        argv = probe_argv or _stat_argv()
        self.procfs_root = procfs_root
        self.mounts = tuple(mounts)
        self._probes = {mp: Probe(argv(mp)) for mp, _ in self.mounts}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.mounts)),
                                        thread_name_prefix="nfs-probe") if len(self.mounts) > 1 else None

    def collect(self) -> Collection:
        problems: list[str] = []
        # Probes first, in their own threads: file parsing overlaps with their waiting.
        pending = None
        if self._pool is not None:
            pending = {mp: self._pool.submit(self._probes[mp].run, t) for mp, t in self.mounts}
        stats: Mountstats | None = None
        try:
            stats = parse_mountstats(read_text(self.procfs_root / "self" / "mountstats"))
            problems.extend(stats.problems)
            if stats.malformed > len(stats.problems):
                problems.append(f"mountstats: {stats.malformed} malformed lines in all")
        except OSError as e:
            problems.append(f"mountstats: {e.strerror or e} ({self.procfs_root}/self/mountstats)")
        rpc: RpcNfs | None = None
        try:
            rpc = parse_rpc_nfs(read_text(self.procfs_root / "net" / "rpc" / "nfs"))
            problems.extend(rpc.problems)
        except OSError as e:
            # absent until the nfs module is loaded: reported, but the mounts' series still flow
            problems.append(f"rpc/nfs: {e.strerror or e}")
        if pending is not None:
            results = {mp: f.result() for mp, f in pending.items()}
        else:
            results = {mp: self._probes[mp].run(t) for mp, t in self.mounts}

        samples: list[Sample] = []
        present = {m.mountpoint for m in stats.mounts} if stats is not None else None
        for mp, _ in self.mounts:
            if present is not None:
                samples.append(Sample.of("nfs_mount_present", 1 if mp in present else 0, mountpoint=mp))
            r = results[mp]
            samples.append(Sample.of("nfs_probe_ok", 1 if r.ok else 0, mountpoint=mp))
            samples.append(Sample.of("nfs_probe_seconds", r.seconds, mountpoint=mp))
            if not r.ok:
                problems.append(f"probe {mp}: {r.detail}")
        if stats is not None:
            samples.extend(mount_samples(stats.mounts))
        if rpc is not None:
            samples.extend(rpc_samples(rpc))
        return Collection(tuple(samples), errors=tuple(problems))

    def close(self) -> None:
        for p in self._probes.values():
            p.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)


def create(cfg: Config, *, probe_argv: ProbeArgv | None = None, **_seams: object) -> NfsCollector:
    """probe_argv: mount point -> argv (the simulator passes its nfsprobe); default `stat -f`."""
    mounts = [(m.path, float(m.timeout)) for m in cfg.collectors.nfs.mounts]
    return NfsCollector(cfg.paths.procfs_root, mounts, probe_argv)


__all__ = ["NfsCollector", "create", "default_probe_argv", "mount_samples", "rpc_samples"]
