"""nvme: NVMe controllers from <sysfs_root>/class/nvme/nvme*/ and, when nvme-cli is there, their SMART log.

The kernel's sysfs gives identity and controller state (model, serial, firmware_rev, state:
live / resetting / connecting / dead ...) but no health log. The health (critical warning,
available spare, percentage used, media errors) comes from `nvme smart-log -o json /dev/nvmeN`:
one argv, no shell, a timeout, run only when `nvme` is on PATH. Without nvme-cli the SMART
series are absent (not zero) and the checks judge what sysfs says. The simulator hands over its
smart-log JSON through the same seam (`smart_source`), in nvme-cli's format, so the parser is the
one real nodes use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, ClassVar, Mapping

from podhealth.collectors.base import Collection, raise_if_local, specs
from podhealth.collectors.sysfs import read_attr
from podhealth.collectors.nvme_parse import SmartLog, parse_smart_log
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

_CTRL = re.compile(r"^nvme[0-9]{1,4}$")
SMART_TIMEOUT = 5.0
_MAX_OUT = 1 << 20

# controller name ("nvme0") -> smart-log JSON text
SmartSource = Callable[[str], str]

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("nvme_info", "info", "An NVMe controller: model, serial, firmware, state (sysfs), pci."),
    MetricSpec("nvme_controller_live", "gauge", "1 when the controller's sysfs state is live."),
    MetricSpec("nvme_smart_up", "gauge", "1 when the SMART log was read (nvme-cli present and answering)."),
    MetricSpec("nvme_critical_warning", "gauge", "SMART critical warning bit field (0 = none)."),
    MetricSpec("nvme_temperature_celsius", "gauge", "Composite temperature (SMART, Kelvin - 273).", "celsius"),
    MetricSpec("nvme_available_spare_percent", "gauge", "Remaining spare capacity, percent."),
    MetricSpec("nvme_available_spare_threshold_percent", "gauge", "Spare threshold the drive warns below, percent."),
    MetricSpec("nvme_percentage_used", "gauge", "Vendor estimate of life used, percent (may exceed 100)."),
    MetricSpec("nvme_media_errors", "counter", "Unrecovered data integrity errors (SMART media_errors)."),
    MetricSpec("nvme_error_log_entries", "counter", "Error information log entries over the drive's life."),
)


def cli_source(argv0: str = "nvme", timeout: float = SMART_TIMEOUT) -> SmartSource:
    def read(ctrl: str) -> str:
        proc = subprocess.run([argv0, "smart-log", "-o", "json", f"/dev/{ctrl}"], capture_output=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"nvme smart-log exited {proc.returncode}: "
                               f"{proc.stderr[:200].decode('utf-8', 'replace').strip()}")
        return proc.stdout[:_MAX_OUT].decode("utf-8", "replace")
    return read


def dir_source(directory: Path) -> SmartSource:
    """<directory>/<ctrl>.json: the simulator's smart logs."""
    def read(ctrl: str) -> str:
        return (directory / f"{ctrl}.json").read_text(encoding="utf-8")
    return read


class NvmeCollector:
    name: ClassVar[str] = "nvme"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, sysfs_root: Path, smart: SmartSource | None) -> None:
        self.sysfs_root = sysfs_root
        self._smart = smart

    def _attr(self, d: Path, name: str, errors: list[str]) -> str:
        return (read_attr(d / name, errors) or "").strip()

    def collect(self) -> Collection:
        base = self.sysfs_root / "class" / "nvme"
        errors: list[str] = []
        try:
            ctrls = sorted((n for n in os.listdir(base) if _CTRL.match(n)), key=lambda n: int(n[4:]))
        except FileNotFoundError:
            ctrls = []  # no NVMe here (or the driver not loaded): nothing to judge, said in errors
            errors.append(f"no NVMe controllers under {base}")
        except OSError as e:
            raise_if_local(e, str(base))
            raise
        samples: list[Sample] = []
        for ctrl in ctrls:
            d = base / ctrl
            state = self._attr(d, "state", errors)
            pci = ""
            try:
                pci = os.path.basename(os.path.realpath(d / "device"))
            except OSError:
                pass
            samples.append(Sample.of("nvme_info", 1, controller=ctrl, model=self._attr(d, "model", errors),
                                     serial=self._attr(d, "serial", errors),
                                     firmware=self._attr(d, "firmware_rev", errors), state=state or "unknown",
                                     pci=pci))
            if state:
                samples.append(Sample.of("nvme_controller_live", 1 if state == "live" else 0, controller=ctrl))
            if self._smart is None:
                continue
            log = self._smart_log(ctrl, errors)
            samples.append(Sample.of("nvme_smart_up", 0 if log is None else 1, controller=ctrl))
            if log is not None:
                samples.extend(_smart_samples(ctrl, log))
        return Collection(tuple(samples), errors=tuple(errors[:32]))

    def _smart_log(self, ctrl: str, errors: list[str]) -> SmartLog | None:
        assert self._smart is not None
        try:
            return parse_smart_log(self._smart(ctrl))
        except subprocess.TimeoutExpired:
            errors.append(f"{ctrl}: nvme smart-log timed out")
        except (OSError, RuntimeError, ValueError) as e:
            raise_if_local(e, f"{ctrl} smart-log")
            errors.append(f"{ctrl}: smart-log: {e}"[:300])
        return None

    def close(self) -> None:
        pass


def _smart_samples(ctrl: str, log: SmartLog) -> list[Sample]:
    pairs = (("nvme_critical_warning", log.critical_warning), ("nvme_temperature_celsius", log.temperature_c),
             ("nvme_available_spare_percent", log.available_spare_pct),
             ("nvme_available_spare_threshold_percent", log.spare_threshold_pct),
             ("nvme_percentage_used", log.percentage_used), ("nvme_media_errors", log.media_errors),
             ("nvme_error_log_entries", log.error_log_entries))
    return [Sample.of(name, v, controller=ctrl) for name, v in pairs if v is not None]


def create(cfg: Config, smart_source: Path | None = None, **_seams: object) -> NvmeCollector:
    """`smart_source`: a directory of <ctrl>.json smart logs (the simulator's) instead of nvme-cli."""
    if smart_source is not None:
        return NvmeCollector(cfg.paths.sysfs_root, dir_source(smart_source))
    argv0 = shutil.which("nvme")
    # one hung drive must leave time for the others within the collection's own timeout
    timeout = min(SMART_TIMEOUT, cfg.collectors.nvme.timeout / 4)
    return NvmeCollector(cfg.paths.sysfs_root, cli_source(argv0, timeout) if argv0 else None)
