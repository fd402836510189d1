"""Pure parsers for /sys/class/infiniband: file text in, values out.

No I/O and no clock here. The reader (collectors/infiniband.py) hands over the text of each file
it could read; a file it could not read is simply absent, and its value stays None (never 0).
"""

from __future__ import annotations

import math
import re

from podhealth import pci

# sysfs prints "N/A (no PMA)" for counters a port cannot report (e.g. some iWARP/OPA devices);
# that is "unsupported", not an error and not zero.
_UNSUPPORTED_PREFIX = "N/A"

# rate units the kernel's rate_show() prints, in bits per second
_RATE_UNITS = {"Gb/sec": 1e9, "Mb/sec": 1e6}


def parse_enum(text: str) -> tuple[int, str]:
    """'4: ACTIVE' -> (4, 'ACTIVE'); the format of ports/N/state and ports/N/phys_state."""
    head, sep, name = text.strip().partition(":")
    if not sep:
        raise ValueError(f"expected '<id>: <name>', got {text.strip()[:40]!r}")
    try:
        ident = int(head.strip())
    except ValueError:
        raise ValueError(f"expected a numeric id before ':', got {text.strip()[:40]!r}") from None
    return ident, name.strip()


def parse_rate(text: str) -> float:
    """'400 Gb/sec (4X NDR)' -> 5e10 bytes per second."""
    parts = text.split()
    if len(parts) < 2 or parts[1] not in _RATE_UNITS:
        raise ValueError(f"expected '<number> Gb/sec ...', got {text.strip()[:40]!r}")
    try:
        value = float(parts[0])
    except ValueError:
        raise ValueError(f"expected a number before {parts[1]!r}, got {parts[0][:20]!r}") from None
    rate = value * _RATE_UNITS[parts[1]] / 8.0
    if not math.isfinite(rate) or rate < 0:  # float() takes "nan", "inf", "1e308" and "-400": no link rate
        raise ValueError(f"expected a rate >= 0, got {parts[0][:20]!r}")
    return rate


# What rate_show() (drivers/infiniband/core/sysfs.c) prints for a speed it has no case for:
# "default to SDR for invalid rates", 2.5 Gb/s per lane, times the width (1X/2X/4X/8X/12X).
# So a link faster than the running kernel knows (XDR on a kernel without IB_SPEED_XDR) reads as SDR.
_SDR_LANE_GBPS = 2.5
_WIDTHS = (1, 2, 4, 8, 12)


def is_kernel_fallback_rate(gbps: float) -> bool:
    """Whether `gbps` is an SDR rate, which rate_show() also prints for speeds it does not know."""
    return any(abs(gbps - _SDR_LANE_GBPS * w) < 0.01 for w in _WIDTHS)


def parse_counter(text: str) -> int | None:
    """A counter file's value; None when the port says it cannot count it ('N/A (no PMA)')."""
    t = text.strip()
    if t.startswith(_UNSUPPORTED_PREFIX):
        return None
    try:
        v = int(t, 10)
    except ValueError:
        raise ValueError(f"expected an unsigned integer, got {t[:40]!r}") from None
    if v < 0:
        raise ValueError(f"expected an unsigned integer, got {t[:40]!r}")
    return v


# --- Where a device sits and what the OS calls it (for checks/ib_roles) ---------------------

# A PCI function as the kernel names it: domain:bus:device.function.
# mlx5 names the RDMA device of a RoCE LAG (its two ports bonded by the OS) mlx5_bond_N.
_BOND_DEVICE = re.compile(r"^mlx5_bond_[0-9]+$")


def parse_pci_address(link: str) -> str | None:
    """The target of <dev>/device ('../../../0000:aa:00.0') -> '0000:aa:00.0'; None when the
    link does not end in a PCI address (a virtual device, a test tree without links)."""
    return pci.normalise(link.rstrip("/").rpartition("/")[2])


def parse_numa_node(text: str) -> int | None:
    """device/numa_node: '1' -> 1; '-1' (no NUMA affinity) or junk -> None."""
    try:
        v = int(text.strip())
    except ValueError:
        return None
    return v if v >= 0 else None


# PCIe transfer rate per lane (GT/s) -> generation, as the kernel prints current_link_speed
# ("32.0 GT/s PCIe"; drivers/pci/pci-sysfs.c, pci_speed_string()).
_PCIE_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}


def parse_pcie_speed(text: str) -> int | None:
    """device/current_link_speed: '32.0 GT/s PCIe' -> 5; 'Unknown' or junk -> None."""
    word = text.strip().split(" ", 1)[0]
    return _PCIE_GEN.get(word)


def parse_pcie_width(text: str) -> int | None:
    """device/current_link_width: '16' -> 16; '0' (link down) or junk -> None."""
    t = text.strip()
    return int(t) if t.isdigit() and int(t) > 0 else None


def parse_netdev(text: str) -> str | None:
    """ports/N/gid_attrs/ndevs/0: the netdev of the port's first GID ('bond0'); empty -> None."""
    name = text.strip()
    return name or None


def parse_bond_slaves(text: str) -> tuple[str, ...]:
    """/sys/class/net/<master>/bonding/slaves: 'enp170s0f0np0 enp170s0f1np1' -> both names."""
    return tuple(text.split())


def is_bond_device(name: str) -> bool:
    return bool(_BOND_DEVICE.match(name))
