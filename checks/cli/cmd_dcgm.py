"""`podhealth dcgm-diag`: run `dcgmi diag -r N -j` and judge every test per GPU (checks/active/dcgm.py)."""

from __future__ import annotations

import argparse
import sys
import time

from podhealth.checks import profiles
from podhealth.checks.cli import active_cli
from podhealth.config import Config


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("dcgm-diag", help="DCGM diagnostics (dcgmi diag -r 1|2|3|4), one result per test and GPU",
                       description="Runs dcgmi diag with a timeout per level and maps DCGM failure codes to "
                                   "actions (checks/data/dcgm_errors.yaml). Without dcgmi the answer is UNKNOWN. "
                                   "Exit 0 pass, 1 fail, 2 could not decide, 64 usage error.")
    p.add_argument("-r", "--level", type=int, choices=[1, 2, 3, 4], help="run level (default: active.dcgm.level)")
    p.add_argument("--timeout", type=float, help="seconds (default: active.dcgm.timeout_rN)")
    p.add_argument("--dcgmi", help="dcgmi binary (default: active.dcgm.dcgmi)")
    p.add_argument("--from-file", metavar="FILE", help="judge a saved `dcgmi diag` output (JSON or text) instead of running")
    return active_cli.add_command(p, _run, progress=True)


def _run(args: argparse.Namespace, cfg: Config, prof: profiles.Profile) -> int:
    from podhealth.checks.active import dcgm

    dc = cfg.active.dcgm
    started = time.time()
    if args.from_file:
        try:
            text = sys.stdin.read() if args.from_file == "-" else open(args.from_file, encoding="utf-8").read()
            results = dcgm.results(dcgm.parse(text))
        except (OSError, dcgm.DiagParseError) as e:
            print(f"podhealth dcgm-diag: {args.from_file}: {e}", file=sys.stderr)
            return 2
        return active_cli.finish(cfg, prof, results, args.format, "dcgm_diag", started)
    level = args.level or dc.level
    timeouts = {1: dc.timeout_r1, 2: dc.timeout_r2, 3: dc.timeout_r3, 4: dc.timeout_r4}
    if args.timeout is not None and args.timeout <= 0:
        return active_cli.usage_error("dcgm-diag", "--timeout must be > 0")
    from podhealth.progress import LongWork

    limit = args.timeout if args.timeout is not None else timeouts[level]
    # -r 3 takes ~30 min and -r 4 up to an hour: show it is alive (a bar on a TTY, else a line per interval)
    with LongWork(f"dcgm-diag -r {level}", interval=args.progress_every) as work:
        work.update(note=f"time limit {limit:g}s")
        run = work.run(lambda: dcgm.run_diag(level, args.dcgmi or dc.dcgmi, args.timeout, timeouts))
    notes = [f"dcgmi diag -r {level}: exit {run.returncode}, {run.duration_s:.1f}s"] if run.argv else []
    return active_cli.finish(cfg, prof, run.results, args.format, "dcgm_diag", started, notes)
