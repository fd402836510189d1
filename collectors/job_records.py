"""Job records: which job holds which GPUs on this node, one small JSON file per job.

Slurm's prolog (`podhealth-slurm-prolog`) writes `<state_dir>/slurm-<job id>.json` once the job
may start, and the epilog removes it; `podhealth simulate job start` writes the same files. The
agent's `jobs` collector reads the directory. The format is podhealth's own:

    {"scheduler": "slurm", "job_id": "1234", "user": "alice", "gpus": [0, 1], "since": 1767000000.0}

Writes are atomic (a dot-named temporary file in the same directory, fsynced, then renamed), so a
reader sees a whole record or none. The state directory lives on /run (tmpfs) by default: a
reboot ends every job, and takes their records with it.

Pure parsing (`parse_record`) is separate from the few I/O helpers, which take the directory.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Literal

from podhealth.atomicfile import write_atomic

Scheduler = Literal["slurm", "kubernetes"]
SCHEDULERS: tuple[str, ...] = ("slurm", "kubernetes")
# Slurm job ids are numbers ("1234"); array and het-job forms ("1234_7", "1234+1") are allowed so
# a site's wrapper can record them. Anything else could not be a file name or a label safely.
_JOB_ID = re.compile(r"^[0-9A-Za-z][0-9A-Za-z_.+-]{0,63}$")
# POSIX portable user names plus what LDAP/AD sites use (dots, @ for realm names).
_USER = re.compile(r"^[A-Za-z0-9_.@-][A-Za-z0-9_.@$-]{0,63}$")
MAX_GPUS = 64  # GPU indices on one node: 8 on a DGX, 4 on a GB200 compute tray; a bound, not a guess
MAX_GPU_LIST = 1024  # characters of an index list ("0-7" is three)
MAX_RECORD_BYTES = 4096
MAX_RECORDS = 256  # more than any node runs at once; a runaway writer must not flood the labels


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job (or pod) and the GPU indices it holds on this node."""

    scheduler: Scheduler
    job_id: str
    gpus: tuple[int, ...]
    user: str = ""
    namespace: str = ""  # Kubernetes only
    pod: str = ""        # Kubernetes only
    since: float = 0.0

    def to_json(self) -> dict[str, object]:
        d: dict[str, object] = {"scheduler": self.scheduler, "job_id": self.job_id, "user": self.user,
                                "gpus": list(self.gpus), "since": self.since}
        if self.namespace:
            d["namespace"] = self.namespace
        if self.pod:
            d["pod"] = self.pod
        return d

    @property
    def label(self) -> str:
        """How an operator names it in one line: "slurm job 1234 (alice)", "pod ns/name"."""
        if self.scheduler == "kubernetes":
            return f"pod {self.namespace}/{self.pod}" if self.pod else f"pod {self.job_id}"
        return f"slurm job {self.job_id}" + (f" ({self.user})" if self.user else "")


def valid_job_id(text: str) -> bool:
    return bool(_JOB_ID.match(text))


def valid_user(text: str) -> bool:
    return text == "" or bool(_USER.match(text))


class GpuListOutOfBounds(ValueError):
    """An index list beyond any node (`SLURM_JOB_GPUS=0-99999999`): it cannot be the job's GPUs."""


def parse_gpu_list(raw: str, gpus: int = MAX_GPUS) -> tuple[int, ...]:
    """"0,1,4-5" (Slurm's SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES in the prolog) -> (0, 1, 4, 5).
    Raises GpuListOutOfBounds for an index or a list the node cannot have (an index of `gpus`,
    the node's GPU count, or more; never beyond MAX_GPUS; a list longer than MAX_GPU_LIST
    characters): expanding what the environment claims must cost no more than a real node's
    list. ValueError on anything else (a GPU UUID, "NoDevFiles", a reversed range)."""
    gpus = min(gpus, MAX_GPUS) if gpus > 0 else MAX_GPUS
    if len(raw) > MAX_GPU_LIST:
        raise GpuListOutOfBounds(f"GPU list of {len(raw)} characters (at most {MAX_GPU_LIST})")
    out: set[int] = set()
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        lo_s, sep, hi_s = part.partition("-")
        if not lo_s.isdigit() or (sep and not hi_s.isdigit()):
            raise ValueError(f"not a GPU index list: {raw[:80]!r}")
        if len(lo_s) > 6 or len(hi_s) > 6:  # int() of a huge digit string is itself slow
            raise GpuListOutOfBounds(f"GPU index out of bounds (0 to {gpus - 1}): {part[:40]!r}")
        lo, hi = int(lo_s), int(hi_s) if sep else int(lo_s)
        if hi >= gpus:
            raise GpuListOutOfBounds(f"GPU index out of bounds (0 to {gpus - 1}): {part[:40]!r}")
        if hi < lo:
            raise ValueError(f"reversed GPU range: {part!r}")
        out.update(range(lo, hi + 1))
    return tuple(sorted(out))


