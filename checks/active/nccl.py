"""nccl-tests output (`all_reduce_perf` and podhealth's own runner) parsed and judged.

Both the classic table and the nccl-tests 2.18+ layout (`# nccl-tests version`, wider `#wrong`
columns, `# Collective test starting/concluded`) share the data-row shape
`size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong`, so rows are read
from their last eight numbers; collectives without redop/root still parse. The parser is pure.

Judging uses the bus bandwidth at the largest sizes, not "Avg bus bandwidth": the average runs
over every size in the sweep and small messages dominate it (the 2.18 H200 capture averages 178
GB/s while it sustains 485 GB/s at 16 GiB).

Variants the parser takes as they come, because a misread one fences healthy nodes:
- nccl-tests before 2.10 print `error` (the largest relative error, "1e-06" on a healthy float
  sum) where later ones print `#wrong` (a count); only "Out of bounds values" judges those runs;
- their device lines have no "Group N" (`#   Rank  0 Pid 123 on host device 0 [0x07] ...`);
- launcher prefixes: `mpirun --tag-output` ("[1,0]<stdout>:") and `srun --label` ("0: ");
- NCCL_DEBUG=INFO lines are chatter, never failures; "NCCL WARN" lines are kept as warnings: a
  run that completes with correct data is judged on its numbers, one that dies shows them;
- only the test's own failure lines fail a run ("Test NCCL failure", a crash, podhealth's runner
  failing); other error-looking lines (Open MPI's openib BTL, HCOLL's "exited with error") are
  evidence;
- a run without its closing summary ("Avg bus bandwidth", 2.18+ "Collective test concluded")
  was killed or hung: UNKNOWN unless what it did print already shows wrong values or a failure;
  so is one Slurm cancelled (time limit, scancel, preemption): the "srun: error: task 0: Killed"
  lines that follow a cancellation are the kill, not a fault;
- a single rank has no bus bandwidth (nccl-tests prints 0): not judged against a gate.
"""

from __future__ import annotations

import dataclasses
import math
import re
import statistics
from dataclasses import dataclass
from typing import Mapping

from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import MAX_EVIDENCE_ITEMS, Action, CheckResult, Status

CHECK = "nccl_allreduce"
MAX_ERROR_LINES = 8


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    dtype: str
    redop: str
    oop_time_us: float
    oop_algbw: float
    oop_busbw: float
    oop_wrong: int | None     # None when validation is off ("N/A")
    ip_time_us: float
    ip_algbw: float
    ip_busbw: float
    ip_wrong: int | None

    @property
    def busbw(self) -> float:
        return max(self.oop_busbw, self.ip_busbw)

    @property
    def wrong(self) -> int:
        return (self.oop_wrong or 0) + (self.ip_wrong or 0)


@dataclass(frozen=True)
class NcclDevice:
    rank: int
    host: str
    device: int
    bus: str
    model: str


@dataclass(frozen=True)
class NcclRun:
    rows: tuple[NcclRow, ...]
    avg_busbw: float | None = None
    out_of_bounds: int | None = None      # "# Out of bounds values : N OK|FAILED"
    nccl_version: str = ""
    tests_version: str = ""
    started: bool = False                 # the "# nThread ..." header was printed
    concluded: bool = False               # 2.18+: "# Collective test concluded"
    devices: tuple[NcclDevice, ...] = ()
    errors: tuple[str, ...] = ()          # failure lines, bounded
    warnings: tuple[str, ...] = ()        # "NCCL WARN" lines, bounded: not failures by themselves
    cancelled: str = ""                   # Slurm's "*** STEP ... CANCELLED AT ... ***" line, if any

    @property
    def complete(self) -> bool:
        """The run printed its closing summary: it was not killed or hung mid-sweep."""
        return self.avg_busbw is not None or self.concluded

    @property
    def fatal_errors(self) -> tuple[str, ...]:
        """The failure lines that say the test itself failed (nccl-tests' "Test NCCL failure", a
        crash, podhealth's runner failing), as opposed to error-looking noise around a run:
        Open MPI's openib BTL warnings, HCOLL's "ml_discover_hierarchy exited with error"."""
        return tuple(e for e in self.errors if _FATAL.search(e))

    @property
    def failure_lines(self) -> tuple[str, ...]:
        """What fails a run that printed results: its fatal lines once it completed (noise around
        a run that finished with correct data is no failure), every error line otherwise."""
        return self.fatal_errors if self.complete else self.errors

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(d.host for d in self.devices))

    def large_busbw(self, top_fraction: float = 0.25) -> float | None:
        """Mean bus bandwidth over the sizes within `top_fraction` of the largest (>= max/4 by
        default: the top three sizes of a factor-2 sweep), the plateau a healthy fabric reaches."""
        if not self.rows:
            return None
        biggest = max(r.size_bytes for r in self.rows)
        top = [r.busbw for r in self.rows if r.size_bytes >= biggest * top_fraction]
        return statistics.fmean(top)


