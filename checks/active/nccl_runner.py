"""podhealth's own all-reduce benchmark: `python -m podhealth.checks.active.nccl_runner`.

For nodes without nccl-tests. One process per GPU with torchrun semantics: NCCL on GPUs, Gloo on
CPU. Rank 0 prints its results in nccl-tests' `all_reduce_perf` table format, so checks/active/nccl.py
parses both with one parser.

How it is launched decides its role:
- plain (`--nproc N`): a launcher that starts N ranks on this host (RANK, WORLD_SIZE,
  LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and relays rank 0's output;
- under torchrun (RANK and WORLD_SIZE set): one rank;
- under srun with `--slurm`: one rank, from SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID; the
  master is the first node of the step's node list (`--node-addr NAME=ADDR` maps Slurm node names
  to addresses; the port is `--master-port`, or derived from the job id).

Timing: every rank times its iterations and the slowest rank's time is reported, as nccl-tests
does. Validation: a separate all-reduce of known values per size; differing elements are #wrong.

Fault injection (test seam, documented here and in `--help`): `--fault slow:NODE` makes the rank
on node NODE sleep `--fault-delay` seconds in every timed iteration, so every pair containing
NODE is slow; `--fault fail:NODE` makes that rank fail at start-up.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from datetime import timedelta
from typing import Sequence

FAILURE_PREFIX = "# podhealth nccl_runner failure:"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m podhealth.checks.active.nccl_runner",
                                description="all-reduce bandwidth test printing nccl-tests' table format")
    p.add_argument("--nproc", type=int, default=0, help="launcher: ranks to start on this host (0 = one per GPU, 2 on CPU)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    p.add_argument("--min-bytes", type=int, default=1 << 20)
    p.add_argument("--max-bytes", type=int, default=1 << 26)
    p.add_argument("--factor", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds for rendezvous and each collective")
    p.add_argument("--slurm", action="store_true", help="take rank and world size from srun's environment")
    p.add_argument("--master-addr", default="")
    p.add_argument("--master-port", type=int, default=0)
    p.add_argument("--node-addr", default="", help="NAME=ADDR[,NAME=ADDR...]: addresses of Slurm node names")
    p.add_argument("--fault", default="", help="test seam: slow:NODE or fail:NODE")
    p.add_argument("--fault-delay", type=float, default=0.02)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.min_bytes <= 0 or args.max_bytes < args.min_bytes or args.factor < 2:
        print(f"{FAILURE_PREFIX} bad size range", flush=True)
        return 2
    if args.slurm or ("RANK" in os.environ and "WORLD_SIZE" in os.environ):
        return _rank_main(args)
    return _launch(args)


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _launch(args: argparse.Namespace) -> int:
    """Start the ranks on this host, relay rank 0's stdout, and stop them all on timeout."""
    device = args.device if args.device != "auto" else ("cuda" if _cuda_count() else "cpu")
    nproc = args.nproc or (_cuda_count() if device == "cuda" else 2)
    port = args.master_port or _free_port()
    base = [sys.executable, "-m", "podhealth.checks.active.nccl_runner", "--device", device,
            "--min-bytes", str(args.min_bytes), "--max-bytes", str(args.max_bytes), "--factor", str(args.factor),
            "--warmup", str(args.warmup), "--iters", str(args.iters), "--timeout", str(args.timeout)]
    if args.fault:
        base += ["--fault", args.fault, "--fault-delay", str(args.fault_delay)]
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(nproc):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        if device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "1")
        procs.append(subprocess.Popen(base, env=env, stdin=subprocess.DEVNULL,
                                      stdout=None if rank == 0 else subprocess.DEVNULL))
    deadline = time.monotonic() + args.timeout * 2 + 30
    rc = 0
    for p in procs:
        try:
            rc = max(rc, p.wait(max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            print(f"{FAILURE_PREFIX} ranks did not finish within {args.timeout * 2 + 30:g}s", flush=True)
            for q in procs:
                q.kill()
            for q in procs:
                q.wait(5)
            return 1
    return rc


def _expand_first(nodelist: str) -> str:
    from podhealth.hostnames import expand_hostlist

    return expand_hostlist(nodelist)[0]


def _rank_env(args: argparse.Namespace) -> tuple[int, int, int, str, int]:
    """(rank, world, local_rank, master_addr, master_port) from torchrun's or srun's environment."""
    env = os.environ
    if args.slurm:
        rank, world, local = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"]), int(env.get("SLURM_LOCALID", "0"))
        first = _expand_first(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env["SLURM_NODELIST"])
        addrs = dict(kv.split("=", 1) for kv in args.node_addr.split(",") if "=" in kv)
        addr = args.master_addr or addrs.get(first, first)
        # One port per job: concurrent pair tests on shared hosts must not collide.
        port = args.master_port or 20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000
        return rank, world, local, addr, port
    return (int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")),
            args.master_addr or env.get("MASTER_ADDR", "127.0.0.1"),
            args.master_port or int(env.get("MASTER_PORT", "29500")))


def _node_name() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _rank_main(args: argparse.Namespace) -> int:
    rank = -1
    try:
        rank, world, local, addr, port = _rank_env(args)
        kind, _, node = args.fault.partition(":")
        if kind == "fail" and node == _node_name():
            raise RuntimeError(f"injected failure on {node}")
        return _bench(args, rank, world, local, addr, port, slow=(kind == "slow" and node == _node_name()))
    except Exception as e:  # noqa: BLE001 - print a parsable failure line, exit non-zero
        print(f"{FAILURE_PREFIX} rank {rank} on {_node_name()}: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return 1


def _bench(args: argparse.Namespace, rank: int, world: int, local: int, addr: str, port: int, slow: bool) -> int:
    import torch
    import torch.distributed as dist

    device = args.device if args.device != "auto" else ("cuda" if _cuda_count() else "cpu")
    if device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        backend = "nccl"
        # pci_bus_id is absent from older torch builds; the bus only labels the device line.
        bus_id = getattr(torch.cuda.get_device_properties(local), "pci_bus_id", None)
        model, bus = torch.cuda.get_device_name(local), f"0x{bus_id:02x}" if isinstance(bus_id, int) else f"cuda:{local}"
    else:
        torch.set_num_threads(1)
        dev, backend, model, bus = torch.device("cpu"), "gloo", "CPU (gloo)", "cpu"
    timeout = timedelta(seconds=args.timeout)
    dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world, timeout=timeout)
    try:
        info: list[object] = [None] * world
        dist.all_gather_object(info, (rank, os.getpid(), _node_name(), local, bus, model))

        def sync() -> None:
            if device == "cuda":
                torch.cuda.synchronize(dev)

        rows = []
        size = args.min_bytes
        while size <= args.max_bytes:
            count = max(1, size // 4)
            nbytes = count * 4
            inp = torch.zeros(count, dtype=torch.float32, device=dev)
            out = torch.empty_like(inp)
            times = []
            for in_place in (False, True):
                for _ in range(args.warmup):
                    _one(dist, inp, out, in_place)
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    _one(dist, inp, out, in_place)
                    if slow:
                        time.sleep(args.fault_delay)
                sync()
                t = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64, device=dev)
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                times.append(float(t.item()))
            # Validation on known values: every element must be 1 + 2 + ... + world.
            check = torch.full((count,), float(rank + 1), dtype=torch.float32, device=dev)
            dist.all_reduce(check)
            expected = world * (world + 1) / 2
            wrong = torch.tensor([int((check != expected).sum().item())], dtype=torch.int64, device=dev)
            dist.all_reduce(wrong)
            rows.append((nbytes, count, times, int(wrong.item())))
            size *= args.factor
        if rank == 0:
            _print_table(args, world, info, rows, backend, torch.__version__)
    finally:
        dist.destroy_process_group()
    return 0


def _one(dist: object, inp: object, out: object, in_place: bool) -> None:
    if in_place:
        dist.all_reduce(inp)  # type: ignore[attr-defined]
    else:
        out.copy_(inp)  # type: ignore[attr-defined]
        dist.all_reduce(out)  # type: ignore[attr-defined]


def _print_table(args: argparse.Namespace, world: int, info: Sequence[object], rows: list[tuple[int, int, list[float], int]],
                 backend: str, torch_version: str) -> None:
    w = sys.stdout.write
    w(f"# podhealth nccl_runner: torch {torch_version}, backend {backend}, {world} ranks\n")
    w(f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.factor}(factor) "
      f"warmup iters: {args.warmup} iters: {args.iters} agg iters: 1 validation: 1 graph: 0\n#\n# Using devices\n")
    devices: list[tuple[int, int, str, int, str, str]] = sorted(info)  # type: ignore[arg-type]
    for rank, pid, node, local, bus, model in devices:
        w(f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {node:>10s} device {local:2d} [{bus}] {model}\n")
    if backend == "nccl":
        import torch

        v = torch.cuda.nccl.version()
        w(f"NCCL version {'.'.join(map(str, v)) if isinstance(v, tuple) else v}\n")
    w("#\n#                                                              out-of-place                       in-place\n")
    w("#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n")
    w("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n")
    factor = 2 * (world - 1) / world
    busbws: list[float] = []
    wrong_total = 0
    for nbytes, count, (t_oop, t_ip), wrong in rows:
        cells = []
        for t in (t_oop, t_ip):
            algbw = nbytes / t / 1e9 if t > 0 else 0.0
            busbw = algbw * factor
            busbws.append(busbw)
            # nccl-tests prints %7.2f; below 1 GB/s (Gloo on CPU) keep more digits so that
            # comparisons between slow pairs still see a difference.
            cells.append(f"{t * 1e6:9.1f} {_bw(algbw)} {_bw(busbw)} {wrong:6d}")
        wrong_total += wrong
        w(f"{nbytes:12d}  {count:12d}     float     sum      -1 {cells[0]} {cells[1]}\n")
    w(f"# Out of bounds values : {wrong_total} {'OK' if wrong_total == 0 else 'FAILED'}\n")
    w(f"# Avg bus bandwidth    : {sum(busbws) / max(1, len(busbws)):.3f}\n#\n")
    sys.stdout.flush()


def _bw(v: float) -> str:
    return f"{v:7.2f}" if v >= 1 else f"{v:7.5f}"


if __name__ == "__main__":
    sys.exit(main())
