"""Every parser of outside input, fuzzed: 0 crashes, only the parser's own error types come out.

Inputs start from the project's fixtures (real formats) and are mutated (tests/harness/fuzz.py).
Each test states the parser's contract: which exception it may raise (or that it never raises)
and a few invariants on what it returns (a counter is never negative, a rate is finite), because
a parser that "succeeds" with nonsense feeds a verdict just as a crash starves one.

Short and derandomized here; `scripts/fuzz.sh [examples]` runs the same tests long and random.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from podhealth.aggregator import ingest
from podhealth.fencing.slurm import parse_show_node
from podhealth.checks import profiles
from podhealth.checks.active import dcgm, localize, nccl, nccl_slurm
from podhealth.checks.passive.xid import evaluate_xids, load_catalog
from podhealth.checks.passive import ib_counters
from podhealth.collectors import ib_parse, nfs_parse, xid_parse
from podhealth.collectors.kmsg_reader import FileFollower
from podhealth.config import default_yaml, loads as config_loads
from podhealth.configload import ConfigError
from podhealth.sim import nvidia_smi
from podhealth.vocab import Event, NodeReport, Status
from tests.harness import ib_device
from tests.harness.fuzz import (
    FIXTURES, HOSTILE_NUMBERS, dumps_loose, fuzz_settings, json_bodies, mutated, mutated_doc, read, texts,
)

pytestmark = pytest.mark.timeout(300)

# ---- /proc/self/mountstats and /proc/net/rpc/nfs -------------------------------------------------

MOUNTSTATS = [read("nfs", "mountstats_dgx.txt"), read("nfs", "mountstats_variants.txt")]
RPC_NFS = [read("nfs", "rpc_nfs_dgx.txt")]


def _ints_in(obj: Any) -> list[int]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [i for x in obj for i in _ints_in(x)]
    if hasattr(obj, "__dataclass_fields__"):
        return [i for f in obj.__dataclass_fields__ for i in _ints_in(getattr(obj, f))]
    return []


@fuzz_settings()
@given(texts(MOUNTSTATS))
def test_mountstats_never_raises_and_counters_are_never_negative(text: str) -> None:
    out = nfs_parse.parse_mountstats(text)
    assert isinstance(out, nfs_parse.Mountstats)
    assert all(v >= 0 for m in out.mounts for v in _ints_in(m))
    assert len(out.problems) <= nfs_parse.MAX_PROBLEMS + 1


@fuzz_settings()
@given(texts(MOUNTSTATS))
def test_mountstats_cut_anywhere_says_so(text: str) -> None:
    """Whatever the text, `truncated` is exactly "it ends mid-line": the collector then leaves
    unlisted mounts unknown instead of missing."""
    out = nfs_parse.parse_mountstats(text)
    assert out.truncated == (text != "" and not text.endswith("\n"))


_XPRT_LINES = sorted({ln.split(":", 1)[1] for t in MOUNTSTATS for ln in t.splitlines() if ln.strip().startswith("xprt:")})
_OP_LINES = sorted({ln.strip() for t in MOUNTSTATS for ln in t.splitlines()
                    if ln.startswith("\t") and ln.strip()[:1].isupper() and ln.strip().split(":")[0].isupper()})


@fuzz_settings()
@given(texts(_XPRT_LINES), texts(_OP_LINES))
def test_xprt_and_per_op_lines_raise_only_value_error(xprt: str, op: str) -> None:
    """The two line parsers the mount parser calls, on their own: ValueError or sane values
    (tcp/udp/rdma of any length the kernels print; per-op 8 or 9 numbers)."""
    try:
        t = nfs_parse.parse_transport(xprt)
        assert t.protocol in nfs_parse.XPRT_FIELDS and all(v >= 0 for _, v in t.values)
    except ValueError:
        pass
    try:
        o = nfs_parse.parse_operation(op)
        assert all(v >= 0 for v in _ints_in(o)) and o.name and " " not in o.name
    except ValueError:
        pass


@fuzz_settings()
@given(texts(RPC_NFS))
def test_rpc_nfs_never_raises(text: str) -> None:
    out = nfs_parse.parse_rpc_nfs(text)
    assert isinstance(out, nfs_parse.RpcNfs)
    assert all(v >= 0 for v in _ints_in(out.net) + _ints_in(out.rpc) + _ints_in(out.procedures))


# ---- /sys/class/infiniband ---------------------------------------------------------------------

_TOPOLOGY_SAMPLES = ["../../../0000:aa:00.1\n", "0000:18:00.0", "1\n", "-1\n", "32.0 GT/s PCIe\n", "16.0 GT/s PCIe",
                     "Unknown\n", "16\n", "0\n", "bond0\n", "enp170s0f0np0 enp170s0f1np1\n", "\n"]


@fuzz_settings()
@given(texts(_TOPOLOGY_SAMPLES))
def test_infiniband_topology_parsers_never_raise(text: str) -> None:
    """Where a device sits (device link, numa_node, PCIe link, netdev, bond slaves): a value or
    None for anything, never an exception (roles are told without a fact sysfs did not give)."""
    pci = ib_parse.parse_pci_address(text)
    assert pci is None or isinstance(pci, str)
    numa = ib_parse.parse_numa_node(text)
    assert numa is None or numa >= 0
    gen = ib_parse.parse_pcie_speed(text)
    assert gen is None or 1 <= gen <= 6
    width = ib_parse.parse_pcie_width(text)
    assert width is None or width > 0
    netdev = ib_parse.parse_netdev(text)
    assert netdev is None or netdev == netdev.strip() != ""
    assert all(s and not any(c.isspace() for c in s) for s in ib_parse.parse_bond_slaves(text))


@fuzz_settings()
@given(st.sampled_from(sorted(ib_counters.load().widths)),
       st.one_of(st.integers(0, 2**64 + 2).map(float), st.sampled_from([float(2**w - 1) for w in (4, 8, 16, 32, 64)]),
                 st.floats(allow_nan=True, allow_infinity=True)))
def test_counter_saturation_is_all_ones_of_a_width_and_nothing_else(counter: str, value: float) -> None:
    """A counter value from sysfs (any size, even junk a float carries) is saturated only when
    it is all ones at the spec width or a wider 32/64; the width said is one of those."""
    m = ib_counters.load()
    width = m.saturated_width(counter, value)
    if width is None:
        assert not m.saturated(counter, value)
    else:
        assert width in (m.widths[counter], 32, 64) and width >= m.widths[counter]
        assert value == float((1 << width) - 1)


@fuzz_settings()
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_kernel_fallback_rate_never_raises(gbps: float) -> None:
    assert ib_parse.is_kernel_fallback_rate(gbps) in (True, False)

_IB = FIXTURES / "infiniband" / "dgx_h100" / "sys" / "class" / "infiniband"


def _ib_samples(name: str) -> list[str]:
    return sorted({p.read_text() for p in _IB.glob(f"*/ports/*/{name}")})


def _counter_samples() -> tuple[list[str], list[str]]:
    files = [p for p in _IB.glob("*/ports/*/*counters/*") if p.is_file()]
    return sorted({p.name for p in files}), sorted({p.read_text() for p in files}) + ["N/A (no PMA)\n"]


COUNTER_NAMES, COUNTER_TEXTS = _counter_samples()


@st.composite
def port_files(draw: Any) -> ib_device.PortFiles:
    attrs = {k: draw(texts(_ib_samples(k))) for k in ("state", "phys_state", "rate", "link_layer")
             if draw(st.integers(0, 5))}  # sometimes a file is missing (unreadable)
    counters = tuple((n, draw(texts(COUNTER_TEXTS))) for n in draw(st.lists(st.sampled_from(COUNTER_NAMES), max_size=6)))
    hw = tuple((n, draw(texts(COUNTER_TEXTS))) for n in draw(st.lists(st.sampled_from(COUNTER_NAMES), max_size=3)))
    port = draw(st.one_of(st.just("1"), st.sampled_from(HOSTILE_NUMBERS), st.text(max_size=4)))
    return ib_device.PortFiles(port=port, attrs=attrs, counters=counters, hw_counters=hw)


@fuzz_settings()
@given(st.lists(port_files(), max_size=3), st.dictionaries(st.sampled_from(["board_id", "fw_ver", "hca_type"]),
                                                         texts(["MT_0000000838\n", "28.39.1002\n", "MT4129\n"])))
def test_infiniband_device_never_raises_and_values_are_sane(ports: list[ib_device.PortFiles], attrs: dict[str, str]) -> None:
    out = ib_device.parse_device(ib_device.DeviceFiles(name="mlx5_0", attrs=attrs, ports=tuple(ports)))
    for p in out.device.ports:
        assert p.rate_bytes_per_second is None or (math.isfinite(p.rate_bytes_per_second)
                                                    and p.rate_bytes_per_second >= 0), p
        assert all(v >= 0 for _, v in p.counters + p.hw_counters)


@fuzz_settings()
@given(texts(COUNTER_TEXTS + _ib_samples("rate") + _ib_samples("state") + _ib_samples("phys_state")))
def test_infiniband_file_parsers_raise_only_value_error(text: str) -> None:
    for fn in (ib_parse.parse_counter, ib_parse.parse_rate, ib_parse.parse_enum):
        try:
            fn(text)
        except ValueError:
            pass
    try:
        rate = ib_parse.parse_rate(text)
    except ValueError:
        return
    assert math.isfinite(rate) and rate >= 0, (text, rate)


# ---- kernel log lines (XID / SXid / fallen off the bus) ----------------------------------------


def _kmsg_samples() -> list[str]:
    out = [ln.split("\t", 1)[0] for f in ("lines.tsv", "generations.tsv", "nvlink5_expected.tsv")
           for ln in read("kmsg", f).splitlines()[1:]]
    out += read("kmsg", "kmsg_records.log").splitlines() + read("kmsg", "syslog_kern.log").splitlines()
    return [ln for ln in out if ln.strip()]


KMSG = _kmsg_samples()


def _check_line(p: object) -> None:
    assert p is None or isinstance(p, (xid_parse.ParsedLine, xid_parse.Malformed))
    if isinstance(p, xid_parse.ParsedLine):
        assert p.code >= 0 and len(p.message) <= xid_parse.MAX_TEXT
        assert p.wall_time is None or math.isfinite(p.wall_time)
        assert p.mono_time is None or (math.isfinite(p.mono_time) and p.mono_time >= 0)


@fuzz_settings(120)
@given(texts(KMSG), st.one_of(st.none(), st.integers(1, 9999)))
def test_kernel_lines_never_raise(line: str, year: int | None) -> None:
    _check_line(xid_parse.parse(line, year=year))


@fuzz_settings()
@given(st.lists(texts(KMSG), max_size=12))
def test_kernel_line_assembler_never_raises(lines: list[str]) -> None:
    asm = xid_parse.LineAssembler()
    for ln in lines:
        _check_line(asm.feed(ln, year=2025))


@fuzz_settings()
@given(st.lists(texts(KMSG), max_size=12), st.integers(1, 5))
def test_xid_verdicts_of_any_kernel_lines_never_raise(lines: list[str], per_read: int) -> None:
    """What the parser made of hostile lines goes on to the rules (Event.kernel, NVLink5 decode,
    XID 154 states): they judge it without raising, one result per entity."""
    asm = xid_parse.LineAssembler()
    parsed = [p for p in (asm.feed(ln, year=2025) for ln in lines) if isinstance(p, xid_parse.ParsedLine)]
    events = [xid_parse.event_of(p, at=1000.0 - i * per_read, gpu=i % 2) for i, p in enumerate(parsed)]
    res = evaluate_xids(events, load_catalog(), 1000.0, 3600.0)
    assert len({(r.check, r.entity) for r in res}) == len(res)


@fuzz_settings()
@given(st.lists(texts(KMSG), max_size=10), st.integers(1, 4))
def test_followed_log_file_gives_every_line_once(tmp_path_factory: pytest.TempPathFactory, lines: list[str],
                                                per_read: int) -> None:
    """Whatever the bytes (invalid UTF-8 included: surrogateescape keeps the samples' bytes) and
    however few lines one read may take, the follower hands out each line once, in order."""
    log = tmp_path_factory.mktemp("follow") / "kern.log"
    raw = [ln.replace("\n", " ").encode("utf-8", "surrogateescape") for ln in lines]
    log.write_bytes(b"".join(x + b"\n" for x in raw))
    follower = FileFollower(log, from_start=True)
    got: list[str] = []
    for _ in range(len(raw) + 2):
        batch = follower.read(per_read, 1 << 20)
        assert batch.error == ""
        got += batch.lines
    follower.close()
    assert got == [x.decode("utf-8", "replace") for x in raw]


# ---- nvidia-smi -q -----------------------------------------------------------------------------

SMI = [read("nvidia_smi", "nvidia-smi-q_2gpu_sample.txt")]


@fuzz_settings()
@given(texts(SMI))
def test_nvidia_smi_raises_only_value_error(text: str) -> None:
    try:
        cap = nvidia_smi.parse(text)
    except ValueError:
        return
    assert cap.gpus


def test_nvidia_smi_deep_indentation_is_not_a_recursion_error() -> None:
    """Found by hand beside the fuzzer (it does not nest 3,000 deep): the clocks-event section is
    walked, and a mangled capture can indent without end."""
    text = SMI[0]
    at = text.index("Clocks Event Reasons") if "Clocks Event Reasons" in text else text.index("Clocks Throttle Reasons")
    indent = at - (text.rfind("\n", 0, at) + 1)
    eol = text.index("\n", at) + 1
    deep = "".join(" " * (indent + 4 + k) + f"K{k} : Not Active\n" for k in range(3000))
    cap = nvidia_smi.parse(text[:eol] + deep + text[eol:])
    assert len(cap.gpus) == len(nvidia_smi.parse(text).gpus) and cap.warnings


# ---- nccl-tests ---------------------------------------------------------------------------------

NCCL = [p.read_text() for p in sorted((FIXTURES / "nccl").glob("*.txt"))]


@fuzz_settings()
@given(texts(NCCL), st.floats(0, 1000))
def test_nccl_output_never_raises_and_is_judged(text: str, gate: float) -> None:
    run = nccl.parse(text)
    assert len(run.errors) <= nccl.MAX_ERROR_LINES
    verdict = nccl.judge(run, nccl.Gates(busbw_gbps=gate, fleet_median_gbps=gate))
    assert verdict.check == nccl.CHECK
    assert len(run.warnings) <= nccl.MAX_ERROR_LINES
    # A run that printed no summary line was cut short: it is never OK (judged nothing) and never
    # FAIL unless what it printed already shows wrong values or a failure.
    if run.rows and not run.complete and verdict.status is not Status.UNKNOWN:
        assert verdict.status is Status.FAIL and (run.fatal_errors or sum(r.wrong for r in run.rows)
                                                  or (run.out_of_bounds or 0) > 0)


_H100 = profiles.load("dgx-h100").thresholds


@fuzz_settings()
@given(texts(NCCL), st.integers(0, 3), st.sampled_from([0, 1, None, 137]))
def test_nccl_multinode_and_pair_judging_never_raises(text: str, prefix: int, rc: int | None) -> None:
    """The other entry points over the same output: per-host verdicts (--judge of a multi-node
    run), a pair's classification for the localiser, the HCA names, behind launcher prefixes."""
    tag = ["", "[1,0]<stdout>:", "0: ", "  "][prefix]
    text = "".join(tag + line for line in text.splitlines(keepends=True))
    run = nccl.parse(text)
    res = nccl.judge_hosts(run, nccl.multinode_gates(_H100))
    assert res and {r.entity for r in res} <= set(run.hosts) | {"node"}
    pr = nccl_slurm.classify(nccl_slurm.PairRun("dgx01", "dgx02", rc, text, run), nccl.multinode_gates(_H100), 300.0, 10.0)
    assert pr.outcome in ("pass", "fail", "unknown")
    assert pr.outcome != "pass" or (run.rows and not run.failure_lines and sum(r.wrong for r in run.rows) == 0)
    assert all(h and " " not in h for h in nccl.hcas_in(text))


_NODES = [f"dgx{i:02d}" for i in range(1, 9)]


@fuzz_settings()
@given(st.sets(st.sampled_from(_NODES), max_size=8), st.lists(st.booleans(), min_size=64, max_size=64),
       st.integers(2, 8))
def test_localisation_ends_and_never_blames_a_good_node(bad: set[str], unknown_draws: list[bool], n: int) -> None:
    """localize.plan driven to the end against an oracle (a pair fails when one of its nodes is
    bad; some tests do not run): it terminates, never repeats a pair, and a node it calls BAD is
    bad (it failed against a partner that passed a pair)."""
    nodes, draws = _NODES[:n], iter(unknown_draws)
    results: list[localize.PairResult] = []
    for _ in range(4 * n):
        p = localize.plan(nodes, results)
        if p.done:
            break
        tried = {r.key for r in results}
        for a, b in p.next_pairs:
            assert frozenset((a, b)) not in tried
            outcome = "unknown" if next(draws, False) and next(draws, False) else ("fail" if {a, b} & bad else "pass")
            results.append(localize.PairResult(a, b, outcome))  # type: ignore[arg-type]
    else:
        raise AssertionError("localisation did not end")
    for v in p.verdicts:
        assert v.state is not localize.NodeState.BAD or v.node in bad
        assert v.state is not localize.NodeState.GOOD or v.node not in bad


# ---- dcgmi diag ---------------------------------------------------------------------------------

DCGM_TEXT = [read("dcgm", "dcgmi_diag_r2_dcgm4_gpu1_fail.txt")] + [
    p.read_text() for p in sorted((FIXTURES / "dcgm").glob("*.txt")) if p.name != "dcgmi_diag_r2_dcgm4_gpu1_fail.txt"]
DCGM_JSON = [json.loads(p.read_text()) for p in sorted((FIXTURES / "dcgm").glob("*.json"))]
# `dcgmi diag --iterations 2 -j`: the runs under "iterations" (the mutations reach inside them).
DCGM_JSON.append({"iterations": DCGM_JSON[:2], "Overall Result": "Fail", "Warning": "The diagnostic failed"})


def _judge_dcgm(text: str) -> None:
    try:
        report = dcgm.parse(text)
    except dcgm.DiagParseError:
        return
    results = dcgm.results(report)
    for r in results:
        assert r.check
    # A run whose every hardware test skipped is never an all-OK answer.
    hw = [e for e in report.entries if e.category.strip().lower() != "deployment"]
    if hw and all(e.status in ("skip", "not run") for e in hw):
        assert any(r.status is Status.UNKNOWN for r in results)


@fuzz_settings()
@given(texts(DCGM_TEXT))
def test_dcgmi_text_raises_only_diag_parse_error(text: str) -> None:
    _judge_dcgm(text)


@fuzz_settings()
@given(json_bodies(DCGM_JSON))
def test_dcgmi_json_raises_only_diag_parse_error(raw: bytes) -> None:
    _judge_dcgm(raw.decode("utf-8", "surrogatepass"))


# ---- the aggregator's request bodies ----------------------------------------------------------


def _report(node: str = "dgx01", t: float = 1000.0) -> dict[str, Any]:
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t, "status": "FAIL",
            "action": "RESET_GPU", "staleness": {"nvml": 0.2},
            "results": [{"check": "xid", "entity": "GPU0", "status": "FAIL", "action": "RESET_GPU", "since": t - 5,
                         "evidence": {"xid": "79"}, "summary": "fell off the bus"},
                        {"check": "nfs", "entity": "/home", "status": "OK", "action": "NONE"}]}


