"""The simulated node's state: plain, frozen, JSON-serialisable data.

`NodeState` is what a simulated node *is* (its GPUs, HCAs, mounts, systemd units) plus the faults
injected into it. Readings that move with time (energy, CRC counters under a rate fault) are not
stored: the NVML simulator and the tree writers compute them from `t0` and each fault's
`injected_at`, so any reader at any moment sees a consistent, monotonic value without a ticker.

`default_state(name, profile)` builds a healthy node from a hardware profile
(`podhealth.checks.profiles`) plus the per-SKU facts below (PCI ids, clocks, VBIOS), which only
the simulator needs.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any, Literal, Mapping

from podhealth.checks import profiles

SCHEMA_VERSION = 1

# NVML's nvmlDeviceArchitecture_t values (nvml.h), by the names used in state files.
ARCHITECTURES: Mapping[str, int] = MappingProxyType(
    {"volta": 5, "turing": 6, "ampere": 7, "ada": 8, "hopper": 9, "blackwell": 10}
)

HcaRole = Literal["compute", "storage", "other"]


@dataclass(frozen=True)
class GpuSpec:
    """One GPU as NVML would describe it on a healthy node, before faults."""

    index: int
    name: str
    uuid: str
    serial: str
    pci_bus_id: str  # NVML form: "00000000:18:00.0"
    pci_device_id: int  # (device << 16) | vendor, e.g. 0x233010DE
    pci_subsystem_id: int
    memory_total_mib: int
    vbios: str
    power_limit_w: int
    max_graphics_clock_mhz: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    max_video_clock_mhz: int
    pcie_gen_max: int
    pcie_width_max: int
    nvlink_count: int
    architecture: str  # key of ARCHITECTURES
    persistence_mode: bool = True
    ecc_enabled: bool = True
    # Baseline counters (a capture may seed non-zero ones). None = not reported by this SKU.
    ecc_sbe_volatile: int = 0
    ecc_dbe_volatile: int = 0
    ecc_sbe_aggregate: int = 0
    ecc_dbe_aggregate: int = 0
    remap_correctable: int | None = 0  # None on pre-Ampere (no row remapping)
    remap_uncorrectable: int | None = 0
    remap_pending: bool = False
    remap_failure: bool = False
    # Banks by spare-row availability (max, high, partial, low, none), as nvidia-smi's "Bank Remap
    # Availability Histogram"; None = every bank at max (REMAP_BANKS of them) where rows remap.
    remap_histogram: tuple[int, int, int, int, int] | None = None
    retired_pages_sbe: int | None = None  # None on Ampere+ (page retirement replaced by remapping)
    retired_pages_dbe: int | None = None
    retired_pages_pending: bool = False
    clocks_event_reasons: int = 0x1  # idle
    # Current clocks in MHz (graphics, SM, memory, video) as a capture showed them; None = the
    # simulator's idle clocks (podhealth.sim.nvml_lib._idle_clocks).
    clock_graphics_mhz: int | None = None
    clock_sm_mhz: int | None = None
    clock_mem_mhz: int | None = None
    clock_video_mhz: int | None = None
    pcie_replay: int = 0
    temperature_c: int = 33
    mem_temperature_c: int = 38
    power_w: float = 72.0
    # NVML temperature thresholds (absolute C; H100 SXM values from a 535 driver capture). The T.Limit
    # margin NVML reports (nvmlDeviceGetMarginTemperature) is temp_max_operating_c - the temperature.
    temp_shutdown_c: int = 92
    temp_slowdown_c: int = 89
    temp_max_operating_c: int = 87
    mem_temp_max_c: int = 95
    has_fabric: bool = True  # NVSwitch fabric state reported (Hopper+ DGX)
    # MIG (Ampere and later): mode on, and one MIG device per GPU instance profile listed here
    # ("1g.10gb" ... "7g.80gb"). NVML still enumerates the physical GPU once (nvmlDeviceGetCount);
    # MIG devices are only reached through nvmlDeviceGetMigDeviceHandleByIndex.
    mig_mode: bool = False
    mig_devices: tuple[str, ...] = ()
    # Clocks-event reason bits the driver says it can report (nvmlDeviceGetSupportedClocksEventReasons);
    # R570-era drivers add bits this project has no name for (0x200 board limit, 0x400 reliability).
    clocks_event_supported: int = 0x1FF
    # A vGPU guest's license (NVML_GRID_LICENSE_STATE_*, 5 = licensed); None = bare metal or
    # passthrough: nvmlDeviceGetGridLicensableFeatures answers NOT_SUPPORTED.
    vgpu_license_state: int | None = None
    # What this SKU or driver generation answers instead of a value: NVML C function name (as the
    # simulator registers it, e.g. "nvmlDeviceGetUtilizationRates"), or "field:<id>" for one field
    # of nvmlDeviceGetFieldValues (answered in that field's nvmlReturn inside an OK call), ->
    # nvmlReturn_t code (NOT_SUPPORTED 3, NO_PERMISSION 4, TIMEOUT 10, GPU_IS_LOST 15, UNKNOWN 999).
    nvml_errors: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "GpuSpec":
        hist = d.get("remap_histogram")
        return cls(**{**d, "mig_devices": tuple(d.get("mig_devices") or ()),
                      "remap_histogram": tuple(int(x) for x in hist) if hist is not None else None,
                      "nvml_errors": {str(k): int(v) for k, v in (d.get("nvml_errors") or {}).items()}})

    @property
    def pci_bus_id_short(self) -> str:
        """The kernel's form, "0000:18:00.0" (NVML pads the domain to 8 digits)."""
        domain, rest = self.pci_bus_id.split(":", 1)
        return f"{int(domain, 16):04x}:{rest.lower()}"


