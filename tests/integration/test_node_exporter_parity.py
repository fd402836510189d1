"""node_exporter 1.5 is the oracle: on the same sysfs/procfs tree, its node_infiniband_*,
node_mountstats_nfs_* and node_nfs_* values must equal podhealth's equivalents.

Trees: the simulated DGX H100 (with IB and NFS faults injected) written by podhealth.sim, and,
when ../shared/fixtures is present, the real-capture InfiniBand trees and mountstats captures.
Known, deliberate differences (asserted below, not skipped silently):
- counters_ext/ (node_infiniband_legacy_*) and hw_counters/ are read by only one side each;
- node_exporter 1.5 cannot parse `xprt: rdma` (the simulator therefore mounts over TCP);
- node_exporter keys mounts by (export, protocol, mountaddr) and keeps the first duplicate;
  podhealth keys them by (mountpoint, export).
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.collectors.nfs import NfsCollector
from podhealth.collectors.nfs_parse import PROCEDURES
from podhealth.sim import tree_ib, tree_nfs
from podhealth.sim.state import Fault, default_state
from podhealth.vocab import Sample
from tests.harness.proc import free_port, http_get, need, service

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0

# node_infiniband_<name>_total -> the counters/ file it comes from (procfs 0.8 class_infiniband.go)
IB_COUNTER_FILES = {
    "excessive_buffer_overrun_errors": "excessive_buffer_overrun_errors",
    "link_downed": "link_downed",
    "link_error_recovery": "link_error_recovery",
    "local_link_integrity_errors": "local_link_integrity_errors",
    "multicast_packets_received": "multicast_rcv_packets",
    "multicast_packets_transmitted": "multicast_xmit_packets",
    "port_constraint_errors_received": "port_rcv_constraint_errors",
    "port_constraint_errors_transmitted": "port_xmit_constraint_errors",
    "port_discards_received": "port_rcv_discards",
    "port_discards_transmitted": "port_xmit_discards",
    "port_errors_received": "port_rcv_errors",
    "port_receive_remote_physical_errors": "port_rcv_remote_physical_errors",
    "port_receive_switch_relay_errors": "port_rcv_switch_relay_errors",
    "port_transmit_wait": "port_xmit_wait",
    "symbol_error": "symbol_error",
    "unicast_packets_received": "unicast_rcv_packets",
    "unicast_packets_transmitted": "unicast_xmit_packets",
    "vl15_dropped": "VL15_dropped",
}
IB_OWN_SERIES = {
    "node_infiniband_state_id": "infiniband_port_state",
    "node_infiniband_physical_state_id": "infiniband_port_physical_state",
    "node_infiniband_rate_bytes_per_second": "infiniband_port_rate_bytes_per_second",
    "node_infiniband_port_data_received_bytes_total": "infiniband_port_data_received_bytes",
    "node_infiniband_port_data_transmitted_bytes_total": "infiniband_port_data_transmitted_bytes",
    "node_infiniband_port_packets_received_total": "infiniband_port_packets_received",
    "node_infiniband_port_packets_transmitted_total": "infiniband_port_packets_transmitted",
}
MOUNTSTATS_SERIES = {
    "node_mountstats_nfs_read_bytes_total": "nfs_read_bytes",
    "node_mountstats_nfs_write_bytes_total": "nfs_write_bytes",
    "node_mountstats_nfs_operations_requests_total": "nfs_operation_requests",
    "node_mountstats_nfs_operations_transmissions_total": "nfs_operation_transmissions",
    "node_mountstats_nfs_operations_major_timeouts_total": "nfs_operation_major_timeouts",
    "node_mountstats_nfs_operations_sent_bytes_total": "nfs_operation_sent_bytes",
    "node_mountstats_nfs_operations_received_bytes_total": "nfs_operation_received_bytes",
    "node_mountstats_nfs_operations_queue_time_seconds_total": "nfs_operation_queue_seconds",
    "node_mountstats_nfs_operations_response_time_seconds_total": "nfs_operation_rtt_seconds",
    "node_mountstats_nfs_operations_request_time_seconds_total": "nfs_operation_execute_seconds",
    "node_mountstats_nfs_transport_sends_total": "nfs_transport_sends",
    "node_mountstats_nfs_transport_receives_total": "nfs_transport_receives",
    "node_mountstats_nfs_transport_bad_transaction_ids_total": "nfs_transport_bad_xids",
}
NFS_SERIES = {
    "node_nfs_rpcs_total": "nfs_rpc_calls",
    "node_nfs_rpc_retransmissions_total": "nfs_rpc_retransmissions",
    "node_nfs_rpc_authentication_refreshes_total": "nfs_rpc_auth_refreshes",
    "node_nfs_connections_total": "nfs_net_tcp_connections",
}


@dataclass(frozen=True)
class Scrape:
    values: dict[tuple[str, frozenset[tuple[str, str]]], float]

    def success(self, collector: str) -> float | None:
        return self.values.get(("node_scrape_collector_success", frozenset({("collector", collector)})))

    def with_prefix(self, prefix: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        return {k: v for k, v in self.values.items() if k[0].startswith(prefix)}


def scrape_node_exporter(sys_root: Path, proc_root: Path, rootfs: Path, logs: Path) -> Scrape:
    binary = need("prometheus-node-exporter")
    port = free_port()
    argv = [binary, f"--web.listen-address=127.0.0.1:{port}", f"--path.sysfs={sys_root}",
            f"--path.procfs={proc_root}", f"--path.rootfs={rootfs}", "--collector.disable-defaults",
            "--collector.infiniband", "--collector.mountstats", "--collector.nfs"]
    url = f"http://127.0.0.1:{port}/metrics"
    with service("node_exporter", argv, logs, port, ready=lambda: http_get(url, timeout=2)[0] == 200):
        status, body = http_get(url)
    assert status == 200
    values = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            values[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return Scrape(values)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-9)


def _index(samples: tuple[Sample, ...]) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels)): s.value for s in samples}


def compare_infiniband(ne: Scrape, ours: tuple[Sample, ...]) -> int:
    """Assert every node_infiniband_* value equals ours; returns how many were compared."""
    assert ne.success("infiniband") == 1
    own = _index(ours)
    compared = 0
    mismatches = []
    for (name, labels), value in sorted(ne.with_prefix("node_infiniband_").items(), key=str):
        if name.startswith("node_infiniband_legacy_"):
            continue  # counters_ext/: not read by podhealth (mlx4 only)
        if name == "node_infiniband_info":
            key = ("infiniband_info", labels)
        elif name in IB_OWN_SERIES:
            cands = [k for k in own if k[0] == IB_OWN_SERIES[name] and
                     {kv for kv in k[1] if kv[0] != "state"} == set(labels)]
            assert len(cands) == 1, f"{name}{dict(labels)}: podhealth has {cands}"
            key = cands[0]
        else:
            m = re.fullmatch(r"node_infiniband_(.+)_total", name)
            assert m and m.group(1) in IB_COUNTER_FILES, f"node_exporter series {name} has no mapping"
            key = ("infiniband_port_stat", labels | {("counter", IB_COUNTER_FILES[m.group(1)])})
        if key not in own:
            mismatches.append(f"{name}{dict(labels)}={value}: podhealth has no {key}")
        elif not _close(own[key], value):
            mismatches.append(f"{name}{dict(labels)}: node_exporter {value!r} != podhealth {own[key]!r}")
        compared += 1
    assert not mismatches, "\n".join(mismatches)
    # and the other way: every counters/ file node_exporter knows is exported by it too
    ne_keys = set(ne.values)
    reverse = {v: k for k, v in IB_COUNTER_FILES.items()}
    for s in ours:
        if s.name == "infiniband_port_stat" and s.label("counter") in reverse:
            labels = frozenset((k, v) for k, v in s.labels if k != "counter")
            assert (f"node_infiniband_{reverse[s.label('counter')]}_total", labels) in ne_keys, s
    return compared


# procfs 0.8 names two NFSv2 procedures differently from the kernel's table
_PROCFS_ALIASES = {"fsstat": "statfs", "wrcache": "writecache"}


def _norm(name: str, version: str = "") -> str:
    n = name.replace("_", "").lower()
    return _PROCFS_ALIASES.get(n, n) if version == "2" else n


def compare_nfs(ne: Scrape, ours: tuple[Sample, ...]) -> int:
    assert ne.success("mountstats") == 1 and ne.success("nfs") == 1
    own = _index(ours)
    # podhealth's mounts by (export, protocol) in file order: node_exporter keeps the first one
    by_export: dict[tuple[str, str], str] = {}
    for s in ours:
        if s.name == "nfs_transport_sends":
            by_export.setdefault((s.label("export"), s.label("protocol")), s.label("mountpoint"))
    compared = 0
    mismatches = []
    for (name, labels), value in sorted(ne.with_prefix("node_mountstats_nfs_").items(), key=str):
        if name not in MOUNTSTATS_SERIES:
            continue  # events, pages, age, direct I/O, slots...: podhealth does not export them
        lab = dict(labels)
        mp = by_export.get((lab["export"], lab["protocol"]))
        assert mp is not None, f"podhealth has no mount for {lab}"
        want = {("mountpoint", mp), ("export", lab["export"])}
        if "operation" in lab:
            want.add(("operation", lab["operation"]))
        if "transport" in MOUNTSTATS_SERIES[name]:
            want.add(("protocol", lab["protocol"]))
        key = (MOUNTSTATS_SERIES[name], frozenset(want))
        if name.endswith("_time_seconds_total") and own.get(key, 0) * 1e9 >= 2**63:
            # a kernel counter that wrapped (node_exporter's own fixture has one): procfs turns
            # the milliseconds into a Go Duration, which overflows int64 nanoseconds; podhealth
            # keeps the raw value / 1000. Neither is meaningful; only this case may differ.
            continue
        if key not in own:
            mismatches.append(f"{name}{lab}: podhealth has no {key}")
        elif not _close(own[key], value):
            mismatches.append(f"{name}{lab}: node_exporter {value!r} != podhealth {own[key]!r}")
        compared += 1
    for (name, labels), value in ne.with_prefix("node_nfs_").items():
        lab = dict(labels)
        if name in NFS_SERIES:
            key = (NFS_SERIES[name], frozenset())
        elif name == "node_nfs_packets_total":
            key = ("nfs_net_packets", frozenset({("protocol", lab["protocol"])}))
        elif name == "node_nfs_requests_total":
            version = [k for k in own if k[0] == "nfs_rpc_procedure_requests" and ("version", lab["proto"]) in k[1]]
            hits = [k for k in version if _norm(dict(k[1])["procedure"]) == _norm(lab["method"], lab["proto"])]
            if not hits:
                # procfs pads a short procN line (older kernel) with zeros; podhealth leaves
                # counters the kernel did not print absent. Only such padding may be missing.
                names = [_norm(n, lab["proto"]) for n in PROCEDURES[lab["proto"]]]
                assert _norm(lab["method"], lab["proto"]) in names[len(version):] and value == 0, \
                    f"{name}{lab}={value}: podhealth has no such procedure"
                continue
            assert len(hits) == 1, f"{name}{lab}: podhealth has {hits}"
            key = hits[0]
        else:
            raise AssertionError(f"node_exporter series {name} has no mapping")
        if key not in own:
            mismatches.append(f"{name}{lab}: podhealth has no {key}")
        elif not _close(own[key], value):
            mismatches.append(f"{name}{lab}: node_exporter {value!r} != podhealth {own[key]!r}")
        compared += 1
    assert not mismatches, "\n".join(mismatches)
    return compared


def _ours(sys_root: Path, proc_root: Path) -> tuple[tuple[Sample, ...], tuple[Sample, ...]]:
    ib = InfinibandCollector(sys_root).collect()
    col = NfsCollector(proc_root, [])
    try:
        nfs = col.collect()
    finally:
        col.close()
    return ib.samples, nfs.samples


def test_simulated_dgx_h100(tmp_path: Path) -> None:
    st = (default_state("dgx01", "dgx-h100", now=T0)
          .with_fault(Fault("ib-down", T0 + 60, device="mlx5_7"))
          .with_fault(Fault("ib-rate", T0 + 60, device="mlx5_4", rate=200.0))
          .with_fault(Fault("ib-symbol-errors", T0 + 60, device="mlx5_5", rate=25.0))
          .with_fault(Fault("nfs-hung", T0 + 60, mount="/cm/shared")))
    root = tmp_path / "root"
    tree_ib.write(st, root / "sys", T0 + 600)
    tree_nfs.write(st, root / "proc", T0 + 600)
    ne = scrape_node_exporter(root / "sys", root / "proc", root, tmp_path / "logs")
    ib, nfs = _ours(root / "sys", root / "proc")
    # 9 ports (8 compute rails + mlx5_bond_0) x (state, phys, rate, 4 data/packet counters,
    # 17 other counters) + 9 info
    assert compare_infiniband(ne, ib) == 9 * (3 + 4 + 17) + 9
    n = compare_nfs(ne, nfs)
    ops = len(PROCEDURES["3"]) + len(PROCEDURES["4"])
    assert n >= 2 * 2 + ops * 8 + 2 * 3 + 5  # bytes, per-op, transport, rpc/net
    # the faults are visible to both
    assert ne.values[("node_infiniband_state_id", frozenset({("device", "mlx5_7"), ("port", "1")}))] == 1
    assert ne.values[("node_infiniband_symbol_error_total", frozenset({("device", "mlx5_5"), ("port", "1")}))] == 25 * 540


@pytest.mark.parametrize("tree", ["procfs_tree", "node_exporter_tree"])
def test_shared_infiniband_trees(shared_fixtures: Path, tmp_path: Path, tree: str) -> None:
    sys_root = shared_fixtures / "infiniband" / tree / "sys"
    # node_exporter refuses to start without <procfs>/self -> <pid>; no mounts in it
    (tmp_path / "proc" / "1").mkdir(parents=True)
    for name in ("mountstats", "mountinfo"):
        (tmp_path / "proc" / "1" / name).write_text("")
    (tmp_path / "proc" / "self").symlink_to("1")
    ne = scrape_node_exporter(sys_root, tmp_path / "proc", tmp_path, tmp_path / "logs")
    ib, _ = _ours(sys_root, tmp_path / "proc")
    assert compare_infiniband(ne, ib) > 20


def _mountinfo_for(mountstats: str) -> str:
    """A mountinfo with one line per mountstats `device` line, same order (how node_exporter pairs
    them); NFS lines carry addr= from the mount options, as the kernel's do."""
    out = []
    for i, line in enumerate(ln for ln in mountstats.splitlines() if ln.startswith("device ")):
        m = re.match(r"device (\S+) mounted on (\S+) with fstype (\S+)", line)
        assert m, line
        dev, mp, fs = m.groups()
        addr = dev.split(":", 1)[0]
        out.append(f"{i + 20} 1 0:{i + 40} / {mp} rw,relatime - {fs} {dev} rw,addr={addr}")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("mountstats,rpc", [
    ("mountstats_node_exporter_fixture_nfs4_nfs3_udp.txt", "proc_net_rpc_nfs_node_exporter_fixture.txt"),
    ("mountstats_nfs4.1_k8s_pod_extended_ops.txt", "proc_net_rpc_nfs_procfs_fixture.txt"),
    ("mountstats_procfs_fixture_pid26231.txt", "proc_net_rpc_nfs_procfs_fixture.txt"),
])
def test_shared_nfs_captures(shared_fixtures: Path, tmp_path: Path, mountstats: str, rpc: str) -> None:
    proc = tmp_path / "proc"
    (proc / "26231").mkdir(parents=True)
    text = (shared_fixtures / "nfs" / mountstats).read_text()
    (proc / "26231" / "mountstats").write_text(text)
    (proc / "26231" / "mountinfo").write_text(_mountinfo_for(text))
    (proc / "self").symlink_to("26231")
    (proc / "net" / "rpc").mkdir(parents=True)
    shutil.copy(shared_fixtures / "nfs" / rpc, proc / "net" / "rpc" / "nfs")
    (tmp_path / "sys").mkdir()
    ne = scrape_node_exporter(tmp_path / "sys", proc, tmp_path, tmp_path / "logs")
    _, nfs = _ours(tmp_path / "sys", proc)
    assert compare_nfs(ne, nfs) > 20
