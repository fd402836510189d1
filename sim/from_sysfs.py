"""Seed a simulated node's InfiniBand from a real /sys/class/infiniband tree.

`read(path) -> Capture` reads a captured tree (as `podhealth simulate node NAME --from-sysfs
DIR` is given it): DIR may be a sysfs root (DIR/class/infiniband), a tree holding one
(DIR/sys/class/infiniband, as the prometheus procfs/node_exporter fixtures are laid out) or
the class/infiniband directory itself. Per device it keeps board_id, fw_ver, hca_type,
node_guid, the PCI address and NUMA node behind `device` when the capture has them; per port
state, phys_state, rate and link_layer verbatim, every counters/ and hw_counters/ file, and the
netdev (gid_attrs/ndevs/0, else device/net/<name>) with its bonding master's slaves and mode
from <root>/class/net when the capture holds class/net.

`to_hcas(capture)` turns it into HcaSpecs: the simulated node then shows the captured files
with the captured values (traffic counters keep moving from there) and faults apply on top.
Bad input (no such directory, no device) raises ValueError; an unreadable or unparsable file
is left out with a warning, as a real reader would have to.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from podhealth.sim.state import HcaRole, HcaSpec

_PCI = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_MAX_FILE = 4096
DEVICE_ATTRS = ("board_id", "fw_ver", "hca_type", "node_guid", "node_type")


@dataclass(frozen=True)
class Capture:
    hcas: tuple[HcaSpec, ...]
    warnings: tuple[str, ...]
    class_dir: Path


def find_class_dir(path: Path) -> Path:
    """The class/infiniband directory in or at `path`; ValueError naming what was tried."""
    for cand in (path / "class" / "infiniband", path / "sys" / "class" / "infiniband", path):
        if cand.is_dir() and any((d / "ports").is_dir() for d in cand.iterdir()):
            return cand
    raise ValueError(f"{path}: no InfiniBand devices found (looked for <DIR>/class/infiniband, "
                     f"<DIR>/sys/class/infiniband and <DIR>/<device>/ports)")


def _text(path: Path, warnings: list[str]) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read(_MAX_FILE).decode("utf-8", "replace").strip()
    except FileNotFoundError:
        return None
    except OSError as e:  # EINVAL from an attribute the driver refuses, EACCES, ...
        warnings.append(f"{path}: unreadable ({e.strerror or e}); left out")
        return None


def _counters(directory: Path, warnings: list[str]) -> dict[str, int | str] | None:
    """Counter files by name: their values, or the verbatim text of one that holds no number
    (i40iw answers "N/A (no PMA)"), which the simulated node then shows as it is."""
    if not directory.is_dir():
        return None
    out: dict[str, int | str] = {}
    for f in sorted(directory.iterdir()):
        if f.name.startswith(".") or not f.is_file():
            continue
        text = _text(f, warnings)
        if text is None:
            continue
        try:
            out[f.name] = int(text, 10)
        except ValueError:
            out[f.name] = text
    return out


def _netdev(dev: Path, port: Path, warnings: list[str]) -> str:
    ndev = _text(port / "gid_attrs" / "ndevs" / "0", []) if (port / "gid_attrs").is_dir() else None
    if ndev:
        return ndev
    net = dev / "device" / "net"
    names = sorted(p.name for p in net.iterdir()) if net.is_dir() else []
    return names[0] if names else ""


def _pci_of(dev: Path, warnings: list[str]) -> str:
    """The adapter's PCI address, from whatever the capture kept of it:
    - `device`, a symlink (`../../../0000:17:00.0`): its own text, even dangling (devices/ not copied);
    - the class entry itself, a symlink into devices/ (`../../devices/pci0000:16/.../0000:17:00.0/
      infiniband/mlx5_0`, how /sys/class/infiniband is laid out, kept by `cp -a` and tar);
    - `device/uevent`'s PCI_SLOT_NAME (a copy that followed the links made `device` a directory);
    - the real path of either."""
    link = dev / "device"
    candidates: list[str] = []
    if link.is_symlink():
        candidates.append(os.readlink(link))
    if dev.is_symlink():
        candidates.append(os.readlink(dev))
    uevent = _text(link / "uevent", []) if link.is_dir() else None
    for line in (uevent or "").splitlines():
        if line.startswith("PCI_SLOT_NAME="):
            candidates.append(line.split("=", 1)[1])
    candidates += [os.path.realpath(link), os.path.realpath(dev)]
    for c in candidates:
        for part in reversed(c.replace("\\", "/").split("/")):
            part = part.strip().lower()
            if _PCI.match(part):
                return part
    return ""


def _role(device: str, link_layer: str, bonded: bool) -> HcaRole:
    # The simulator only uses the role for how busy a port is; the checks classify on their own
    # from what the tree shows (checks/passive/ib_roles.py). Bonded or RoCE ports carry storage on DGX.
    if bonded or "bond" in device or link_layer == "Ethernet":
        return "storage"
    return "compute" if link_layer == "InfiniBand" else "other"


def read(path: Path | str) -> Capture:
    class_dir = find_class_dir(Path(path))
    # class/net of the same capture, if it has one (bonding masters and their slaves)
    net_root = class_dir.parent / "net"
    warnings: list[str] = []
    hcas: list[HcaSpec] = []
    for dev in sorted(class_dir.iterdir()):
        if dev.name.startswith(".") or not (dev / "ports").is_dir():
            continue
        attrs = {a: _text(dev / a, warnings) for a in DEVICE_ATTRS}
        pci = _pci_of(dev, warnings)
        numa = -1
        if (dev / "device").exists():
            numa_text = _text(dev / "device" / "numa_node", warnings)
            numa = int(numa_text) if numa_text and re.fullmatch(r"-?\d+", numa_text) else -1
        for port in sorted((dev / "ports").iterdir(), key=lambda p: (len(p.name), p.name)):
            if not port.name.isdigit():
                continue
            state = _text(port / "state", warnings) or ""
            phys = _text(port / "phys_state", warnings) or ""
            rate = _text(port / "rate", warnings) or ""
            link_layer = _text(port / "link_layer", warnings) or "InfiniBand"
            m = _RATE.match(rate)
            if rate and not m:
                warnings.append(f"{port / 'rate'}: unrecognised rate {rate!r}; kept verbatim")
            netdev = _netdev(dev, port, warnings)
            slaves: tuple[str, ...] = ()
            mode = ""
            if netdev and (net_root / netdev / "bonding").is_dir():
                slaves = tuple((_text(net_root / netdev / "bonding" / "slaves", warnings) or "").split())
                mode = _text(net_root / netdev / "bonding" / "mode", warnings) or ""
            hcas.append(HcaSpec(
                device=dev.name, port=int(port.name),
                rate_gbps=int(float(m.group(1))) if m else 0,
                link_layer=link_layer,
                board_id=attrs["board_id"] or "", fw_ver=attrs["fw_ver"] or "",
                role=_role(dev.name, link_layer, bool(slaves)),
                node_guid=(attrs["node_guid"] or "").replace(":", ""),
                pci_addr=pci, numa_node=numa, netdev=netdev,
                hca_type=attrs["hca_type"] or "",
                bond_slaves=slaves, bond_mode=mode,
                rate_text=rate, state_text=state, phys_state_text=phys,
                counters=_counters(port / "counters", warnings) or {},
                hw_counters=_counters(port / "hw_counters", warnings),
                counters_ext=_counters(port / "counters_ext", warnings),
                absent=tuple(a for a in DEVICE_ATTRS if attrs[a] is None),
            ))
    if not hcas:
        raise ValueError(f"{class_dir}: no InfiniBand port found (no <device>/ports/<n>)")
    return Capture(hcas=tuple(hcas), warnings=tuple(warnings), class_dir=class_dir)
