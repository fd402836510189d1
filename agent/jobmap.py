"""The agent's view of which job holds each GPU, from the `jobs` collector's latest samples.

It puts the job where an operator reads about a GPU:
- `/health` and published transitions/reports: a GPU result's evidence gains `job` ("slurm job
  1234 (alice)", "pod ml/train-0"), so the aggregator's fence reason, the UI and the events it
  stores name the job a failing GPU hurts;
- published XID events: `job` on an event for a GPU (Event.job);
- optionally dcgm-exporter's HPC job-mapping files (collectors.jobs.dcgm_job_mapping_dir): one
  file per GPU named by its index, one job id per line (dcgm-exporter's hpcMapper reads every
  file whose name is an integer and adds `hpc_job` to that GPU's series). Files are written
  atomically (a dot-named temporary, which the exporter skips as not an integer, then rename)
  and a GPU's file is removed when its job ends.

When the jobs collector is stale or could not read a source, nothing is claimed: the evidence
says nothing rather than naming a job that may have ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from podhealth import log
from podhealth.agent.plugin import Plugin
from podhealth.atomicfile import write_atomic
from podhealth.collectors.job_records import JobRecord
from podhealth.collectors.jobs import records_from_samples
from podhealth.snapshot import Snapshot
from podhealth.vocab import MAX_EVIDENCE_ITEMS, CheckResult, Event
from podhealth.worker import call_off_loop

if TYPE_CHECKING:
    from podhealth.agent.agent import Agent

_log = log.get("podhealth.agent.jobmap")
_GPU_ENTITY = re.compile(r"^gpu(\d{1,3})$")
_INDEX_NAME = re.compile(r"^\d{1,3}$")

Jobs = dict[int, list[JobRecord]]


def jobs_of(snap: Snapshot) -> Jobs:
    """GPU -> jobs from the jobs collector; {} when it is stale or has not run."""
    st = snap.collectors.get("jobs")
    if st is None or snap.stale("jobs"):
        return {}
    return records_from_samples(st.samples)


def describe(jobs: list[JobRecord]) -> str:
    return ", ".join(j.label for j in jobs)


def annotate(results: tuple[CheckResult, ...], jobs: Jobs) -> tuple[CheckResult, ...]:
    """GPU results with `job` in their evidence (replacing an older `job`); others unchanged."""
    out: list[CheckResult] = []
    for r in results:
        held = None
        if jobs:  # ~130 results every judgement, and most nodes most of the time hold no job
            m = _GPU_ENTITY.match(r.entity)
            held = jobs.get(int(m.group(1))) if m else None
        if not held and not any(k == "job" for k, _ in r.evidence):
            out.append(r)
            continue
        ev = tuple(kv for kv in r.evidence if kv[0] != "job")
        if held:
            ev = (ev + (("job", describe(held)[:256]),))[:MAX_EVIDENCE_ITEMS]
        out.append(r if ev == r.evidence else dataclasses.replace(r, evidence=ev))
    return tuple(out)


def tag_event(ev: Event, jobs: Jobs) -> Event:
    held = jobs.get(ev.gpu) if ev.gpu is not None else None
    return dataclasses.replace(ev, job=describe(held)[:256]) if held else ev


# ---- dcgm-exporter's HPC job-mapping files ------------------------------------------------------

def mapping_files(jobs: Jobs) -> dict[str, str]:
    """File name (the GPU index) -> content (one job id per line), as dcgm-exporter reads them."""
    return {str(g): "".join(f"{j.job_id}\n" for j in held) for g, held in sorted(jobs.items()) if held}


def write_mapping(directory: Path, files: dict[str, str]) -> list[str]:
    """Make `directory` hold exactly `files` among its GPU-index-named files (others untouched).
    Blocking; returns one line per file that could not be written or removed."""
    errors: list[str] = []
    directory.mkdir(mode=0o755, parents=True, exist_ok=True)
    for name in os.listdir(directory):
        if _INDEX_NAME.match(name) and name not in files:
            try:
                os.unlink(directory / name)
            except FileNotFoundError:
                pass
            except OSError as e:
                errors.append(f"{directory / name}: {e.strerror or e}")
    for name, body in files.items():
        path = directory / name
        try:
            if path.exists() and path.read_text() == body:
                continue
            write_atomic(path, body, fsync=False)  # rewritten on every change while the agent runs
        except OSError as e:
            errors.append(f"{path}: {e.strerror or e}")
    return errors


class JobMap(Plugin):
    """Holds the latest GPU -> jobs and keeps the dcgm-exporter files in step with it."""

    name = "jobmap"

    def __init__(self, mapping_dir: Path | None) -> None:
        self.jobs: Jobs = {}
        self.mapping_dir = mapping_dir
        self._written: dict[str, str] | None = None
        self._writing: asyncio.Task[None] | None = None
        self._failing = False

    def on_snapshot(self, snap: Snapshot) -> None:
        st = snap.collectors.get("jobs")
        if st is None:
            return
        self.jobs = jobs_of(snap)
        # A stale collector claims nothing for the evidence, but the files stay as they were:
        # removing them would tell dashboards every job ended.
        if self.mapping_dir is not None and not snap.stale("jobs"):
            files = mapping_files(self.jobs)
            if files != self._written and (self._writing is None or self._writing.done()):
                self._writing = asyncio.get_running_loop().create_task(self._write(files), name="jobmap-write")

    async def _write(self, files: dict[str, str]) -> None:
        mapping_dir = self.mapping_dir
        assert mapping_dir is not None
        try:
            errors = await call_off_loop("jobmap-write", lambda: write_mapping(mapping_dir, files))
        except OSError as e:
            errors = [f"{self.mapping_dir}: {e.strerror or e}"]
        if errors:
            if not self._failing:
                _log.warning("dcgm-exporter job mapping not written", errors="; ".join(errors[:4]))
            self._failing = True
            self._written = None  # try again at the next snapshot
            return
        if self._failing:
            _log.info("dcgm-exporter job mapping written again", directory=str(self.mapping_dir))
        self._failing = False
        self._written = files


def install(agent: "Agent") -> JobMap:
    jm = JobMap(agent.cfg.collectors.jobs.dcgm_job_mapping_dir)
    agent.add_plugin(jm)
    agent.sinks.annotate_event = lambda ev: tag_event(ev, jm.jobs)  # published XID events name the job
    return jm
