"""The UI's pure JavaScript (timefmt.js: relative and UTC times; timeline.js: spans from history),
run in Node.js against the files the aggregator serves. Skips when node is not installed."""

from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from podhealth.aggregator import ui

pytestmark = pytest.mark.timeout(60)

STATIC = Path(ui.__file__).parent / "static"


def run_modules(modules: dict[str, str], expr: str) -> Any:
    """Import the named static files as ES modules (name -> file) and print `expr` as JSON. They
    are copied beside a package.json saying "type": "module": Node 18 (Debian 12's) loads a .js
    file as CommonJS without it, and only newer Nodes detect the module syntax themselves."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node (Node.js) is not installed; the browser test exercises the same code")
    with tempfile.TemporaryDirectory(prefix="podhealth-js-") as td:
        for f in STATIC.glob("*.js"):
            shutil.copy(f, td)
        (Path(td) / "package.json").write_text('{"type": "module"}\n')
        script = "".join(f"const {name} = await import({json.dumps((Path(td) / file).as_uri())});\n"
                         for name, file in modules.items())
        script += f"process.stdout.write(JSON.stringify({expr}));\n"
        out = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, text=True,
                             timeout=30, cwd=td)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def js(expr: str) -> Any:
    """Evaluate `expr` (with timefmt.js and timeline.js imported as T and L) in Node; its JSON value."""
    return run_modules({"T": "timefmt.js", "L": "timeline.js"}, expr)


NOW = 1_796_000_000.0


@pytest.mark.parametrize(("ago", "text"), [
    (0, "just now"), (4, "just now"), (42, "42 s ago"), (59, "59 s ago"), (60, "1 min ago"), (180, "3 min ago"),
    (3599, "59 min ago"), (3600, "1 h ago"), (7500, "2 h 5 min ago"), (86400, "1 d ago"),
    (3 * 86400 + 4 * 3600 + 59, "3 d 4 h ago"), (-180, "in 3 min"), (-7500, "in 2 h 5 min"),
])
def test_relative_time(ago: float, text: str) -> None:
    assert js(f"T.relTime({NOW - ago}, {NOW})") == text


def test_no_time_reads_never() -> None:
    assert js(f"[T.relTime(0, {NOW}), T.relTime(null, {NOW}), T.isoUtc(0)]") == ["never", "never", ""]


def test_iso_and_clock_are_utc() -> None:
    t = 1_764_601_572.9
    iso = dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert js(f"T.isoUtc({t})") == iso == "2025-12-01T15:06:12Z"
    assert js(f"T.clockUtc({t}, {t + 60})") == "15:06 UTC"  # same UTC day: the time only
    assert js(f"T.clockUtc({t}, {t + 86400})") == "12-01 15:06 UTC"


def test_verdict_spans_follow_opens_and_closes() -> None:
    history = [  # what the store keeps: a row when a condition opens (its status) and when it closes (OK)
        {"type": "verdict", "time": 100, "check": "xid", "entity": "gpu3", "status": "FAIL"},
        {"type": "verdict", "time": 150, "check": "gpu_thermal", "entity": "gpu1", "status": "WARN"},
        {"type": "verdict", "time": 200, "check": "xid", "entity": "gpu3", "status": "OK"},
        {"type": "verdict", "time": 260, "check": "gpu_thermal", "entity": "gpu1", "status": "OK"},
        {"type": "verdict", "time": 300, "check": "nfs_mount", "entity": "/home", "status": "UNKNOWN"},
    ]
    got = js(f"L.verdictSpans({json.dumps(list(reversed(history)))}, 50, 400)")  # newest first, as the API
    assert got["node"] == [
        {"t0": 50, "t1": 100, "status": "OK"}, {"t0": 100, "t1": 200, "status": "FAIL"},
        {"t0": 200, "t1": 260, "status": "WARN"}, {"t0": 260, "t1": 300, "status": "OK"},
        {"t0": 300, "t1": 400, "status": "UNKNOWN"},
    ]
    rows = {r["key"]: r["spans"] for r in got["rows"]}
    assert rows == {"xid gpu3": [{"t0": 100, "t1": 200, "status": "FAIL"}],
                    "gpu_thermal gpu1": [{"t0": 150, "t1": 260, "status": "WARN"}],
                    "nfs_mount /home": [{"t0": 300, "t1": 400, "status": "UNKNOWN"}]}  # still open: up to now
    assert [r["key"] for r in got["rows"]] == ["xid gpu3", "gpu_thermal gpu1", "nfs_mount /home"]


def test_fence_spans_from_the_audit_log() -> None:
    audit = [{"time": 100, "what": "fence requested"}, {"time": 101, "what": "fence done"},
             {"time": 300, "what": "release done"}, {"time": 500, "what": "fence done"}]
    assert js(f"L.fenceSpans({json.dumps(audit)}, 500, true, 0, 900)") == [{"t0": 101, "t1": 300}, {"t0": 500, "t1": 900}]
    assert js(f"L.fenceSpans({json.dumps(audit[:3])}, 0, false, 0, 900)") == [{"t0": 101, "t1": 300}]
    # fenced before the history we have: from fenced_at (or the chart's start) to now
    assert js("L.fenceSpans([], 50, true, 10, 900)") == [{"t0": 50, "t1": 900}]


def test_time_range() -> None:
    items = [{"time": NOW - 30}]
    assert js(f"L.timeRange({json.dumps(items)}, {{first_seen: {NOW - 40}}}, {NOW}, 3600)") == [NOW - 3600, NOW]
    lo, hi = js(f"L.timeRange({json.dumps(items)}, {{first_seen: {NOW - 40}}}, {NOW}, 0)")
    assert hi == NOW and lo == pytest.approx(NOW - 120 * 1.03)  # a new node: two minutes, not 40 s stretched
    lo, _ = js(f"L.timeRange([], {{first_seen: {NOW - 30 * 86400}}}, {NOW}, 0)")
    assert lo == pytest.approx(NOW - 7 * 86400 * 1.03)  # never more than a week on "auto"


def chart(expr: str) -> Any:
    return run_modules({"C": "chart.js"}, expr)


def test_fleet_samples_split_where_the_aggregator_was_away() -> None:
    times = [0, 300, 600, 5000, 5300, 20000]
    samples = [{"time": t} for t in times]
    got = chart(f"C.runs({json.dumps(samples)}, 930).map((r) => r.map((s) => s.time))")
    assert got == [[0, 300, 600], [5000, 5300], [20000]]
    assert chart("C.runs([], 930)") == []


def test_time_ticks_fall_on_round_utc_times() -> None:
    ticks = chart(f"C.timeTicks({NOW - 86400}, {NOW})")
    assert 3 <= len(ticks) <= 6 and all(t % 3600 == 0 for t in ticks)
    assert all(NOW - 86400 <= t <= NOW for t in ticks)
