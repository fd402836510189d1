"""edac: host memory ECC counters from <sysfs_root>/devices/system/edac/mc (Documentation/admin-guide/ras.rst).

Per memory controller mcN: ce_count / ue_count (corrected / uncorrected errors since the driver
loaded) and ce_noinfo_count / ue_noinfo_count (errors the driver could not pin to a DIMM). Per
DIMM, two layouts exist: the current one, mcN/dimmM/{dimm_ce_count,dimm_ue_count,dimm_label}, and
the legacy csrow one, mcN/csrowR/chC_{ce,ue}_count + chC_dimm_label (node_exporter's fixture, old
drivers). Kernels with the dimm layout still emulate csrows for some drivers, so csrows are read
only when a controller has no dimm directories (else every DIMM would count twice).

A DIMM's label is what the BIOS/driver calls the slot ("CPU_SrcID#0_MC#0_Chan#0_DIMM#1", or a
label set through ras-mc-ctl): it is what a technician needs, so it rides on the series.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import ClassVar, Mapping

from podhealth.collectors.base import Collection, raise_if_local, specs
from podhealth.collectors.sysfs import parse_count, read_attr, read_parsed
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

_MC = re.compile(r"^mc[0-9]{1,4}$")
_DIMM = re.compile(r"^(?:dimm|rank)[0-9]{1,4}$")
_CSROW = re.compile(r"^csrow[0-9]{1,4}$")
_CH = re.compile(r"^(ch[0-9]{1,3})_(ce|ue)_count$")

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("edac_mc_errors", "counter", "Memory errors a memory controller counted (label type ce|ue)."),
    MetricSpec("edac_mc_noinfo_errors", "counter",
               "Memory errors the EDAC driver could not pin to a DIMM (ce_noinfo_count / ue_noinfo_count)."),
    MetricSpec("edac_dimm_errors", "counter",
               "Memory errors on one DIMM (label type ce|ue; dimm is dimmN or csrowR_chC; label its slot label)."),
    MetricSpec("edac_memory_controllers", "gauge", "EDAC memory controllers present (0 = no EDAC driver loaded)."),
)


def parse_label(text: str) -> str:
    """A DIMM label: one line, printable; "" when the driver left it empty."""
    return "".join(ch for ch in text.strip().splitlines()[0] if ch.isprintable())[:64] if text.strip() else ""


class EdacCollector:
    name: ClassVar[str] = "edac"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, sysfs_root: Path) -> None:
        self.sysfs_root = sysfs_root

    def _count(self, path: Path, errors: list[str]) -> int | None:
        return read_parsed(path, parse_count, errors)

    def _list(self, d: Path, pattern: re.Pattern[str]) -> list[str]:
        try:
            return sorted((n for n in os.listdir(d) if pattern.match(n)), key=_natural)
        except FileNotFoundError:
            return []
        except OSError as e:
            raise_if_local(e, str(d))
            raise

    def collect(self) -> Collection:
        base = self.sysfs_root / "devices" / "system" / "edac" / "mc"
        errors: list[str] = []
        mcs = self._list(base, _MC)
        if not mcs:
            errors.append(f"no EDAC memory controllers under {base} (EDAC driver not loaded)")
        samples: list[Sample] = [Sample.of("edac_memory_controllers", len(mcs))]
        for mc in mcs:
            d = base / mc
            for kind in ("ce", "ue"):
                n = self._count(d / f"{kind}_count", errors)
                if n is not None:
                    samples.append(Sample.of("edac_mc_errors", n, mc=mc, type=kind))
                n = self._count(d / f"{kind}_noinfo_count", errors)
                if n is not None:
                    samples.append(Sample.of("edac_mc_noinfo_errors", n, mc=mc, type=kind))
            dimms = self._list(d, _DIMM)
            if dimms:
                for dimm in dimms:
                    label = parse_label(read_attr(d / dimm / "dimm_label", errors) or "")
                    for kind in ("ce", "ue"):
                        n = self._count(d / dimm / f"dimm_{kind}_count", errors)
                        if n is not None:
                            samples.append(Sample.of("edac_dimm_errors", n, mc=mc, dimm=dimm, label=label, type=kind))
                continue
            for row in self._list(d, _CSROW):
                for fname in self._list(d / row, _CH):
                    m = _CH.match(fname)
                    assert m is not None
                    ch, kind = m.groups()
                    n = self._count(d / row / fname, errors)
                    if n is None:
                        continue
                    label = parse_label(read_attr(d / row / f"{ch}_dimm_label", errors) or "")
                    samples.append(Sample.of("edac_dimm_errors", n, mc=mc, dimm=f"{row}_{ch}", label=label, type=kind))
        return Collection(tuple(samples), errors=tuple(errors[:32]))

    def close(self) -> None:
        pass


def _natural(name: str) -> tuple[str, int, str]:
    """dimm2 before dimm10 (sysfs lists in creation order, which is not guaranteed either)."""
    m = re.match(r"^(\D*)(\d+)", name)
    return (m.group(1), int(m.group(2)), name) if m else (name, -1, name)


def create(cfg: Config, **_seams: object) -> EdacCollector:
    return EdacCollector(cfg.paths.sysfs_root)