REPORTS = [_report(), {"node": "dgx01", "time": 1010.0, "digest": "0123456789abcdef", "agent_version": "0.1.0",
                       "status": "FAIL", "staleness": {"nvml": 0.2}}]
EVENTS = [{"node": "dgx01", "events": [
    {"id": "e1", "type": "event", "time": 1000.0,
     "event": {"kind": "xid", "code": 79, "time": 1000.0, "text": "NVRM: Xid 79", "id": "e1"}},
    {"id": "t1", "type": "transition", "time": 1000.0, "old": None,
     "new": {"check": "xid", "entity": "GPU1", "status": "FAIL", "action": "RESET_GPU", "since": 1000.0}},
    {"id": "r1", "type": "report", "time": 1000.0, "report": _report()},
    {"id": "s1", "type": "summary", "time": 1000.0, "first": 900.0, "last": 1000.0, "count": 3,
     "counts": {"event:xid:79": 3}}]}]
ALERTS = [{"alerts": [{"status": "firing", "fingerprint": "abc123", "startsAt": "2025-03-04T10:20:30.123456789Z",
                       "labels": {"node": "dgx03", "alertname": "PodhealthGpuFallenOffBus", "gpu": "5",
                                  "action": "DRAIN", "severity": "critical"},
                       "annotations": {"summary": "GPU 5 fell off the bus"}}]}]


