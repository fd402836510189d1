"""GPU burn-in: GEMM stress on every GPU at once, judged for correctness, speed and telemetry.

`run_burnin()` starts one worker process per GPU (checks/active/burnin_worker.py; on a CPU-only host N
workers of one thread each stand in for GPUs), watches the GPUs while they run
(checks/active/burnin_watch.py), and hands everything to `judge()`, a pure function:

- correctness (`burnin_correctness`, per GPU): the reference check, the repeat comparison and the
  cross-GPU checksum comparison on identical seeded inputs. Any mismatch is FAIL naming the GPU:
  silent data corruption is what a burn-in is for, and such a GPU goes back (REPLACE).
- performance (`burnin_tflops`, per GPU): FAIL below the profile's gate (gemm_bf16_tflops,
  gemm_fp32_tflops); WARN when more than peer_slow_pct below the node's median, which catches the
  one slow GPU a fixed gate misses.
- telemetry (`burnin_telemetry`, per GPU): XIDs, uncorrectable ECC, thermal / power-brake
  slowdown and temperature seen during the run.
"""

from __future__ import annotations

import json
import os
import queue as queue_mod
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

from podhealth.checks.active.burnin_watch import BAD_CLOCK_EVENTS, NullWatcher, WatchReport, Watcher
from podhealth.checks.active.burnin_worker import (
    DTYPES, FAULTS, DtypeResult, Fault, WorkerResult, WorkerSpec, result_from_json, spec_to_json,
)
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult

CHECK_CORRECT, CHECK_PERF, CHECK_TELEMETRY, CHECK_RUN = (
    "burnin_correctness", "burnin_tflops", "burnin_telemetry", "burnin")
# Cross-GPU checksum tolerance, relative to sum(|C0|): identical inputs through the same kernel on
# the same GPU model give identical bits, so this only absorbs float64 summation noise. A wrong
# element shifts the sum by its error; one in the low mantissa bits hides here and is left to the
# reference and repeat checks.
CHECKSUM_TOL = {"bf16": 1e-7, "fp32": 1e-7}
DEFAULT_SIZE = {"cuda": 8192, "cpu": 160}
CPU_STANDINS = 2
START_GRACE_S = 120.0    # importing torch and creating a CUDA context, per worker, on a busy node


@dataclass(frozen=True)
class Thresholds:
    gemm_bf16_tflops: float = 0.0
    gemm_fp32_tflops: float = 0.0
    peer_slow_pct: float = 10.0
    gpu_temp_warn_c: float = 85.0
    gpu_temp_fail_c: float = 90.0

    @classmethod
    def from_profile(cls, thresholds: Mapping[str, float]) -> "Thresholds":
        names = ("gemm_bf16_tflops", "gemm_fp32_tflops", "peer_slow_pct", "gpu_temp_warn_c", "gpu_temp_fail_c")
        return cls(**{k: float(thresholds[k]) for k in names if k in thresholds})

    def gate(self, dtype: str) -> float:
        return {"bf16": self.gemm_bf16_tflops, "fp32": self.gemm_fp32_tflops}.get(dtype, 0.0)


@dataclass(frozen=True)
class BurninOptions:
    duration_s: float = 60.0
    gpus: tuple[int, ...] | None = None        # None: every GPU (CPU: CPU_STANDINS workers)
    device: str = "auto"                       # auto | cuda | cpu
    size: int | None = None                    # None: DEFAULT_SIZE for the device
    dtypes: tuple[str, ...] = DTYPES
    backend: str = "auto"                      # auto | torch | cupy
    seed: int = 1234
    # Test seam: {worker index: fault}; see burnin_worker's docstring. Empty in production.
    faults: Mapping[int, Fault] = field(default_factory=dict)
    slow_factor: float = 4.0


@dataclass(frozen=True)
class BurninOutcome:
    results: tuple[CheckResult, ...]
    workers: tuple[WorkerResult, ...]
    watch: WatchReport
    device: str
    size: int
    duration_s: float
    notes: tuple[str, ...] = ()


class BurninUnavailable(RuntimeError):
    """Neither PyTorch nor CuPy can run here; the caller reports UNKNOWN."""


def parse_faults(items: Sequence[str]) -> dict[int, Fault]:
    """`["corrupt:1", "slow:0"]` -> {1: "corrupt", 0: "slow"}; ValueError on anything else."""
    out: dict[int, Fault] = {}
    for it in items:
        kind, _, idx = it.partition(":")
        if kind not in FAULTS or not idx.isdigit():
            raise ValueError(f"bad fault {it!r}: expected KIND:INDEX with KIND one of {', '.join(FAULTS)}")
        out[int(idx)] = kind  # type: ignore[assignment]
    return out