_NUM = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
# Numbers converted with int() are ASCII digits of bounded length: regex \d takes any script's
# digits and int() refuses more than 4,300 of them.
# "Group N" came with nccl-tests 2.x's multi-group runs; older builds print "Rank 0 Pid ...".
_DEVICE = re.compile(r"^#\s+Rank\s+([0-9]{1,9})\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+([0-9]{1,9})"
                     r"\s+\[([^\]]*)\]\s*(.*)$")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*(" + _NUM + r")")
_OOB = re.compile(r"^#\s*Out of bounds values\s*:\s*([0-9]{1,18})\b\s*(\w+)?")
_ERROR = re.compile(r"(Test (?:CUDA|NCCL) failure|Test failure|NCCL WARN|\bNCCL error\b|\bError\b|\bERROR\b"
                    r"|not enough slots|failure:|Segmentation fault|Aborted|timed out|Timeout)", re.I)
# The test failed, crashed or our runner did (its "ranks did not finish" is a hang, not a failure).
_FATAL = re.compile(r"Test (?:CUDA|NCCL) failure|Test failure|\bNCCL error\b|Cuda failure|Segmentation fault"
                    r"|\bBus error\b|\bAborted\b|core dumped|^# podhealth nccl_runner failure:(?!.*did not finish)")
# What launchers put before each line: mpirun --tag-output "[1,0]<stdout>:", srun --label "0: ".
_PREFIX = re.compile(r"^\s*(?:\[[0-9]{1,6},[0-9]{1,6}\]<std(?:out|err)>:|[0-9]{1,6}:(?=\s))")
_NCCL_INFO = re.compile(r"\bNCCL INFO\b")
_LAUNCHER = ("srun:", "slurmstepd:", "slurmstepd-")
_CANCELLED = re.compile(r"\bCANCELLED AT\b|\bDUE TO (?:TIME LIMIT|PREEMPTION)\b|Job step aborted|forcing job termination")
_NCCL_WARN = re.compile(r"\bNCCL WARN\b")
_HCA = re.compile(r"\b(mlx5_\d+(?::\d+)?|ibp\d+s\d+|bnxt_re\d+)\b")


def _wrong(tok: str) -> int | None:
    """#wrong is a count; "N/A" when validation is off. Before 2.10 the column was `error`, the
    largest relative error ("1e-06", "0e+00"): no count, so None (Out of bounds judges it)."""
    if tok.upper() == "N/A":
        return None
    if tok.isdigit() and len(tok) <= 18:
        return int(tok)
    value = float(tok)          # ValueError: not a number, the row is no data row
    if not math.isfinite(value) or value < 0:
        raise ValueError(tok)
    return None


def _row(line: str) -> NcclRow | None:
    toks = line.split()
    if len(toks) < 10 or not toks[0].isdigit() or not toks[1].isdigit() or len(toks[0]) > 20:
        return None  # > 20 digits: no byte count (and int * float would overflow judging it)
    try:
        tail = toks[-8:]
        row = NcclRow(
            size_bytes=int(toks[0]), count=int(toks[1]),
            dtype=toks[2] if len(toks) > 10 else "", redop=toks[3] if len(toks) > 12 else "",
            oop_time_us=float(tail[0]), oop_algbw=float(tail[1]), oop_busbw=float(tail[2]), oop_wrong=_wrong(tail[3]),
            ip_time_us=float(tail[4]), ip_algbw=float(tail[5]), ip_busbw=float(tail[6]), ip_wrong=_wrong(tail[7]),
        )
    except ValueError:
        return None
    # "inf"/"nan" (a zero time) is no measurement: a NaN compares below no gate and would pass.
    if not all(math.isfinite(v) for v in (row.oop_time_us, row.oop_algbw, row.oop_busbw,
                                           row.ip_time_us, row.ip_algbw, row.ip_busbw)):
        return None
    return row


