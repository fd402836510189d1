"""The simulated node's host-error trees: PCIe AER, EDAC memory controllers, NVMe controllers.

Written in the kernel's formats (current short AER names, the mcN/dimmM EDAC layout, the nvme
class attributes) under the node's sys/:

    devices/pci0000:RR/0000:RR:01.0/                root port: aer_dev_*, aer_rootport_total_err_*
    devices/pci0000:RR/0000:RR:01.0/<gpu pci>/      vendor 0x10de, class 0x030200, aer_dev_*
    devices/pci0000:RR/0000:RR:01.0/<hca pci>/      (tree_ib's directory) class 0x020700, aer_dev_*
    devices/pci0000:c0/0000:c0:01.0/0000:c1:00.0/   NVMe: aer_dev_*, nvme/nvmeN/{model,serial,...}
    bus/pci/devices/<pci> -> ../../../devices/...    every function above
    class/nvme/nvmeN -> ../../devices/.../nvme/nvmeN
    devices/system/edac/mc/mcN/{ce,ue}_count, dimmM/{dimm_ce_count,dimm_ue_count,dimm_label}

The root-port layout is tree_ib's (one port per 16 buses), so a GPU and the HCA beside it share
a port, as they share a PCIe switch on a DGX. The kernel's sysfs has no SMART log; the node's
smart logs are nvme-cli JSON files in <node>/nvme-smart/ (the nvme collector's `smart_source`
seam), next to sys/.

Faults: pcie-aer-fatal gpu=N (Surprise Down + Completion Timeout on the GPU, counted at its root
port too), edac-ue (one uncorrectable error on mc0's second DIMM), nvme-critical (nvme0 reports
critical warning 0x04, reliability degraded, and media errors).
"""

from __future__ import annotations

import json
from pathlib import Path

from podhealth.sim.state import NodeState
from podhealth.sim.tree_write import TreeWriter

NVIDIA, INTEL, MELLANOX, SAMSUNG = "0x10de", "0x8086", "0x15b3", "0x144d"
CORRECTABLE = ("RxErr", "BadTLP", "BadDLLP", "Rollover", "Timeout", "NonFatalErr", "CorrIntErr", "HeaderOF")
UNCORRECTABLE = ("Undefined", "DLP", "SDES", "TLP", "FCP", "CmpltTO", "CmpltAbrt", "UnxCmplt", "RxOF", "MalfTLP",
                 "ECRC", "UnsupReq", "ACSViol", "UncorrIntErr", "BlockedTLP", "AtomicOpBlocked", "TLPBlockedErr",
                 "PoisonTLPBlocked")
SOCKETS, MCS_PER_SOCKET, DIMMS_PER_MC = 2, 2, 2
NVME_BUSES = (0xC1, 0xC2)  # two U.2 data drives behind one root port
NVME_MODEL = "SAMSUNG MZQL23T8HCLS-00A07"  # PM9A3 3.84 TB, the drive DGX H100 ships for cache
NVME_FW = "GDC5602Q"
SMART_DIR = "nvme-smart"


def _aer(counts: dict[str, int], names: tuple[str, ...], total: str) -> str:
    lines = [f"{n} {counts.get(n, 0)}" for n in names]
    # TOTAL_ERR_* counts messages, and one message can carry several error bits (the ABI doc):
    # a simulated fault is one message.
    return "\n".join(lines + [f"{total} {1 if any(counts.values()) else 0}"]) + "\n"


def _write_aer(w: TreeWriter, d: Path, fatal: dict[str, int] | None = None) -> None:
    w.put(d / "aer_dev_correctable", _aer({}, CORRECTABLE, "TOTAL_ERR_COR"))
    w.put(d / "aer_dev_nonfatal", _aer({}, UNCORRECTABLE, "TOTAL_ERR_NONFATAL"))
    w.put(d / "aer_dev_fatal", _aer(fatal or {}, UNCORRECTABLE, "TOTAL_ERR_FATAL"))


def _port_dir(sys_root: Path, bus: int) -> tuple[str, Path]:
    root_bus = bus & 0xF0
    addr = f"0000:{root_bus:02x}:01.0"
    return addr, sys_root / "devices" / f"pci0000:{root_bus:02x}" / addr


def _link(w: TreeWriter, sys_root: Path, addr: str, real: Path) -> None:
    link = sys_root / "bus" / "pci" / "devices" / addr
    link.parent.mkdir(parents=True, exist_ok=True)
    w.symlink(link, "../../../" + str(real.relative_to(sys_root)))