def _resolve(opts: BurninOptions) -> tuple[str, str, list[int]]:
    """(device, backend, worker indices). Imports torch (or cupy) in the parent only to count GPUs."""
    backend = opts.backend
    try:
        import torch
    except ImportError:
        torch = None  # type: ignore[assignment]
    if backend == "auto":
        if torch is not None:
            backend = "torch"
        else:
            try:
                import cupy  # noqa: F401
                backend = "cupy"
            except ImportError:
                raise BurninUnavailable("neither PyTorch nor CuPy is installed "
                                        "(pip install 'podhealth[burnin]')") from None
    if backend == "torch" and torch is None:
        raise BurninUnavailable("PyTorch is not installed (pip install 'podhealth[burnin]')")
    if backend == "torch":
        cuda_n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    else:
        import cupy
        cuda_n = cupy.cuda.runtime.getDeviceCount()
    device = opts.device
    if device == "auto":
        device = "cuda" if cuda_n else "cpu"
    if device == "cuda" and not cuda_n:
        raise BurninUnavailable("--device cuda, but no CUDA GPU is visible")
    if backend == "cupy" and device == "cpu":
        raise BurninUnavailable("the CuPy backend needs a GPU")
    if opts.gpus is not None:
        gpus = list(opts.gpus)
        if device == "cuda" and any(g >= cuda_n or g < 0 for g in gpus):
            raise ValueError(f"--gpus {','.join(map(str, gpus))}: only {cuda_n} GPU(s) visible")
    else:
        gpus = list(range(cuda_n if device == "cuda" else CPU_STANDINS))
    if not gpus:
        raise ValueError("no GPUs selected")
    return device, backend, gpus


ProgressFn = Callable[[int, str, float], None]   # (gpu, dtype, fraction done)