@dataclass(frozen=True)
class HcaSpec:
    device: str  # mlx5_0
    port: int
    rate_gbps: int
    link_layer: str
    board_id: str
    fw_ver: str
    role: HcaRole
    node_guid: str = ""
    # Where the adapter sits and what the OS calls it ("" / -1 = not modelled: no device link,
    # no netdev written). podhealth.sim.topology fills these per SKU.
    pci_addr: str = ""  # kernel form, "0000:aa:00.0"
    numa_node: int = -1
    netdev: str = ""  # ibp23s0, enp169s0f0np0, or a bonding master (bond0)
    hca_type: str = ""  # "" = from the firmware major (28.x -> MT4129)
    bond_slaves: tuple[str, ...] = ()  # member netdevs when `netdev` is a bonding master
    bond_mode: str = ""  # /sys/class/net/<bond>/bonding/mode, e.g. "802.3ad 4"
    # A node seeded from a real sysfs tree keeps what the capture said, verbatim ("" / None =
    # the healthy simulated value): port state texts, the rate text, and its counter files.
    rate_text: str = ""
    state_text: str = ""
    phys_state_text: str = ""
    counters: dict[str, int | str] | None = None  # str: verbatim text ("N/A (no PMA)")
    hw_counters: dict[str, int | str] | None = None
    counters_ext: dict[str, int | str] | None = None  # mlx4's 64-bit counters_ext/, as captured
    absent: tuple[str, ...] = ()  # device attribute files the capture did not have (not written)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "HcaSpec":
        return cls(**{**d, "bond_slaves": tuple(d.get("bond_slaves") or ()),
                      "absent": tuple(d.get("absent") or ())})


@dataclass(frozen=True)
class Fault:
    """One injected fault. Only the fields its kind uses are set (see podhealth.sim.faults)."""

    kind: str
    injected_at: float
    seq: int = 0  # unique per node; XID events are delivered once per seq
    gpu: int | None = None
    link: int | None = None
    code: int | None = None  # XID code
    rate: float | None = None  # errors/s for climbing counters; Gb/s for ib-rate
    width: int | None = None
    gen: int | None = None
    seconds: float | None = None
    device: str | None = None
    mount: str | None = None
    unit: str | None = None
    port: int | None = None  # IB port of `device` (None = every port)
    count: int | None = None  # ib-flap: down/up cycles
    period: float | None = None  # ib-flap: seconds per cycle
    counter: str | None = None  # ib-counter-saturated: counters/ file name
    persist: int | None = None  # 1: survives a reboot (fault=reboot clears every fault without it)
    pct: float | None = None  # fail-slow kinds: how much slower, in percent (sim/perfmodel.py)

    def describe(self) -> str:
        parts = [f"fault={self.kind}" if self.kind != "xid" else f"xid={self.code}"]
        for f in fields(self):
            if f.name in ("kind", "injected_at", "seq", "code"):
                continue
            v = getattr(self, f.name)
            if v is not None:
                parts.append(f"{f.name}={v:g}" if isinstance(v, float) else f"{f.name}={v}")
        return " ".join(parts)


