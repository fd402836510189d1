"""The simulated node's /sys/class/infiniband and /sys/class/net, in the kernel's exact formats.

Counters are a pure function of (state, now): traffic grows from `t0` at a per-port rate and
stops while the port is down, so every rewrite (and every reader between rewrites) sees
monotonic values. Formats follow mlx5 on a DGX H100 (ConnectX-7, fw 28.x, kernel 5.15):
ports/N/state "4: ACTIVE", phys_state "5: LinkUp", rate "400 Gb/sec (4X NDR)".

The layout is sysfs's: an adapter with a PCI address lives under
devices/pci0000:RR/0000:RR:01.0/<pci>/ (numa_node, vendor, device, infiniband/<dev>/, net/<if>/)
and class/infiniband/<dev> and class/net/<if> are symlinks into it; infiniband/<dev>/device
points back at ../../../<pci>. A bonding master lives under devices/virtual/net/<bond>/ with
bonding/{mode,slaves,mii_status,miimon}; its members get master -> the bond and bonding_slave/.
A RoCE port names its netdev in ports/1/gid_attrs/ndevs/0 (for an InfiniBand port the kernel
answers EINVAL there, so the file is not written). Adapters without a PCI address (states
from older versions, non-DGX profiles) are plain directories under class/infiniband, as before.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Mapping

from podhealth.sim.faults import climbed, down_intervals, saturated_value
from podhealth.sim.state import Fault, HcaSpec, NodeState
from podhealth.sim.tree_write import TreeWriter

# IB speed names by per-port rate with 4X width (ib_verbs.h ib_port_speed x width)
_SPEED = {800: "4X XDR", 400: "4X NDR", 200: "4X HDR", 100: "4X EDR", 56: "4X FDR", 40: "4X QDR",
          20: "4X DDR", 10: "4X SDR"}
# mlx5 reports the SDR default while a port has no link
_DOWN_RATE = "10 Gb/sec (4X SDR)"
# PCI device id per firmware major (28.x = ConnectX-7, 20.x = ConnectX-6, 22.x = ConnectX-6 Dx,
# 32.x = BlueField-3)
_HCA_TYPE = {"28": "MT4129", "20": "MT4123", "22": "MT4125", "26": "MT4127", "32": "MT41692"}
MELLANOX_VENDOR = "0x15b3"

COUNTERS = ("VL15_dropped", "excessive_buffer_overrun_errors", "link_downed", "link_error_recovery",
            "local_link_integrity_errors", "multicast_rcv_packets", "multicast_xmit_packets",
            "port_rcv_constraint_errors", "port_rcv_data", "port_rcv_errors", "port_rcv_packets",
            "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors",
            "port_xmit_constraint_errors", "port_xmit_data", "port_xmit_discards", "port_xmit_packets",
            "port_xmit_wait", "symbol_error", "unicast_rcv_packets", "unicast_xmit_packets")
# mlx5 hw_counters of an InfiniBand port
HW_COUNTERS = ("duplicate_request", "implied_nak_seq_err", "lifespan", "local_ack_timeout_err",
               "out_of_buffer", "out_of_sequence", "packet_seq_err", "req_cqe_error",
               "req_cqe_flush_error", "req_remote_access_errors", "req_remote_invalid_request",
               "req_rnr_retries_exceeded", "req_transport_retries_exceeded", "resp_cqe_error",
               "resp_cqe_flush_error", "resp_local_length_error", "resp_remote_access_errors",
               "rnr_nak_retry_err", "rx_atomic_requests", "rx_dct_connect", "rx_read_requests",
               "rx_write_requests")
# ... plus the RoCE congestion-control counters mlx5 adds on an Ethernet port
ROCE_HW_COUNTERS = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled", "rp_cnp_ignored",
                    "roce_adp_retrans", "roce_adp_retrans_to", "roce_slow_restart",
                    "roce_slow_restart_cnps", "roce_slow_restart_trans", "rx_icrc_encapsulated")

UPTIME_BEFORE_T0 = 3 * 86400.0  # the node had been up a while when the simulation started
MTU_BYTES = 4096


def _jitter(*parts: str) -> float:
    """A stable factor in [0.5, 1.5) per port, so ports differ as on a real node."""
    return 0.5 + hashlib.sha256("/".join(parts).encode()).digest()[0] / 256.0


def _faults_for(state: NodeState, hca: HcaSpec, kind: str) -> list[Fault]:
    return [f for f in state.faults_of(kind) if f.device in (None, hca.device)
            and f.port in (None, hca.port)]


def _rate_text(gbps: float) -> str:
    g = int(gbps) if float(gbps).is_integer() else gbps
    return f"{g} Gb/sec ({_SPEED.get(int(gbps), '4X')})"


def _up_seconds(start: float, now: float, downs: list[tuple[float, float]]) -> float:
    """Seconds in [start, now] outside every down interval (traffic stops while a port is down)."""
    total = max(0.0, now - start)
    merged: list[tuple[float, float]] = []
    for a, b in sorted((max(a, start), min(b, now)) for a, b in downs):
        if b <= a:
            continue
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return total - sum(b - a for a, b in merged)


def _synth(state: NodeState, hca: HcaSpec, now: float) -> tuple[dict[str, str], dict[str, int], dict[str, int]]:
    """Port attributes and counters of a simulated port at `now`, before saturation."""
    downs = [iv for f in _faults_for(state, hca, "ib-down") + _faults_for(state, hca, "ib-flap")
             for iv in down_intervals(f)]
    started = [iv for iv in downs if iv[0] <= now]
    is_down = any(a <= now < b for a, b in started)
    slow = [f for f in _faults_for(state, hca, "ib-rate") if f.injected_at <= now]
    sym = _faults_for(state, hca, "ib-symbol-errors")

    # seconds of traffic: from boot until now, less the time the port was down
    active = UPTIME_BEFORE_T0 + _up_seconds(state.t0, now, downs)
    j = _jitter(state.name, hca.device, str(hca.port))
    # average utilisation: compute ports run collectives (~12% of line rate), storage ports ~2%
    util = (0.12 if hca.role == "compute" else 0.02) * j
    bytes_per_s = hca.rate_gbps * 1e9 / 8 * util
    xmit_bytes = int(active * bytes_per_s)
    rcv_bytes = int(active * bytes_per_s * 0.97)
    xmit_pkts = xmit_bytes // MTU_BYTES
    rcv_pkts = rcv_bytes // MTU_BYTES
    mcast = int(active * 0.2)

    ethernet = hca.link_layer == "Ethernet"
    if is_down:
        # mlx5: an IB port without link polls for a peer; a RoCE port follows its netdev (Disabled)
        attrs = {"state": "1: DOWN", "phys_state": "3: Disabled" if ethernet else "2: Polling",
                 "rate": _DOWN_RATE}
    else:
        if slow and slow[-1].rate:
            rate = _rate_text(float(slow[-1].rate))
        else:
            rate = hca.rate_text or _rate_text(float(hca.rate_gbps))
        attrs = {"state": hca.state_text or "4: ACTIVE", "phys_state": hca.phys_state_text or "5: LinkUp",
                 "rate": rate}
    attrs["link_layer"] = hca.link_layer

    counters = {name: 0 for name in COUNTERS}
    counters.update({
        "port_xmit_data": xmit_bytes // 4,  # the PMA counts 4-byte words
        "port_rcv_data": rcv_bytes // 4,
        "port_xmit_packets": xmit_pkts, "port_rcv_packets": rcv_pkts,
        "unicast_xmit_packets": xmit_pkts - mcast, "unicast_rcv_packets": rcv_pkts - mcast,
        "multicast_xmit_packets": mcast, "multicast_rcv_packets": mcast,
        # ticks the port had data but no credits (light congestion); saturates at 32 bits
        "port_xmit_wait": int(active * 2.5e5 * j),
        # the HCA counts every time the link leaves LinkUp
        "link_downed": len(started),
        "symbol_error": sum(climbed(f, now) for f in sym),
    })

    ops = active * (5000.0 if hca.role == "compute" else 300.0) * j
    hw = {name: 0 for name in HW_COUNTERS + (ROCE_HW_COUNTERS if ethernet else ())}
    hw.update({
        "lifespan": 10,  # ms the driver caches hw counters; a setting, not a count
        "rx_write_requests": int(ops * 0.6), "rx_read_requests": int(ops * 0.4),
        "rx_atomic_requests": int(ops * 0.001),
        "out_of_sequence": int(active * 1e-4), "duplicate_request": int(active * 1e-4),
        "local_ack_timeout_err": len(started) * 7,
        "req_cqe_flush_error": len(started) * 64, "resp_cqe_flush_error": len(started) * 64,
    })
    if ethernet:
        hw.update({"np_cnp_sent": int(active * 0.5), "rp_cnp_handled": int(active * 0.5),
                   "np_ecn_marked_roce_packets": int(active * 0.5)})
    return attrs, counters, hw


Counts = dict[str, "int | str"]  # a counter file's value, or its verbatim text (seeded captures)


def _port_values(state: NodeState, hca: HcaSpec, now: float) -> tuple[dict[str, str], Counts, Counts]:
    attrs, synth_c, synth_h = _synth(state, hca, now)
    counters: Counts = dict(synth_c)
    hw: Counts = dict(synth_h)
    if hca.counters is not None or hca.hw_counters is not None:
        # Seeded from a capture: its files, its values, plus what moved since t0 (nothing
        # moves on a port the capture shows without link).
        _, c0, h0 = _synth(state, hca, state.t0)
        if hca.state_text and not hca.state_text.startswith("4"):
            c0, h0 = synth_c, synth_h
        if hca.counters is not None:
            counters = _grown(hca.counters, counters, c0)
        # a capture without hw_counters/ (mlx4, hfi1) gets none
        hw = _grown(hca.hw_counters or {}, hw, h0)
    counters = {k: saturated_value(k, v) if isinstance(v, int) else v for k, v in counters.items()}
    for f in _faults_for(state, hca, "ib-counter-saturated"):
        if f.injected_at <= now and f.counter in counters:
            counters[f.counter] = saturated_value(f.counter, 1 << 64)
    return attrs, counters, hw


def _grown(captured: Mapping[str, int | str], now: Mapping[str, int | str],
           at_t0: Mapping[str, int | str]) -> dict[str, int | str]:
    """The captured counters plus what the simulation moved since t0; text stays as it is."""
    out: dict[str, int | str] = {}
    for k, v in captured.items():
        a, b = now.get(k, 0), at_t0.get(k, 0)
        out[k] = v + max(0, a - b) if isinstance(v, int) and isinstance(a, int) and isinstance(b, int) else v
    return out


def hca_type(hca: HcaSpec) -> str:
    return hca.hca_type or _HCA_TYPE.get(hca.fw_ver.split(".", 1)[0], "MT4129")


def _pci_device_id(hca: HcaSpec) -> str:
    """PCI device id from the CA type: MT4129 is device 4129 = 0x1021 (ConnectX-7)."""
    digits = hca_type(hca)[2:]
    return f"0x{int(digits):04x}" if digits.isdigit() else "0x0000"


def _pci_dir(sys_root: Path, pci: str) -> Path:
    """devices/pci0000:RR/0000:RR:01.0/<pci>: the adapter behind a root port of its bus range."""
    root_bus = int(pci.split(":")[1], 16) & 0xF0
    return sys_root / "devices" / f"pci0000:{root_bus:02x}" / f"0000:{root_bus:02x}:01.0" / pci


def _link(w: TreeWriter, path: Path, target: Path) -> None:
    """`path` -> `target` as a relative link (sysfs links are relative); a real directory left
    there by an older simulator (class/infiniband/<dev> used to be one) is replaced."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rel = os.path.relpath(target, path.parent)
    if target in path.parents:
        # the kernel spells a link to an ancestor by going past it: ../../../0000:17:00.0
        rel = os.path.join(os.path.relpath(target.parent, path.parent), target.name)
    w.symlink(path, rel)


