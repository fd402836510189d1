"""NFS client mounts: <procfs_root>/self/mountstats, <procfs_root>/net/rpc/nfs, and a statfs probe.

Counters come from the kernel's own bookkeeping (reading them never touches the server). Whether
a configured mount still answers is a separate question, asked by a statfs of the mount point in a
long-lived, killable helper process per mount (collectors/probe.py), all mounts at once, so one
hung mount costs its own timeout and nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, ClassVar, Iterable, Mapping, Sequence

from podhealth.collectors.base import Collection, raise_if_local, specs
from podhealth.collectors.nfs_parse import (
    Mountstats, NfsMount, RpcNfs, parse_mountstats, parse_rpc_nfs,
)
from podhealth.collectors.probe import Probe, ProbeResult, Sent, answers, statfs_helper_argv
from podhealth.collectors.samplecache import SampleCache
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample, labels_of

ProbeArgv = Callable[[str], Sequence[str]]
_MAX_READ = 16 * 1024 * 1024  # mountstats on a node with hundreds of mounts is a few MB at most
_CHUNK = 256 * 1024

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("nfs_mount_present", "gauge", "1 when a configured NFS mount is listed in mountstats."),
    MetricSpec("nfs_mount_automount", "gauge",
               "1 when a configured mount point is an autofs trigger with no NFS mount on it (mounted on demand)."),
    MetricSpec("nfs_probe_ok", "gauge", "1 when a statfs of the mount point answered in time."),
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


def default_probe_argv(mountpoint: str) -> list[str]:
    """The statfs helper (collectors/probe.py) for one mount: statfs always asks the server
    (FSSTAT); a plain stat of the mount root can be answered from the attribute cache for up
    to acdirmax seconds and miss a dead server."""
    return statfs_helper_argv(mountpoint)


def read_text(path: Path) -> str:
    """A whole procfs file, at most _MAX_READ bytes (procfs reports size 0: read to EOF)."""
    return read_bounded(path)[0]


def read_bounded(path: Path) -> tuple[str, bool]:
    """read_text, and whether the read stopped at _MAX_READ (the file may go on)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks: list[bytes] = []
        total = 0
        while total < _MAX_READ:
            b = os.read(fd, min(_CHUNK, _MAX_READ - total))
            if not b:
                break
            chunks.append(b)
            total += len(b)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), total >= _MAX_READ


_OP_METRICS = ("nfs_operation_requests", "nfs_operation_transmissions", "nfs_operation_major_timeouts",
               "nfs_operation_sent_bytes", "nfs_operation_received_bytes", "nfs_operation_queue_seconds",
               "nfs_operation_rtt_seconds", "nfs_operation_execute_seconds")
_BYTES_METRICS = ("nfs_read_bytes", "nfs_write_bytes")
_XPRT_FIELDS = (("sends", "nfs_transport_sends"), ("receives", "nfs_transport_receives"),
                ("bad_xids", "nfs_transport_bad_xids"))


def mount_samples(mounts: Iterable[NfsMount], cache: SampleCache | None = None) -> list[Sample]:
    """Counter series per NFS mount. Two entries for the same (mountpoint, export) (stacked
    mounts) would make duplicate series: the later one, the one on top and visible, wins."""
    c = cache if cache is not None else SampleCache()
    latest: dict[tuple[str, str], NfsMount] = {}
    for m in mounts:
        latest[(m.mountpoint, m.device)] = m
    out: list[Sample] = []
    for (mp, export), m in sorted(latest.items()):
        if m.bytes is not None:
            out.extend(c.samples(("bytes", mp, export), _BYTES_METRICS,
                                 (float(m.bytes.normal_read), float(m.bytes.normal_write)),
                                 lambda: labels_of(mountpoint=mp, export=export)))
        for op in m.operations:
            out.extend(c.samples(
                ("op", mp, export, op.name), _OP_METRICS,
                (float(op.requests), float(op.transmissions), float(op.major_timeouts), float(op.bytes_sent),
                 float(op.bytes_received), op.queue_ms / 1000.0, op.rtt_ms / 1000.0, op.execute_ms / 1000.0),
                lambda: labels_of(mountpoint=mp, export=export, operation=op.name)))  # noqa: B023 - called at once
        # nconnect=N prints N xprt lines of one protocol: one series per protocol, summed.
        sums: dict[str, dict[str, int]] = {}
        for t in m.transports:
            acc = sums.setdefault(t.protocol, {})
            for field, _ in _XPRT_FIELDS:
                v = t.get(field)
                if v is not None:
                    acc[field] = acc.get(field, 0) + v
        for proto, acc in sorted(sums.items()):
            present = tuple((metric, float(acc[field])) for field, metric in _XPRT_FIELDS if field in acc)
            if present:
                out.extend(c.samples(("xprt", mp, export, proto, *(n for n, _ in present)),
                                     tuple(n for n, _ in present), tuple(v for _, v in present),
                                     lambda: labels_of(protocol=proto, mountpoint=mp, export=export)))  # noqa: B023
    if cache is None:
        c.commit()
    return out


