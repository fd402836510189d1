"""Which Slurm jobs run on a node, and on which of its GPUs: pure parsers of `squeue` and
`scontrol -d show job`.

`squeue -h -w NODE -o '%i|%T|%u|%P|%j'` names the jobs on the node (the name last: it may hold
`|`). The GPUs are only in the detailed job record, one line per node (or per group of nodes
with the same allocation, as a hostlist), in the forms Slurm has printed over the years:

    Nodes=node-06 CPU_IDs=10-11,15,21 Mem=81920 GRES_IDX=gpu(IDX:0,2-3,5)      (17.x)
    Nodes=cortex-08 CPU_IDs=20 Mem=8192 GRES=gpu(IDX:5)                         (19.x)
    Nodes=gpu01 CPU_IDs=0-5 Mem=0 GRES=gpu:1(IDX:0)                             (20.x+)
    Nodes=node-001 CPU_IDs=2-3 Mem=1024 GRES=gpu:rtx2080:1(IDX:1),gg:g0(CNT:1)  (typed, 23.x+)

A record without detail lines (PENDING) or with an empty GRES has no GPUs. Slurm itself cuts a
long CPU_IDs list (`...,112,115- Mem=70000`): the fields are found by name, not by position.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from podhealth.hostnames import expand_hostlist

_DETAIL = re.compile(r"^\s+Nodes=(\S+)\s")
_GRES_FIELD = re.compile(r"\s(?:GRES_IDX|GRES)=(\S*)")
# One GRES entry of a detail line: name[:type][:count](IDX:list) or (CNT:n).
_GPU_IDX = re.compile(r"(?:^|,)gpu(?::[^:(,]+)*\(IDX:([^)]*)\)")
_USER = re.compile(r"^([^()]+)(?:\(\d+\))?$")


@dataclass(frozen=True)
class SlurmJob:
    job_id: str
    state: str = ""
    user: str = ""
    partition: str = ""
    name: str = ""
    # node -> the GPU indices (GRES IDX) the job holds there; a node with none is absent
    gpus: dict[str, tuple[int, ...]] = field(default_factory=dict)
    nodes: tuple[str, ...] = ()


def parse_indices(text: str) -> tuple[int, ...]:
    """`0,2-3,5` -> (0, 2, 3, 5); `N/A` or garbage -> ()."""
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            return ()
        a, b = int(lo), int(hi or lo)
        if b < a or b - a > 1024:
            return ()
        out.extend(range(a, b + 1))
    return tuple(dict.fromkeys(out))


def gpu_indices(gres: str) -> tuple[int, ...]:
    """The GPU indices in a detail line's GRES value (`gg:g0(CNT:1),gpu:1(IDX:3)` -> (3,))."""
    out: list[int] = []
    for m in _GPU_IDX.finditer(gres):
        out.extend(parse_indices(m.group(1)))
    return tuple(dict.fromkeys(out))


def _field(text: str, key: str) -> str:
    m = re.search(rf"(?:^|\s){re.escape(key)}=(\S*)", text)
    return m.group(1) if m else ""


def parse_show_job(text: str) -> list[SlurmJob]:
    """Every record of `scontrol -d show job [ID]` output. Pure; a truncated record yields what it names."""
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("JobId="):
            records.append([line])
        elif records:
            records[-1].append(line)
    out: list[SlurmJob] = []
    for rec in records:
        head = rec[0]
        job_id = _field(head, "JobId")
        if not job_id:
            continue
        name = head.split("JobName=", 1)[1].strip() if "JobName=" in head else ""
        body = "\n".join(rec)
        user_m = _USER.match(_field(body, "UserId"))
        gpus: dict[str, tuple[int, ...]] = {}
        nodes: list[str] = []
        for line in rec[1:]:
            m = _DETAIL.match(line)
            if m is None:
                continue
            try:
                names = expand_hostlist(m.group(1))
            except ValueError:
                continue  # a name Slurm would not print; skip the line rather than guess
            g = _GRES_FIELD.search(line)
            idx = gpu_indices(g.group(1)) if g else ()
            for n in names:
                nodes.append(n)
                if idx:
                    gpus[n] = idx
        out.append(SlurmJob(job_id=job_id, state=_field(body, "JobState"), user=user_m.group(1) if user_m else "",
                            partition=_field(body, "Partition"), name=name, gpus=gpus,
                            nodes=tuple(dict.fromkeys(nodes))))
    return out


SQUEUE_FORMAT = "%i|%T|%u|%P|%j"


def parse_squeue(text: str) -> list[SlurmJob]:
    """`squeue -h -o '%i|%T|%u|%P|%j'` lines -> jobs (no GPUs: those come from parse_show_job)."""
    out: list[SlurmJob] = []
    for line in text.splitlines():
        parts = line.strip().split("|", 4)
        if len(parts) != 5 or not parts[0]:
            continue
        out.append(SlurmJob(job_id=parts[0], state=parts[1], user=parts[2], partition=parts[3], name=parts[4]))
    return out