def write(state: NodeState, sys_root: Path, now: float) -> None:
    w = TreeWriter(sys_root)
    aer_gpus = {f.gpu for f in state.faults_of("pcie-aer-fatal") if f.injected_at <= now}
    ports: dict[str, tuple[Path, int]] = {}
    for g in state.gpus:
        pci = g.pci_bus_id_short
        bus = int(pci.split(":")[1], 16)
        port, pdir = _port_dir(sys_root, bus)
        fatal = {"SDES": 1, "CmpltTO": 1} if g.index in aer_gpus else {}
        prev = ports.get(port, (pdir, 0))[1]
        ports[port] = (pdir, prev + (1 if fatal else 0))
        d = pdir / pci
        w.put(d / "vendor", NVIDIA + "\n")
        w.put(d / "device", f"0x{g.pci_device_id >> 16:04x}\n")
        w.put(d / "class", "0x030200\n")
        _write_aer(w, d, fatal)
        _link(w, sys_root, pci, d)
    for h in state.hcas:
        if not h.pci_addr:
            continue
        bus = int(h.pci_addr.split(":")[1], 16)
        port, pdir = _port_dir(sys_root, bus)
        ports.setdefault(port, (pdir, 0))
        d = pdir / h.pci_addr  # tree_ib writes vendor, device, infiniband/ here
        w.put(d / "class", "0x020700\n")
        _write_aer(w, d)
        _link(w, sys_root, h.pci_addr, d)
    port, pdir = _port_dir(sys_root, NVME_BUSES[0])
    ports.setdefault(port, (pdir, 0))
    critical = any(f.injected_at <= now for f in state.faults_of("nvme-critical"))
    smart_dir = sys_root.parent / SMART_DIR
    smart_dir.mkdir(parents=True, exist_ok=True)
    for i, bus in enumerate(NVME_BUSES):
        pci = f"0000:{bus:02x}:00.0"
        d = pdir / pci
        w.put(d / "vendor", SAMSUNG + "\n")
        w.put(d / "class", "0x010802\n")
        _write_aer(w, d)
        _link(w, sys_root, pci, d)
        ctrl = f"nvme{i}"
        cdir = d / "nvme" / ctrl
        w.put(cdir / "model", f"{NVME_MODEL:<40}\n")  # the kernel pads model to the field's 40 bytes
        w.put(cdir / "serial", f"S64HNE0R{state.name[-4:]:>04}{i:02d}\n".replace(" ", "0"))
        w.put(cdir / "firmware_rev", NVME_FW + "\n")
        w.put(cdir / "state", "live\n")
        w.symlink(cdir / "device", "../../../" + pci)
        klass = sys_root / "class" / "nvme" / ctrl
        klass.parent.mkdir(parents=True, exist_ok=True)
        w.symlink(klass, "../../" + str(cdir.relative_to(sys_root)))
        bad = critical and i == 0
        w.put(smart_dir / f"{ctrl}.json", _smart_json(bad, now - state.t0))
    for port, (pdir, fatal_msgs) in sorted(ports.items()):
        w.put(pdir / "vendor", INTEL + "\n")
        w.put(pdir / "class", "0x060400\n")
        _write_aer(w, pdir)
        w.put(pdir / "aer_rootport_total_err_cor", "0\n")
        w.put(pdir / "aer_rootport_total_err_nonfatal", "0\n")
        w.put(pdir / "aer_rootport_total_err_fatal", f"{fatal_msgs}\n")
        _link(w, sys_root, port, pdir)
    _write_edac(w, sys_root, state, now)


def _write_edac(w: TreeWriter, sys_root: Path, state: NodeState, now: float) -> None:
    ue = any(f.injected_at <= now for f in state.faults_of("edac-ue"))
    base = sys_root / "devices" / "system" / "edac" / "mc"
    for socket in range(SOCKETS):
        for imc in range(MCS_PER_SOCKET):
            n = socket * MCS_PER_SOCKET + imc
            mc = base / f"mc{n}"
            mc_ue = 1 if ue and n == 0 else 0
            w.put(mc / "ce_count", "0\n")
            w.put(mc / "ue_count", f"{mc_ue}\n")
            w.put(mc / "ce_noinfo_count", "0\n")
            w.put(mc / "ue_noinfo_count", "0\n")
            for dimm in range(DIMMS_PER_MC):
                d = mc / f"dimm{dimm}"
                # i10nm_edac / skx_edac label: CPU_SrcID#<socket>_MC#<imc>_Chan#<ch>_DIMM#<slot>
                w.put(d / "dimm_label", f"CPU_SrcID#{socket}_MC#{imc}_Chan#{dimm}_DIMM#0\n")
                w.put(d / "dimm_ce_count", "0\n")
                w.put(d / "dimm_ue_count", f"{1 if mc_ue and dimm == 1 else 0}\n")


def _smart_json(critical: bool, uptime_s: float) -> str:
    """nvme-cli v2.11's `smart-log -o json` shape: critical_warning an object, temperature in
    Kelvin, 128-bit counters as numbers (json-c prints them as strings only beyond 64 bits)."""
    log = {
        "critical_warning": {"value": 4 if critical else 0, "available_spare": 0, "temp_threshold": 0,
                             "reliability_degraded": 1 if critical else 0, "ro": 0, "vmbu_failed": 0, "pmr_ro": 0},
        "temperature": 309,
        "avail_spare": 100,
        "spare_thresh": 10,
        "percent_used": 1,
        "endurance_grp_critical_warning_summary": 0,
        "data_units_read": 1204551,
        "data_units_written": 3310722,
        "host_read_commands": 51027313,
        "host_write_commands": 120349881,
        "controller_busy_time": 61,
        "power_cycles": 12,
        "power_on_hours": 2210 + int(max(0.0, uptime_s) // 3600),
        "unsafe_shutdowns": 3,
        "media_errors": 3 if critical else 0,
        "num_err_log_entries": 7 if critical else 0,
        "warning_temp_time": 0,
        "critical_comp_time": 0,
        "temperature_sensor_1": 309,
        "temperature_sensor_2": 315,
        "thm_temp1_trans_count": 0,
        "thm_temp2_trans_count": 0,
        "thm_temp1_total_time": 0,
        "thm_temp2_total_time": 0,
    }
    return json.dumps(log, indent=2) + "\n"