def rpc_samples(rpc: RpcNfs, cache: SampleCache | None = None) -> list[Sample]:
    c = cache if cache is not None else SampleCache()
    out: list[Sample] = []
    if rpc.rpc is not None:
        out.extend(c.samples(("rpc",), ("nfs_rpc_calls", "nfs_rpc_retransmissions", "nfs_rpc_auth_refreshes"),
                             (float(rpc.rpc.calls), float(rpc.rpc.retransmissions), float(rpc.rpc.auth_refreshes)),
                             lambda: ()))
    if rpc.net is not None:
        out.extend(c.samples(("net", "udp"), ("nfs_net_packets",), (float(rpc.net.udp_packets),),
                             lambda: labels_of(protocol="udp")))
        out.extend(c.samples(("net", "tcp"), ("nfs_net_packets",), (float(rpc.net.tcp_packets),),
                             lambda: labels_of(protocol="tcp")))
        out.extend(c.samples(("net",), ("nfs_net_tcp_connections",), (float(rpc.net.tcp_connections),),
                             lambda: ()))
    for pc in rpc.procedures:
        procs = tuple(name for name, _ in pc.counts)
        out.extend(c.row(("proc", pc.version, *procs), "nfs_rpc_procedure_requests",
                         tuple(float(v) for _, v in pc.counts),
                         lambda: [labels_of(version=pc.version, procedure=p) for p in procs]))  # noqa: B023
    if cache is None:
        c.commit()
    return out