def parse(text: str) -> NcclRun:
    """Parse all_reduce_perf (or podhealth runner) output. Never raises on odd input: lines that do
    not fit are ignored, failure lines are collected."""
    rows: list[NcclRow] = []
    devices: list[NcclDevice] = []
    errors: list[str] = []
    warnings: list[str] = []
    launcher: list[str] = []
    cancelled = ""
    avg = oob = None
    nccl_version = tests_version = ""
    started = concluded = False
    for raw in text.lstrip("\ufeff").splitlines():     # a byte-order mark from a saved file
        line = _PREFIX.sub("", raw, count=1).strip()
        if not line:
            continue
        if _NCCL_INFO.search(line):
            continue        # NCCL_DEBUG=INFO chatter ("NCCL_IB_TIMEOUT set by environment ...")
        if _NCCL_WARN.search(line):
            if len(warnings) < MAX_ERROR_LINES:
                warnings.append(line[:240])
            continue
        if line.startswith(_LAUNCHER):
            if _CANCELLED.search(line):
                cancelled = cancelled or line[:240]
            elif _ERROR.search(line) and len(launcher) < MAX_ERROR_LINES:
                launcher.append(line[:240])
            continue
        if line.startswith("#"):
            if line.startswith("# nThread"):
                started = True
            elif line.startswith("# podhealth nccl_runner failure"):
                # Our runner ran on the node and failed there (rendezvous, CUDA, NCCL): not a
                # launch problem, so it counts as started.
                started = True
                if len(errors) < MAX_ERROR_LINES:
                    errors.append(line[:240])
            elif line.startswith("# nccl-tests version"):
                tests_version = line.split()[3] if len(line.split()) > 3 else ""
            elif line.startswith("# Collective test concluded"):
                concluded = True
            elif m := _DEVICE.match(line):
                devices.append(NcclDevice(int(m.group(1)), m.group(2), int(m.group(3)), m.group(4), m.group(5).strip()))
            elif m := _AVG.match(line):
                avg = float(m.group(1))
            elif m := _OOB.match(line):
                oob = int(m.group(1))
            elif "busbw" in line or "(B)" in line:
                pass        # the column header: its "error" column (before 2.10) is no failure
            elif _ERROR.search(line) and len(errors) < MAX_ERROR_LINES:
                errors.append(line[:240])
            continue
        if line.startswith("NCCL version"):
            nccl_version = line.split()[2] if len(line.split()) > 2 else ""
            continue
        row = _row(line)
        if row is not None:
            rows.append(row)
        elif _ERROR.search(line) and len(errors) < MAX_ERROR_LINES:
            errors.append(line[:240])
    if not cancelled:   # after a cancellation, "srun: error: task 0: Killed" is the kill itself
        errors = (errors + launcher)[:MAX_ERROR_LINES]
    return NcclRun(tuple(rows), avg, oob, nccl_version, tests_version, started, concluded,
                   tuple(devices), tuple(errors), tuple(warnings), cancelled)


def hcas_in(text: str) -> tuple[str, ...]:
    """HCA / rail names mentioned in failure output (NCCL names the device in NET/IB errors)."""
    return tuple(dict.fromkeys(_HCA.findall(text)))


@dataclass(frozen=True)
class Gates:
    busbw_gbps: float = 0.0            # FAIL below (0 = no fixed gate), from the profile
    fleet_median_gbps: float = 0.0     # WARN when this % below the fleet median (0 = no median)
    fleet_slow_pct: float = 10.0
    min_bytes: int = 0                 # the gate holds for sweeps whose largest size reaches this
    required: bool = False             # no usable gate -> UNKNOWN, not OK (multi-node runs)


def multinode_gates(thresholds: Mapping[str, float], override_gbps: float = 0.0,
                    slow_pct: float = 10.0) -> Gates:
    """The two-node gate of a profile (thresholds.nccl_multinode_*), required: a SKU without one
    gets UNKNOWN verdicts, never a PASS against a gate of 0."""
    gate = override_gbps or float(thresholds.get("nccl_multinode_busbw_gbps", 0.0))
    return Gates(gate, 0.0, slow_pct, int(thresholds.get("nccl_multinode_min_bytes", 0)), required=True)


def no_gate_reason(run: NcclRun, gates: Gates) -> str:
    """Why `gates` cannot judge this run ("" when it can): no gate where one is required, or a
    sweep that stops short of the sizes the gate is stated for (in-node too: smaller messages
    never reach the NVLink plateau, and a gate read there fails healthy nodes)."""
    if gates.required and gates.busbw_gbps <= 0:
        return ("no multi-node busbw gate measured for this fabric (profile thresholds.nccl_multinode_busbw_gbps; "
                "`podhealth profile capture --nccl FILE` states the site's own from a healthy run)")
    if gates.busbw_gbps <= 0:
        return ""
    biggest = max((r.size_bytes for r in run.rows), default=0)
    if biggest < gates.min_bytes:
        return (f"largest size {biggest} B is below the {gates.min_bytes} B the gate is stated for "
                "(raise --max-bytes)")
    return ""


