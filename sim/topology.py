"""The network adapters of a simulated DGX node, as the real SKU has them.

A DGX does not have "N identical IB ports". A DGX H100/H200 has eight single-port ConnectX-7
NDR 400 InfiniBand adapters for the GPU rails (compute), named as the kernel enumerates them
(mlx5_0, mlx5_1, mlx5_4..mlx5_9 on the captured DGX H100: ../shared/fixtures/infiniband/
ibstat.47.0.h100.all.active.2.txt), and a storage / in-band pair that a site runs in one of
the documented ways:

    bond      Ethernet (RoCE) ports bonded by the OS: mlx5 replaces their two RDMA devices with
              ONE `mlx5_bond_0` whose netdev is the bonding master `bond0` (the capture: CA type
              MT41692, fw 32.38.3056, rate 200, link layer Ethernet)
    ethernet  the same ports unbonded: two RoCE devices, one netdev each
    ib        the same ports as InfiniBand: two more IB devices (mlx5_2, mlx5_3 on DGX H100)
    none      no storage adapters

PCI addresses put each compute adapter beside its GPU's PCIe switch and on its NUMA node, as
`nvidia-smi topo -m` on an 8-GPU H100 shows (NIC0-3 PIX to GPU0-3 on NUMA 0, NIC4-7 on NUMA 1);
IB netdevs take the predictable name `ibp<bus>s0`, Ethernet ones `enp<bus>s0f<fn>np<fn>`; the
storage pair is one dual-port card (functions .0 and .1 of one bus).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Mapping

from podhealth.sim.state import HcaRole, HcaSpec

STORAGE_MODES = ("bond", "ethernet", "ib", "none")
BOND_DEVICE = "mlx5_bond_0"
BOND_NETDEV = "bond0"
# mode text as /sys/class/net/bond0/bonding/mode shows it; DGX OS storage bonds use LACP
BOND_MODE = "802.3ad 4"


@dataclass(frozen=True)
class Layout:
    """Where one SKU's adapters sit and what they are."""

    compute: tuple[tuple[str, int, int], ...]  # (device, PCI bus, NUMA node)
    compute_rate: int
    compute_fw: str
    compute_board: str
    storage_devices: tuple[str, str]  # names of the unbonded storage devices
    storage_bus: int
    storage_numa: int
    storage_ib_rate: int
    storage_eth_rate: int
    storage_fw: str
    storage_board: str
    storage_hca_type: str  # "" = from the firmware major, as compute
    default_storage: str


# DGX H100/H200: names from the captured ibstat; buses one below each GPU's (the HCA shares the
# GPU's PCIe switch), storage a dual-port card at bus 0xa9. The bond's adapter is the captured
# BlueField-3 (MT41692, fw 32.x); its board id is illustrative.
_HOPPER = Layout(
    compute=(("mlx5_0", 0x17, 0), ("mlx5_1", 0x29, 0), ("mlx5_4", 0x39, 0), ("mlx5_5", 0x5c, 0),
             ("mlx5_6", 0x99, 1), ("mlx5_7", 0xaa, 1), ("mlx5_8", 0xb9, 1), ("mlx5_9", 0xda, 1)),
    compute_rate=400, compute_fw="28.41.1000", compute_board="MT_0000000838",
    storage_devices=("mlx5_2", "mlx5_3"), storage_bus=0xa9, storage_numa=1,
    storage_ib_rate=400, storage_eth_rate=200,
    storage_fw="32.38.3056", storage_board="MT_0000000884", storage_hca_type="MT41692",
    default_storage="bond",
)

LAYOUTS: Mapping[str, Layout] = {
    "dgx-h100": _HOPPER,
    "dgx-h200": _HOPPER,
    # DGX B200: ConnectX-7 compute, BlueField-3 storage/in-band (DGX B200 user guide).
    "dgx-b200": Layout(
        compute=(("mlx5_0", 0x1a, 0), ("mlx5_1", 0x42, 0), ("mlx5_4", 0x51, 0), ("mlx5_5", 0x60, 0),
                 ("mlx5_6", 0x9c, 1), ("mlx5_7", 0xc2, 1), ("mlx5_8", 0xd0, 1), ("mlx5_9", 0xde, 1)),
        compute_rate=400, compute_fw="28.43.1014", compute_board="MT_0000000838",
        storage_devices=("mlx5_2", "mlx5_3"), storage_bus=0x2a, storage_numa=0,
        storage_ib_rate=400, storage_eth_rate=200,
        storage_fw="32.43.1014", storage_board="MT_0000000884", storage_hca_type="MT41692",
        default_storage="bond",
    ),
    # DGX A100: ConnectX-6 HDR compute mlx5_0-3, mlx5_6-9; storage mlx5_4/mlx5_5 on a dual-port
    # ConnectX-6 at bus 0xe1, InfiniBand by default (DGX A100 user guide, network ports).
    "dgx-a100": Layout(
        compute=(("mlx5_0", 0x0c, 3), ("mlx5_1", 0x12, 3), ("mlx5_2", 0x4b, 1), ("mlx5_3", 0x54, 1),
                 ("mlx5_6", 0x8d, 7), ("mlx5_7", 0x94, 7), ("mlx5_8", 0xba, 5), ("mlx5_9", 0xcc, 5)),
        compute_rate=200, compute_fw="20.39.1002", compute_board="MT_0000000223",
        storage_devices=("mlx5_4", "mlx5_5"), storage_bus=0xe1, storage_numa=5,
        storage_ib_rate=200, storage_eth_rate=200,
        storage_fw="20.39.1002", storage_board="MT_0000000223", storage_hca_type="",
        default_storage="ib",
    ),
    # GB200 NVL72 compute tray: 4x ConnectX-7 400G (one per GPU) and 2x BlueField-3 for storage /
    # in-band (DGX GB200 user guide, network ports); buses per Grace socket, illustrative.
    "gb200-nvl72": Layout(
        compute=(("mlx5_0", 0x03, 0), ("mlx5_1", 0x04, 0), ("mlx5_2", 0x13, 1), ("mlx5_3", 0x14, 1)),
        compute_rate=400, compute_fw="28.43.1014", compute_board="MT_0000000838",
        storage_devices=("mlx5_4", "mlx5_5"), storage_bus=0x01, storage_numa=0,
        storage_ib_rate=400, storage_eth_rate=200,
        storage_fw="32.43.1014", storage_board="MT_0000000884", storage_hca_type="MT41692",
        default_storage="bond",
    ),
}


