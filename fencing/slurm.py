"""The Slurm fencer: drain/resume through `scontrol`, plus a pure parser of `scontrol show node`.

Why scontrol and not slurmrestd: in Slurm 22.05 the REST API can only read nodes, so a drain has
to go through scontrol anyway. Every call is argv (never a shell) with a timeout, node names are
validated before any command is built, and the reason is sanitised, so nothing a check reports can
reach scontrol's parser as syntax.

A node is ours only when its reason starts with `podhealth:`; a node drained (or downed with a
reason) by anyone else counts as opted out and is never touched: we do not overwrite its reason
and never resume it (LBNL NHC works the same way).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, TypeVar

from podhealth.fencing.fence import (
    REASON_PREFIX, FenceError, FenceOutcome, FenceReason, FenceState, Guard, Job, LeaseExpired, NodeNames, Refused,
    Transient, mark_epoch, parse_reason, refuse_bad_name, render_reason, time_left,
)
from podhealth.hostnames import is_valid_node_name, validate_node_name
from podhealth.fencing import spawn
from podhealth.fencing.slurmjobs import SQUEUE_FORMAT, parse_show_job, parse_squeue
from podhealth.worker import offload
from podhealth import log as plog

if TYPE_CHECKING:
    from podhealth.config_aggregator import SlurmFencerConfig

log = plog.get("podhealth.fencing.slurm")
MAX_REASON_CHARS = 200
MAX_JOBS = 64  # jobs looked at per node (a DGX runs a handful; the cap bounds the scontrol calls)
READ_CHUNK = 256  # node names per `scontrol show node -o a,b,...` (argv stays well under 16 KB)
DRAIN_CHUNK = 64  # updates per scontrol session (~3 ms each in slurmctld); sessions run side by side
_SESSION_UNSAFE = ('"', "\\", "\n", "\r")
_NOT_FOUND = re.compile(r"Node (\S+) not found")
MAX_OUTPUT_CHARS = 4000  # what an outcome keeps for the audit log
_FIELD_LIMITS = (("check", 48), ("entity", 64), ("action", 24), ("id", 64))

# sinfo's one-character suffixes on a compact state (`down*`, `idle~`) and the flag each means.
_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWER_DOWN",
                 "%": "POWERING_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                 "-": "PLANNED"}
# Errors that mean "slurmctld did not answer": worth another try (by the action runner, later).
# Anything else (an invalid node, a permission error) will not change by retrying.
_TRANSIENT = ("unable to contact slurm controller", "socket timed out", "zero bytes were transmitted",
              "connection refused", "connection timed out", "communication connection failure",
              "slurm backup controller in standby mode", "timed out after")

_KEY = re.compile(r"(?:(?<=\s)|^)([A-Z][A-Za-z0-9_]*)=")
# `Reason=<text> [<user>@<time>]` ends at the first [user@time] that is followed by another key or
# the end of the line: in the one-line form fields like ReservationName= may follow the reason.
# Without that suffix (it is printed whenever Slurm knows the reason's time) the reason runs to the
# end of the line, since free text may itself contain "Key=".
# The time is ISO 8601 (`2024-01-02T03:04:05`) because every scontrol runs with
# SLURM_TIME_FORMAT=standard (SlurmFencer._env); the pattern still takes any other rendering
# (`[root@01/12 23:51]` under a site's `SLURM_TIME_FORMAT="%d/%m %H:%M"`, `[root@1796169118]`
# under `%s`: tests/fixtures/slurm/scontrol_show_node_o_loopback_time_*.txt) so that a reason
# read by another caller never swallows its own suffix.
_REASON_ONE_LINE = re.compile(
    r"(?:(?<=\s)|^)Reason=(?P<text>.*?) \[(?P<user>[^\]\s@]*)@(?P<time>[^\[\]]+)\]"
    r"(?=\s+[A-Z][A-Za-z0-9_]*=|\s*$| {8}\S)")
# A reason of several lines (`Reason="$(cmd)"`): scontrol prints [user@time] after the first line
# and each further line after a line end plus 7 spaces: 8 spaces in all with -o, a line starting
# with 10 spaces in the multi-line form (tests/fixtures/slurm/*two_line_reason*). With -o the last
# line runs up to the fields printed after the reason.
_MORE_REASON = " " * 8
_REASON_MORE_ONE_LINE = re.compile(
    r"^ {8}(?P<more>.*?)(?=\s+(?:Comment|Extra|InstanceId|InstanceType|ReservationName)=|\s*$)")
_REASON_TO_EOL = re.compile(r"(?:(?<=\s)|^)Reason=(?P<text>.*)$")
_REASON_SUFFIX = re.compile(r"^(?P<text>.*?) \[(?P<user>[^\]\s@]*)@(?P<time>[^\[\]]+)\]\s*$")
# Base states that already mean "drained" (sinfo's %T and %t forms: `drained`, `draining`, `drain`,
# `drng`, and FAIL's `fail`, `failing`, `failg`); scontrol prints the DRAIN/FAIL flag instead.
_DRAINED_BASES = frozenset({"DRAINED", "DRAINING", "DRAIN", "DRNG", "FAIL", "FAILING", "FAILG"})


@dataclass(frozen=True)
class SlurmNode:
    """One node of `scontrol show node` output. `fields` keeps every other key verbatim."""

    name: str
    state: str = ""                 # as printed, e.g. "IDLE+DRAIN", "DOWN*+NOT_RESPONDING"
    base_state: str = ""            # "IDLE", "MIXED", "DOWN", ...
    flags: tuple[str, ...] = ()     # ("DRAIN",), ("NOT_RESPONDING",) ...
    reason: str = ""                # without the trailing [user@time]
    reason_user: str = ""
    reason_time: str = ""
    partitions: tuple[str, ...] = ()
    fields: tuple[tuple[str, str], ...] = ()

    def field(self, key: str, default: str = "") -> str:
        for k, v in self.fields:
            if k == key:
                return v
        return default

    @property
    def drained(self) -> bool:
        """DRAIN set (IDLE+DRAIN = drained, MIXED+DRAIN = draining) or FAIL (drain + failing)."""
        return bool({"DRAIN", "FAIL"} & set(self.flags)) or self.base_state in _DRAINED_BASES

    @property
    def down(self) -> bool:
        return self.base_state == "DOWN"

    @property
    def not_responding(self) -> bool:
        return "NOT_RESPONDING" in self.flags

    @property
    def fenced(self) -> bool:
        """Out of service on purpose: drained, or down with a reason (someone's, maybe Slurm's)."""
        return self.drained or (self.down and bool(self.reason))

    @property
    def ours(self) -> bool:
        return self.fenced and self.reason.startswith(REASON_PREFIX)


def parse_state(state: str) -> tuple[str, tuple[str, ...]]:
    """`MIXED+DRAIN` -> ("MIXED", ("DRAIN",)); `DOWN*+NOT_RESPONDING` -> ("DOWN", ("NOT_RESPONDING",)).

    Also takes sinfo's lower-case forms, long (%T: `drained*`, `draining`, `mixed-`) and compact
    (%t: `drain`, `drng`, `boot^`, `alloc+`), whose base may itself mean drained (see
    SlurmNode.drained). A trailing bare `+` (`alloc+`, `ALLOCATED+`) is sinfo's "jobs completing",
    not a separator. Flags are deduplicated in first-seen order. sinfo's long and compact forms hide
    DRAIN behind a pending reboot (`reboot`, `boot^`), MAINT and INVAL: only scontrol's form
    (what the fencer reads) always shows it.
    """
    text = state.strip().upper()
    parts = [p for p in text.split("+") if p]
    if not parts:
        return "", ()
    flags: list[str] = []
    base = parts[0]
    while base and base[-1] in _SUFFIX_FLAGS:
        flags.append(_SUFFIX_FLAGS[base[-1]])
        base = base[:-1]
    for p in parts[1:]:
        flags.append(p.rstrip("".join(_SUFFIX_FLAGS)))
    if len(parts) == 1 and text.endswith("+"):
        flags.append("COMPLETING")
    return base, tuple(dict.fromkeys(f for f in flags if f))


def _split_reason(value: str) -> tuple[str, str, str]:
    m = _REASON_SUFFIX.match(value)
    if m is None:
        return value.strip(), "", ""
    return m.group("text").strip(), m.group("user"), m.group("time")


def _parse_fields(text: str) -> list[tuple[str, str]]:
    keys = list(_KEY.finditer(text))
    out: list[tuple[str, str]] = []
    for i, m in enumerate(keys):
        end = keys[i + 1].start() if i + 1 < len(keys) else len(text)
        out.append((m.group(1), text[m.end():end].strip()))
    return out


def _parse_record(lines: list[str]) -> SlurmNode | None:
    reason = user = when = ""
    rest: list[str] = []
    body = [ln for ln in lines if ln.strip()]
    if len(body) > 1:
        # Multi-line form: Reason= owns its whole line, whatever it contains, and the deeper
        # indented lines right after it.
        in_reason = False
        for ln in body:
            s = ln.strip()
            if s.startswith("Reason="):
                reason, user, when = _split_reason(s[len("Reason="):])
                in_reason = True
            elif in_reason and ln.startswith("   " + _MORE_REASON[1:]):
                reason += "\n" + s
            else:
                in_reason = False
                rest.append(s)
        text = " ".join(rest)
    else:
        text = body[0].strip() if body else ""
        m = _REASON_ONE_LINE.search(text)
        if m is not None:
            reason, user, when = m.group("text").strip(), m.group("user"), m.group("time")
            tail = text[m.end():]
            more = _REASON_MORE_ONE_LINE.match(tail)
            if more is not None:
                reason += "".join("\n" + ln.strip() for ln in more.group("more").split(_MORE_REASON) if ln.strip())
                tail = tail[more.end():]
            text = (text[:m.start()] + " " + tail).strip()
        elif (m2 := _REASON_TO_EOL.search(text)) is not None:
            reason = m2.group("text").strip()
            text = text[:m2.start()].strip()
    fields = _parse_fields(text)
    name = next((v for k, v in fields if k == "NodeName"), "")
    if not name:
        return None
    state = next((v for k, v in fields if k == "State"), "")
    base, flags = parse_state(state)
    parts = next((v for k, v in fields if k == "Partitions"), "")
    return SlurmNode(name=name, state=state, base_state=base, flags=flags, reason=reason, reason_user=user,
                     reason_time=when, partitions=tuple(p for p in parts.split(",") if p),
                     fields=tuple((k, v) for k, v in fields if k not in ("NodeName", "State")))


def parse_show_node(text: str) -> list[SlurmNode]:
    """Parse `scontrol show node [-o]` output (one-line or multi-line records) into nodes.

    Pure: no I/O. Lines before the first `NodeName=` and records without a name are ignored, so
    a truncated capture yields the nodes that are complete enough to name.
    """
    records: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("NodeName="):
            records.append([line])
        elif records:
            records[-1].append(line)
    out: list[SlurmNode] = []
    for rec in records:
        node = _parse_record(rec)
        if node is not None:
            out.append(node)
    return out


def _clean_field(value: str, limit: int) -> str:
    # One token per field, printable ASCII, no quotes or brackets (the id is wrapped in [...]).
    text = "".join(c if (c.isascii() and c.isprintable() and c not in "\"'`\\[]") else " " for c in value)
    text = "_".join(text.split())
    return (text[:limit] or "-")


def _clean_reason(text: str) -> str:
    """Free text for a Reason=: printable ASCII without quotes or backslashes (argv, never a shell)."""
    return " ".join("".join(c if (c.isascii() and c.isprintable() and c not in "\"'`\\") else " " for c in text).split())


def sanitise_reason(reason: FenceReason) -> str:
    """The Slurm reason for `reason`: `podhealth: <check> <entity> <action> [<id>]`, bounded and safe."""
    clean = FenceReason(**{k: _clean_field(getattr(reason, k), n) for k, n in _FIELD_LIMITS})
    epoch = f" e{reason.epoch}" if reason.epoch > 0 else ""  # kept whole: reconcile reads it
    return render_reason(clean)[:MAX_REASON_CHARS - len(epoch)] + epoch


class SlurmUnavailable(Transient):
    """slurmctld could not be reached (one attempt); the action runner tries again later."""


@dataclass(frozen=True)
class _Run:
    argv: tuple[str, ...]
    rc: int | None   # None: timed out and killed, or could not start
    out: str
    err: str

    @property
    def text(self) -> str:
        return (self.out + self.err).strip()[:MAX_OUTPUT_CHARS]

    @property
    def transient(self) -> bool:
        if self.rc is None:
            return True
        low = self.text.lower()
        return self.rc != 0 and any(t in low for t in _TRANSIENT)


class SlurmFencer:
    """Drains and resumes Slurm nodes with scontrol. Safe to share between tasks."""

    name = "slurm"

    def target(self, names: NodeNames) -> str:
        """Slurm's NodeName (nodes[].slurm_name), else podhealth's name."""
        return names.slurm or names.node

    def __init__(self, scontrol: str = "scontrol", slurm_conf: str | os.PathLike[str] | None = None,
                 timeout: float = 10.0, budget: float | None = None, env: Mapping[str, str] | None = None,
                 squeue: str = "squeue") -> None:
        """`timeout` bounds each scontrol run; `budget` (default 1.5 x timeout) bounds one whole
        public call (a fence is read, update, read back), so a caller's own deadline of 2 x timeout
        is never hit. Each scontrol runs once: the action runner is the one retrier."""
        if timeout <= 0:
            raise ValueError("timeout must be > 0")
        self.scontrol = scontrol
        self.squeue = squeue
        self.timeout = timeout
        self.budget = budget if budget is not None else timeout * 1.5
        base = dict(env if env is not None else os.environ)
        # A site's SLURM_TIME_FORMAT (profile.d often sets one, e.g. "%d/%m %H:%M" or "relative")
        # changes how scontrol prints a reason's [user@time]; pin the ISO form the parser reads.
        base["SLURM_TIME_FORMAT"] = "standard"
        if slurm_conf:
            base["SLURM_CONF"] = str(slurm_conf)
        self._env = base
        # Set by the aggregator: its lease (fencing/fence.py Guard); None for --drain-self.
        self.guard: Guard | None = None
        self._timeout_cmd = shutil.which("timeout", path=base.get("PATH")) or ""  # coreutils

    # ---- Fencer protocol ------------------------------------------------------------------------

    async def read(self, node: str) -> FenceState:
        """Current state; raises SlurmUnavailable when slurmctld cannot be reached, ValueError for a bad name."""
        validate_node_name(node)
        deadline = time.monotonic() + self.budget
        return await self._read(node, deadline)

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        refuse_bad_name(validate_node_name, node)
        deadline = time.monotonic() + self.budget
        try:
            before = await self._read(node, deadline)
        except SlurmUnavailable as e:
            raise SlurmUnavailable(str(e), command=self._drain_argv(node, reason)) from None
        return await self._drain(node, reason, before, deadline)

    async def fence_seen(self, node: str, reason: FenceReason, seen: FenceState) -> FenceOutcome:
        """fence() from the caller's read of the node just before (SeenFencer): one scontrol run."""
        refuse_bad_name(validate_node_name, node)
        return await self._drain(node, reason, seen, time.monotonic() + self.budget)

    def _drain_argv(self, node: str, reason: FenceReason) -> tuple[str, ...]:
        return (self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={sanitise_reason(reason)}")

    async def _drain(self, node: str, reason: FenceReason, before: FenceState, deadline: float) -> FenceOutcome:
        """DRAIN `node` unless `before` (read right before) says it is unknown or fenced already:
        by us (idempotent) or by someone else (left alone: never drained over a human's drain).
        Not read back: `scontrol update` exits 0 only once slurmctld has applied the update (the
        RPC's answer), so the rc already says the node is drained with our reason, and a read
        afterwards would only cost another scontrol run (~12 ms of CPU) on the fence's path."""
        argv = self._drain_argv(node, reason)
        if before.node != node:
            raise ValueError(f"the state given is {before.node}'s, not {node}'s")
        if not before.exists:
            raise Refused(f"node {node} is not known to Slurm", command=argv, output=before.raw)
        if before.fenced:
            who = "podhealth" if before.ours else "someone else; left alone"
            return FenceOutcome(changed=False, command=argv,
                                output=f"already drained by {who}: {before.reason}")
        run = await self._run_once(argv, deadline)
        if run.rc != 0:
            raise Refused(f"scontrol drain failed: {run.text or 'rc ' + str(run.rc)}", command=argv, output=run.text)
        return FenceOutcome(changed=True, command=argv,
                            output=run.text or f"drained: {sanitise_reason(reason)}")

    async def release(self, node: str) -> FenceOutcome:
        refuse_bad_name(validate_node_name, node)
        argv = (self.scontrol, "update", f"NodeName={node}", "State=RESUME")
        deadline = time.monotonic() + self.budget
        try:
            before = await self._read(node, deadline)
        except SlurmUnavailable as e:
            raise SlurmUnavailable(str(e), command=argv) from None
        if not before.exists:
            raise Refused(f"node {node} is not known to Slurm", command=argv)
        if not before.fenced:
            return FenceOutcome(changed=False, command=argv, output="not drained")
        if not before.ours:
            raise Refused(f"drained by someone else ({before.reason!r}); podhealth does not resume it", command=argv)
        # Slurm has no compare-and-set: re-reading right before RESUME keeps the window small.
        return await self._update_and_confirm(
            node, argv, deadline, "resume", lambda a: not a.fenced,
            lambda a: f"after the resume {node} is still fenced: {a.reason!r}", lambda a: "resumed")

    # ---- JobSource: the jobs on a node, and requeueing them -----------------------------------

    async def jobs(self, node: str) -> list[Job]:
        """`squeue -h -w NODE` for the jobs, then `scontrol -d show job ID` for each job's GPUs
        there (GRES IDX). Raises SlurmUnavailable when Slurm does not answer."""
        validate_node_name(node)
        deadline = time.monotonic() + self.budget
        run = await self._run((self.squeue, "-h", "-w", node, "-o", SQUEUE_FORMAT),
                              max(0.1, min(self.timeout, deadline - time.monotonic())))
        if run.rc != 0:
            raise SlurmUnavailable(f"squeue -w {node}: {run.text or 'rc ' + str(run.rc)}")
        out: list[Job] = []
        for j in parse_squeue(run.out)[:MAX_JOBS]:
            if j.state not in ("RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING", "STOPPED"):
                continue
            detail = await self._run((self.scontrol, "-d", "show", "job", j.job_id),
                                     max(0.1, min(self.timeout, deadline - time.monotonic())))
            recs = [r for r in parse_show_job(detail.out) if r.job_id == j.job_id] if detail.rc == 0 else []
            gpus = recs[0].gpus.get(node, ()) if recs else ()
            out.append(Job(id=j.job_id, owner=j.user, name=j.name, state=j.state, gpus=gpus))
        return out

    async def evacuate(self, node: str, jobs: Sequence[Job], force: bool) -> FenceOutcome:
        """force: `scontrol requeue ID[,ID...]` (the jobs go back to the queue, to run elsewhere);
        otherwise nothing: the drain already lets them finish."""
        names = ", ".join(j.label() for j in jobs) or "none"
        if not force or not jobs:
            return FenceOutcome(changed=False, command=(),
                                output=f"drain lets the job(s) on {node} finish: {names}")
        ids = [j.id for j in jobs if j.id.replace("_", "").isdigit()]
        argv = (self.scontrol, "requeue", ",".join(ids))
        run = await self._run(argv, self.timeout)
        if run.rc is None or run.transient:
            raise SlurmUnavailable(run.text or run.err)
        if run.rc != 0:
            raise Refused(f"scontrol requeue failed: {run.text or 'rc ' + str(run.rc)}", command=argv, output=run.text)
        return FenceOutcome(changed=True, command=argv, output=f"requeued {names}")

    async def announce_jobs(self, node: str, message: str) -> str:
        """Name the jobs a fence hurts in the node's reason, after podhealth's own mark
        (`podhealth: xid gpu3 DRAIN [id] jobs: 4102 (bob, GPU 3,5)`, cut to Slurm's reason
        length), so `sinfo -R` shows them. Only on a drain whose reason is still exactly ours;
        '' when done, else why not (best effort: the audit log has the jobs either way)."""
        ours, _, jobs = message.partition(": on ")
        deadline = time.monotonic() + self.budget
        try:
            before = await self._read(node, deadline)
        except SlurmUnavailable as e:
            return f"reason not updated: {e}"
        # The mark on the node carries the fencing leader's epoch, which the caller's rendering may
        # lack: the same fence is the same check, entity, action and id, with nothing after it.
        mark, now = parse_reason(ours), parse_reason(before.reason)
        same = (mark is not None and now is not None and before.reason == render_reason(now)
                and (mark.check, mark.entity, mark.action, mark.id) == (now.check, now.entity, now.action, now.id))
        if not (before.fenced and before.ours and same):
            return f"reason not updated: it is no longer podhealth's own ({before.reason!r})"
        text = _clean_reason(f"{before.reason} jobs on {jobs}")[:MAX_REASON_CHARS]
        argv = (self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}")
        run = await self._run(argv, max(0.1, min(self.timeout, deadline - time.monotonic())))
        return "" if run.rc == 0 else f"reason not updated: {run.text or 'rc ' + str(run.rc)}"

    # ---- Remediator: the ladder's reboot and the REPAIR reason -------------------------------

    async def reboot(self, node: str, reason: FenceReason) -> FenceOutcome:
        """`scontrol reboot ASAP nextstate=DOWN reason=<ours> NODE`: slurmd runs the RebootProgram
        once the node's jobs are done. nextstate=DOWN, not RESUME: with RESUME Slurm clears the
        drain and the reason after the reboot (scontrol(1)), returning the node to users before
        the handover suite has passed; DOWN keeps it out with our reason, and podhealth's release
        (State=RESUME) returns it. One scontrol run: the action runner is the one retrier.
        Idempotent: a reboot already requested or issued (the REBOOT_REQUESTED / REBOOT_ISSUED
        flags) is not asked again, so a restart never reboots a node twice."""
        refuse_bad_name(validate_node_name, node)
        text = sanitise_reason(reason)
        argv = (self.scontrol, "reboot", "ASAP", "nextstate=DOWN", f"reason={text}", node)
        deadline = time.monotonic() + self.budget
        before = await self._read(node, deadline)  # SlurmUnavailable: the runner tries again later
        if not before.exists:
            raise Refused(f"node {node} is not known to Slurm", command=argv)
        if not (before.fenced and before.ours):
            raise Refused(f"{node} is not fenced by podhealth ({before.reason!r}): not rebooted",
                          command=argv, output=before.raw)
        if _rebooting(before):
            return FenceOutcome(changed=False, command=argv, output=f"reboot already requested: {before.raw}")
        run = await self._run(argv, max(0.1, min(self.timeout, deadline - time.monotonic())))
        if run.rc is None or run.transient:
            raise SlurmUnavailable(run.text or run.err)
        if run.rc != 0:
            raise Refused(f"scontrol reboot failed: {run.text or 'rc ' + str(run.rc)}", command=argv, output=run.text)
        after = await self._read(node, deadline)
        if not (_rebooting(after) or after.raw != before.raw):
            # Asked, but Slurm shows nothing pending: the ladder counts it a failed attempt (Refused).
            raise Refused(f"after scontrol reboot {node} shows no reboot pending: {_shown(after)}",
                          command=argv, output=after.raw)
        return FenceOutcome(changed=True, command=argv, output=run.text or f"reboot requested: {after.raw}")

    async def remark(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Replace the reason on podhealth's drain (REPAIR). State=DRAIN keeps a drained node
        drained and adds the drain to one left DOWN by a reboot, so nothing schedules on it."""
        refuse_bad_name(validate_node_name, node)
        text = sanitise_reason(reason)
        argv = (self.scontrol, "update", f"NodeName={node}", "State=DRAIN", f"Reason={text}")
        deadline = time.monotonic() + self.budget
        before = await self._read(node, deadline)
        if not (before.exists and before.fenced and before.ours):
            raise Refused(f"{node} is not fenced by podhealth ({before.reason!r}): reason left alone",
                          command=argv, output=before.raw)
        return await self._update_and_confirm(
            node, argv, deadline, "drain", lambda a: a.fenced and a.reason.startswith(text),
            lambda a: f"after the update {node} shows reason {a.reason!r}", lambda a: f"reason now: {a.reason}")

    async def _update_and_confirm(self, node: str, argv: tuple[str, ...], deadline: float, verb: str,
                                  done: Callable[[FenceState], bool], not_done: Callable[[FenceState], str],
                                  default_output: Callable[[FenceState], str]) -> FenceOutcome:
        """Run one `scontrol update` and read the node back: only what Slurm then shows counts."""
        run = await self._run_once(argv, deadline)
        if run.rc != 0:
            raise Refused(f"scontrol {verb} failed: {run.text or 'rc ' + str(run.rc)}", command=argv, output=run.text)
        past = "drained" if verb == "drain" else "resumed"
        try:
            after = await self._read(node, deadline)
        except SlurmUnavailable as e:
            raise SlurmUnavailable(f"{past}, but could not read it back: {e}", command=argv, output=run.text) from None
        if not done(after):  # the update ran and did not take (someone else's change between): later
            raise Transient(not_done(after), command=argv, output=after.raw)
        return FenceOutcome(changed=True, command=argv, output=run.text or default_output(after))

    # ---- BatchFencer: many nodes per scontrol process ---------------------------------------
    #
    # Each scontrol process costs ~12 ms of CPU here, and a fence is three of them (read,
    # update, read back). In a batch the reads name up to READ_CHUNK nodes each, and the updates
    # go to one interactive `scontrol` session per DRAIN_CHUNK nodes as lines on its stdin: one
    # process, one RPC per node, and every node keeps its own reason (Slurm 22.05 applies one
    # Reason= to all nodes of a single update, and the [id] differs per node).

    async def read_many(self, nodes: Sequence[str]) -> dict[str, FenceState]:
        """read() for many nodes; invalid names are left out (read() says why). Raises SlurmUnavailable."""
        names = [n for n in dict.fromkeys(nodes) if is_valid_node_name(n)]
        return await self._read_many(names, time.monotonic() + self.budget)

    async def fence_many(self, items: Sequence[tuple[str, FenceReason]]) -> dict[str, FenceOutcome | FenceError]:
        """fence() for many nodes: the same checks, outcomes and errors per node. A node whose state
        could not be told apart (missing from a read) is left out for the caller's fence()."""
        out: dict[str, FenceOutcome | FenceError] = {}
        texts: dict[str, str] = {}
        for node, reason in items:
            try:
                validate_node_name(node)
            except ValueError as e:
                out[node] = Refused(str(e))
                continue
            text = sanitise_reason(reason)
            # sanitise_reason already drops these; should one ever get through, that node is
            # left out for fence(), whose argv no tokenizer reads.
            if not any(c in text for c in _SESSION_UNSAFE):
                texts[node] = text
        argv = {n: (self.scontrol, "update", f"NodeName={n}", "State=DRAIN", f"Reason={t}") for n, t in texts.items()}
        deadline = time.monotonic() + self.budget
        try:
            before = await self._read_many(list(texts), deadline)
        except SlurmUnavailable as e:
            return out | {n: SlurmUnavailable(str(e), command=argv[n]) for n in texts}
        todo: list[str] = []
        for n in texts:
            st = before.get(n)
            if st is None:
                continue
            if not st.exists:
                out[n] = Refused(f"node {n} is not known to Slurm", command=argv[n], output=st.raw)
            elif st.fenced:
                who = "podhealth" if st.ours else "someone else; left alone"
                out[n] = FenceOutcome(changed=False, command=argv[n],
                                      output=f"already drained by {who}: {st.reason}")
            else:
                todo.append(n)
        if not todo:
            return out
        chunks = [todo[i:i + DRAIN_CHUNK] for i in range(0, len(todo), DRAIN_CHUNK)]
        runs = await asyncio.gather(*(self._drain_session(c, texts, deadline) for c in chunks))
        said = {n: run for c, run in zip(chunks, runs) for n in c}
        try:
            after = await self._read_many(todo, deadline)
        except SlurmUnavailable as e:
            return out | {n: SlurmUnavailable(f"drained, but could not read it back: {e}", command=argv[n],
                                              output=said[n].text) for n in todo}
        for n in todo:
            st, run = after.get(n), said[n]
            if st is None:
                continue
            if st.fenced and st.ours:
                out[n] = FenceOutcome(changed=True, command=argv[n],
                                      output=f"drained: {st.reason} (a batch of {len(todo)}, "
                                             f"{len(chunks)} scontrol session(s))")
            elif run.rc is None or run.transient:
                continue  # slurmctld did not answer: left out, for the caller's fence() of this one
            else:
                err = run.err.strip()[:MAX_OUTPUT_CHARS]
                out[n] = Refused(f"after the drain {n} shows {_shown(st)}" + (f"; scontrol said: {err}" if err else ""),
                                 command=argv[n], output=st.raw)
        return out

    async def _read_many(self, names: list[str], deadline: float) -> dict[str, FenceState]:
        chunks = [names[i:i + READ_CHUNK] for i in range(0, len(names), READ_CHUNK)]
        out: dict[str, FenceState] = {}
        for part in await asyncio.gather(*(self._read_chunk(c, deadline) for c in chunks)):
            out.update(part)
        return out

    async def _read_chunk(self, names: list[str], deadline: float) -> dict[str, FenceState]:
        """One `scontrol show node -o a,b,c`: a node it does not know gets a line `Node X not found`
        (and rc 1) while the others are still printed."""
        run = await self._run_once((self.scontrol, "show", "node", "-o", ",".join(names)), deadline)
        out, missing = await _off_loop(_parse_listing, run.out)
        if run.rc != 0 and not out and not missing:
            raise SlurmUnavailable(f"scontrol show node: {run.text or 'rc ' + str(run.rc)}")
        wanted = set(names)
        return {n: st for n, st in out.items() if n in wanted} | {
            n: FenceState(node=n, exists=False, fenced=False, ours=False, raw=raw)
            for n, raw in missing.items() if n in wanted and n not in out}

    async def _drain_session(self, nodes: list[str], texts: Mapping[str, str], deadline: float) -> _Run:
        """DRAIN `nodes` in one interactive scontrol: `update ...` lines on stdin, parsed by
        scontrol's own tokenizer (names are validated and reasons carry no quotes, backslashes or
        line breaks, so each line is exactly the argv fence() would run)."""
        script = "".join(f'update NodeName={n} State=DRAIN Reason="{texts[n]}"\n' for n in nodes)
        left = deadline - time.monotonic()
        if left <= 0:
            return _Run((self.scontrol,), None, "", "not run: no time left")
        return await self._run((self.scontrol,), min(self.timeout, left), script.encode())

    async def list_fenced(self) -> dict[str, FenceState]:
        """Every drained/fenced node (ours or not); raises SlurmUnavailable when slurmctld is away."""
        deadline = time.monotonic() + self.budget
        run = await self._run_once((self.scontrol, "show", "node", "-o"), deadline)
        if run.rc != 0:
            raise SlurmUnavailable(f"scontrol show node: {run.text or 'rc ' + str(run.rc)}")
        nodes = await _off_loop(parse_show_node, run.out)
        return {n.name: _state_of(n, "") for n in nodes if n.fenced}

    # ---- internals ------------------------------------------------------------------------------

    async def _read(self, node: str, deadline: float) -> FenceState:
        run = await self._run_once((self.scontrol, "show", "node", "-o", node), deadline)
        if run.rc != 0:
            if "not found" in run.text.lower() or "invalid node name" in run.text.lower():
                return FenceState(node=node, exists=False, fenced=False, ours=False, raw=run.text)
            raise SlurmUnavailable(f"scontrol show node {node}: {run.text or 'rc ' + str(run.rc)}")
        nodes = [n for n in parse_show_node(run.out) if n.name == node]
        if not nodes:
            return FenceState(node=node, exists=False, fenced=False, ours=False, raw=run.text)
        return _state_of(nodes[0], run.out.strip())

    async def _run_once(self, argv: tuple[str, ...], deadline: float) -> _Run:
        """One scontrol run within what is left of `deadline`; slurmctld not answering is
        SlurmUnavailable (a Transient: the action runner decides whether and when to try again)."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise SlurmUnavailable(f"{' '.join(argv[1:3])}: not run: no time left")
        run = await self._run(argv, min(self.timeout, left))
        if run.rc is None:
            raise SlurmUnavailable(run.err)
        if run.transient:
            raise SlurmUnavailable(f"{' '.join(argv[1:3])}: {run.text}")
        return run

    async def _run(self, argv: tuple[str, ...], timeout: float, stdin: bytes | None = None) -> _Run:
        # The lease, on the monotonic clock, immediately before the call: a deposed leader
        # starts nothing (LeaseExpired), and a call gets no more time than the lease has left.
        left = time_left(self.guard, " ".join(argv[1:3]))
        lease_bound = left < timeout
        timeout = min(timeout, left)
        run = argv
        if math.isfinite(left) and self._timeout_cmd:
            # Killed at the deadline by `timeout` even if this process is frozen (SIGSTOP) then:
            # its own wait below cannot run while it is stopped, and a late drain or resume
            # would land after a follower took over.
            run = (self._timeout_cmd, "-s", "KILL", f"{max(0.001, left):.3f}", *argv)
        started, wall = time.monotonic(), time.time()
        try:
            # Its own process group: the kill below reaches `timeout` and the scontrol it runs.
            # Started by vfork (fencing/spawn.py): uvloop's fork costs 3-25 ms per run here.
            proc = spawn.start(run, env=self._env, stdin=stdin is not None)
        except OSError as e:
            return _Run(argv, None, "", f"cannot run {argv[0]}: {e}")
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout)
        except asyncio.TimeoutError:
            _kill(proc)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(proc.wait(), 5)
            if lease_bound:
                raise LeaseExpired(f"{' '.join(argv[1:3])}: killed at this aggregator's lease deadline") from None
            return _Run(argv, None, "", f"{' '.join(argv[:3])} timed out after {timeout:.1f}s (killed)")
        except asyncio.CancelledError:  # the lease was lost (the runner cancels), or a stop
            _kill(proc)
            raise
        # The fence path's stage times (bench/fault_to_fence.py --trace reads them at debug level).
        log.debug("scontrol ran", argv=" ".join(argv[1:5])[:120], rc=proc.returncode, started=wall,
                  took_ms=round((time.monotonic() - started) * 1e3, 1))
        if run is not argv and proc.returncode in (124, 137, -signal.SIGKILL) \
                and time.monotonic() - started >= left - 0.05:
            # `timeout` ended it at the deadline (killing its group, itself included: -9)
            raise LeaseExpired(f"{' '.join(argv[1:3])}: killed at this aggregator's lease deadline")
        return _Run(argv, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def _kill(proc: spawn.Process) -> None:
    """SIGKILL the call's process group (`timeout` and its scontrol), or the process alone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()


_T = TypeVar("_T")
_INLINE_BYTES = 32_768  # ~60 nodes' lines; parsing more (10,000 nodes: ~0.7 s here) would stall the loop


async def _off_loop(parse: Callable[[str], _T], text: str) -> _T:
    """Parse scontrol's output in a worker thread when it is long (a whole cluster's listing)."""
    if len(text) <= _INLINE_BYTES:
        return parse(text)
    return await offload(parse, text)


def _parse_listing(text: str) -> tuple[dict[str, FenceState], dict[str, str]]:
    """`scontrol show node -o a,b,c` output: the states it prints, and the `Node X not found` lines."""
    out: dict[str, FenceState] = {}
    missing: dict[str, str] = {}
    for line in text.splitlines():
        m = _NOT_FOUND.fullmatch(line.strip())
        if m is not None:
            missing[m.group(1)] = line.strip()
            continue
        for node in parse_show_node(line):
            out[node.name] = _state_of(node, line.strip())
    return out, missing


_REBOOT_FLAGS = frozenset({"REBOOT_REQUESTED", "REBOOT_ISSUED", "REBOOT"})


def _rebooting(st: FenceState) -> bool:
    """A reboot is pending on the node: its state carries one of Slurm's reboot flags
    (`IDLE+DRAIN+REBOOT_REQUESTED`, `DOWN+REBOOT_ISSUED`; 22.05 prints REBOOT for the first)."""
    nodes = parse_show_node(st.raw)
    return bool(nodes) and bool(_REBOOT_FLAGS & set(nodes[0].flags))


def _shown(st: FenceState) -> str:
    """What an error shows of a node: its State and Reason (scontrol's line starts with a dozen
    other fields, so its first 200 characters never reached the state)."""
    nodes = parse_show_node(st.raw)
    if not nodes:
        return repr(st.raw[:200])
    return f"State={nodes[0].state}" + (f" Reason={nodes[0].reason!r}" if nodes[0].reason else "")


def _state_of(n: SlurmNode, raw: str) -> FenceState:
    return FenceState(node=n.name, exists=True, fenced=n.fenced, ours=n.ours, reason=n.reason,
                      opted_out=n.fenced and not n.ours, raw=raw[:MAX_OUTPUT_CHARS],
                      epoch=mark_epoch(n.reason) if n.ours else 0)


def from_config(cfg: "SlurmFencerConfig") -> SlurmFencer:
    return SlurmFencer(scontrol=cfg.scontrol, slurm_conf=cfg.slurm_conf or None, timeout=cfg.timeout, squeue=cfg.squeue)
