"""PCI addresses: the one normaliser. Every source names a device its own way, and podhealth joins
them on the address (an XID line's GPU to NVML's index, an AER counter to gpu_up, a DCGM field to
its GPU), so every reader turns what it read into one form here: the kernel's, `0000:18:00.0`
(lower case; domain as `%04x`, as drivers/pci/probe.c's pci_name prints it).

Forms met:
- sysfs: `0000:1b:00.0` (bus/pci/devices/*, a <dev>/device link's last component);
- NVML's busId: `00000000:1B:00.0` (8-digit domain, upper case; from ctypes it may be bytes with
  trailing NULs), DCGM's pciBusId the same;
- the NVIDIA kernel driver: `PCI:0000:18:00` (no function: 0), `18:00.0` (no domain: 0).
A domain above 0xffff is real (Intel VMD puts its devices at 0x10000 and up) and is kept, printed
as the kernel prints it (`10000:e1:00.0`).

Anything else (garbage, out-of-range parts, a non-string) gives None: never an exception, so one
bad label or log line costs its own join and nothing more.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_ADDRESS = re.compile(
    r"(?:PCI:)?(?:(?P<dom>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})(?:\.(?P<fn>[0-7]))?")


class Address(NamedTuple):
    domain: int
    bus: int
    device: int
    function: int

    def __str__(self) -> str:
        return f"{self.domain:04x}:{self.bus:02x}:{self.device:02x}.{self.function}"


def parse(raw: object) -> Address | None:
    """Any of the forms above -> its parts; None when `raw` is not a PCI address."""
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    if not isinstance(raw, str):
        return None
    m = _ADDRESS.fullmatch(raw.strip().rstrip("\x00").strip())
    if not m:
        return None
    # (a device number is 5 bits on the bus, but two hex digits in text: anonymised captures and the
    # driver's own lines hold larger ones, and refusing them would lose the GPU of a real line)
    return Address(int(m.group("dom") or "0", 16), int(m.group("bus"), 16), int(m.group("dev"), 16),
                   int(m.group("fn") or "0"))


def normalise(raw: object) -> str | None:
    """Any of the forms above -> `0000:18:00.0`; None when `raw` is not a PCI address."""
    addr = parse(raw)
    return str(addr) if addr is not None else None


def dcgm_form(raw: object) -> str | None:
    """The address as DCGM and dcgm-exporter label it: `00000000:18:00.0` (8-digit domain, upper
    case); None when `raw` is not a PCI address."""
    addr = parse(raw)
    if addr is None:
        return None
    return f"{addr.domain:08X}:{addr.bus:02X}:{addr.device:02X}.{addr.function}"