@fuzz_settings(120)
@given(json_bodies(REPORTS))
def test_posted_reports_raise_only_bad_request(raw: bytes) -> None:
    try:
        out = ingest.read_posted(raw)
    except ingest.BadRequest:
        return
    assert math.isfinite(out.time)
    if isinstance(out, ingest.ParsedReport):
        assert all(math.isfinite(v.since) for v in out.verdicts)


@fuzz_settings(120)
@given(json_bodies(EVENTS))
def test_event_batches_raise_only_bad_request(raw: bytes) -> None:
    try:
        batch = ingest.parse_events(ingest.loads(raw))
    except ingest.BadRequest:
        return
    assert all(math.isfinite(e.time) for e in batch.events)


@fuzz_settings()
@given(json_bodies(ALERTS))
def test_alertmanager_webhooks_raise_only_bad_request(raw: bytes) -> None:
    try:
        alerts = ingest.parse_alertmanager(ingest.loads(raw), 1000.0, ingest.parse_rfc3339)
    except ingest.BadRequest:
        return
    assert all(math.isfinite(a.time) for a in alerts)


def _event_bodies() -> list[dict[str, Any]]:
    """The collector's own events as an agent sends them (with Event.kernel), and as an older one did."""
    events = [xid_parse.event_of(p, at=1000.0, gpu=0) for p in (xid_parse.parse_line(x) for x in KMSG) if p is not None]
    bodies = [{**e.to_json(), "id": f"e{i}"} for i, e in enumerate(events)  # fixed ids: the same seeds every run
              if e.kernel is not None and (e.kernel.nvlink5 or e.kernel.recovery or e.kernel.fatal is not None)][:6]
    return bodies + [{k: v for k, v in b.items() if k != "kernel"} for b in bodies[:2]]


