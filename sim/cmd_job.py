"""`podhealth simulate job start|stop|list NODE`: put a job on a simulated node's GPUs.

    podhealth simulate job start dgx01 --gpus 0,1 --id 42 --user alice
    podhealth simulate job start dgx01 --gpus 3 --id train-0 --namespace ml --pod train-0   (a GPU pod)
    podhealth simulate job stop dgx01 --id 42
    podhealth simulate job list dgx01

It writes the same record `podhealth-slurm-prolog` writes (collectors/job_records.py) into the
node's job state directory: `<node dir>/run/podhealth/jobs`, which `podhealth agent --simulate`
reads when collectors.jobs.state_dir is left at its default, or `--state-dir` (the directory a
real prolog and agent share). `stop` removes it, as the epilog does.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def state_dir_of(node_dir: Path) -> Path:
    """Where a simulated node's job records live (sim/agentnode.py points the agent there)."""
    return node_dir / "run" / "podhealth" / "jobs"


def _dir(args: argparse.Namespace) -> Path:
    from podhealth.sim.cmd import _open

    node = _open(args)  # a node that does not exist is bad input, whatever --state-dir says
    return Path(args.state_dir) if args.state_dir else state_dir_of(node.dir)


def _cmd_start(args: argparse.Namespace) -> int:
    from podhealth.collectors import job_records
    from podhealth.sim.cmd import _BadInput, _open

    node = _open(args)
    try:
        gpus = job_records.parse_gpu_list(args.gpus)
    except ValueError as e:
        raise _BadInput(f"--gpus: {e}") from None
    if not gpus:
        raise _BadInput("--gpus: name at least one GPU index")
    missing = [g for g in gpus if g >= len(node.state.gpus)]
    if missing:
        raise _BadInput(f"node {node.name} has no GPU {missing[0]} ({len(node.state.gpus)} GPUs)")
    if not job_records.valid_job_id(args.id):
        raise _BadInput(f"--id {args.id!r}: expected a job id (letters, digits, _ . + -)")
    if not job_records.valid_user(args.user):
        raise _BadInput(f"--user {args.user!r}: expected a user name")
    if bool(args.namespace) != bool(args.pod):
        raise _BadInput("--namespace and --pod go together (a Kubernetes pod)")
    sched = "kubernetes" if args.pod else "slurm"
    rec = job_records.JobRecord(sched, args.id, gpus, args.user, args.namespace, args.pod)  # type: ignore[arg-type]
    path = job_records.write_record(_dir(args), rec)
    print(f"{rec.label} on {node.name} GPU {','.join(map(str, gpus))} ({path})")
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from podhealth.collectors import job_records
    from podhealth.sim.cmd import _BadInput

    if not job_records.valid_job_id(args.id):
        raise _BadInput(f"--id {args.id!r}: expected a job id")
    d = _dir(args)
    gone = [s for s in job_records.SCHEDULERS if job_records.remove_record(d, s, args.id)]
    if not gone:
        raise _BadInput(f"no job {args.id} on {args.node}")
    print(f"job {args.id} ended on {args.node}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from podhealth.collectors import job_records

    recs, errors = job_records.read_records(_dir(args))
    print(json.dumps({"jobs": [r.to_json() for r in recs], "errors": errors}, indent=2))
    return 0


def add_subcommand(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("job", help="put a job on a simulated node's GPUs (as the Slurm prolog records it)")
    jobs = p.add_subparsers(dest="job_command", required=True)
    node_args = argparse.ArgumentParser(add_help=False)
    node_args.add_argument("node")
    node_args.add_argument("--state-dir", default="",
                           help="job record directory (default: the simulated node's run/podhealth/jobs)")
    s = jobs.add_parser("start", parents=[common, node_args], help="a job starts on GPUs")
    s.add_argument("--gpus", required=True, help="GPU indices: 0,1 or 0-3")
    s.add_argument("--id", required=True, help="the job id (Slurm job id, or a pod's name)")
    s.add_argument("--user", default="", help="the job's user")
    s.add_argument("--namespace", default="", help="a Kubernetes pod's namespace (with --pod)")
    s.add_argument("--pod", default="", help="a Kubernetes pod's name (with --namespace)")
    s.set_defaults(sim_func=_cmd_start)
    t = jobs.add_parser("stop", parents=[common, node_args], help="a job ends")
    t.add_argument("--id", required=True)
    t.set_defaults(sim_func=_cmd_stop)
    ls = jobs.add_parser("list", parents=[common, node_args], help="the jobs on a node, as JSON")
    ls.set_defaults(sim_func=_cmd_list)