@dataclass(frozen=True)
class NodeState:
    name: str
    profile: str
    driver_version: str
    cuda_version: int  # NVML form: 12040 = 12.4
    nvml_version: str
    gpus: tuple[GpuSpec, ...]
    hcas: tuple[HcaSpec, ...]
    mounts: tuple[str, ...]
    units: Mapping[str, str]  # systemd unit -> ActiveState
    faults: tuple[Fault, ...] = ()
    t0: float = field(default_factory=time.time)
    next_seq: int = 1

    def gpu(self, index: int) -> GpuSpec:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def faults_of(self, kind: str, gpu: int | None = None) -> tuple[Fault, ...]:
        return tuple(f for f in self.faults if f.kind == kind and (gpu is None or f.gpu == gpu))

    def with_fault(self, fault: Fault) -> "NodeState":
        return replace(self, faults=self.faults + (replace(fault, seq=self.next_seq),),
                       next_seq=self.next_seq + 1)

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["gpus"] = [asdict(g) for g in self.gpus]
        d["hcas"] = [asdict(h) for h in self.hcas]
        d["faults"] = [asdict(f) for f in self.faults]
        d["mounts"] = list(self.mounts)
        d["units"] = dict(self.units)
        d["schema"] = SCHEMA_VERSION
        return d

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NodeState":
        if d.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"state schema {d.get('schema')!r} is not {SCHEMA_VERSION}")
        return cls(
            name=str(d["name"]),
            profile=str(d["profile"]),
            driver_version=str(d["driver_version"]),
            cuda_version=int(d["cuda_version"]),
            nvml_version=str(d["nvml_version"]),
            gpus=tuple(GpuSpec.from_json(g) for g in d["gpus"]),
            hcas=tuple(HcaSpec.from_json(h) for h in d["hcas"]),
            mounts=tuple(str(m) for m in d["mounts"]),
            units=MappingProxyType({str(k): str(v) for k, v in d["units"].items()}),
            faults=tuple(Fault(**f) for f in d["faults"]),
            t0=float(d["t0"]),
            next_seq=int(d.get("next_seq", 1)),
        )

    @classmethod
    def loads(cls, text: str) -> "NodeState":
        return cls.from_json(json.loads(text))


@dataclass(frozen=True)
class Sku:
    """Facts about one GPU SKU that only the simulator needs (profiles.yaml holds the rest)."""

    pci_device_id: int
    pci_subsystem_id: int
    vbios: str
    max_graphics_clock_mhz: int
    max_sm_clock_mhz: int
    max_mem_clock_mhz: int
    max_video_clock_mhz: int
    architecture: str
    bus_ids: tuple[int, ...]  # PCI bus numbers of the GPUs, in NVML index order
    driver_version: str
    cuda_version: int
    hca_board_id: str
    hca_fw_ver: str


# Values from nvidia-smi -q captures (H100 SXM 565.57.01, H200 550.90.12) and the DGX user guides
# (bus layout: `nvidia-smi topo -m` / lspci on DGX H100; DGX A100 and B200 system guides).
# The 8-GPU H100/H200 SXM baseboard: the same GPUs in a DGX and in an OEM HGX server.
_H100_SXM = Sku(0x233010DE, 0x16C110DE, "96.00.74.00.01", 1980, 1980, 2619, 1545, "hopper",
                 (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB), "565.57.01", 12070,
                 "MT_0000000838", "28.41.1000")
_H200_SXM = Sku(0x233510DE, 0x18BE10DE, "96.00.A5.00.01", 1980, 1980, 3201, 1545, "hopper",
                 (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB), "550.90.12", 12040,
                 "MT_0000000838", "28.41.1000")