def _write_netdev(w: TreeWriter, ndir: Path, hca: HcaSpec, up: bool, pci_dir: Path | None,
                  master: Path | None) -> None:
    ethernet = hca.link_layer == "Ethernet"
    w.put(ndir / "operstate", ("up" if up else "down") + "\n")
    w.put(ndir / "carrier", ("1" if up else "0") + "\n")
    w.put(ndir / "type", ("1" if ethernet else "32") + "\n")  # ARPHRD_ETHER / ARPHRD_INFINIBAND
    w.put(ndir / "mtu", ("9000" if ethernet else "4092") + "\n")
    if ethernet:
        # Mb/s; a bond's members share its rate (2 x 100GbE under a 200 Gb/s mlx5_bond_0)
        mbps = hca.rate_gbps * 1000 // (len(hca.bond_slaves) if master is not None else 1)
        w.put(ndir / "speed", (f"{mbps}" if up else "-1") + "\n")
    if pci_dir is not None:
        _link(w, ndir / "device", pci_dir)
    if master is not None:
        _link(w, ndir / "master", master)


def _write_adapter(w: TreeWriter, sys_root: Path, hca: HcaSpec, attrs: dict[str, str],
                   counters: Counts, hw: Counts) -> tuple[Path, list[str]]:
    """One RDMA device port; returns the device's real directory and the class/net names it owns."""
    base = sys_root / "class" / "infiniband"
    up = attrs["state"].startswith("4")
    nets: list[str] = []
    pci_dir = _pci_dir(sys_root, hca.pci_addr) if hca.pci_addr else None
    if pci_dir is not None:
        dev = pci_dir / "infiniband" / hca.device
        w.put(pci_dir / "numa_node", f"{hca.numa_node}\n")
        w.put(pci_dir / "vendor", MELLANOX_VENDOR + "\n")
        w.put(pci_dir / "device", _pci_device_id(hca) + "\n")
        # ConnectX-7 / BlueField-3 train PCIe gen5 x16 (a real H100 boot log: mlx5_core "32.0 GT/s PCIe
        # x16 link", ../shared/fixtures/xid_kernel_logs/dmesg_decode_iso_boot_h100_nvswitch_mlx5.log);
        # ConnectX-6 (firmware 20.x, Dx 22.x) is a gen4 part.
        gen4 = hca.fw_ver.split(".", 1)[0] in ("20", "22")
        w.put(pci_dir / "current_link_speed", ("16.0" if gen4 else "32.0") + " GT/s PCIe\n")
        w.put(pci_dir / "current_link_width", "16\n")
        _link(w, base / hca.device, dev)
        _link(w, dev / "device", pci_dir)
    else:
        dev = base / hca.device
    g = hca.node_guid.rjust(16, "0")
    for name, text in (("board_id", hca.board_id), ("fw_ver", hca.fw_ver), ("hca_type", hca_type(hca)),
                       ("node_type", "1: CA"),
                       ("node_guid", ":".join(g[i:i + 4] for i in range(0, 16, 4)) if hca.node_guid else "")):
        if text and name not in hca.absent:
            w.put(dev / name, text + "\n")
    port = dev / "ports" / str(hca.port)
    for name, text in attrs.items():
        w.put(port / name, text + "\n")
    for name, v in counters.items():
        w.put(port / "counters" / name, f"{v}\n")
    for name, v in hw.items():
        w.put(port / "hw_counters" / name, f"{v}\n")
    for name, v in (hca.counters_ext or {}).items():
        w.put(port / "counters_ext" / name, f"{v}\n")
    if hca.link_layer == "Ethernet" and hca.netdev:
        w.put(port / "gid_attrs" / "ndevs" / "0", hca.netdev + "\n")
        w.put(port / "gid_attrs" / "types" / "0", "IB/RoCE v1\n")
    if not hca.netdev:
        return dev, nets
    if hca.bond_slaves:
        bond = sys_root / "devices" / "virtual" / "net" / hca.netdev
        _write_netdev(w, bond, hca, up, None, None)
        w.put(bond / "bonding" / "mode", hca.bond_mode + "\n")
        w.put(bond / "bonding" / "slaves", " ".join(hca.bond_slaves) + "\n")
        w.put(bond / "bonding" / "mii_status", ("up" if up else "down") + "\n")
        w.put(bond / "bonding" / "miimon", "100\n")
        _link(w, sys_root / "class" / "net" / hca.netdev, bond)
        nets.append(hca.netdev)
        bus = hca.pci_addr.rsplit(".", 1)[0] if hca.pci_addr else ""
        for fn, slave in enumerate(hca.bond_slaves):
            sdir = (_pci_dir(sys_root, f"{bus}.{fn}") / "net" / slave if bus
                    else sys_root / "devices" / "virtual" / "net" / slave)
            spci = _pci_dir(sys_root, f"{bus}.{fn}") if bus else None
            if spci is not None:
                w.put(spci / "numa_node", f"{hca.numa_node}\n")
                w.put(spci / "vendor", MELLANOX_VENDOR + "\n")
            _write_netdev(w, sdir, hca, up, spci, bond)
            w.put(sdir / "bonding_slave" / "state", ("active" if up else "backup") + "\n")
            w.put(sdir / "bonding_slave" / "mii_status", ("up" if up else "down") + "\n")
            _link(w, sys_root / "class" / "net" / slave, sdir)
            _link(w, bond / f"lower_{slave}", sdir)
            nets.append(slave)
        return dev, nets
    ndir = (pci_dir / "net" / hca.netdev) if pci_dir is not None else (
        sys_root / "devices" / "virtual" / "net" / hca.netdev)
    _write_netdev(w, ndir, hca, up, pci_dir, None)
    _link(w, sys_root / "class" / "net" / hca.netdev, ndir)
    nets.append(hca.netdev)
    return dev, nets


def _prune(directory: Path, keep: set[str]) -> None:
    """Remove entries a previous state wrote (a node re-created with another topology)."""
    try:
        entries = list(directory.iterdir())
    except FileNotFoundError:
        return
    for p in entries:
        if p.name in keep or p.name.startswith("."):
            continue
        if p.is_symlink() or not p.is_dir():
            p.unlink()
        else:
            shutil.rmtree(p)


def write(state: NodeState, sys_root: Path, now: float) -> None:
    """(Re)write <sys_root>/class/infiniband (and class/net) for every HCA port of `state` at `now`."""
    w = TreeWriter(sys_root)
    devices: set[str] = set()
    nets: set[str] = set()
    for hca in state.hcas:
        attrs, counters, hw = _port_values(state, hca, now)
        _, owned = _write_adapter(w, sys_root, hca, attrs, counters, hw)
        devices.add(hca.device)
        nets.update(owned)
    _prune(sys_root / "class" / "infiniband", devices)
    _prune(sys_root / "class" / "net", nets)