def run_burnin(opts: BurninOptions, thresholds: Thresholds, watcher: Watcher | None = None,
               progress: ProgressFn | None = None) -> BurninOutcome:
    """Run the burn-in on every selected GPU at once and judge it. Blocks for about duration_s."""
    try:
        device, backend, gpus = _resolve(opts)
    except BurninUnavailable as e:
        return BurninOutcome((unknown(CHECK_RUN, "node", f"burn-in cannot run: {e}"),), (),
                             WatchReport("none", False, str(e)), opts.device, 0, 0.0)
    size = opts.size or DEFAULT_SIZE[device]
    watcher = watcher or NullWatcher()
    specs = [WorkerSpec(g, device, opts.duration_s, size, opts.dtypes, opts.seed, backend,
                        opts.faults.get(g, ""), opts.slow_factor) for g in gpus]
    events: "queue_mod.Queue[tuple[int, dict[str, object] | None]]" = queue_mod.Queue()
    procs: dict[int, subprocess.Popen[bytes]] = {}
    got: dict[int, WorkerResult] = {}
    limit = opts.duration_s + START_GRACE_S
    t0 = time.monotonic()
    watcher.start()
    try:
        for s in specs:
            env = {**os.environ, **({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"} if device == "cpu" else {})}
            procs[s.index] = subprocess.Popen(
                [sys.executable, "-m", "podhealth.checks.active.burnin_worker", spec_to_json(s)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env)
            threading.Thread(target=_pump, args=(s.index, procs[s.index], events), daemon=True).start()
        done: set[int] = set()
        while len(done) < len(procs):
            left = t0 + limit - time.monotonic()
            if left <= 0:
                break
            try:
                g, msg = events.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                continue
            if msg is None:          # the worker's stdout closed
                done.add(g)
            elif "progress" in msg and progress is not None:
                frac_dt: list[object] = msg["progress"]  # type: ignore[assignment]
                progress(g, str(frac_dt[1]), float(frac_dt[0]))  # type: ignore[arg-type]
            elif "result" in msg:
                got[g] = result_from_json(msg["result"])  # type: ignore[arg-type]
    finally:
        watch = watcher.stop()
        for g, p in procs.items():
            hung = p.poll() is None
            if hung:
                _kill(p)
            try:
                err = p.stderr.read()[-2000:].decode("utf-8", "replace") if p.stderr else ""  # type: ignore[union-attr]
            except (OSError, ValueError):
                err = ""
            if g not in got:
                why = (f"worker did not finish within {limit:g}s (hung)" if hung
                       else f"worker exited with code {p.returncode} without a result")
                got[g] = WorkerResult(g, "", error=f"{why}: {err.strip()[-300:]}" if err.strip() else why)
    elapsed = time.monotonic() - t0
    workers = tuple(got[g] for g in gpus)
    gated = device == "cuda"
    notes = () if gated else ("cpu stand-ins: the profile's TFLOPS gates are not applied; peer comparison is",)
    results = judge(workers, watch, thresholds, apply_gates=gated)
    return BurninOutcome(tuple(results), workers, watch, device, size, elapsed, notes)


def _pump(index: int, proc: "subprocess.Popen[bytes]",
          events: "queue_mod.Queue[tuple[int, dict[str, object] | None]]") -> None:
    """Forward a worker's JSON lines to the event queue; None marks the end of its output."""
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            msg = json.loads(line)
        except ValueError:
            continue             # a library printing to stdout must not break the protocol
        if isinstance(msg, dict):
            events.put((index, msg))
    events.put((index, None))


def _kill(proc: "subprocess.Popen[bytes]") -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(5)
            return
        except subprocess.TimeoutExpired:
            continue


def _entity(index: int) -> str:
    return f"gpu{index}"


def judge(workers: Sequence[WorkerResult], watch: WatchReport, th: Thresholds,
          apply_gates: bool = True) -> list[CheckResult]:
    """Verdicts from worker results and telemetry. Pure."""
    out: list[CheckResult] = []
    ran = [w for w in workers if not w.error]
    dtypes = list(dict.fromkeys(r.dtype for w in ran for r in w.results if not r.skipped))
    medians = {dt: statistics.median([r.tflops for w in ran for r in w.results if r.dtype == dt and not r.skipped])
               for dt in dtypes}
    disagree = {dt: _checksum_outliers(ran, dt) for dt in dtypes}
    telemetry_note = "" if watch.available else f"telemetry unavailable: {watch.reason}"
    for w in workers:
        ent = _entity(w.index)
        if w.error:
            first = w.error.strip().splitlines()[0] if w.error.strip() else "worker failed"
            out.append(fail(CHECK_CORRECT, ent, f"burn-in worker failed: {first}", Action.DRAIN,
                            error=w.error[-240:], device=w.device_name))
            continue
        out.append(_correctness(w, disagree))
        out.append(_performance(w, medians, th, apply_gates))
        if watch.available:
            out.append(_telemetry(w.index, watch, th))
    if telemetry_note:
        out = [CheckResult(r.check, r.status, r.entity, r.evidence + (("telemetry", telemetry_note[:256]),),
                           r.action, r.since, r.summary) for r in out]
    return out


def _checksum_outliers(ran: Sequence[WorkerResult], dt: str) -> dict[int, str]:
    """GPUs whose checksum disagrees with the majority: {gpu: why}. With no majority (two GPUs
    that differ), every GPU outside the largest agreeing group is named, ties naming all."""
    vals = [(w.index, r) for w in ran for r in w.results if r.dtype == dt and not r.skipped]
    if len(vals) < 2:
        return {}
    scale = max(r.abs_checksum for _, r in vals) or 1.0
    tol = CHECKSUM_TOL[dt] * scale
    groups: list[list[tuple[int, DtypeResult]]] = []
    for v in vals:
        for grp in groups:
            if abs(grp[0][1].checksum - v[1].checksum) <= tol:
                grp.append(v)
                break
        else:
            groups.append([v])
    if len(groups) == 1:
        return {}
    groups.sort(key=len, reverse=True)
    majority = groups[0] if len(groups[0]) > len(vals) / 2 else None
    ref = majority[0][1].checksum if majority else None
    out: dict[int, str] = {}
    for grp in groups:
        if grp is majority:
            continue
        for g, r in grp:
            out[g] = (f"{dt} checksum {r.checksum:.6g} differs from the other GPUs' {ref:.6g}" if ref is not None
                      else f"{dt} checksum {r.checksum:.6g}: GPUs disagree and no majority")
    return out


def _correctness(w: WorkerResult, disagree: Mapping[str, Mapping[int, str]]) -> CheckResult:
    ent = _entity(w.index)
    problems: list[str] = []
    ev: dict[str, object] = {"device": w.device_name}
    for r in w.results:
        if r.skipped:
            ev[f"{r.dtype}"] = f"skipped: {r.skipped}"
            continue
        ev[f"{r.dtype}_ref_error"] = f"{r.ref_error:.3g}"
        ev[f"{r.dtype}_repeat_checks"] = r.repeat_checks
        if not r.ref_ok:
            problems.append(f"{r.dtype} result differs from the float64 reference (rel. error {r.ref_error:.3g})")
        if r.repeat_mismatches:
            problems.append(f"{r.dtype} result changed between identical products in {r.repeat_mismatches} "
                            f"of {r.repeat_checks} checks (max rel. diff {r.max_repeat_error:.3g})")
        if w.index in disagree.get(r.dtype, {}):
            problems.append(disagree[r.dtype][w.index])
    if problems:
        return fail(CHECK_CORRECT, ent, f"silent data corruption on {ent}: " + "; ".join(problems),
                    Action.REPLACE, **ev)
    return ok(CHECK_CORRECT, ent, "results match the reference and the other GPUs", **ev)


def _performance(w: WorkerResult, medians: Mapping[str, float], th: Thresholds, apply_gates: bool) -> CheckResult:
    ent = _entity(w.index)
    ev: dict[str, object] = {}
    fails: list[str] = []
    slow: list[str] = []
    for r in w.results:
        if r.skipped:
            continue
        ev[f"{r.dtype}_tflops"] = round(r.tflops, 3 if r.tflops < 10 else 1)
        ev[f"{r.dtype}_median_tflops"] = round(medians[r.dtype], 3 if medians[r.dtype] < 10 else 1)
        ev[f"{r.dtype}_iterations"] = r.iterations
        gate = th.gate(r.dtype)
        if apply_gates and gate > 0 and r.tflops < gate:
            fails.append(f"{r.dtype} {r.tflops:.1f} TFLOPS below the gate {gate:g}")
        floor = medians[r.dtype] * (1 - th.peer_slow_pct / 100)
        if r.tflops < floor:
            slow.append(f"{r.dtype} {r.tflops:.3g} TFLOPS is more than {th.peer_slow_pct:g}% below the node "
                        f"median {medians[r.dtype]:.3g}")
    if fails:
        return fail(CHECK_PERF, ent, "; ".join(fails + slow), Action.DRAIN, **ev)
    if slow:
        return warn(CHECK_PERF, ent, "; ".join(slow), Action.NONE, **ev)
    return ok(CHECK_PERF, ent, ", ".join(f"{k.split('_')[0]} {v} TFLOPS" for k, v in ev.items()
                                         if k.endswith("_tflops") and "median" not in k), **ev)


def _telemetry(index: int, watch: WatchReport, th: Thresholds) -> CheckResult:
    ent = _entity(index)
    g = watch.gpu(index)
    if g is None:
        return unknown(CHECK_TELEMETRY, ent, f"no telemetry for {ent} from {watch.source}")
    ev: dict[str, object] = {"source": watch.source, "samples": watch.samples}
    if g.max_temp_c is not None:
        ev["max_temp_c"] = g.max_temp_c
    if g.clock_events:
        ev["clock_events"] = ",".join(g.clock_events)
    if g.ecc_corrected is not None:
        ev["ecc_corrected_increase"] = g.ecc_corrected
    if g.ecc_uncorrected is not None:
        ev["ecc_uncorrected_increase"] = g.ecc_uncorrected
    if g.xids:
        ev["xids"] = ",".join(map(str, g.xids))
        return fail(CHECK_TELEMETRY, ent, f"XID {', '.join(map(str, g.xids))} during the burn-in",
                    Action.RESET_GPU, **ev)
    if g.ecc_uncorrected:
        return fail(CHECK_TELEMETRY, ent, f"{g.ecc_uncorrected:g} uncorrectable ECC errors during the burn-in",
                    Action.RESET_GPU, **ev)
    if g.max_temp_c is not None and g.max_temp_c >= th.gpu_temp_fail_c:
        return fail(CHECK_TELEMETRY, ent, f"reached {g.max_temp_c:g} C under load (limit {th.gpu_temp_fail_c:g} C)",
                    Action.DRAIN, **ev)
    bad_events = [e for e in g.clock_events if e in BAD_CLOCK_EVENTS]
    problems = []
    if bad_events:
        problems.append(f"clocks slowed by {', '.join(bad_events)}")
    if g.max_temp_c is not None and g.max_temp_c >= th.gpu_temp_warn_c:
        problems.append(f"reached {g.max_temp_c:g} C under load")
    if g.ecc_corrected:
        problems.append(f"{g.ecc_corrected:g} corrected ECC errors")
    if problems:
        return warn(CHECK_TELEMETRY, ent, "; ".join(problems) + " during the burn-in", Action.NONE, **ev)
    return ok(CHECK_TELEMETRY, ent, "no thermal, power-brake, ECC or XID events during the burn-in", **ev)