@fuzz_settings(120)
@given(json_bodies(_event_bodies()))
def test_event_json_raises_only_value_or_key_error_and_round_trips(raw: bytes) -> None:
    """Event.from_json (an agent's event read back: spool, bundle, tests) and the one parser's
    completion of an event without fields (what the XID rules run on every event)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return
    try:
        ev = Event.from_json(doc)
    except (ValueError, KeyError):
        return
    assert Event.from_json(json.loads(json.dumps(ev.to_json()))) == ev or not math.isfinite(ev.time)
    done = xid_parse.with_kernel_fields(ev)
    assert done.kernel is not None or ev.kind not in ("xid", "sxid", "kernel")


@fuzz_settings()
@given(json_bodies([_report()]))
def test_agent_health_json_raises_only_value_or_key_error(raw: bytes) -> None:
    """What `podhealth slurm-health` reads from the agent's /health (it catches these two)."""
    try:
        doc = json.loads(raw)
    except ValueError:
        return
    except RecursionError:  # the json module's own limit on nesting, before from_json runs
        return
    try:
        NodeReport.from_json(doc)
    except (ValueError, KeyError):
        pass


# ---- config YAML --------------------------------------------------------------------------------

CONFIG_TEXT = default_yaml()
CONFIG_DOC = yaml.safe_load(CONFIG_TEXT)
YAML_SPECIALS = ("!!int abc", "!!float x", "!!binary ~~", "!!timestamp 2025-13-45", "!custom 3", "&a [*a]", "*nope",
                 "<<: *a", "? [a]\n: b", "!!python/object:os.system x", "{a: [1, {b: 2}]}", "'x", "--- a\n--- b",
                 "1" + "0" * 5000, ".nan", "-.inf", "0o777", "0b101", "1_0", "@", "%YAML 9.9", "\x00", "\t")


