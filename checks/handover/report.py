"""Rendering a handover/check report: a rich table for people, JSON and JUnit XML for machines.

Exit codes are part of the contract: 0 pass, 1 fail, 2 could not decide (UNKNOWN or no answer).
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import IO, Sequence

from podhealth.exitcodes import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from podhealth.vocab import CheckResult, Status

__all__ = ["EXIT_FAIL", "EXIT_PASS", "EXIT_UNKNOWN", "SuiteReport", "render", "worst_exit"]


@dataclass(frozen=True)
class SuiteReport:
    node: str
    profile: str
    results: tuple[CheckResult, ...]
    durations: tuple[tuple[str, float], ...] = ()  # check -> seconds
    started: float = 0.0
    finished: float = 0.0
    notes: tuple[str, ...] = field(default=())

    @property
    def status(self) -> Status:
        if not self.results:
            return Status.UNKNOWN
        return Status.worst([r.status for r in self.results])

    @property
    def exit_code(self) -> int:
        s = self.status
        if s is Status.FAIL:
            return EXIT_FAIL
        if s is Status.UNKNOWN:
            return EXIT_UNKNOWN
        return EXIT_PASS

    def summary(self) -> str:
        """One line that names what matters, worst first: the FAILs, then the WARNs, then how many
        were UNKNOWN (named only when nothing failed: then they are why the report is undecided),
        then the OKs. In table order, five UNKNOWNs used to hide three real FAILs here; the
        aggregator's handover audit carries the same line."""
        by = {s: [f"{r.check}:{r.entity}" for r in self.results if r.status is s] for s in Status}
        head = {Status.OK: "PASS", Status.WARN: "PASS (with warnings)", Status.FAIL: "FAIL",
                Status.UNKNOWN: "UNDECIDED"}[self.status]
        named = {Status.FAIL: True, Status.WARN: True, Status.UNKNOWN: not by[Status.FAIL], Status.OK: False}
        parts = [f"{len(by[s])} {s.value.lower()}" + (f" ({_first(by[s])})" if named[s] else "")
                 for s in (Status.FAIL, Status.WARN, Status.UNKNOWN, Status.OK) if by[s]]
        return f"{self.node}: {head}: {', '.join(parts) or 'no results'}"

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "profile": self.profile, "status": self.status.value,
                "exit_code": self.exit_code, "summary": self.summary(), "started": self.started,
                "finished": self.finished, "durations": dict(self.durations), "notes": list(self.notes),
                "results": [r.to_json() for r in self.results]}

    @classmethod
    def from_json(cls, d: dict[str, object]) -> "SuiteReport":
        res = d.get("results")
        if not isinstance(res, list):
            raise ValueError("report has no results list")
        dur, notes = d.get("durations", {}), d.get("notes", [])
        if not isinstance(dur, dict) or not isinstance(notes, list):
            raise ValueError("durations must be an object and notes a list")
        return cls(node=str(d.get("node", "")), profile=str(d.get("profile", "")),
                   results=tuple(CheckResult.from_json(r) for r in res),
                   durations=tuple((str(k), float(v)) for k, v in dur.items()),
                   started=float(d.get("started", 0.0)), finished=float(d.get("finished", 0.0)),  # type: ignore[arg-type]
                   notes=tuple(str(n) for n in notes))


SUMMARY_NAMES = 5


def _first(names: Sequence[str]) -> str:
    more = len(names) - SUMMARY_NAMES
    return ", ".join(names[:SUMMARY_NAMES]) + (f", +{more} more" if more > 0 else "")


_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.UNKNOWN: "magenta"}


def _entities(names: list[str]) -> str:
    """`gpu0..gpu7` style compaction for a list of OK entities, so a DGX report fits a screen."""
    if len(names) <= 3:
        return ", ".join(names)
    return f"{names[0]} … {names[-1]} ({len(names)})"


def render_table(rep: SuiteReport, out: IO[str], verbose: bool = False) -> None:
    """Problems one per row with their evidence; OK results folded into one row per check."""
    from rich.table import Table

    from podhealth.console import console as make_console, plain

    console = make_console(out, min_width=100)
    durs = dict(rep.durations)
    t = Table(title=plain(f"podhealth handover — {rep.node} ({rep.profile})"), show_lines=False)
    for col in ("check", "entity", "status", "action", "evidence", "duration"):
        t.add_column(col, overflow="fold")
    by_check: dict[str, list[CheckResult]] = {}
    for r in rep.results:
        by_check.setdefault(r.check, []).append(r)
    for check, results in by_check.items():
        dur = f"{durs[check]:.2f}s" if check in durs else ""
        oks = [r for r in results if r.status is Status.OK]
        for r in results:
            if r.status is Status.OK and not verbose:
                continue
            ev = r.summary or ", ".join(f"{k}={v}" for k, v in r.evidence)
            if r.summary and r.evidence:
                ev += " (" + ", ".join(f"{k}={v}" for k, v in r.evidence[:4]) + ")"
            t.add_row(plain(check), plain(r.entity), f"[{_STYLE[r.status]}]{r.status.value}[/]",
                      r.action.value if r.status is not Status.OK else "", plain(ev), dur)
        if oks and not verbose:
            sample = oks[0].summary or ", ".join(f"{k}={v}" for k, v in oks[0].evidence[:3])
            t.add_row(plain(check), plain(_entities([r.entity for r in oks])), f"[{_STYLE[Status.OK]}]OK[/]", "",
                      plain(sample) if len(oks) == 1 else "", dur)
    console.print(t)
    for note in rep.notes:
        console.print(f"[dim]note: {plain(note)}[/]")
    console.print(f"[{_STYLE[rep.status]}]{plain(rep.summary())}[/]")


def render_json(rep: SuiteReport, out: IO[str]) -> None:
    json.dump(rep.to_json(), out, indent=2)
    out.write("\n")


def render_junit(rep: SuiteReport, out: IO[str]) -> None:
    durs = dict(rep.durations)
    suite = ET.Element("testsuite", name=f"podhealth.{rep.node}", tests=str(len(rep.results)),
                       failures=str(sum(r.status is Status.FAIL for r in rep.results)),
                       skipped=str(sum(r.status is Status.UNKNOWN for r in rep.results)),
                       errors="0", time=f"{sum(durs.values()):.3f}")
    for r in rep.results:
        case = ET.SubElement(suite, "testcase", classname=f"{rep.node}.{r.check}", name=r.entity,
                             time=f"{durs.get(r.check, 0.0):.3f}")
        text = "\n".join(f"{k}={v}" for k, v in r.evidence)
        if r.status is Status.FAIL:
            f = ET.SubElement(case, "failure", message=r.summary or "FAIL", type=r.action.value)
            f.text = text
        elif r.status is Status.UNKNOWN:
            ET.SubElement(case, "skipped", message=r.summary or "could not decide")
        elif r.status is Status.WARN:
            so = ET.SubElement(case, "system-out")
            so.text = f"WARN: {r.summary}\n{text}"
    out.write(ET.tostring(suite, encoding="unicode", xml_declaration=True))
    out.write("\n")


def render(rep: SuiteReport, fmt: str, out: IO[str], verbose: bool = False) -> None:
    if fmt == "table":
        render_table(rep, out, verbose)
    else:
        {"json": render_json, "junit": render_junit}[fmt](rep, out)


def worst_exit(reports: Sequence[SuiteReport]) -> int:
    codes = [r.exit_code for r in reports]
    return EXIT_FAIL if EXIT_FAIL in codes else EXIT_UNKNOWN if EXIT_UNKNOWN in codes else EXIT_PASS
