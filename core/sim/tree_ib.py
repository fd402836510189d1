"""The simulated node's /sys/class/infiniband, in the kernel's exact formats.

Counters are a pure function of (state, now): traffic grows from `t0` at a per-port rate and
stops while the port is down, so every rewrite (and every reader between rewrites) sees
monotonic values. Formats follow mlx5 on a DGX H100 (ConnectX-7, fw 28.x, kernel 5.15):
ports/N/state "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)".
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from podhealth.sim.faults import climbed
from podhealth.sim.state import Fault, HcaSpec, NodeState
from podhealth.sim.tree_write import TreeWriter

# IB speed names by per-port rate with 4X width (ib_verbs.h ib_port_speed x width)
_SPEED = {800: "4X XDR", 400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 56: "4X FDR", 40: "4X QDR",
          20: "4X DDR", 10: "4X SDR"}
# mlx5 reports the SDR default while a port has no link
_DOWN_RATE = "10 Gb/sec (4X SDR)"
# PCI device id per firmware major (28.x = ConnectX-7, 20.x = ConnectX-6, 22.x = ConnectX-6 Dx)
_HCA_TYPE = {"28": "MT4129", "20": "MT4123", "22": "MT4125", "26": "MT4127"}

# PMA counter widths (IBTA PortCounters): they saturate at their maximum instead of wrapping.
_WIDTH_BITS = {
    "symbol_error": 16, "link_error_recovery": 8, "link_downed": 8, "port_rcv_errors": 16,
    "port_rcv_remote_physical_errors": 16, "port_rcv_switch_relay_errors": 16,
    "port_xmit_discards": 16, "port_xmit_constraint_errors": 8, "port_rcv_constraint_errors": 8,
    "local_link_integrity_errors": 4, "excessive_buffer_overrun_errors": 4, "VL15_dropped": 16,
}
COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
            "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
            "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
            "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
            "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
            "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets")
# mlx5 hw_counters of an InfiniBand port (the RoCE congestion counters exist only on Ethernet)
HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
               "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
               "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
               "req_rnr_retries_exceeded", "req_transport_retries_exceeded", "resp_cqe_error",
               "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors",
               "rnr_nak_retry_err", "rx_atomic_requests", "rx_dct_connect", "rx_read_requests",
               "rx_write_requests")

UPTIME_BEFORE_T0 = 3 * 86400.0  # the node had been up a while when the simulation started
MTU_BYTES = 4096


def _jitter(*parts: str) -> float:
    """A stable factor in [0.5, 1.5) per port, so ports differ as on a real node."""
    return 0.5 + hashlib.sha256("/".join(parts).encode()).digest()[0] / 256.0


def _faults_for(state: NodeState, hca: HcaSpec, kind: str) -> list[Fault]:
    return [f for f in state.faults_of(kind) if f.device in (None, hca.device)]


def _saturate(name: str, v: int) -> int:
    bits = _WIDTH_BITS.get(name)
    return min(v, (1 << bits) - 1) if bits else v


def _rate_text(gbps: float) -> str:
    g = int(gbps) if float(gbps).is_integer() else gbps
    return f"{g} Gb/sec ({_SPEED.get(int(gbps), '4X')})"


def _port_values(state: NodeState, hca: HcaSpec, now: float) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
    down = [f for f in _faults_for(state, hca, "ib-down") if f.injected_at <= now]
    slow = [f for f in _faults_for(state, hca, "ib-rate") if f.injected_at <= now]
    sym = _faults_for(state, hca, "ib-symbol-errors")

    # seconds of traffic: from boot until now, or until the first down fault
    stop = min([now] + [f.injected_at for f in down])
    active = UPTIME_BEFORE_T0 + max(0.0, stop - state.t0)
    j = _jitter(state.name, hca.device, str(hca.port))
    # average utilisation: compute ports run collectives (~12% of line rate), storage ports ~2%
    util = (0.12 if hca.role == "compute" else 0.02) * j
    bytes_per_s = hca.rate_gbps * 1e9 / 8 * util
    xmit_bytes = int(active * bytes_per_s)
    rcv_bytes = int(active * bytes_per_s * 0.97)
    xmit_pkts = xmit_bytes // MTU_BYTES
    rcv_pkts = rcv_bytes // MTU_BYTES
    mcast = int(active * 0.2)

    if down:
        attrs = {"state": "1: DOWN", "phys_state": "2: Polling", "rate": _DOWN_RATE}
    else:
        gbps = float(slow[-1].rate) if slow and slow[-1].rate else float(hca.rate_gbps)
        attrs = {"state": "4: ACTIVE", "phys_state": "5: LinkUp", "rate": _rate_text(gbps)}
    attrs["link_layer"] = hca.link_layer

    counters = {name: 0 for name in COUNTERS}
    counters.update({
        "port_xmit_data": xmit_bytes // 4,  # the PMA counts 4-byte words
        "port_rcv_data": rcv_bytes // 4,
        "port_xmit_packets": xmit_pkts, "port_rcv_packets": rcv_pkts,
        "unicast_xmit_packets": xmit_pkts - mcast, "unicast_rcv_packets": rcv_pkts - mcast,
        "multicast_xmit_packets": mcast, "multicast_rcv_packets": mcast,
        # ticks the port had data but no credits (light congestion); a 32-bit PMA counter
        "port_xmit_wait": min(int(active * 2.5e5 * j), (1 << 32) - 1),
        "link_downed": len(down),
        "symbol_error": sum(climbed(f, now) for f in sym),
    })
    counters = {k: _saturate(k, v) for k, v in counters.items()}

    ops = active * (5000.0 if hca.role == "compute" else 300.0) * j
    hw = {name: 0 for name in HW_COUNTERS}
    hw.update({
        "lifespan": 10,  # ms the driver caches hw counters; a setting, not a count
        "rx_write_requests": int(ops * 0.6), "rx_read_requests": int(ops * 0.4),
        "rx_atomic_requests": int(ops * 0.001),
        "out_of_sequence": int(active * 1e-4), "duplicate_request": int(active * 1e-4),
        "local_ack_timeout_err": len(down) * 7,
        "req_cqe_flush_error": len(down) * 64, "resp_cqe_flush_error": len(down) * 64,
    })
    return attrs, counters, hw


def hca_type(hca: HcaSpec) -> str:
    return _HCA_TYPE.get(hca.fw_ver.split(".", 1)[0], "MT4129")


def write(state: NodeState, sys_root: Path, now: float) -> None:
    """(Re)write <sys_root>/class/infiniband for every HCA port of `state` at time `now`."""
    w = TreeWriter(sys_root)
    base = sys_root / "class" / "infiniband"
    for hca in state.hcas:
        dev = base / hca.device
        w.put(dev / "board_id", hca.board_id + "\n")
        w.put(dev / "fw_ver", hca.fw_ver + "\n")
        w.put(dev / "hca_type", hca_type(hca) + "\n")
        w.put(dev / "node_type", "1: CA\n")
        if hca.node_guid:
            g = hca.node_guid.rjust(16, "0")
            w.put(dev / "node_guid", ":".join(g[i:i + 4] for i in range(0, 16, 4)) + "\n")
        attrs, counters, hw = _port_values(state, hca, now)
        port = dev / "ports" / str(hca.port)
        for name, text in attrs.items():
            w.put(port / name, text + "\n")
        for name, v in counters.items():
            w.put(port / "counters" / name, f"{v}\n")
        for name, v in hw.items():
            w.put(port / "hw_counters" / name, f"{v}\n")
