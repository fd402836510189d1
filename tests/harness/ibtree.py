"""Small /sys/class/infiniband trees for tests, in the formats mlx5 writes (and `ibstat` /
`ibstatus` text turned into such trees, for the real-capture corpus).

A port is its attributes (state, phys_state, rate, link_layer) and counters; a device adds
hca_type/fw_ver/board_id and where it sits: the `device` link to its PCI function, numa_node,
its netdev (device/net/<name>, or ports/N/gid_attrs/ndevs/0 for RoCE), and for a bond the
bonding master's slaves file under class/net.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

ERROR_COUNTERS = ("symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
                  "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
                  "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
                  "excessive_buffer_overrun_errors", "VL15_dropped")
HW_COUNTERS = ("local_ack_timeout_err", "packet_seq_err", "out_of_sequence", "implied_nak_seq_err")

_STATES = {"Down": "1: DOWN", "Initializing": "2: INIT", "Armed": "3: ARMED", "Active": "4: ACTIVE"}
_PHYS = {"Sleep": "1: Sleep", "Polling": "2: Polling", "Disabled": "3: Disabled", "LinkUp": "5: LinkUp",
         "LinkErrorRecovery": "6: LinkErrorRecovery"}


@dataclass
class Port:
    state: str = "4: ACTIVE"
    phys_state: str = "5: LinkUp"
    rate: str = "400 Gb/sec (4X NDR)"
    link_layer: str = "InfiniBand"
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)
    gid_netdev: str | None = None  # ports/N/gid_attrs/ndevs/0 (RoCE ports)


@dataclass
class Hca:
    name: str
    hca_type: str = "MT4129"
    fw_ver: str = "28.41.1000"
    board_id: str = "MT_0000000838"
    pci: str | None = None  # "0000:18:00.0"; None = no device link
    numa: int | None = None
    netdev: str | None = None  # device/net/<netdev>
    bond_slaves: tuple[str, ...] | None = None  # class/net/<gid netdev>/bonding/slaves
    ports: dict[int, Port] = field(default_factory=lambda: {1: Port()})


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def write_tree(sys_root: Path, hcas: list[Hca]) -> Path:
    """Write `hcas` under sys_root/class/infiniband (and the PCI devices and class/net they point
    to); returns sys_root."""
    for h in hcas:
        d = sys_root / "class" / "infiniband" / h.name
        d.mkdir(parents=True, exist_ok=True)
        _w(d / "hca_type", h.hca_type + "\n")
        _w(d / "fw_ver", h.fw_ver + "\n")
        _w(d / "board_id", h.board_id + "\n")
        _w(d / "node_type", "1: CA\n")
        if h.pci is not None:
            bus = h.pci.rsplit(":", 2)[0]
            pdev = sys_root / "devices" / f"pci{bus}" / h.pci
            pdev.mkdir(parents=True, exist_ok=True)
            if h.numa is not None:
                _w(pdev / "numa_node", f"{h.numa}\n")
            if h.netdev is not None:
                (pdev / "net" / h.netdev).mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(pdev, d), d / "device")
        for n, p in h.ports.items():
            pd = d / "ports" / str(n)
            _w(pd / "state", p.state + "\n")
            _w(pd / "phys_state", p.phys_state + "\n")
            _w(pd / "rate", p.rate + "\n")
            _w(pd / "link_layer", p.link_layer + "\n")
            counters = {c: 0 for c in ERROR_COUNTERS}
            counters.update(port_xmit_wait=12345, port_rcv_data=987654321, port_xmit_data=876543210,
                            port_rcv_packets=123456, port_xmit_packets=234567)
            counters.update(p.counters)
            for c, v in counters.items():
                _w(pd / "counters" / c, f"{v}\n")
            hw = {c: 0 for c in HW_COUNTERS}
            hw.update(p.hw_counters)
            for c, v in hw.items():
                _w(pd / "hw_counters" / c, f"{v}\n")
            if p.gid_netdev is not None:
                _w(pd / "gid_attrs" / "ndevs" / "0", p.gid_netdev + "\n")
                if h.bond_slaves is not None:
                    _w(sys_root / "class" / "net" / p.gid_netdev / "bonding" / "slaves", " ".join(h.bond_slaves) + "\n")
    return sys_root


# DGX H100 user guide, network ports table: the compute adapters' buses (ibp24s0 = bus 0x18, ...);
# names as on the captured healthy H100 (ibstat.47.0.h100.all.active.2): mlx5_0,1,4..9 + mlx5_bond_0.
H100_COMPUTE = (("mlx5_0", 0x18, 0), ("mlx5_1", 0x40, 0), ("mlx5_4", 0x4f, 0), ("mlx5_5", 0x5e, 0),
                ("mlx5_6", 0x9a, 1), ("mlx5_7", 0xc0, 1), ("mlx5_8", 0xce, 1), ("mlx5_9", 0xdc, 1))
STORAGE_BUS = 0xaa


def dgx_h100(storage: str = "bond") -> list[Hca]:
    """A healthy DGX H100: eight single-port NDR compute adapters and the storage pair of one
    dual-port card as `bond` (RoCE LAG: mlx5_bond_0, Ethernet 200, the captured BlueField-3),
    `ib` (two InfiniBand ports mlx5_2/mlx5_3 at NDR 400) or `none`."""
    hcas = [Hca(name, pci=f"0000:{bus:02x}:00.0", numa=numa, netdev=f"ibp{bus}s0")
            for name, bus, numa in H100_COMPUTE]
    if storage == "bond":
        slaves = (f"enp{STORAGE_BUS}s0f0np0", f"enp{STORAGE_BUS}s0f1np1")
        hcas.append(Hca("mlx5_bond_0", hca_type="MT41692", fw_ver="32.38.3056", board_id="MT_0000000884",
                        pci=f"0000:{STORAGE_BUS:02x}:00.0", numa=1, netdev=slaves[0], bond_slaves=slaves,
                        ports={1: Port(rate="200 Gb/sec (4X HDR)", link_layer="Ethernet", gid_netdev="bond0")}))
    elif storage == "ib":
        for fn in (0, 1):
            hcas.append(Hca(f"mlx5_{2 + fn}", pci=f"0000:{STORAGE_BUS:02x}:00.{fn}", numa=1,
                            netdev=f"ibp{STORAGE_BUS}s0f{fn}"))
    return hcas


def _rate_text(gbps: str) -> str:
    return f"{gbps} Gb/sec (4X)"


def from_ibstat(text: str) -> list[Hca]:
    """`ibstat` or `ibstatus` output as devices (no PCI placement: the tools do not print it)."""
    hcas: dict[str, Hca] = {}
    cur: Hca | None = None
    port: Port | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if m := re.match(r"CA '([^']+)'", line):
            cur = hcas[m.group(1)] = Hca(m.group(1), ports={})
            port = None
        elif m := re.match(r"Infiniband device '([^']+)' port (\d+) status:", line):
            cur = hcas.setdefault(m.group(1), Hca(m.group(1), hca_type="", fw_ver="", ports={}))
            port = cur.ports[int(m.group(2))] = Port()
        elif cur is None:
            continue
        elif m := re.match(r"CA type: (\S+)", line):
            cur.hca_type = m.group(1)
        elif m := re.match(r"Firmware version: (\S+)", line):
            cur.fw_ver = m.group(1)
        elif m := re.match(r"Port (\d+):$", line):
            port = cur.ports[int(m.group(1))] = Port()
        elif port is None:
            continue
        elif m := re.match(r"State: (\S+)", line):
            port.state = _STATES[m.group(1)]
        elif m := re.match(r"Physical state: (\S+)", line):
            port.phys_state = _PHYS[m.group(1)]
        elif m := re.match(r"Rate: (\d+)", line):
            port.rate = _rate_text(m.group(1))
        elif m := re.match(r"Link layer: (\S+)", line):
            port.link_layer = m.group(1)
        elif m := re.match(r"state:\s+(\d+: \S+)", line):
            port.state = m.group(1)
        elif m := re.match(r"phys state:\s+(\d+: \S+)", line):
            port.phys_state = m.group(1)
        elif m := re.match(r"rate:\s+(.+)", line):
            port.rate = m.group(1)
        elif m := re.match(r"link_layer:\s+(\S+)", line):
            port.link_layer = m.group(1)
    return list(hcas.values())
