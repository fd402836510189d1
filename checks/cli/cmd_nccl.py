"""`podhealth nccl`: all-reduce bandwidth in this node, or pairwise across nodes to find bad ones."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from podhealth.checks import profiles
from podhealth.checks.cli import active_cli
from podhealth.config import Config


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("nccl", help="NCCL all-reduce bandwidth: in-node, or pairwise over Slurm with bad-node localisation",
                       description="Without --nodes: runs nccl-tests all_reduce_perf (when configured) or podhealth's "
                                   "torch.distributed runner on this node. With --nodes: pairwise two-node tests "
                                   "through srun, then re-tests of failing pairs against known-good nodes. "
                                   "Exit 0 pass, 1 fail, 2 could not decide, 64 usage error.")
    p.add_argument("--nodes", help="Slurm hostlist for pairwise tests, e.g. 'dgx[01-16]'")
    p.add_argument("--reference", action="append", default=[], metavar="NODE",
                   help="a known-good node to test suspects against (repeatable)")
    p.add_argument("--all-reduce-perf", help="nccl-tests binary (default: active.nccl.all_reduce_perf; empty = runner)")
    p.add_argument("--nproc", type=int, default=0, help="ranks per node (default: one per GPU; 2 on CPU in-node, 1 per node pairwise)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--min-bytes", type=int, help="default: active.nccl.min_bytes")
    p.add_argument("--max-bytes", type=int, help="default: active.nccl.max_bytes")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--timeout", type=float, help="seconds per run / per pair (default: active.nccl.timeout)")
    p.add_argument("--fleet-median", type=float, help="in-node busbw fleet median, GB/s (default: active.nccl.fleet_median_gbps)")
    p.add_argument("--slow-pct", type=float, help="%% below the median that counts as slow (default: active.nccl.fleet_slow_pct)")
    p.add_argument("--pair-gate", type=float, help="two-node busbw gate, GB/s (default: active.nccl.pair_busbw_gbps, "
                                                   "else the profile's thresholds.nccl_multinode_busbw_gbps)")
    p.add_argument("--judge", metavar="FILE", help="judge a saved all_reduce_perf output (e.g. a multi-node sbatch run) "
                                                  "instead of running one; multi-node output blames the hosts it names")
    p.add_argument("--parallel", type=int, default=8, help="pair tests run at once")
    p.add_argument("--runner-fault", default="", help="testing only: passed to the runner's --fault (slow:NODE, fail:NODE)")
    return active_cli.add_command(p, _run, progress=True)


def _device(requested: str) -> str:
    if requested != "auto":
        return requested
    try:
        import torch
    except ImportError:
        return "cuda"    # no torch: only all_reduce_perf can run, and it needs GPUs
    return "cuda" if torch.cuda.is_available() else "cpu"


def _run(args: argparse.Namespace, cfg: Config, prof: profiles.Profile) -> int:
    nc = cfg.active.nccl
    min_b = args.min_bytes or nc.min_bytes
    max_b = args.max_bytes or nc.max_bytes
    timeout = args.timeout if args.timeout is not None else nc.timeout
    slow_pct = args.slow_pct if args.slow_pct is not None else nc.fleet_slow_pct
    if min_b <= 0 or max_b < min_b or timeout <= 0 or not 0 <= slow_pct <= 100:
        return active_cli.usage_error("nccl", "need 0 < --min-bytes <= --max-bytes, --timeout > 0, "
                                               "0 <= --slow-pct <= 100")
    binary = args.all_reduce_perf if args.all_reduce_perf is not None else nc.all_reduce_perf
    device = "cuda" if binary else _device(args.device)
    started = time.time()
    if args.judge:
        return _judge_file(args, cfg, prof, slow_pct, started)
    if args.nodes:
        return _pairwise(args, cfg, prof, binary, device, min_b, max_b, timeout, slow_pct, started)
    return _single(args, cfg, prof, binary, device, min_b, max_b, timeout, slow_pct, started)


def _single(args: argparse.Namespace, cfg, prof, binary: str, device: str, min_b: int, max_b: int,  # type: ignore[no-untyped-def]
            timeout: float, slow_pct: float, started: float) -> int:
    from podhealth.checks.active import nccl
    from podhealth.checks.passive.result import unknown

    if binary:
        if not os.access(binary, os.X_OK):
            return active_cli.finish(cfg, prof, [unknown(nccl.CHECK, "node", f"all_reduce_perf not executable: {binary}")],
                                     args.format, nccl.CHECK, started)
        ngpus = args.nproc or prof.gpu_count or 1
        argv = [binary, "-b", str(min_b), "-e", str(max_b), "-f", "2", "-g", str(ngpus),
                "-n", str(args.iters), "-w", str(args.warmup)]
    else:
        argv = [sys.executable, "-m", "podhealth.checks.active.nccl_runner", "--device", device, "--nproc", str(args.nproc),
                "--min-bytes", str(min_b), "--max-bytes", str(max_b), "--iters", str(args.iters),
                "--warmup", str(args.warmup), "--timeout", str(timeout)]
        if args.runner_fault:
            argv += ["--fault", args.runner_fault]
    try:
        r = subprocess.run(argv, capture_output=True, timeout=timeout * 2 + 60, check=False, stdin=subprocess.DEVNULL)
        text = r.stdout.decode("utf-8", "replace")
        note = f"{os.path.basename(argv[0]) if binary else 'nccl_runner'}: exit {r.returncode}"
        if r.returncode and not text.strip():
            text = r.stderr.decode("utf-8", "replace")
    except subprocess.TimeoutExpired:
        return active_cli.finish(cfg, prof, [unknown(nccl.CHECK, "node", f"all-reduce timed out after {timeout * 2 + 60:g}s")],
                                 args.format, nccl.CHECK, started)
    median = args.fleet_median if args.fleet_median is not None else cfg.active.nccl.fleet_median_gbps
    if device != "cuda":
        result = nccl.judge(nccl.parse(text), nccl.Gates(0.0, median, slow_pct))
        notes = [note, "cpu (gloo): the profile's busbw gate is not applied"]
        return active_cli.finish(cfg, prof, [result], args.format, nccl.CHECK, started, notes)
    return active_cli.finish(cfg, prof, _judged(text, args, cfg, prof, median, slow_pct), args.format, nccl.CHECK,
                             started, [note])


def _judged(text: str, args: argparse.Namespace, cfg, prof, median: float, slow_pct: float):  # type: ignore[no-untyped-def]
    """In-node output against the in-node gate; output naming several hosts against the profile's
    multi-node gate, blaming those hosts (a wrapper may have launched mpirun across nodes)."""
    from podhealth.checks.active import nccl

    run = nccl.parse(text)
    if len(run.hosts) > 1:
        override = args.pair_gate if args.pair_gate is not None else cfg.active.nccl.pair_busbw_gbps
        return nccl.judge_hosts(run, nccl.multinode_gates(prof.thresholds, override, slow_pct))
    return [nccl.judge(run, nccl.Gates(prof.threshold("nccl_allreduce_busbw_gbps"), median, slow_pct,
                                       int(prof.thresholds.get("nccl_allreduce_min_bytes", 0))))]


def _judge_file(args: argparse.Namespace, cfg, prof, slow_pct: float, started: float) -> int:  # type: ignore[no-untyped-def]
    from podhealth.checks.active import nccl
    from podhealth.checks.passive.result import unknown

    try:
        with open(args.judge, "rb") as f:
            text = f.read(64 << 20).decode("utf-8", "replace")
    except OSError as e:
        return active_cli.finish(cfg, prof, [unknown(nccl.CHECK, "node", f"cannot read {args.judge}: {e.strerror or e}")],
                                 args.format, nccl.CHECK, started)
    median = args.fleet_median if args.fleet_median is not None else cfg.active.nccl.fleet_median_gbps
    return active_cli.finish(cfg, prof, _judged(text, args, cfg, prof, median, slow_pct), args.format, nccl.CHECK,
                             started, [f"judged {args.judge}"])


def _pairwise(args: argparse.Namespace, cfg, prof, binary: str, device: str, min_b: int, max_b: int,  # type: ignore[no-untyped-def]
              timeout: float, slow_pct: float, started: float) -> int:
    from podhealth.checks.active import localize, nccl, nccl_slurm
    from podhealth.hostnames import expand_hostlist

    nc = cfg.active.nccl
    try:
        nodes = list(expand_hostlist(args.nodes))
        refs = [n for r in args.reference for n in expand_hostlist(r)]
    except ValueError as e:
        return active_cli.usage_error("nccl", f"--nodes: {e}")
    if len(nodes) + len(refs) < 2:
        return active_cli.usage_error("nccl", "pairwise tests need at least two nodes")
    srun = nc.srun
    scontrol = os.path.join(os.path.dirname(srun), "scontrol") if os.sep in srun else "scontrol"
    ranks = args.nproc or (1 if device == "cpu" else (prof.gpu_count or 1))
    job = nccl_slurm.PairJob(srun=srun, python=nc.python, ranks_per_node=ranks, device=device, min_bytes=min_b,
                             max_bytes=max_b, iters=args.iters, warmup=args.warmup, timeout_s=timeout,
                             partition=nc.partition, node_addr=nccl_slurm.node_addresses(nodes + refs, scontrol),
                             runner=binary,
                             extra_runner_args=("--fault", args.runner_fault) if args.runner_fault else ())
    override = args.pair_gate if args.pair_gate is not None else nc.pair_busbw_gbps
    # On CPU (gloo) the profile's fabric gate means nothing: pairs are judged against their median only.
    gates = nccl.multinode_gates(prof.thresholds, override, slow_pct) if device == "cuda" else \
        nccl.Gates(override, 0.0, slow_pct)
    from podhealth.progress import LongWork

    with LongWork("nccl pair tests", interval=args.progress_every) as work:
        seen: list[str] = []

        def on_pair(r: "localize.PairResult") -> None:  # rounds follow from the results: no total
            seen.append(r.outcome)
            bad = sum(1 for o in seen if o != "pass")
            work.update(done=len(seen), note=f"{len(seen)} pair test(s) done, {bad} not passing")

        work.update(note="first round of pair tests")
        out = work.run(lambda: nccl_slurm.run_pairwise(nodes, job, gates, slow_pct, refs, max_parallel=args.parallel,
                                                       on_pair=on_pair))
    notes = [f"{len(out.pairs)} pair test(s); pairs' median busbw {out.median_gbps:.3g} GB/s"]
    if device != "cuda":
        notes.append("cpu (gloo): the profile's multi-node gate is not applied")
    return active_cli.finish(cfg, prof, out.results, args.format, nccl_slurm.CHECK, started, notes)
