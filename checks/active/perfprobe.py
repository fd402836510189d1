"""Fail-slow probes: a short, bounded performance fingerprint of the node's GPUs and links.

`run_probes(opts)` measures, within `opts.budget` seconds:
- per GPU: GEMM TFLOPS at the profile's dtype, SM clock under that load, HBM copy bandwidth
  (checks/active/perfprobe_worker.py, torch in its own process);
- per GPU: PCIe host->device and device->host, and per GPU pair: NVLink P2P, from `nvbandwidth`
  when it is installed (NVIDIA's own copy-engine figures), else from the torch worker;
- per InfiniBand HCA: RDMA write bandwidth from `ib_write_bw` (perftest) in loopback through the
  HCA (its PCIe link and engine; the cable is the fabric checks' business);
with UNKNOWN where neither a tool nor CUDA can measure (a probe that cannot run never FAILs).

Results are the handover report's CheckResults: `perfprobe_<metric>` per entity, OK with the
figure in its evidence (`value`, `unit`, `fraction_of_peak` of checks/data/perf_peaks.yaml,
`tool`), so `podhealth perfprobe --format json`, the handover suite and the agent all read them
the same way. Judging is not done here: the aggregator compares each figure with its cohort.

The parsers (`parse_nvbandwidth`, `parse_ib_write_bw`) are pure and table-tested.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from podhealth.checks import perf_peaks
from podhealth.checks.passive.result import ok, unknown
from podhealth.config_failslow import METRICS, SHORT
from podhealth.vocab import CheckResult

UNITS = {"gemm_tflops": "TFLOPS", "sm_clock_mhz": "MHz"}
CHECK_PREFIX = "perfprobe_"
WORKER_GRACE_S = 90.0  # importing torch and creating CUDA contexts on a busy node
IB_PORT = 18515  # perftest's default


@dataclass(frozen=True)
class Reading:
    entity: str
    metric: str
    value: float
    tool: str


@dataclass(frozen=True)
class ProbeOptions:
    profile: str
    budget: float = 120.0
    gpus: tuple[int, ...] | None = None
    sysfs_root: Path = Path("/sys")
    nvbandwidth: str = "nvbandwidth"
    ib_write_bw: str = "ib_write_bw"


def check_name(metric: str) -> str:
    return CHECK_PREFIX + SHORT[metric]


def metric_of(check: str) -> str | None:
    short = check.removeprefix(CHECK_PREFIX)
    return next((m for m, s in SHORT.items() if s == short), None) if check.startswith(CHECK_PREFIX) else None


# ---- nvbandwidth -----------------------------------------------------------------------------

_TITLE = re.compile(r"(CPU|GPU)\(row\)\s*(->|<-)\s*(CPU|GPU)\(column\)\s*bandwidth \(GB/s\)")


def parse_nvbandwidth(text: str) -> dict[str, list[list[float | None]]]:
    """{"h2d" | "d2h" | "d2d": matrix} from nvbandwidth's text output (copy-engine or SM copies).

    Each matrix follows a title such as `memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)`, which
    says what it measured (more robust than the `Running NAME.` line, which pasted logs lose or
    prefix with "> "), then a line of column indices and one row per source (`N/A` = None)."""
    out: dict[str, list[list[float | None]]] = {}
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _TITLE.search(lines[i])
        i += 1
        if not m:
            continue
        src, arrow, dst = m.groups()
        if src == "GPU" and dst == "GPU":
            kind = "d2d"
        elif src == "CPU":
            kind = "h2d" if arrow == "->" else "d2h"
        else:
            kind = "d2h" if arrow == "->" else "h2d"
        i += 1  # the column indices
        rows: list[list[float | None]] = []
        while i < len(lines) and lines[i].strip():
            cells = lines[i].split()
            if not cells[0].isdigit():
                break
            try:
                rows.append([None if c == "N/A" else float(c) for c in cells[1:]])
            except ValueError:
                break
            i += 1
        if rows:
            out[kind] = rows
    return out


def readings_from_nvbandwidth(tests: Mapping[str, list[list[float | None]]]) -> list[Reading]:
    out: list[Reading] = []
    for kind, metric in (("h2d", "pcie_h2d_gbs"), ("d2h", "pcie_d2h_gbs")):
        rows = tests.get(kind)
        if rows:
            out += [Reading(f"gpu{g}", metric, v, "nvbandwidth") for g, v in enumerate(rows[0]) if v is not None]
    m = tests.get("d2d")
    if m:
        for i in range(len(m)):
            for j in range(i + 1, min(len(m), len(m[i]))):
                vals = [v for v in (m[i][j], m[j][i] if i < len(m[j]) else None) if v is not None]
                if vals:
                    out.append(Reading(f"gpu{i}-gpu{j}", "nvlink_gbs", min(vals), "nvbandwidth"))
    return out


# ---- ib_write_bw -----------------------------------------------------------------------------

_BW_HEADER = re.compile(r"BW average\[(Gb/sec|MB/sec)\]")


def parse_ib_write_bw(text: str) -> float | None:
    """GB/s (10^9 bytes) from perftest's summary table (`BW average[Gb/sec]`, or MB/sec without
    --report_gbits); None when there is no such table."""
    unit = None
    for line in text.splitlines():
        h = _BW_HEADER.search(line)
        if h:
            unit = h.group(1)
            continue
        if unit is None:
            continue
        cells = line.split()
        if len(cells) >= 4 and cells[0].isdigit():
            try:
                avg = float(cells[3])
            except ValueError:
                return None
            return avg / 8.0 if unit == "Gb/sec" else avg * 1.048576 / 1000.0
    return None


def ib_devices(sysfs_root: Path) -> list[str]:
    """InfiniBand HCAs with an ACTIVE port 1 (Ethernet/RoCE and storage bonds are left to their checks)."""
    base = sysfs_root / "class" / "infiniband"
    out = []
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    for dev in names:
        try:
            layer = (base / dev / "ports" / "1" / "link_layer").read_text().strip()
            state = (base / dev / "ports" / "1" / "state").read_text()
        except OSError:
            continue
        if layer == "InfiniBand" and "ACTIVE" in state:
            out.append(dev)
    return out


def _ib_write_bw(tool: str, dev: str, seconds: float, port: int) -> float | None:
    args = [tool, "-d", dev, "-F", "--report_gbits", "-D", f"{max(1, int(seconds))}", "-p", str(port)]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(0.5)  # perftest's server has no readiness signal; the client retries below
        for _ in range(3):
            r = subprocess.run([*args, "127.0.0.1"], capture_output=True, text=True, timeout=seconds + 15)
            got = parse_ib_write_bw(r.stdout)
            if got is not None:
                return got
            time.sleep(0.5)
        return None
    finally:
        server.kill()
        server.wait(5)


# ---- the run ---------------------------------------------------------------------------------


def _worker(spec: dict[str, object], timeout: float) -> tuple[list[Reading], list[tuple[str, str, str]]]:
    try:
        r = subprocess.run([sys.executable, "-m", "podhealth.checks.active.perfprobe_worker", json.dumps(spec)],
                           capture_output=True, text=True, timeout=timeout, start_new_session=True)
    except subprocess.TimeoutExpired:
        return [], [("node", "*", f"the CUDA probes did not finish within {timeout:.0f}s")]
    except OSError as e:
        return [], [("node", "*", f"cannot start the CUDA probes: {e}")]
    try:
        out = json.loads(r.stdout)
        readings = [Reading(str(x["entity"]), str(x["metric"]), float(x["value"]), str(x["tool"]))
                    for x in out["readings"] if x["metric"] in METRICS]
        errors = [(str(x["entity"]), str(x["metric"]), str(x["why"])) for x in out["errors"]]
    except (ValueError, KeyError, TypeError):
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        return [], [("node", "*", f"the CUDA probes exited {r.returncode}: {tail[:200]}")]
    return readings, errors


def run_probes(opts: ProbeOptions) -> list[CheckResult]:
    started = time.monotonic()
    pk = perf_peaks.peaks(opts.profile)
    readings: list[Reading] = []
    unknowns: list[CheckResult] = []
    nvb = shutil.which(opts.nvbandwidth)
    have_nvb = False
    if nvb:
        try:
            r = subprocess.run([nvb, "-t", "host_to_device_memcpy_ce", "device_to_host_memcpy_ce",
                                "device_to_device_memcpy_read_ce"], capture_output=True, text=True,
                               timeout=opts.budget / 3, start_new_session=True)
            got = readings_from_nvbandwidth(parse_nvbandwidth(r.stdout))
            if opts.gpus is not None:
                got = [x for x in got if all(int(g[3:]) in opts.gpus for g in x.entity.split("-"))]
            readings += got
            have_nvb = bool(got)
        except (OSError, subprocess.TimeoutExpired):
            pass
    per_probe = max(1.0, min(3.0, opts.budget / 60))
    spec: dict[str, object] = {"dtype": pk.dtype if pk else "bf16", "seconds": per_probe,
                               "what": ["gemm", "hbm"] + ([] if have_nvb else ["pcie", "nvlink"])}
    if opts.gpus is not None:
        spec["gpus"] = list(opts.gpus)
    left = opts.budget - (time.monotonic() - started)
    got, errors = _worker(spec, max(10.0, left) + WORKER_GRACE_S)
    readings += got
    for entity, metric, why in errors:
        if metric == "*":
            for m in ("gemm_tflops", "sm_clock_mhz", "hbm_gbs") + (() if have_nvb else ("pcie_h2d_gbs", "pcie_d2h_gbs")):
                unknowns.append(unknown(check_name(m), entity, f"not measured: {why}"))
            if entity == "node" and not have_nvb:
                unknowns.append(unknown(check_name("nvlink_gbs"), "node", f"not measured: {why}"))
        else:
            unknowns.append(unknown(check_name(metric), entity, f"not measured: {why}"))
    devs = ib_devices(opts.sysfs_root)
    ibw = shutil.which(opts.ib_write_bw) if devs else None
    if devs and not ibw:
        unknowns.append(unknown(check_name("rdma_gbs"), "node", f"{opts.ib_write_bw} (perftest) is not installed"))
    for k, dev in enumerate(devs if ibw else []):
        left = opts.budget - (time.monotonic() - started)
        if left < 3:
            unknowns.append(unknown(check_name("rdma_gbs"), dev, "not measured: the probe round's budget ran out"))
            continue
        try:
            bw = _ib_write_bw(str(ibw), dev, min(3.0, left / 2), IB_PORT + k)
        except (OSError, subprocess.TimeoutExpired) as e:
            bw = None
            why = str(e)
        else:
            why = "no bandwidth in its output"
        if bw is None:
            unknowns.append(unknown(check_name("rdma_gbs"), dev, f"ib_write_bw: {why}"))
        else:
            readings.append(Reading(dev, "rdma_gbs", bw, "ib_write_bw"))
    return [result_of(r, pk) for r in readings] + unknowns


def result_of(r: Reading, pk: perf_peaks.Peaks | None) -> CheckResult:
    unit = UNITS.get(r.metric, "GB/s")
    frac = r.value / pk.peak(r.metric) if pk and pk.peak(r.metric) > 0 else None
    text = f"{r.value:.1f} {unit}" + (f" ({frac:.0%} of the profile's peak)" if frac is not None else "")
    ev: dict[str, object] = {"value": f"{r.value:.3f}", "unit": unit, "tool": r.tool}
    if frac is not None:
        ev["fraction_of_peak"] = f"{frac:.3f}"
    return ok(check_name(r.metric), r.entity, text, **ev)


def readings_of(results: Sequence[CheckResult]) -> list[tuple[str, str, float]]:
    """(entity, metric, value) of the OK probe results (what the agent exports and sends)."""
    out = []
    for r in results:
        metric = metric_of(r.check)
        ev = dict(r.evidence)
        if metric is None or r.status.value != "OK" or "value" not in ev:
            continue
        try:
            out.append((r.entity, metric, float(ev["value"])))
        except ValueError:
            continue
    return out