SKUS: Mapping[str, Sku] = MappingProxyType({
    "dgx-h100": _H100_SXM,
    "dgx-h200": _H200_SXM,
    "dgx-b200": Sku(0x290110DE, 0x199910DE, "97.00.4A.00.01", 1965, 1965, 3996, 1710, "blackwell",
                    (0x1B, 0x43, 0x52, 0x61, 0x9D, 0xC3, 0xD1, 0xDF), "570.124.06", 12080,
                    "MT_0000000838", "28.43.1014"),
    "dgx-a100": Sku(0x20B210DE, 0x147F10DE, "92.00.36.00.02", 1410, 1410, 1593, 1290, "ampere",
                    (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD), "535.183.01", 12020,
                    "MT_0000000223", "20.39.1002"),
    # HGX 8-GPU baseboards in OEM servers: the DGX's GPUs (the 565.57.01 HGX H100 capture's ids,
    # VBIOS, clocks and bus layout; H200 as dgx-h200).
    "hgx-h100": _H100_SXM,
    "hgx-h200": _H200_SXM,
    # PCIe cards: the profile states no count (the chassis decides); the simulator builds the common
    # one (bus numbers one root port apart, as the 8-GPU RTX 6000 Ada capture: 01, 25, 41, ... E1).
    # Device ids: H100 NVL 0x2321 (dcgmi capture of NVIDIA/DCGM#198), H100 PCIe 0x2331, L40S 0x26B9
    # (dcgmi capture of NVIDIA/DCGM#253); subsystem ids and VBIOS strings are illustrative.
    "h100-nvl": Sku(0x232110DE, 0x183910DE, "96.00.99.00.01", 1785, 1785, 2619, 1590, "hopper",
                    (0x01, 0x25, 0x41, 0x61), "565.57.01", 12070, "MT_0000000838", "28.41.1000"),
    "h100-pcie": Sku(0x233110DE, 0x162610DE, "96.00.30.00.01", 1755, 1755, 1593, 1590, "hopper",
                     (0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1), "565.57.01", 12070,
                     "MT_0000000838", "28.41.1000"),
    "l40s": Sku(0x26B910DE, 0x185110DE, "95.02.66.00.02", 2520, 2520, 9001, 1965, "ada",
                (0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1), "570.148.08", 12080,
                "MT_0000000838", "28.41.1000"),
    # GH200: the 550.127.05 capture's ids (0x2342, subsystem 0x1809) and its clocks.
    "gh200": Sku(0x234210DE, 0x180910DE, "96.00.74.00.0B", 1980, 1980, 2619, 1545, "hopper",
                 (0x01,), "550.127.05", 12040, "MT_0000000838", "28.41.1000"),
    # GB200 compute tray: 4 GPUs, one PCI domain each on Grace (0008/0009/0018/0019, as the GB200
    # kernel-log captures address them); device 0x2941.
    "gb200-nvl72": Sku(0x294110DE, 0x20E610DE, "97.00.82.00.01", 2062, 2062, 3996, 1815, "blackwell",
                       (0x01, 0x01, 0x01, 0x01), "570.124.06", 12080, "MT_0000000838", "28.43.1014"),
})
GENERIC_SKU = Sku(0, 0, "", 0, 0, 0, 0, "hopper", (), "565.57.01", 12070, "MT_0000000838", "28.41.1000")
# PCI domains of a GB200 tray's GPUs (the domain, not the bus, tells them apart)
_DOMAINS: Mapping[str, tuple[int, ...]] = MappingProxyType({"gb200-nvl72": (0x8, 0x9, 0x18, 0x19)})


def simulated_profiles() -> tuple[str, ...]:
    """The profiles a node can be simulated as (`--simulate`, `simulate fleet --profile`): every one
    of the one list (checks/data/profiles.yaml), `generic` included (a node seeded from a capture of
    any GPU server is `generic` when no shipped profile is what it is). tests/unit/test_profile_list.py
    holds SKUS (and topology.LAYOUTS) to that list."""
    return profiles.names()

SITE_MOUNTS = ("/home", "/cm/shared")

DEFAULT_UNITS: Mapping[str, str] = MappingProxyType({
    "nvidia-fabricmanager.service": "active",
    "nvidia-persistenced.service": "active",
    "nvidia-dcgm.service": "active",
    "slurmd.service": "active",
    "openibd.service": "active",
})


def _digest(*parts: str) -> bytes:
    return hashlib.sha256("/".join(parts).encode()).digest()


def gpu_uuid(node: str, index: int) -> str:
    """Deterministic per (node, index) so a re-created node keeps its GPU identities."""
    return "GPU-" + str(uuid.UUID(bytes=_digest("gpu", node, str(index))[:16]))


