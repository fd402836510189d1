"""Which GPUs a Kubernetes pod holds, and the results that concern them: `podhealth check --gpus`.

The NVIDIA container runtime tells a container its GPUs in $NVIDIA_VISIBLE_DEVICES: indices
("0,3"), UUIDs ("GPU-9a4a...,GPU-fad7..."; the device plugin's default), MIG UUIDs, "all", or
"none"/"void" (no GPU). A preflight judges the node for this pod only, as the Slurm prolog judges
a job's GPUs (checks/cli/slurm_hooks.py for_job): another pod's broken GPU must not fail this one,
but a lost InfiniBand port or NFS mount hurts every pod on the node, so node-wide results stay.

A UUID is matched through the `uuid` evidence the GPU checks carry; a UUID that no result names
cannot be placed, and then every GPU counts (said in a note): judging too much fails a pod that
might have run, judging too little starts a job on a broken GPU.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

from podhealth.collectors.job_records import GpuListOutOfBounds, parse_gpu_list
from podhealth.vocab import CheckResult

_GPU_ENTITY = re.compile(r"gpu(\d+)$")
MAX_UUIDS = 1024


@dataclass(frozen=True)
class PodGpus:
    indices: frozenset[int]
    uuids: frozenset[str]

    def describe(self) -> str:
        shown = [str(i) for i in sorted(self.indices)] + sorted(self.uuids)
        return ",".join(shown) if shown else "none (node-wide checks only)"


def parse(text: str) -> PodGpus | None:
    """None for every GPU ("all", or nothing given); ValueError for a list that is neither indices
    nor GPU/MIG UUIDs (it names what it got)."""
    raw = text.strip()
    if raw.lower() in ("", "all"):
        return None
    if raw.lower() in ("none", "void"):
        return PodGpus(frozenset(), frozenset())
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    uuids = {p for p in parts if p.startswith(("GPU-", "MIG-"))}
    if len(uuids) > MAX_UUIDS:
        raise ValueError(f"{len(uuids)} GPU UUIDs (at most {MAX_UUIDS})")
    rest = ",".join(p for p in parts if p not in uuids)
    try:
        indices = parse_gpu_list(rest) if rest else ()
    except (GpuListOutOfBounds, ValueError) as e:
        raise ValueError(f"--gpus: expected GPU indices or UUIDs ($NVIDIA_VISIBLE_DEVICES), got {raw[:80]!r}: {e}") from None
    return PodGpus(frozenset(indices), frozenset(uuids))


def for_pod(results: Iterable[CheckResult], gpus: PodGpus | None) -> tuple[list[CheckResult], str]:
    """(the results that concern the pod, a note: "" or why every GPU was kept)."""
    results = list(results)
    if gpus is None:
        return results, ""
    by_uuid: dict[str, int] = {}
    for r in results:
        m = _GPU_ENTITY.match(r.entity)
        uuid = dict(r.evidence).get("uuid")
        if m and isinstance(uuid, str) and uuid:
            by_uuid[uuid] = int(m.group(1))
    # a MIG UUID names a slice, not its GPU: the GPU checks cannot place it
    unplaced = sorted(u for u in gpus.uuids if u not in by_uuid)
    if unplaced:
        return results, (f"GPU {unplaced[0]} is not named by any result here: every GPU was judged "
                         "(a UUID the agent does not report, or a MIG slice)")
    mine = set(gpus.indices) | {by_uuid[u] for u in gpus.uuids}
    keep = [r for r in results if (m := _GPU_ENTITY.match(r.entity)) is None or int(m.group(1)) in mine]
    return keep, ""
