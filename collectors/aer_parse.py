"""Pure parsers for PCIe AER statistics in sysfs (Documentation/ABI/testing/sysfs-bus-pci-devices-aer_stats).

`aer_dev_correctable`, `aer_dev_nonfatal`, `aer_dev_fatal` hold one "<name> <count>" line per
error bit and a closing `TOTAL_ERR_COR|TOTAL_ERR_NONFATAL|TOTAL_ERR_FATAL <count>`. Kernel 4.19
(where the files appeared, and the ABI document's sample) printed long names ("Receiver Error 2",
"Bad TLP 0"); later kernels print the short names of the aer.c string tables ("RxErr 0",
"BadTLP 0"), and add bits over time (PoisonTLPBlocked). Long names are mapped to the short ones
so a series keeps its label across kernels; a name we do not know is kept as written (a newer
kernel's new bit is still counted). `aer_rootport_total_err_{cor,fatal,nonfatal}` hold one number.

Text in, values out: no I/O. A malformed line raises ValueError naming it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from podhealth.collectors.sysfs import parse_count

Severity = Literal["correctable", "nonfatal", "fatal"]
SEVERITIES: tuple[Severity, ...] = ("correctable", "nonfatal", "fatal")
# file name -> severity, and the severity's TOTAL line
FILES: dict[Severity, str] = {"correctable": "aer_dev_correctable", "nonfatal": "aer_dev_nonfatal",
                              "fatal": "aer_dev_fatal"}
ROOTPORT_FILES: dict[Severity, str] = {"correctable": "aer_rootport_total_err_cor",
                                       "nonfatal": "aer_rootport_total_err_nonfatal",
                                       "fatal": "aer_rootport_total_err_fatal"}
_TOTALS = {"TOTAL_ERR_COR", "TOTAL_ERR_NONFATAL", "TOTAL_ERR_FATAL"}

# 4.19's aer_stats strings (long) -> the names current kernels print (short).
LONG_TO_SHORT: dict[str, str] = {
    # correctable
    "Receiver Error": "RxErr", "Bad TLP": "BadTLP", "Bad DLLP": "BadDLLP", "RELAY_NUM Rollover": "Rollover",
    "Replay Timer Timeout": "Timeout", "Advisory Non-Fatal": "NonFatalErr",
    "Corrected Internal Error": "CorrIntErr", "Header Log Overflow": "HeaderOF",
    # uncorrectable (nonfatal and fatal share the table)
    "Data Link Protocol": "DLP", "Surprise Down Error": "SDES", "Poisoned TLP": "TLP",
    "Flow Control Protocol": "FCP", "Completion Timeout": "CmpltTO", "Completer Abort": "CmpltAbrt",
    "Unexpected Completion": "UnxCmplt", "Receiver Overflow": "RxOF", "Malformed TLP": "MalfTLP",
    "Unsupported Request": "UnsupReq", "ACS Violation": "ACSViol",
    "Uncorrectable Internal Error": "UncorrIntErr", "MC Blocked TLP": "BlockedTLP",
    "AtomicOp Egress Blocked": "AtomicOpBlocked", "TLP Prefix Blocked Error": "TLPBlockedErr",
}
# Numbers are bounded ASCII digits: a counter is 64-bit at most.
_LINE = re.compile(r"^(?P<name>\S(?:.*\S)?)\s+(?P<n>[0-9]{1,20})$", re.ASCII)


@dataclass(frozen=True, slots=True)
class AerCounts:
    """One aer_dev_* file: the per-bit counts (short names) and the TOTAL line (None if absent)."""

    errors: tuple[tuple[str, int], ...]
    total: int | None

    @property
    def effective_total(self) -> int:
        """TOTAL_ERR_* counts messages; several bits can ride one message, so the TOTAL may be
        below the bit sum (ABI doc). Without a TOTAL line, the largest bit stands in (never 0
        for a file that shows an error)."""
        if self.total is not None:
            return self.total
        return max((n for _, n in self.errors), default=0)


def parse_aer_file(text: str) -> AerCounts:
    errors: list[tuple[str, int]] = []
    total: int | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise ValueError(f"not '<name> <count>': {line[:60]!r}")
        name, n = m.group("name"), int(m.group("n"))
        if name.split()[-1].isdigit():  # no kernel name ends in a number: "RxErr 1 2" is garbage
            raise ValueError(f"not '<name> <count>': {line[:60]!r}")
        if name in _TOTALS:
            total = n
        else:
            errors.append((LONG_TO_SHORT.get(name, name), n))
    if not errors and total is None:
        raise ValueError("empty AER statistics file")
    return AerCounts(tuple(errors), total)


# aer_rootport_total_err_* is a plain count attribute.
parse_rootport_total = parse_count


# PCI class codes (PCI Code and ID Assignment spec): base class << 16 | subclass << 8 | prog-if.
NVIDIA_VENDOR = 0x10DE


def device_kind(vendor: int | None, pci_class: int | None, has_infiniband: bool) -> str:
    """What a PCI function is, for the AER rules: gpu, nvswitch, hca, nvme, port or other.

    NVIDIA data-center GPUs are class 0x0302 (3D controller; 0x0300 VGA on some boards); the
    NVSwitch ASICs are NVIDIA's class 0x0680 ("other bridge"); an HCA is what has an infiniband/
    directory (the mlx5 driver's), whatever its class; 0x0108 is NVMe; 0x0604 a PCI-to-PCI bridge
    (root ports and switch ports: the links above the devices)."""
    if has_infiniband:
        return "hca"
    if pci_class is None:
        return "other"
    base_sub = pci_class >> 8
    if vendor == NVIDIA_VENDOR and base_sub in (0x0302, 0x0300):
        return "gpu"
    if vendor == NVIDIA_VENDOR and base_sub == 0x0680:
        return "nvswitch"
    if base_sub == 0x0108:
        return "nvme"
    if base_sub == 0x0604:
        return "port"
    return "other"


def parse_hex(text: str) -> int | None:
    """`vendor` / `class` files: "0x10de\\n"; None when garbled."""
    t = text.strip()
    if not re.fullmatch(r"0x[0-9a-fA-F]{1,8}", t):
        return None
    return int(t, 16)