def gpu_serial(node: str, index: int) -> str:
    return "1654" + str(int.from_bytes(_digest("serial", node, str(index))[:8], "big"))[:9].zfill(9)


def default_state(name: str, profile: str = "dgx-h100", now: float | None = None,
                  storage: str | None = None) -> NodeState:
    """A healthy node of kind `profile`; raises profiles.ProfileError for an unknown profile.

    `storage` picks the storage-adapter build (podhealth.sim.topology.STORAGE_MODES: bond,
    ethernet, ib, none); None = what the profile's storage role pins, else the SKU's default.
    ValueError for another value.
    """
    from podhealth.sim import topology  # it builds HcaSpecs: importing it at the top would be circular

    prof = profiles.load(profile)
    sku = SKUS.get(profile, GENERIC_SKU)
    arch = sku.architecture
    # Ampere replaced dynamic page retirement with row remapping: NVML answers NOT_SUPPORTED.
    retires_pages = ARCHITECTURES[arch] < ARCHITECTURES["ampere"]
    gpus = []
    domains = _DOMAINS.get(profile, ())
    # a profile that states no count (PCIe cards) is built with the SKU's common one
    for i in range(prof.gpu_count or len(sku.bus_ids)):
        bus = sku.bus_ids[i] if i < len(sku.bus_ids) else 0x10 + 0x10 * i
        domain = domains[i] if i < len(domains) else 0
        # Idle readings vary a little per GPU, as on a real node, but deterministically.
        jitter = _digest("idle", name, str(i))[0] % 8
        gpus.append(GpuSpec(
            index=i,
            name=prof.gpu_model,
            uuid=gpu_uuid(name, i),
            serial=gpu_serial(name, i),
            pci_bus_id=f"{domain:08X}:{bus:02X}:00.0",
            pci_device_id=sku.pci_device_id,
            pci_subsystem_id=sku.pci_subsystem_id,
            memory_total_mib=prof.gpu_memory_mib,
            vbios=sku.vbios,
            power_limit_w=prof.power_limit_w,
            max_graphics_clock_mhz=sku.max_graphics_clock_mhz,
            max_sm_clock_mhz=sku.max_sm_clock_mhz,
            max_mem_clock_mhz=sku.max_mem_clock_mhz,
            max_video_clock_mhz=sku.max_video_clock_mhz,
            pcie_gen_max=prof.pcie_gen,
            pcie_width_max=prof.pcie_width,
            nvlink_count=prof.nvlink_links,
            architecture=arch,
            remap_correctable=0 if prof.has_row_remapping else None,
            remap_uncorrectable=0 if prof.has_row_remapping else None,
            retired_pages_sbe=0 if retires_pages else None,
            retired_pages_dbe=0 if retires_pages else None,
            temperature_c=30 + jitter,
            mem_temperature_c=35 + jitter,
            power_w=70.0 + 6 * jitter,
            has_fabric=prof.has_nvswitch_fabric,
        ))
    role = prof.network.roles.get("storage")
    if storage is None and role is not None:
        storage = topology.storage_mode(role.count, role.bonded, role.link_layers)
    hcas = topology.build(name, profile, prof.compute_hcas, prof.ib_rate_gbps, prof.ib_link_layer,
                          prof.storage_hcas, storage)
    units = dict(DEFAULT_UNITS)
    if not gpus or not prof.nvlink_links or prof.nvlink_domain.imex:
        # Fabric Manager runs where NVSwitches sit in the node; a GB200 tray's are in the rack's
        # switch trays, and the tray runs the IMEX service instead
        units.pop("nvidia-fabricmanager.service")
    for unit in prof.units:
        units[unit] = "active"
    return NodeState(
        name=name,
        profile=profile,
        driver_version=sku.driver_version,
        cuda_version=sku.cuda_version,
        nvml_version=f"12.{sku.driver_version}",
        gpus=tuple(gpus),
        hcas=hcas,
        # the simulated cluster's shared mounts (what the agent's default collectors.nfs.mounts
        # needs) on every node, whatever its hardware, beside what its profile requires
        mounts=tuple(dict.fromkeys([*prof.nfs_mounts, *SITE_MOUNTS])),
        units=MappingProxyType(units),
        t0=time.time() if now is None else now,
    )
