"""Slurm's own hooks: HealthCheckProgram, Prolog and Epilog entry points (console scripts).

slurmd runs each of them as root, with no arguments and a small environment of its own
(slurm.conf(5), prolog_epilog.shtml): the node is $SLURMD_NODENAME (several slurmd can share a
host), the job is $SLURM_JOB_ID and its GPUs $SLURM_JOB_GPUS (or $CUDA_VISIBLE_DEVICES, which
in Prolog/Epilog holds the same host device indices). The configuration comes from
$PODHEALTH_CONFIG, else /etc/podhealth/podhealth.yaml, else the defaults.

- `podhealth-slurm-healthcheck` (HealthCheckProgram): the node's verdict from its agent; Slurm
  acts on nothing by itself, so the program drains (and resumes its own drains) when
  `checks.slurm_drain` says so (auto: only when no aggregator is configured, which otherwise
  owns drain and resume). slurmd kills it after 60 s; it answers within a few seconds.
- `podhealth-slurm-prolog`: passive checks on the job's own GPUs (and the node-wide ones)
  within `checks.prolog_budget`. A FAIL drains the node with podhealth's reason and exits 1:
  Slurm then requeues the job (held) and keeps the node drained. UNKNOWN lets the job run.
- `podhealth-slurm-epilog`: the same judgement after the job; a GPU the job broke drains the
  node before the next job lands there. It exits 0 once its own drain is in place (Slurm's
  generic "Epilog error" would replace the reason) and 1 when it could not drain.

The prolog also records the job's GPUs (SLURM_JOB_ID, SLURM_JOB_USER, SLURM_JOB_GPUS) in
collectors.jobs.state_dir for the agent's `jobs` collector, and the epilog removes the record.

Only GPU results for GPUs outside the job are dropped: another job's broken GPU must not fail
this one, but a lost InfiniBand port or NFS mount hurts every job on the node.
"""

from __future__ import annotations

import os
import re
import socket
import sys
import time
from typing import Callable, Iterable, Sequence

from podhealth.checks.handover.report import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from podhealth.exitcodes import EXIT_USAGE
from podhealth.checks.cli.slurm_health import agent_key, agent_report, line, local_base, local_tls
from podhealth.config import Config
from podhealth.vocab import CheckResult, NodeReport, Status

_GPU_ENTITY = re.compile(r"gpu(\d+)$")


def load_config(env: "os._Environ[str] | dict[str, str]") -> Config:
    """$PODHEALTH_CONFIG, else the agent's default file, else the defaults (core/cliconfig.py)."""
    from podhealth import cliconfig

    return cliconfig.load(cliconfig.locate(None, env=env))


def node_name(cfg: Config, env: "os._Environ[str] | dict[str, str]") -> str:
    return env.get("SLURMD_NODENAME") or cfg.node.name or socket.gethostname().split(".")[0]


def agent_base(cfg: Config, node: str) -> str:
    """This node's agent: `checks.agents` names it (several simulated nodes on one host), else
    the agent on loopback at its configured port."""
    return (cfg.checks.agents.get(node) or local_base(cfg)).rstrip("/")


def job_gpus(env: "os._Environ[str] | dict[str, str]", node_gpus: int = 0) -> frozenset[int] | None:
    """The job's GPU indices, or None when the job has no index list (none, or UUIDs: then every
    GPU counts). Raises job_records.GpuListOutOfBounds for a list beyond the node (`node_gpus`,
    its profile's GPU count; 0: unknown, then job_records.MAX_GPUS): `0-99999999` once grew the
    prolog to 13 GiB (issue 27). The caller leaves the job undecided."""
    from podhealth.collectors import job_records

    raw = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    try:
        return frozenset(job_records.parse_gpu_list(raw, node_gpus)) or None
    except job_records.GpuListOutOfBounds:
        raise
    except ValueError:
        return None


def for_job(results: Iterable[CheckResult], gpus: frozenset[int] | None) -> list[CheckResult]:
    if gpus is None:
        return list(results)
    keep = []
    for r in results:
        m = _GPU_ENTITY.match(r.entity)
        if m is None or int(m.group(1)) in gpus:
            keep.append(r)
    return keep


def should_drain(cfg: Config) -> bool:
    mode = cfg.checks.slurm_drain
    return mode == "always" or (mode == "auto" and not cfg.publish.urls())


