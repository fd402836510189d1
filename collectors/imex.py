"""imex: the IMEX service that holds a multi-node NVLink domain up (GB200 NVL72 racks).

A rack's 72 GPUs share memory across its compute trays only while each tray's `nvidia-imex`
daemon is READY and the domain UP. The state comes from the service's own tool, one argv each, no
shell, a timeout, output bounded: `nvidia-imex-ctl -q` (this daemon) and `nvidia-imex-ctl -N -j`
(the domain as it sees it; collectors/imex_parse.py). Where the tool is not installed (every node
without an NVLink domain) the collector is disabled, not failing. The simulator hands over the same
outputs through the `status_source` seam (a directory holding `q.txt` and `N.json`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Callable, ClassVar, Mapping

from podhealth.collectors.base import Collection, CollectorDisabled, raise_if_local, specs
from podhealth.collectors.imex_parse import ImexDomain, parse_daemon, parse_domain
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

_MAX_OUT = 1 << 20

# "-q" or "-N -j" -> the tool's stdout
Source = Callable[[tuple[str, ...]], str]

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("imex_daemon_state_info", "info", "This node's IMEX daemon state (label state, nvidia-imex-ctl -q)."),
    MetricSpec("imex_daemon_ready", "gauge", "1 when this node's IMEX daemon is READY."),
    MetricSpec("imex_domain_state_info", "info", "The IMEX domain's state as this daemon sees it (label state: UP, "
                                                 "DEGRADED, DOWN; nvidia-imex-ctl -N -j)."),
    MetricSpec("imex_domain_up", "gauge", "1 when the IMEX domain is UP."),
    MetricSpec("imex_domain_nodes", "gauge", "Nodes of the IMEX domain by `status` (READY, UNAVAILABLE, ...)."),
)


def cli_source(argv0: str, timeout: float) -> Source:
    def read(args: tuple[str, ...]) -> str:
        proc = subprocess.run([argv0, *args], capture_output=True, timeout=timeout, check=False)
        out = proc.stdout[:_MAX_OUT].decode("utf-8", "replace")
        if proc.returncode != 0 and not out.strip():
            raise RuntimeError(f"nvidia-imex-ctl {' '.join(args)} exited {proc.returncode}: "
                               f"{proc.stderr[:200].decode('utf-8', 'replace').strip()}")
        return out
    return read


def dir_source(directory: Path) -> Source:
    """The simulator's: <directory>/q.txt and <directory>/N.json."""
    def read(args: tuple[str, ...]) -> str:
        return (directory / ("q.txt" if args == ("-q",) else "N.json")).read_text(encoding="utf-8")
    return read


def domain_samples(domain: ImexDomain) -> list[Sample]:
    out = [Sample.of("imex_domain_state_info", 1, state=domain.status),
           Sample.of("imex_domain_up", int(domain.status == "UP"))]
    counts: dict[str, int] = {}
    for n in domain.nodes:
        counts[n.status] = counts.get(n.status, 0) + 1
    out += [Sample.of("imex_domain_nodes", c, status=s) for s, c in sorted(counts.items())]
    return out


class ImexCollector:
    name: ClassVar[str] = "imex"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, source: Source) -> None:
        self._source = source

    def collect(self) -> Collection:
        samples: list[Sample] = []
        errors: list[str] = []
        try:
            state = parse_daemon(self._source(("-q",)))
            samples += [Sample.of("imex_daemon_state_info", 1, state=state),
                        Sample.of("imex_daemon_ready", int(state == "READY"))]
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            raise_if_local(e, "nvidia-imex-ctl -q")
            errors.append(f"nvidia-imex-ctl -q: {e}"[:300])
        try:
            samples += domain_samples(parse_domain(self._source(("-N", "-j"))))
        except (OSError, RuntimeError, ValueError, subprocess.TimeoutExpired) as e:
            raise_if_local(e, "nvidia-imex-ctl -N -j")
            errors.append(f"nvidia-imex-ctl -N -j: {e}"[:300])
        return Collection(tuple(samples), errors=tuple(errors))

    def close(self) -> None:
        pass


def create(cfg: Config, status_source: Path | None = None, **_seams: object) -> ImexCollector:
    """`status_source`: the simulator's directory of nvidia-imex-ctl outputs instead of the tool."""
    if status_source is not None:
        return ImexCollector(dir_source(status_source))
    argv0 = shutil.which("nvidia-imex-ctl")
    if argv0 is None:
        raise CollectorDisabled("nvidia-imex-ctl not installed (no multi-node NVLink domain on this node)")
    return ImexCollector(cli_source(argv0, min(5.0, cfg.collectors.imex.timeout / 2)))