@st.composite
def config_texts(draw: Any) -> str:
    choice = draw(st.integers(0, 2))
    if choice == 0:
        return draw(mutated([CONFIG_TEXT]))
    doc = draw(mutated_doc([CONFIG_DOC]))
    try:
        text = yaml.safe_dump(doc, allow_unicode=True)
    except (yaml.YAMLError, UnicodeError):
        text = CONFIG_TEXT
    if choice == 2:  # a YAML oddity as some key's value
        lines = text.splitlines()
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        if lines and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            lines[i] = f"{key}: {draw(st.sampled_from(YAML_SPECIALS))}"
        text = "\n".join(lines) + "\n"
    return text


@fuzz_settings(120)
@given(config_texts())
def test_config_raises_only_config_error(text: str) -> None:
    try:
        config_loads(text, "fuzz.yaml")
    except ConfigError as e:
        assert str(e).startswith("fuzz.yaml")


# ---- scontrol show node (the Slurm fencer's view of a node) ------------------------------------

SCONTROL = [p.read_text() for p in sorted((FIXTURES / "slurm").glob("scontrol_show_node*.txt"))]


@fuzz_settings()
@given(texts(SCONTROL))
def test_scontrol_show_node_never_raises(text: str) -> None:
    for n in parse_show_node(text):
        assert n.name