class NfsCollector:
    name: ClassVar[str] = "nfs"
    # Its own thread: a hung mount holds a collection for up to the probe timeout, every interval.
    own_worker: ClassVar[bool] = True
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, procfs_root: Path, mounts: Sequence[tuple[str, float]],
                 probe_argv: ProbeArgv | None = None) -> None:
        """mounts: (mount point, probe timeout seconds) of every configured mount.

        A collection lasts as long as the slowest probe (at most its mount's timeout). When that
        exceeds the collector's own timeout, the agent abandons the collection and the whole
        collector goes stale instead of reporting nfs_probe_ok 0: give the nfs collector a
        timeout above its mounts' timeouts when the verdict "hung" is wanted."""
        argv = probe_argv or default_probe_argv
        self.procfs_root = procfs_root
        self.mounts = tuple(mounts)
        self._probes = {mp: Probe(argv(mp)) for mp, _ in self.mounts}
        self._cache = SampleCache()
        # parse_* are pure: the same text gives the same result, so an idle mount costs a compare.
        self._mountstats: tuple[str, Mountstats] | None = None
        self._rpc: tuple[str, RpcNfs] | None = None

    def _parse_mountstats(self, text: str) -> Mountstats:
        if self._mountstats is None or self._mountstats[0] != text:
            self._mountstats = (text, parse_mountstats(text))
        return self._mountstats[1]

    def _parse_rpc(self, text: str) -> RpcNfs:
        if self._rpc is None or self._rpc[0] != text:
            self._rpc = (text, parse_rpc_nfs(text))
        return self._rpc[1]

    def collect(self) -> Collection:
        # Every mount asked first; the files are parsed while the helpers answer.
        sent: dict[str, Sent] = {}
        results: dict[str, ProbeResult] = {}
        try:
            for mp, t in self.mounts:
                r = self._probes[mp].send(t)
                if isinstance(r, Sent):
                    sent[mp] = r
                else:
                    results[mp] = r
            stats, rpc, cut, problems = self._read_files()
        finally:
            # Always answered, even when a read above raised: an unread answer would be taken
            # for the next probe's.
            results.update(zip(sent, answers(list(sent.values()))))
        return self._samples(results, stats, rpc, cut, problems)

    def _read_files(self) -> tuple["Mountstats | None", "RpcNfs | None", bool, list[str]]:
        problems: list[str] = []
        stats: Mountstats | None = None
        cut = False
        try:
            text, capped = read_bounded(self.procfs_root / "self" / "mountstats")
            stats = self._parse_mountstats(text)
            cut = capped or stats.truncated
            problems.extend(stats.problems)
            if capped:
                problems.append(f"mountstats: read stopped at {_MAX_READ} bytes")
            if stats.malformed > len(stats.problems):
                problems.append(f"mountstats: {stats.malformed} malformed lines in all")
        except OSError as e:
            # Without the mount table nothing can be called missing: a local fault fails the
            # collection (UNKNOWN); any other error leaves nfs_mount_present out, never 0.
            raise_if_local(e, f"{self.procfs_root}/self/mountstats")
            problems.append(f"mountstats: {e.strerror or e} ({self.procfs_root}/self/mountstats)")
        rpc: RpcNfs | None = None
        try:
            rpc = self._parse_rpc(read_text(self.procfs_root / "net" / "rpc" / "nfs"))
            problems.extend(rpc.problems)
        except OSError as e:
            raise_if_local(e, f"{self.procfs_root}/net/rpc/nfs")
            # absent until the nfs module is loaded: reported, but the mounts' series still flow
            problems.append(f"rpc/nfs: {e.strerror or e}")
        return stats, rpc, cut, problems

    def _samples(self, results: dict[str, ProbeResult], stats: "Mountstats | None", rpc: "RpcNfs | None",
                 cut: bool, problems: list[str]) -> Collection:
        samples: list[Sample] = []
        cache = self._cache
        present = {m.mountpoint for m in stats.mounts} if stats is not None else None
        autofs = set(stats.autofs) if stats is not None else set()
        for mp, _ in self.mounts:
            r = results[mp]
            if present is not None and mp not in present and mp in autofs:
                # Mounted on demand: not missing (the probe's statfs walks into it and so
                # triggers the mount; a dead server then shows as a hung probe).
                samples.extend(cache.samples(("automount", mp), ("nfs_mount_automount",), (1.0,),
                                             lambda: labels_of(mountpoint=mp)))  # noqa: B023
            # A mount table cut short lists what came before the cut: a mount not in it is not
            # known to be missing (no nfs_mount_present, so the check says UNKNOWN, never FAIL).
            elif present is not None and (mp in present or not cut):
                samples.extend(cache.samples(("present", mp), ("nfs_mount_present",),
                                             (1.0 if mp in present else 0.0,), lambda: labels_of(mountpoint=mp)))  # noqa: B023
            samples.extend(cache.samples(("probe", mp), ("nfs_probe_ok", "nfs_probe_seconds"),
                                         (1.0 if r.ok else 0.0, float(r.seconds)), lambda: labels_of(mountpoint=mp)))  # noqa: B023
            if not r.ok:
                problems.append(f"probe {mp}: {r.detail}")
        if stats is not None:
            samples.extend(mount_samples(stats.mounts, cache))
        if rpc is not None:
            samples.extend(rpc_samples(rpc, cache))
        cache.commit()
        return Collection(tuple(samples), errors=tuple(problems))

    def close(self) -> None:
        for p in self._probes.values():
            p.close()


def create(cfg: Config, *, probe_argv: ProbeArgv | None = None, **_seams: object) -> NfsCollector:
    """probe_argv: mount point -> the argv of its probe helper (collectors/probe.py speaks to it;
    the simulator passes its nfsprobe); default the statfs helper."""
    mounts = [(m.path, float(m.timeout)) for m in cfg.collectors.nfs.mounts]
    return NfsCollector(cfg.paths.procfs_root, mounts, probe_argv)


__all__ = ["NfsCollector", "create", "default_probe_argv", "mount_samples", "rpc_samples"]