def _judge(results: Sequence[CheckResult]) -> tuple[list[CheckResult], list[CheckResult]]:
    fails = [r for r in results if r.status is Status.FAIL]
    unknowns = [r for r in results if r.status is Status.UNKNOWN]
    return fails, unknowns


def _report(cfg: Config, node: str, budget: float) -> NodeReport:
    """The agent's verdict; when no agent answers, the fast passive sources collected here."""
    t0 = time.monotonic()
    rep = agent_report(agent_base(cfg, node), node, agent_key(cfg, node), timeout=min(2.0, budget / 2),
                       tls=local_tls(cfg))
    if rep is not None:
        return rep
    from podhealth.checks.cli.slurm_health import local_report

    return local_report(cfg, node, cap=max(0.5, budget - (time.monotonic() - t0) - 0.5))


def _drain(node: str, failing: CheckResult | None) -> str:
    from podhealth.checks.cli.selfdrain import drain_or_resume

    return drain_or_resume(node, failing)


def healthcheck(env: "os._Environ[str] | dict[str, str]") -> int:
    from podhealth.checks.cli.slurm_health import answer

    cfg = load_config(env)
    node = node_name(cfg, env)
    return answer(node, _report(cfg, node, cfg.checks.healthcheck_budget), should_drain(cfg))


def record_job(cfg: Config, env: "os._Environ[str] | dict[str, str]", hook: str) -> str:
    """The prolog records which GPUs the job holds (collectors.jobs.state_dir, read by the agent's
    `jobs` collector). Returns a line for stderr when it could not: knowing the job is worth a
    log line, never a failed job or a drained node."""
    from podhealth.collectors import job_records

    job = env.get("SLURM_JOB_ID", "")
    if not job_records.valid_job_id(job):
        return f"podhealth {hook}: no usable SLURM_JOB_ID ({job[:40]!r}): job not recorded"
    state_dir = cfg.collectors.jobs.state_dir
    try:
        # SLURM_JOB_GPUS holds the host's GPU indices in the prolog (so does CUDA_VISIBLE_DEVICES
        # there, unlike inside the job): prolog_epilog.shtml. A job without GPUs holds none.
        gpus = job_records.parse_gpu_list(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or "")
        if not gpus:
            return ""
        user = env.get("SLURM_JOB_USER", "")
        job_records.write_record(state_dir, job_records.JobRecord(
            "slurm", job, gpus, user if job_records.valid_user(user) else ""))
        return ""
    except (OSError, ValueError) as e:
        return f"podhealth {hook}: job {job} not recorded in {state_dir}: {e}"


def forget_job(cfg: Config, env: "os._Environ[str] | dict[str, str]", hook: str) -> str:
    """Remove the job's record (the epilog; a prolog that failed the job). "" or a stderr line."""
    from podhealth.collectors import job_records

    job = env.get("SLURM_JOB_ID", "")
    if not job_records.valid_job_id(job):
        return ""
    try:
        job_records.remove_record(cfg.collectors.jobs.state_dir, "slurm", job)
        return ""
    except OSError as e:
        return f"podhealth {hook}: job {job}'s record not removed: {e}"


def _job_hook(env: "os._Environ[str] | dict[str, str]", hook: str) -> int:
    cfg = load_config(env)
    node = node_name(cfg, env)
    job = env.get("SLURM_JOB_ID", "?")
    from podhealth.collectors.job_records import GpuListOutOfBounds

    try:
        gpus = job_gpus(env, _profile_gpus(cfg))
    except GpuListOutOfBounds as e:
        # Not a list any node has: judging "the job's GPUs" would judge nothing real. The job runs
        # (a prolog's non-zero exit drains the node) and the error is logged for the admin.
        print(f"podhealth {hook}: job {job} on {node}: undecided: SLURM_JOB_GPUS/CUDA_VISIBLE_DEVICES: {e}",
              file=sys.stderr)
        return EXIT_PASS
    # The epilog: the job is over whatever the verdict, its GPUs are free. The prolog records the
    # job before judging, so a job that runs because podhealth could not judge is known too.
    _note(record_job(cfg, env, hook) if hook == "prolog" else forget_job(cfg, env, hook))
    rep = _report(cfg, node, cfg.checks.prolog_budget)
    results = for_job(rep.results, gpus)
    fails, unknowns = _judge(results)
    scope = "all GPUs" if gpus is None else "GPUs " + ",".join(map(str, sorted(gpus)))
    for r in unknowns:
        print(f"podhealth {hook}: job {job} on {node}: undecided: {line(r)}", file=sys.stderr)
    if not fails:
        return EXIT_PASS
    if hook == "prolog":  # the job will not run here: it holds no GPUs
        _note(forget_job(cfg, env, hook))
    for r in fails:
        print(f"podhealth {hook}: job {job} on {node} ({scope}): {line(r)}", file=sys.stderr)
    msg = _drain(node, fails[0])
    if msg:
        print(msg, file=sys.stderr)
    # The node is drained (by us now, earlier, or by someone else) unless the drain itself
    # failed; then a non-zero epilog makes Slurm drain it ("Epilog error").
    drained = "failed" not in msg and "cannot read" not in msg
    if hook == "epilog" and drained:
        return EXIT_PASS
    return EXIT_FAIL


