"""`podhealth perfprobe`: the fail-slow probes of this node (checks/active/perfprobe.py).

Each figure is printed with its fraction of the profile's peak; nothing is judged here (the
aggregator compares it with the fleet). Run it on an idle node: the agent does, when its job
record says the node has no job. Exit 0 measured, 2 nothing could be measured, 64 usage error.
"""

from __future__ import annotations

import argparse
import time

from podhealth.checks import profiles
from podhealth.checks.cli import active_cli
from podhealth.config import Config


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("perfprobe", help="fail-slow probes: GEMM, SM clock, HBM, PCIe, NVLink pairs, RDMA per HCA",
                       description="Measures this node's GPUs and links in a bounded time (nvbandwidth and "
                                   "ib_write_bw where installed, torch/CUDA otherwise; UNKNOWN where neither) and "
                                   "prints each figure with its fraction of the profile's peak. Run it only on an "
                                   "idle node. Exit 0 measured, 2 nothing could be measured, 64 usage error.")
    p.add_argument("--budget", type=float, default=None, help="seconds for the whole round (default: failslow.budget)")
    p.add_argument("--gpus", type=active_cli.parse_gpus, help="GPU indices, e.g. 0,1 (default: all)")
    return active_cli.add_command(p, _run)


def _run(args: argparse.Namespace, cfg: Config, prof: profiles.Profile) -> int:
    from pathlib import Path

    from podhealth.checks.active import perfprobe

    budget = args.budget if args.budget is not None else cfg.failslow.budget
    if not 0 < budget <= 600:
        return active_cli.usage_error("perfprobe", "--budget must be within (0, 600] seconds")
    started = time.time()
    results = perfprobe.run_probes(perfprobe.ProbeOptions(profile=prof.name, budget=budget, gpus=args.gpus,
                                                          sysfs_root=Path(cfg.paths.sysfs_root)))
    return active_cli.finish(cfg, prof, results, args.format, "perfprobe", started)
