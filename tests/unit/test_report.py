"""Handover report rendering: exit codes, JSON round trip, JUnit, folded table; bad JSON rejected."""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET

import pytest

from podhealth.checks.handover.report import SuiteReport, render
from podhealth.vocab import Action, CheckResult, Status, evidence_of


def rep(*statuses: Status) -> SuiteReport:
    results = tuple(CheckResult("ecc", s, f"gpu{i}", evidence_of(uncorrected_volatile=i),
                                Action.RESET_GPU if s is Status.FAIL else Action.NONE, summary=f"s{i}")
                    for i, s in enumerate(statuses))
    return SuiteReport("dgx01", "dgx-h100", results, (("ecc", 0.5),), notes=("collector disabled — dcgm: no bindings",))


@pytest.mark.parametrize("statuses, code, word", [
    ((Status.OK, Status.OK), 0, "PASS"), ((Status.OK, Status.WARN), 0, "PASS (with warnings)"),
    ((Status.OK, Status.FAIL, Status.UNKNOWN), 1, "FAIL"), ((Status.OK, Status.UNKNOWN), 2, "UNDECIDED"), ((), 2, "UNDECIDED"),
])
def test_exit_codes_and_summary(statuses: tuple[Status, ...], code: int, word: str) -> None:
    r = rep(*statuses)
    assert r.exit_code == code and f"dgx01: {word}:" in r.summary()


def test_json_round_trip() -> None:
    r = rep(Status.OK, Status.FAIL)
    out = io.StringIO()
    render(r, "json", out)
    back = SuiteReport.from_json(json.loads(out.getvalue()))
    assert back.results == r.results and back.durations == r.durations and back.notes == r.notes


@pytest.mark.parametrize("bad", [{}, {"results": "x"}, {"results": [], "durations": []}, {"results": [{"check": "x"}]}])
def test_bad_report_json_is_rejected(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises((ValueError, KeyError)):
        SuiteReport.from_json(bad)


def test_junit_marks_failures_and_unknowns() -> None:
    out = io.StringIO()
    render(rep(Status.OK, Status.FAIL, Status.UNKNOWN), "junit", out)
    suite = ET.fromstring(out.getvalue().split("?>", 1)[1])
    assert suite.get("failures") == "1" and suite.get("skipped") == "1" and suite.get("tests") == "3"
    fail = [c for c in suite.iter("testcase") if c.find("failure") is not None][0]
    assert fail.get("name") == "gpu1" and fail.find("failure").get("type") == "RESET_GPU"  # type: ignore[union-attr]


def test_table_folds_ok_rows_and_shows_problems_and_notes() -> None:
    out = io.StringIO()
    render(rep(*([Status.OK] * 8), Status.FAIL), "table", out)
    text = out.getvalue()
    assert "gpu0 … gpu7 (8)" in text and "gpu8" in text and "RESET_GPU" in text
    assert "collector disabled" in text and "dgx01: FAIL" in text
    verbose = io.StringIO()
    render(rep(*([Status.OK] * 8), Status.FAIL), "table", verbose, verbose=True)
    assert "gpu3" in verbose.getvalue()


def test_summary_names_the_fails_first_then_warns_then_counts_unknowns() -> None:
    # as found on a fresh node: five UNKNOWNs in table order before three real FAILs
    results = (*(CheckResult("gpu_count", Status.UNKNOWN, f"e{i}") for i in range(5)),
               CheckResult("ib_port", Status.FAIL, "mlx5_1/1"), CheckResult("nfs_mount", Status.FAIL, "/home"),
               CheckResult("nfs_mount", Status.FAIL, "/scratch"), CheckResult("thermal", Status.WARN, "gpu3"),
               CheckResult("ecc", Status.OK, "gpu0"))
    line = SuiteReport("dgx01", "dgx-h100", results).summary()
    assert line == ("dgx01: FAIL: 3 fail (ib_port:mlx5_1/1, nfs_mount:/home, nfs_mount:/scratch), "
                    "1 warn (thermal:gpu3), 5 unknown, 1 ok")
    # undecided: the UNKNOWNs are the reason, so they are named (five, then a count)
    undecided = SuiteReport("dgx01", "dgx-h100", results[:5] * 2).summary()
    assert undecided.startswith("dgx01: UNDECIDED: 10 unknown (gpu_count:e0, ") and undecided.endswith("+5 more)")