def parse_record(text: str) -> JobRecord:
    """A record file's text -> JobRecord; ValueError naming what is wrong."""
    try:
        d = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON: {e.msg}") from None
    if not isinstance(d, dict):
        raise ValueError("expected a JSON object")
    sched = d.get("scheduler")
    if sched not in SCHEDULERS:
        raise ValueError(f"scheduler: expected one of {', '.join(SCHEDULERS)}")
    job_id = d.get("job_id")
    if not isinstance(job_id, str) or not valid_job_id(job_id):
        raise ValueError("job_id: expected a job id")
    user = d.get("user", "")
    if not isinstance(user, str) or not valid_user(user):
        raise ValueError("user: expected a user name")
    gpus = d.get("gpus")
    if (not isinstance(gpus, list) or len(gpus) > MAX_GPUS
            or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < MAX_GPUS for g in gpus)):
        raise ValueError("gpus: expected a list of GPU indices")
    since = d.get("since", 0.0)
    if isinstance(since, bool) or not isinstance(since, (int, float)):
        raise ValueError("since: expected a number")
    ns, pod = d.get("namespace", ""), d.get("pod", "")
    if not isinstance(ns, str) or not isinstance(pod, str) or len(ns) > 253 or len(pod) > 253:
        raise ValueError("namespace/pod: expected short strings")
    return JobRecord(sched, job_id, tuple(sorted(set(gpus))), user, ns, pod, float(since))  # type: ignore[arg-type]


def record_path(state_dir: Path, scheduler: str, job_id: str) -> Path:
    if not valid_job_id(job_id):
        raise ValueError(f"invalid job id {job_id!r}")
    return state_dir / f"{scheduler}-{job_id}.json"


def write_record(state_dir: Path, rec: JobRecord) -> Path:
    """Write (or replace) the job's record atomically; creates the directory (0755: the agent
    may run as another user than slurmd's root prolog)."""
    path = record_path(state_dir, rec.scheduler, rec.job_id)
    state_dir.mkdir(mode=0o755, parents=True, exist_ok=True)
    body = json.dumps(rec.to_json() if rec.since else {**rec.to_json(), "since": time.time()}).encode()
    write_atomic(path, body)
    return path


def remove_record(state_dir: Path, scheduler: str, job_id: str) -> bool:
    """Remove the job's record; False when there was none."""
    try:
        os.unlink(record_path(state_dir, scheduler, job_id))
        return True
    except FileNotFoundError:
        return False


def read_records(state_dir: Path) -> tuple[list[JobRecord], list[str]]:
    """Every record in the directory, and one error line per file that could not be used.

    A missing directory is no records (no prolog has run). An unreadable directory raises the
    OSError: the caller decides whether that is "unknown" (it is, for the jobs collector)."""
    try:
        names = sorted(n for n in os.listdir(state_dir) if n.endswith(".json") and not n.startswith("."))
    except FileNotFoundError:
        return [], []
    out: list[JobRecord] = []
    errors: list[str] = []
    for name in names[:MAX_RECORDS]:
        path = state_dir / name
        try:
            with open(path, "rb") as f:
                text = f.read(MAX_RECORD_BYTES + 1)
        except FileNotFoundError:
            continue  # the epilog removed it between listdir and open
        if len(text) > MAX_RECORD_BYTES:
            errors.append(f"{path}: larger than {MAX_RECORD_BYTES} bytes")
            continue
        try:
            out.append(parse_record(text.decode("utf-8", "replace")))
        except ValueError as e:
            errors.append(f"{path}: {e}")
    if len(names) > MAX_RECORDS:
        errors.append(f"{state_dir}: {len(names)} records, only the first {MAX_RECORDS} read")
    return out, errors


def by_gpu(records: Iterable[JobRecord]) -> dict[int, list[JobRecord]]:
    """GPU index -> the jobs on it (usually one; shared GPUs, MPS and sharding give several)."""
    out: dict[int, list[JobRecord]] = {}
    for r in records:
        for g in r.gpus:
            out.setdefault(g, []).append(r)
    return out