def storage_mode(count: int, bonded: str, link_layers: tuple[str, ...]) -> str | None:
    """The storage build a profile's storage role implies (None = the SKU's default): a role a
    site pinned to one build (bonded required / forbidden, one link layer) gets that build."""
    if count == 0:
        return "none"
    if bonded == "required":
        return "bond"
    if bonded == "forbidden" or link_layers == ("InfiniBand",):
        return "ib" if "InfiniBand" in link_layers else "ethernet"
    return None


def _guid(node: str, device: str) -> str:
    """A stable node GUID per (node, device) with Mellanox's OUI prefix, as real ones carry."""
    return "a088c203" + hashlib.sha256(f"guid/{node}/{device}".encode()).hexdigest()[:8]


def _pci(bus: int, fn: int = 0) -> str:
    return f"0000:{bus:02x}:00.{fn}"


def build(node: str, profile: str, compute_count: int, compute_rate: int, link_layer: str,
          storage_count: int, storage: str | None = None) -> tuple[HcaSpec, ...]:
    """The adapters of a healthy node of `profile`. ValueError for an unknown storage mode.

    `compute_count`/`compute_rate`/`link_layer`/`storage_count` come from the hardware profile
    (the checks judge against the same numbers); where the profile has more compute ports than
    the SKU layout names, the extra ones get the next free mlx5_N.
    """
    layout = LAYOUTS.get(profile)
    mode = storage or (layout.default_storage if layout else ("ib" if storage_count else "none"))
    if mode not in STORAGE_MODES:
        raise ValueError(f"bad storage mode {mode!r} (allowed: {', '.join(STORAGE_MODES)})")
    hcas: list[HcaSpec] = []

    def add(device: str, role: HcaRole, rate: int, ll: str, fw: str, board: str, pci: str,
            numa: int, netdev: str, hca_type: str = "", slaves: tuple[str, ...] = ()) -> None:
        hcas.append(HcaSpec(device=device, port=1, rate_gbps=rate, link_layer=ll, board_id=board,
                            fw_ver=fw, role=role, node_guid=_guid(node, device), pci_addr=pci,
                            numa_node=numa, netdev=netdev, hca_type=hca_type, bond_slaves=slaves,
                            bond_mode=BOND_MODE if slaves else ""))

    if layout is None:
        # Not a DGX: N identical single-port adapters, no PCI placement to model.
        for i in range(compute_count + storage_count):
            role: HcaRole = "compute" if i < compute_count else "storage"
            add(f"mlx5_{i}", role, compute_rate, link_layer, "28.41.1000", "MT_0000000838", "", -1,
                "")
        return tuple(hcas)
    for i in range(compute_count):
        if i < len(layout.compute):
            device, bus, numa = layout.compute[i]
        else:
            n = 10 + i - len(layout.compute)
            device, bus, numa = f"mlx5_{n}", 0xe0 + i, 1
        netdev = f"ibp{bus}s0" if link_layer == "InfiniBand" else f"enp{bus}s0np0"
        add(device, "compute", compute_rate, link_layer, layout.compute_fw, layout.compute_board,
            _pci(bus), numa, netdev)
    if mode == "none" or storage_count == 0:
        return tuple(hcas)
    b = layout.storage_bus
    eth = tuple(f"enp{b}s0f{fn}np{fn}" for fn in range(storage_count))
    if mode == "bond":
        add(BOND_DEVICE, "storage", layout.storage_eth_rate, "Ethernet", layout.storage_fw,
            layout.storage_board, _pci(b), layout.storage_numa, BOND_NETDEV, layout.storage_hca_type,
            eth)
        return tuple(hcas)
    names = list(layout.storage_devices) + [f"mlx5_{10 + j}" for j in range(storage_count)]
    for fn in range(storage_count):
        if mode == "ib":
            add(names[fn], "storage", layout.storage_ib_rate, "InfiniBand", layout.storage_fw,
                layout.storage_board, _pci(b, fn), layout.storage_numa, f"ibp{b}s0f{fn}",
                layout.storage_hca_type)
        else:
            add(names[fn], "storage", layout.storage_eth_rate, "Ethernet", layout.storage_fw,
                layout.storage_board, _pci(b, fn), layout.storage_numa, eth[fn],
                layout.storage_hca_type)
    return tuple(hcas)