def test_the_samples_themselves_parse() -> None:
    """The seeds are what the mutations start from: they must be valid input (else the fuzz
    tests only ever exercise the error paths)."""
    assert nfs_parse.parse_mountstats(MOUNTSTATS[0]).malformed == 0
    assert nfs_parse.parse_rpc_nfs(RPC_NFS[0]).malformed == 0
    assert sum(isinstance(xid_parse.parse(ln), xid_parse.ParsedLine) for ln in KMSG) >= len(KMSG) // 2
    assert nvidia_smi.parse(SMI[0]).gpus
    assert all(nccl.parse(t).started for t in NCCL)
    assert all(dcgm.parse(t).entries for t in DCGM_TEXT) and all(dcgm.results(dcgm.parse(json.dumps(d))) for d in DCGM_JSON)
    assert isinstance(ingest.read_posted(dumps_loose(REPORTS[0])), ingest.ParsedReport)
    assert isinstance(ingest.read_posted(dumps_loose(REPORTS[1])), ingest.Lease)
    assert len(ingest.parse_events(EVENTS[0]).events) == 4
    assert len(ingest.parse_alertmanager(ALERTS[0], 0.0, ingest.parse_rfc3339)) == 1
    config_loads(CONFIG_TEXT, "default.yaml")
    assert all(parse_show_node(t) for t in SCONTROL)
    assert Path(FIXTURES).is_dir()