def _profile_gpus(cfg: Config) -> int:
    """GPUs the node's hardware profile has (8 on a DGX H100); 0 when it does not say. A GPU that
    fell off the bus is still counted here: the job's index to it is judged (gpu_count FAILs)."""
    from podhealth.checks import profiles
    from podhealth.configload import ConfigError

    try:
        return max(0, int(profiles.of_config(cfg).gpu_count))
    except (ConfigError, OSError, ValueError):  # ProfileError is a ValueError
        return 0  # the verdict will say what is wrong with the profile; the bound stays MAX_GPUS


def _note(msg: str) -> None:
    if msg:
        print(msg, file=sys.stderr)


Hook = Callable[["os._Environ[str] | dict[str, str]"], int]


USAGE = {
    "healthcheck": "Slurm HealthCheckProgram: reads this node's verdict from its agent (proven with the node's agent\n"
                   "key) and, when checks.slurm_drain says so, drains the node or resumes podhealth's own drain.",
    "prolog": "Slurm Prolog: passive checks on the job's GPUs ($SLURM_JOB_GPUS) within checks.prolog_budget; a FAIL\n"
              "drains the node and exits 1 (Slurm requeues the job).",
    "epilog": "Slurm Epilog: the same judgement after the job; a GPU the job broke drains the node.",
}


def _arguments(hook: str, argv: Sequence[str]) -> int | None:
    """slurmd passes no arguments. -h/--help and --version print and exit 0; anything else is a
    usage error (64). Either way nothing is judged and nothing drained: a person typing
    `podhealth-slurm-healthcheck --help` on a node must not drain it. None: go ahead."""
    if not argv:
        return None
    if list(argv) in (["-h"], ["--help"]):
        print(f"usage: podhealth-slurm-{hook}\n\n{USAGE[hook]}\n\nslurmd runs it as root with no arguments; the "
              "config is $PODHEALTH_CONFIG, else /etc/podhealth/podhealth.yaml.\nExit codes: 0 pass, 1 fail, "
              "2 could not decide (healthcheck), 64 usage.")
        return EXIT_PASS
    if list(argv) == ["--version"]:
        from podhealth import __version__

        print(f"podhealth-slurm-{hook} {__version__}")
        return EXIT_PASS
    print(f"podhealth-slurm-{hook}: unexpected argument {argv[0]!r}: slurmd passes none; nothing was judged "
          f"or changed (see --help)", file=sys.stderr)
    return EXIT_USAGE


def _entry(hook: str, fn: Hook, on_error: int, argv: Sequence[str] | None = None) -> int:
    usage = _arguments(hook, sys.argv[1:] if argv is None else argv)
    if usage is not None:
        return usage
    try:
        return int(fn(os.environ))
    except Exception as e:  # noqa: BLE001 - slurmd only logs our exit code and stderr
        print(f"podhealth: could not judge this node: {type(e).__name__}: {e}", file=sys.stderr)
        return on_error


def healthcheck_main(argv: Sequence[str] | None = None) -> int:
    return _entry("healthcheck", healthcheck, EXIT_UNKNOWN, argv)


# A prolog or epilog that exits non-zero drains the node: our own failure to judge must not.
def prolog_main(argv: Sequence[str] | None = None) -> int:
    return _entry("prolog", lambda env: _job_hook(env, "prolog"), EXIT_PASS, argv)


def epilog_main(argv: Sequence[str] | None = None) -> int:
    return _entry("epilog", lambda env: _job_hook(env, "epilog"), EXIT_PASS, argv)