def judge(run: NcclRun, gates: Gates, entity: str = "node", check: str = CHECK) -> CheckResult:
    """One verdict for one all-reduce run.

    A run that never printed its header did not start (launcher, MPI slots, srun): that is
    UNKNOWN, not a node fault. A run that started and then failed, or that counted wrong values,
    is FAIL: the GPUs or the fabric broke under load.
    """
    large = run.large_busbw()
    ev: dict[str, object] = {}
    if large is not None:
        ev["busbw_large_gbps"] = round(large, 2)
        ev["max_size_bytes"] = max(r.size_bytes for r in run.rows)
    if run.avg_busbw is not None:
        ev["avg_busbw_gbps"] = run.avg_busbw
    if run.nccl_version:
        ev["nccl_version"] = run.nccl_version
    if run.errors:
        ev["error"] = run.errors[0]
    if run.warnings:
        ev["nccl_warn"] = run.warnings[0]
    wrong = sum(r.wrong for r in run.rows)
    if wrong or (run.out_of_bounds or 0) > 0:
        return fail(check, entity, f"all-reduce produced wrong values ({wrong} wrong, "
                    f"{run.out_of_bounds or 0} out of bounds)", Action.DRAIN, wrong=wrong, **ev)
    fatal = run.fatal_errors
    if run.cancelled and not fatal:
        return unknown(check, entity, f"the scheduler cancelled the run: {run.cancelled}", **ev)
    if not run.rows:
        if not run.started:
            return unknown(check, entity, "all-reduce did not start: " + (run.errors[0] if run.errors else "no output"), **ev)
        if fatal or run.warnings:   # NCCL said why (a WARN), or the test did
            return fail(check, entity, "all-reduce failed: " + (fatal or run.warnings)[0], Action.DRAIN, **ev)
        # Started, then nothing but noise: no failure of the test, no result. Killed or hung (a
        # timeout, the OOM killer, a cancelled job) says nothing about the node.
        return unknown(check, entity, "all-reduce printed its header and stopped without a result or a test "
                                      "failure (killed or hung?)", **ev)
    assert large is not None
    if fatal:
        return fail(check, entity, f"all-reduce reported errors: {fatal[0]}", Action.DRAIN, **ev)
    if not run.complete:
        return unknown(check, entity, f"all-reduce output ends at {max(r.size_bytes for r in run.rows)} B without its "
                                      "summary (killed or hung?): the sizes it reached are not judged", **ev)
    if len(run.devices) == 1 and all(r.busbw == 0 for r in run.rows):
        return unknown(check, entity, "a single rank has no bus bandwidth (nccl-tests prints 0): run one rank per GPU",
                       **ev)
    missing = no_gate_reason(run, gates)
    if not missing and gates.busbw_gbps > 0 and large < gates.busbw_gbps:
        return fail(check, entity, f"bus bandwidth {large:.1f} GB/s below the gate {gates.busbw_gbps:g} GB/s",
                    Action.DRAIN, gate_gbps=gates.busbw_gbps, **ev)
    if gates.fleet_median_gbps > 0:
        floor = gates.fleet_median_gbps * (1 - gates.fleet_slow_pct / 100)
        if large < floor:
            return warn(check, entity, f"bus bandwidth {large:.1f} GB/s is more than {gates.fleet_slow_pct:g}% "
                        f"below the fleet median {gates.fleet_median_gbps:.1f} GB/s", Action.NONE,
                        fleet_median_gbps=gates.fleet_median_gbps, **ev)
    if missing:
        return unknown(check, entity, f"bus bandwidth {large:.1f} GB/s not judged: {missing}", **ev)
    return ok(check, entity, f"bus bandwidth {large:.1f} GB/s", **ev)


def judge_hosts(run: NcclRun, gates: Gates, check: str = CHECK) -> list[CheckResult]:
    """A run that spans several hosts blames the hosts its output names (the "# Rank N ... on
    HOST device D" lines), one result each, not the host that launched it: mpirun or srun may
    run on a login node that took no part. Two hosts are judged against the two-node gate; a
    larger run is below it only as a WARN (busbw at scale is not what the gate states), to be
    localised with pair tests (`podhealth nccl --nodes`)."""
    hosts = run.hosts
    if len(hosts) < 2:
        return [judge(run, gates, "node", check)]
    r = judge(run, gates, hosts[0], check)
    if len(hosts) > 2 and r.status is Status.FAIL and "gate_gbps" in dict(r.evidence):
        r = dataclasses.replace(r, status=Status.WARN, action=Action.NONE,
                                summary=r.summary + f" (the gate is stated for 2 nodes; this run had {len(hosts)}: "
                                "localise with `podhealth nccl --nodes`)")
    ranks = {h: sum(1 for d in run.devices if d.host == h) for h in hosts}
    out = []
    for h in hosts:
        ev = (("hosts", ",".join(hosts)), ("ranks", str(ranks[h]))) + r.evidence
        out.append(dataclasses.replace(r, entity=h, evidence=ev[:MAX_EVIDENCE_ITEMS],
                                       summary=f"{len(hosts)}-node all-reduce with {', '.join(x for x in hosts if x != h)}: "
                                               f"{r.summary}"))
    return out
