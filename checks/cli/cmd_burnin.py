"""`podhealth burnin`: GEMM stress on every GPU at once (checks/active/burnin.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable

from podhealth.checks import profiles
from podhealth.checks.cli import active_cli
from podhealth.config import Config


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("burnin", help="GPU burn-in: bf16/fp32 GEMM stress, correctness and TFLOPS per GPU",
                       description="Runs a GEMM stress on all selected GPUs at once, checks every result "
                                   "against a reference and across GPUs, and compares TFLOPS with the profile "
                                   "gate and the node median. Exit 0 pass, 1 fail, 2 could not decide, 64 usage error.")
    p.add_argument("--duration", type=float, help="seconds (default: active.burnin.duration)")
    p.add_argument("--gpus", type=active_cli.parse_gpus, help="GPU indices, e.g. 0,1 (default: all)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="cpu runs worker processes standing in for GPUs (for testing)")
    p.add_argument("--size", type=int, help="matrix size n (default: active.burnin.size, 0 = auto)")
    p.add_argument("--watch", choices=["nvml", "metrics", "none"], help="telemetry source during the run")
    p.add_argument("--metrics-url", help="agent /metrics URL for --watch metrics")
    p.add_argument("--inject-fault", action="append", default=[], metavar="KIND:INDEX",
                   help="testing only: corrupt|flip|slow on one worker (see checks/active/burnin_worker.py)")
    return active_cli.add_command(p, _run)


def _run(args: argparse.Namespace, cfg: Config, prof: profiles.Profile) -> int:
    from podhealth.checks.active import burnin
    from podhealth.checks.active.burnin_watch import MetricsWatcher, NullWatcher, NvmlWatcher, Watcher

    try:
        faults = burnin.parse_faults(args.inject_fault)
    except ValueError as e:
        return active_cli.usage_error("burnin", str(e))
    bc = cfg.active.burnin
    duration = args.duration if args.duration is not None else bc.duration
    size = args.size if args.size is not None else bc.size
    if duration <= 0 or size < 0:
        return active_cli.usage_error("burnin", "--duration must be > 0 and --size >= 0")
    opts = burnin.BurninOptions(duration_s=duration, gpus=args.gpus, device=args.device, size=size or None,
                                faults=faults)
    mode = args.watch or bc.watcher
    gpus = list(args.gpus) if args.gpus else list(range(max(prof.gpu_count, 8)))
    watcher: Watcher
    if mode == "nvml" and args.device != "cpu":
        watcher = NvmlWatcher(gpus)
    elif mode == "metrics":
        watcher = MetricsWatcher(args.metrics_url or bc.metrics_url, gpus)
    else:
        watcher = NullWatcher("telemetry off" if mode == "none" else "cpu stand-ins have no GPU telemetry")
    started = time.time()
    with _progress(sys.stderr.isatty() and args.format == "table") as prog:
        out = burnin.run_burnin(opts, burnin.Thresholds.from_profile(prof.thresholds), watcher, prog)
    notes = list(out.notes) + [f"device {out.device}, n={out.size}, {out.duration_s:.1f}s wall, "
                               f"{len(out.workers)} worker(s)"]
    if not out.watch.available:
        notes.append(f"telemetry: {out.watch.reason}")
    return active_cli.finish(cfg, prof, out.results, args.format, "burnin", started, notes)


class _progress:
    """A rich progress bar per GPU on a TTY; a no-op otherwise (logs and pipes stay clean)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: object = None
        self.tasks: dict[int, object] = {}

    def __enter__(self) -> Callable[[int, str, float], None] | None:
        if not self.enabled:
            return None
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from podhealth.console import console

        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                            TimeElapsedColumn(), transient=True, console=console(stderr=True))
        self.bar.start()  # type: ignore[attr-defined]

        def update(gpu: int, dtype: str, frac: float) -> None:
            if gpu not in self.tasks:
                self.tasks[gpu] = self.bar.add_task(f"gpu{gpu}", total=1.0)  # type: ignore[attr-defined]
            self.bar.update(self.tasks[gpu], completed=frac, description=f"gpu{gpu} {dtype}")  # type: ignore[attr-defined]
        return update

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.stop()  # type: ignore[attr-defined]
