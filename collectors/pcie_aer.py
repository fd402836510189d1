"""pcie_aer: PCIe Advanced Error Reporting counters from <sysfs_root>/bus/pci/devices/*.

Per AER-capable function: the TOTAL of aer_dev_correctable / _nonfatal / _fatal (one series per
severity), the error bits that are not zero (bits that never fired make no series: a DGX has ~40
AER functions x 35 bits), and on root ports aer_rootport_total_err_*. Each function is named by
what it is (gpu, hca, nvswitch, nvme, port, other: aer_parse.device_kind) and a port by the GPUs,
HCAs and NVSwitches below it, because the ABI says an endpoint's errors may be counted at its link
partner: a GPU's bad link often shows only on the switch port above it. Which GPU index a PCI
address is belongs to NVML (checks map it through gpu_up's pci_bus_id); the HCA's name comes from
its infiniband/ directory.

Values are exported raw; what a fatal count means is for checks/host_errors.py.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Mapping

from podhealth.collectors.aer_parse import (FILES, ROOTPORT_FILES, SEVERITIES, AerCounts, Severity, device_kind,
                                            parse_aer_file, parse_hex, parse_rootport_total)
from podhealth.collectors.base import Collection, raise_if_local, specs
from podhealth.collectors.samplecache import SampleCache
from podhealth.collectors.sysfs import ParseMemo, read_attr, read_parsed
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample, labels_of

_PCI_ADDR = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
MAX_SERVES = 8  # endpoints named on one port's series (a DGX PCIe switch serves 2 GPUs + 2-3 HCAs + NVMe)
ENDPOINT_KINDS = ("gpu", "hca", "nvswitch")

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("pcie_aer_errors", "counter",
               "AER error messages a PCI function reported (TOTAL_ERR_* of aer_dev_<severity>); labels pci, "
               "severity, kind (gpu|hca|nvswitch|nvme|port|other), device (HCA name), serves (for a port: "
               "the GPUs/HCAs/NVSwitches below it)."),
    MetricSpec("pcie_aer_error_bits", "counter",
               "One AER error bit's count (short kernel name in label error), only bits that are not zero."),
    MetricSpec("pcie_aer_rootport_errors", "counter",
               "ERR_* messages reported to a root port from its whole hierarchy (aer_rootport_total_err_*)."),
    MetricSpec("pcie_aer_devices", "gauge", "PCI functions with AER statistics."),
)


@dataclass(frozen=True, slots=True)
class PciFunction:
    addr: str
    kind: str
    device: str  # the HCA's RDMA name, "" for others
    chain: tuple[str, ...]  # PCI addresses above it, nearest first


@dataclass
class _Read:
    dev: dict[Severity, AerCounts] = field(default_factory=dict)
    rootport: dict[Severity, int] = field(default_factory=dict)


def _optional(path: Path, errors: list[str]) -> str | None:
    return read_attr(path, errors, "ascii")


class PcieAerCollector:
    name: ClassVar[str] = "pcie_aer"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root
        self._topology: dict[str, PciFunction] = {}
        self._listed: tuple[str, ...] = ()
        # AER counters rarely move: each file's parse and last cycle's Samples are kept while they hold
        self._parsed = ParseMemo()
        self._cache = SampleCache()

    def _function(self, base: Path, addr: str, errors: list[str]) -> PciFunction:
        known = self._topology.get(addr)
        if known is not None:
            return known
        d = base / addr
        try:
            real = os.path.realpath(d)
        except OSError as e:
            raise_if_local(e, str(d))
            real = str(d)
        chain = tuple(p for p in reversed(Path(real).parts[:-1]) if _PCI_ADDR.match(p))
        vendor = parse_hex(_optional(d / "vendor", errors) or "")
        pci_class = parse_hex(_optional(d / "class", errors) or "")
        try:
            ib = sorted(os.listdir(d / "infiniband"))
        except FileNotFoundError:
            ib = []
        except OSError as e:
            raise_if_local(e, str(d / "infiniband"))
            ib = []
        fn = PciFunction(addr, device_kind(vendor, pci_class, bool(ib)), ib[0] if ib else "", chain)
        self._topology[addr] = fn
        return fn

    def collect(self) -> Collection:
        base = self.sysfs_root / "bus" / "pci" / "devices"
        try:
            names = tuple(sorted(n for n in os.listdir(base) if _PCI_ADDR.match(n)))
        except OSError as e:
            raise_if_local(e, str(base))
            raise  # no PCI in this sysfs at all: the collection failed (UNKNOWN), not "no errors"
        if names != self._listed:  # hotplug / a new tree: topology is read again
            self._topology.clear()
            self._listed = names
        errors: list[str] = []
        counts: dict[str, _Read] = {}
        memo, where = self._parsed, str(base)
        for addr in names:
            per = _Read()
            for sev in SEVERITIES:
                # paths as strings: ~170 files a cycle, a Path each cost more than the read
                dev = read_parsed(os.path.join(where, addr, FILES[sev]), parse_aer_file, errors,
                                  name=f"{addr}/{FILES[sev]}", encoding="ascii", memo=memo)
                if dev is not None:
                    per.dev[sev] = dev
                total = read_parsed(os.path.join(where, addr, ROOTPORT_FILES[sev]), parse_rootport_total, errors,
                                    name=f"{addr}/{ROOTPORT_FILES[sev]}", encoding="ascii", memo=memo)
                if total is not None:
                    per.rootport[sev] = total
            if per.dev or per.rootport:
                counts[addr] = per
        memo.commit()
        funcs = {a: self._function(base, a, errors) for a in counts}
        serves = _serves(funcs)
        one = self._cache.one
        samples: list[Sample] = [Sample.of("pcie_aer_devices", len(counts))]
        for addr, per in counts.items():
            fn = funcs[addr]
            for sev, c in per.dev.items():
                served = serves.get(addr, "")
                samples.append(one(("errors", addr, sev, fn.kind, fn.device, served), "pcie_aer_errors",
                                   c.effective_total, lambda: labels_of(pci=addr, severity=sev, kind=fn.kind,
                                                                        device=fn.device, serves=served)))
                samples.extend(one(("bits", addr, sev, err), "pcie_aer_error_bits", n,
                                   lambda: labels_of(pci=addr, severity=sev, error=err))
                               for err, n in c.errors if n)
            samples.extend(one(("rootport", addr, sev), "pcie_aer_rootport_errors", n,
                               lambda: labels_of(pci=addr, severity=sev))
                           for sev, n in per.rootport.items())
        self._cache.commit()
        return Collection(tuple(samples), errors=tuple(errors[:32]))

    def close(self) -> None:
        pass


def endpoint_name(fn: PciFunction) -> str:
    """How an endpoint is named on its ports' series: the HCA's RDMA name, else kind:pci."""
    return fn.device if fn.kind == "hca" and fn.device else f"{fn.kind}:{fn.addr}"


def _serves(funcs: Mapping[str, PciFunction]) -> dict[str, str]:
    """port address -> the GPUs / HCAs / NVSwitches below it (comma-joined, bounded)."""
    below: dict[str, list[str]] = {}
    for fn in funcs.values():
        if fn.kind not in ENDPOINT_KINDS:
            continue
        for up in fn.chain:
            below.setdefault(up, []).append(endpoint_name(fn))
    return {port: ",".join(sorted(names)[:MAX_SERVES]) for port, names in below.items()}


def create(cfg: Config, **_seams: object) -> PcieAerCollector:
    return PcieAerCollector(cfg.paths.sysfs_root)
