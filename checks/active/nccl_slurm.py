"""Multi-node NCCL: pairwise all-reduce tests through Slurm, localised by checks/active/localize.py.

Each pair is one `srun -N2 -w a,b ...` job (argv, no shell, node names validated before they
reach srun) with a timeout; pairs of one round run concurrently (they are disjoint). Each pair's
output is parsed by checks/active/nccl.py; a pair fails when the run failed, produced wrong values, fell
below the pair gate, or was more than fleet_slow_pct below the median of all pairs so far.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from podhealth import subproc
from podhealth.checks.active import localize, nccl
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.hostnames import validate_node_name
from podhealth.vocab import Action, CheckResult

CHECK = "nccl_pairwise"


@dataclass(frozen=True)
class PairJob:
    srun: str = "srun"
    python: str = ""                  # interpreter on the compute nodes; "" = this one
    ranks_per_node: int = 1           # GPUs per node (1 on CPU)
    device: str = "auto"
    min_bytes: int = 1 << 20
    max_bytes: int = 1 << 30
    iters: int = 20
    warmup: int = 5
    timeout_s: float = 600.0
    partition: str = ""
    node_addr: Mapping[str, str] | None = None   # Slurm node name -> address (from scontrol)
    runner: str = ""                  # all_reduce_perf path; "" = podhealth's runner
    extra_runner_args: tuple[str, ...] = ()      # e.g. the runner's --fault test seam
    env: Mapping[str, str] | None = None


@dataclass(frozen=True)
class PairRun:
    a: str
    b: str
    returncode: int | None
    output: str
    run: nccl.NcclRun


KILL_GRACE_S = 10.0  # after SIGTERM at the timeout (srun cancels the step), before SIGKILL
MAX_OUTPUT = 16 * 1024 * 1024  # an all_reduce_perf sweep prints tens of KiB; a runaway job no more than this


def srun_argv(job: PairJob, a: str, b: str) -> list[str]:
    for n in (a, b):
        validate_node_name(n)
    argv = [job.srun, "-N2", f"--ntasks-per-node={job.ranks_per_node}", "-w", f"{a},{b}",
            "--job-name=podhealth-nccl", f"--time={max(1, int(job.timeout_s // 60) + 1)}", "--kill-on-bad-exit=1"]
    if job.partition:
        argv.append(f"--partition={job.partition}")
    if job.runner:
        argv += [job.runner, "-b", str(job.min_bytes), "-e", str(job.max_bytes), "-f", "2", "-g", "1",
                 "-n", str(job.iters), "-w", str(job.warmup)]
        return argv
    argv += [job.python or sys.executable, "-m", "podhealth.checks.active.nccl_runner", "--slurm", "--device", job.device,
             "--min-bytes", str(job.min_bytes), "--max-bytes", str(job.max_bytes), "--iters", str(job.iters),
             "--warmup", str(job.warmup), "--timeout", str(job.timeout_s)]
    if job.node_addr:
        argv += ["--node-addr", ",".join(f"{k}={v}" for k, v in job.node_addr.items() if k in (a, b))]
    return argv + list(job.extra_runner_args)


def run_pair(job: PairJob, a: str, b: str) -> PairRun:
    argv = srun_argv(job, a, b)
    env = {**os.environ, **(job.env or {})}
    # srun forwards SIGTERM to the step and cancels it; SIGKILL follows after the grace.
    run = subproc.run(argv, job.timeout_s, env=env, cwd=os.getcwd(), term_grace=KILL_GRACE_S, merge_stderr=True,
                      max_output=MAX_OUTPUT)
    if run.error:
        return PairRun(a, b, None, f"cannot start srun: {run.error}", nccl.NcclRun(()))
    text = run.stdout.decode("utf-8", "replace")
    if run.timed_out:
        text += f"\n# pair test timed out after {job.timeout_s:g}s\n"
        return PairRun(a, b, None, text, nccl.parse(text))
    rc = run.exit_code if run.exit_code is not None else -run.signal if run.signal is not None else None
    return PairRun(a, b, rc, text, nccl.parse(text))


def node_addresses(nodes: Sequence[str], scontrol: str = "scontrol", timeout_s: float = 10.0) -> dict[str, str]:
    """NodeAddr of each node from `scontrol show node -o` (names validated); missing ones omitted."""
    out: dict[str, str] = {}
    for n in nodes:
        validate_node_name(n)
    try:
        r = subprocess.run([scontrol, "show", "node", "-o", ",".join(nodes)], capture_output=True,
                           timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in r.stdout.decode("utf-8", "replace").splitlines():
        m = re.search(r"\bNodeName=(\S+)", line)
        a = re.search(r"\bNodeAddr=(\S+)", line)
        if m and a:
            out[m.group(1)] = a.group(1)
    return out


def classify(run: PairRun, gate: float | nccl.Gates, median_gbps: float, slow_pct: float) -> localize.PairResult:
    """Turn one pair's run into pass / fail / unknown for the localiser.

    `gate`: the profile's two-node gate (nccl.multinode_gates: required, so a SKU without one
    makes a completed pair "unknown", never "pass"), or a bare number (0 = median only, CPU runs).
    """
    gates = gate if isinstance(gate, nccl.Gates) else nccl.Gates(gate)
    gate_gbps = gates.busbw_gbps
    r = run.run
    hcas = nccl.hcas_in(run.output)
    large = r.large_busbw()
    if not r.rows:
        why = r.errors[0] if r.errors else _tail(run.output) or "no output"
        if not _ran_at_all(run.output):
            return localize.PairResult(run.a, run.b, "unknown", None, why, hcas)
        if r.started or r.errors or run.returncode is None:    # failed or hung once running
            return localize.PairResult(run.a, run.b, "fail", None, why, hcas)
        return localize.PairResult(run.a, run.b, "unknown", None, why, hcas)
    assert large is not None
    wrong = sum(x.wrong for x in r.rows)
    if wrong or (r.out_of_bounds or 0) > 0:
        return localize.PairResult(run.a, run.b, "fail", large, f"{wrong} wrong values", hcas)
    failed = r.failure_lines     # a completed pair's MPI/HCOLL noise is no failure (nccl.NcclRun)
    if failed or (run.returncode not in (0, None)):
        return localize.PairResult(run.a, run.b, "fail", large, failed[0] if failed else f"exit {run.returncode}", hcas)
    missing = nccl.no_gate_reason(r, gates)
    if not missing and gate_gbps > 0 and large < gate_gbps:
        return localize.PairResult(run.a, run.b, "fail", large, f"busbw {large:.3g} GB/s below the gate {gate_gbps:g}",
                                   hcas, slow_only=True)
    if median_gbps > 0 and large < median_gbps * (1 - slow_pct / 100):
        return localize.PairResult(run.a, run.b, "fail", large,
                                   f"busbw {large:.3g} GB/s is more than {slow_pct:g}% below the pairs' median "
                                   f"{median_gbps:.3g}", hcas, slow_only=True)
    if missing:
        return localize.PairResult(run.a, run.b, "unknown", large, f"busbw {large:.3g} GB/s not judged: {missing}", hcas)
    return localize.PairResult(run.a, run.b, "pass", large, f"busbw {large:.3g} GB/s", hcas)


def _ran_at_all(text: str) -> bool:
    # Slurm's own refusals (unknown node, no allocation) mean the test never ran: UNKNOWN.
    return not re.search(r"srun: error: (Unable to allocate|Invalid node name|Required node not available)", text)


def _tail(text: str, n: int = 200) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1][:n] if lines else ""


@dataclass(frozen=True)
class PairwiseOutcome:
    results: tuple[CheckResult, ...]
    plan: localize.Plan
    pairs: tuple[localize.PairResult, ...]
    median_gbps: float


def run_pairwise(nodes: Sequence[str], job: PairJob, gate_gbps: float | nccl.Gates = 0.0, slow_pct: float = 10.0,
                 known_good: Sequence[str] = (), max_parallel: int = 8,
                 on_pair: Callable[[localize.PairResult], None] | None = None,
                 run: Callable[[PairJob, str, str], PairRun] = run_pair) -> PairwiseOutcome:
    """Localise bad nodes: rounds of disjoint pair tests until the localiser has no more to ask."""
    for n in list(nodes) + list(known_good):
        validate_node_name(n)
    runs: list[PairRun] = []
    pairs: list[localize.PairResult] = []
    p = localize.plan(nodes, pairs, known_good)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, max_parallel)) as ex:
        while p.next_pairs:
            new = list(ex.map(lambda ab: run(job, ab[0], ab[1]), p.next_pairs))
            runs += new
            # Re-judge every pair against the median of all pairs so far: the first round sets it.
            bws = [r.run.large_busbw() for r in runs if r.run.rows]
            median = statistics.median([b for b in bws if b is not None]) if bws else 0.0
            pairs = [classify(r, gate_gbps, median, slow_pct) for r in runs]
            if on_pair:
                for r in pairs[-len(new):]:
                    on_pair(r)
            p = localize.plan(nodes, pairs, known_good)
    bws = [x.busbw_gbps for x in pairs if x.busbw_gbps is not None]
    median = statistics.median(bws) if bws else 0.0
    return PairwiseOutcome(tuple(verdict_results(p, pairs)), p, tuple(pairs), median)


def verdict_results(p: localize.Plan, pairs: Sequence[localize.PairResult]) -> list[CheckResult]:
    out: list[CheckResult] = []
    for v in p.verdicts:
        ev: dict[str, object] = {"reason": v.reason}
        mine = [x for x in pairs if v.node in (x.a, x.b)]
        ev["pairs"] = "; ".join(f"{x.a}-{x.b}:{x.outcome}" + (f"({x.busbw_gbps:.3g})" if x.busbw_gbps else "")
                                for x in mine)
        if v.failed_with:
            ev["failed_with"] = ",".join(v.failed_with)
        if v.hcas:
            ev["hcas"] = ",".join(v.hcas)
        why = next((x.reason for x in mine if x.outcome == "fail"), "")
        if v.state is localize.NodeState.BAD:
            hca = f" (HCA {', '.join(v.hcas)})" if v.hcas else ""
            if v.slow_only:
                out.append(warn(CHECK, v.node, f"slow in pair tests against known-good nodes{hca}: {why}",
                                Action.DRAIN, **ev))
            else:
                out.append(fail(CHECK, v.node, f"fails pair tests against known-good nodes{hca}: {why}",
                                Action.DRAIN, **ev))
        elif v.state is localize.NodeState.GOOD:
            out.append(ok(CHECK, v.node, "passed a pair test", **ev))
        else:
            # A pair that ran but could not be judged (no gate for the SKU) says why itself.
            unjudged = next((x.reason for x in mine if x.outcome == "unknown" and x.busbw_gbps is not None), "")
            out.append(unknown(CHECK, v.node, f"{v.reason}: {unjudged}" if unjudged else v.reason, **ev))
    for a, b in p.bad_links:
        out.append(warn(CHECK, f"link:{a}-{b}", f"{a} and {b} pass with others but fail together: a bad link or rail",
                        Action.NONE, **{"pairs": "; ".join(f"{x.reason}" for x in pairs
                                                           if {x.a, x.b} == {a, b})}))
    return out
