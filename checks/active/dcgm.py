"""DCGM diagnostics: run `dcgmi diag -r N -j`, parse its output, judge one result per (test, GPU).

Three output shapes are understood, all into the same `DiagReport`:
- DCGM 4 JSON (`"DCGM Diagnostic"`, results per entity with error_id/category/severity),
- the legacy JSON (`"DCGM GPU Diagnostic"`, version 1.7: `gpu_ids: "0,1,2,3"` per result; DCGM
  2/3's dcgmi: `gpu_id: "0"` per result, metadata at the top level, deployment warnings whose
  message sits under "warnings"), and `--iterations N` runs (`"iterations": [run, ...]`),
- the text table `dcgmi diag -r N` prints without -j (DCGM 3 "Pass - All" / "Pass - GPUs: 0, 1"
  rows with "GPU n ..." warnings and "Error" rows, and DCGM 4 rows with per-GPU "GPUn: Pass" lines).
Log lines before the JSON (dcgm logging to stdout, a wrapper's banner) and text after it are
skipped. A run in which every hardware test skipped a GPU (MIG mode, a SKU without parameters)
tested nothing there: that GPU is UNKNOWN, not OK.
What a failure code asks for lives in checks/data/dcgm_errors.yaml, not here. Parsers are pure;
`run_diag` is the only I/O and never reports OK without output it could parse.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping, Sequence

from podhealth import subproc, yamldata
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.vocab import Action, CheckResult, Status

CHECK = "dcgm_diag"
# Seconds per run level: r1 is a quick deployment check, r3 runs the long stress plugins.
DEFAULT_TIMEOUTS: Mapping[int, float] = {1: 120.0, 2: 900.0, 3: 3600.0, 4: 7200.0}
MAX_OUTPUT = 16 * 1024 * 1024
KILL_GRACE_S = 3.0  # after SIGTERM at the timeout, before SIGKILL


@dataclass(frozen=True)
class DiagWarning:
    text: str
    error_id: int | None = None
    category: int | None = None
    severity: int | None = None


@dataclass(frozen=True)
class DiagEntry:
    """One test's outcome for one GPU (gpu=None: for the node / the test as a whole)."""

    test: str
    category: str
    gpu: int | None
    status: str                  # pass | fail | warn | skip | not run
    warnings: tuple[DiagWarning, ...] = ()
    info: tuple[str, ...] = ()


@dataclass(frozen=True)
class DiagReport:
    entries: tuple[DiagEntry, ...]
    format: str                  # dcgm4-json | legacy-json | text
    version: str = ""
    driver: str = ""
    runtime_error: str = ""


class DiagParseError(ValueError):
    pass


def _status(s: object) -> str:
    t = str(s or "").strip().lower()
    return {"passed": "pass", "failed": "fail", "skipped": "skip", "warning": "warn",
            "notrun": "not run", "not_run": "not run"}.get(t, t)


def _int(v: object) -> int | None:
    try:
        return int(v)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError, OverflowError):  # OverflowError: JSON's Infinity
        return None


def _list(v: object) -> list[Any]:
    """A JSON list where one is expected; anything else (a number, a string) holds no entries."""
    return v if isinstance(v, list) else []


def _warnings(items: object) -> tuple[DiagWarning, ...]:
    out: list[DiagWarning] = []
    for w in items if isinstance(items, list) else []:
        if isinstance(w, Mapping):
            # DCGM 3's deployment results put the message under "warnings" (sic) in each warning.
            text = next((w[k] for k in ("warning", "warnings", "error") if isinstance(w.get(k), str)), "")
            out.append(DiagWarning(text, _int(w.get("error_id")),
                                   _int(w.get("error_category")), _int(w.get("error_severity"))))
        elif isinstance(w, str):
            out.append(DiagWarning(w))
    return tuple(out)


def _info(v: object) -> tuple[str, ...]:
    if isinstance(v, list):
        return tuple(" ".join(str(x).split()) for x in v)
    return (" ".join(str(v).split()),) if v else ()


def parse_json(text: str) -> DiagReport:
    """DCGM 4 or legacy `dcgmi diag -j` JSON (text after the object is ignored). Raises
    DiagParseError when it is neither."""
    try:
        doc, _ = json.JSONDecoder().raw_decode(text.lstrip())
    except ValueError as e:  # JSONDecodeError, or an integer literal of more than 4,300 digits
        raise DiagParseError(f"not JSON: {e}") from None
    except RecursionError:
        raise DiagParseError("not JSON: nested too deeply") from None
    if not isinstance(doc, dict):
        raise DiagParseError("JSON top level is not an object")
    if isinstance(doc.get("iterations"), list) and "DCGM Diagnostic" not in doc and "DCGM GPU Diagnostic" not in doc:
        runs = [_json_report(it) for it in doc["iterations"] if isinstance(it, dict)]
        if not runs:
            raise DiagParseError("'iterations' holds no diagnostic run")
        return _merge(runs)
    return _json_report(doc)


def _merge(runs: Sequence[DiagReport]) -> DiagReport:
    """`dcgmi diag --iterations N`: one result per (test, GPU), the worst any iteration gave."""
    worst: dict[tuple[str, str, int | None], DiagEntry] = {}
    for r in runs:
        for e in r.entries:
            key = (e.category, e.test, e.gpu)
            if key not in worst or _RANK.get(e.status, 0) > _RANK.get(worst[key].status, 0):
                worst[key] = e
    errors = "; ".join(dict.fromkeys(r.runtime_error for r in runs if r.runtime_error))
    return DiagReport(tuple(worst.values()), runs[0].format, runs[0].version, runs[0].driver, errors)


def _json_report(doc: Mapping[str, Any]) -> DiagReport:
    if isinstance(doc.get("DCGM Diagnostic"), dict):
        body, fmt = doc["DCGM Diagnostic"], "dcgm4-json"
    elif isinstance(doc.get("DCGM GPU Diagnostic"), dict):
        body, fmt = doc["DCGM GPU Diagnostic"], "legacy-json"
    else:
        raise DiagParseError("no 'DCGM Diagnostic' or 'DCGM GPU Diagnostic' object")
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    # DCGM 4 keeps these under "metadata", DCGM 2/3 beside the diagnostic object, 1.7 inside it.
    version = str(meta.get("version") or body.get("version") or doc.get("version") or "")
    driver = str(meta.get("Driver Version Detected") or body.get("Driver Version Detected")
                 or doc.get("Driver Version Detected") or "")
    entries: list[DiagEntry] = []
    for cat in _list(body.get("test_categories")):
        if not isinstance(cat, dict):
            continue
        cname = str(cat.get("category", ""))
        for test in _list(cat.get("tests")):
            if not isinstance(test, dict):
                continue
            entries.extend(_json_test(test, cname))
    return DiagReport(tuple(entries), fmt, version, driver, str(body.get("runtime_error") or ""))


def _json_test(test: Mapping[str, Any], cname: str) -> list[DiagEntry]:
    name = str(test.get("name", "?"))
    out: list[DiagEntry] = []
    for r in _list(test.get("results")):
        if not isinstance(r, dict):
            continue
        st, ws, info = _status(r.get("status")), _warnings(r.get("warnings")), _info(r.get("info"))
        if "gpu_ids" in r:   # legacy: one result may cover several GPUs
            ids = [_int(x) for x in str(r["gpu_ids"]).split(",") if x.strip()]
            gpus: list[int | None] = [i for i in ids if i is not None] or [None]
        elif "gpu_id" in r:  # DCGM 2/3 dcgmi: "gpu_id": "0" (a number on deployment results)
            gpus = [_int(r["gpu_id"])]
        elif str(r.get("entity_group", "GPU")).upper() == "GPU":
            gpus = [_int(r.get("entity_id"))]
        else:                # CPU / switch entities: kept, named by the test, at node level
            gpus = [None]
        out.extend(DiagEntry(name, cname, g, st, ws, info) for g in gpus)
    summary = test.get("test_summary")
    if isinstance(summary, dict):
        st = _status(summary.get("status"))
        ws = _warnings(summary.get("warnings") or test.get("warnings"))
        if _RANK.get(st, 0) > max((_RANK.get(e.status, 0) for e in out), default=-1):
            # The test failed as a whole (e.g. an internal error) while no entity did.
            out.append(DiagEntry(name, cname, None, st, ws, _info(summary.get("info"))))
    return out


_RANK = {"pass": 0, "skip": 0, "not run": 0, "warn": 1, "fail": 2}

# --- text table --------------------------------------------------------------------------------

# A section's border, "|-----  Metadata  ----------+---...|": what runs to the first | or + is
# read once, the title split from its dashes in _section (a lazy title before "\s+-+" retried
# the spaces after every character: a line of 64 K spaces took seconds).
_SECTION = re.compile(r"[|+]-+\s+(\S[^|+]*)[|+]")
_RESULT = re.compile(r"\b(Pass|Fail|Skip|Warn)\b(?:\s*-\s*(All|GPUs?:\s*[\d,\s]+))?", re.I)
# GPU indices: ASCII digits, a few of them (regex \d takes any script's digits, int() refuses
# more than 4,300 of them; no node has 10,000 GPUs).
_GPU_ROW = re.compile(r"^GPU\s?([0-9]{1,4}):\s*(Pass|Fail|Skip|Warn)\b", re.I)
_GPU_IN_TEXT = re.compile(r"\bGPU\s?:?\s?([0-9]{1,4})\b")   # "GPU 2", "GPU2", DCGM 4.5's "the GPU: 2"


@dataclass
class _TextTest:
    name: str
    category: str
    result: list[str] = field(default_factory=list)
    gpu_rows: dict[int, str] = field(default_factory=dict)
    warnings: list[list[str]] = field(default_factory=list)
    info: list[list[str]] = field(default_factory=list)


def _join(chunks: Sequence[str], width: int) -> str:
    """Undo DCGM's wrapping: it cuts text every width-1 characters (mid-word, the cell keeps one
    space of padding); a shorter chunk ended at a word boundary whose space was dropped."""
    out, full = "", True
    for c in chunks:
        body = c[: width - 1]
        out = out + body if full else out.rstrip() + " " + body.lstrip()
        full = len(body.rstrip()) >= width - 1
    return " ".join(out.split())


def _section(line: str) -> str | None:
    """The title of a section border line, or None: the text before the dashes that end at the
    border (at least one space between them)."""
    m = _SECTION.match(line)
    if m is None:
        return None
    head = m.group(1)
    title = head.rstrip("-")
    if len(title) == len(head) or title == title.rstrip():
        return None
    return title.strip()


def parse_text(text: str) -> DiagReport:
    """The `dcgmi diag -r N` table (DCGM 3 and 4 layouts). Raises DiagParseError without a table."""
    section = ""
    meta: dict[str, str] = {}
    tests: list[_TextTest] = []
    cur: _TextTest | None = None
    target: list[str] | None = None     # the cell continuation rows extend
    width = 46
    seen_table = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if (title := _section(line)) is not None:
            section, cur, target = title, None, None
            continue
        if not line.startswith("|") or not line.endswith("|") or line.count("|") < 3:
            continue
        seen_table = True
        mid = line.index("|", 1)
        left = line[1:mid].strip()
        right = line[mid + 2:-2] if len(line) >= mid + 4 else ""
        width = max(width, len(right))
        if left in ("Diagnostic",) and right.strip() == "Result":
            continue
        if section.lower() == "metadata":
            if left:
                meta[left] = right.strip()
            continue
        if not left:
            if cur is not None and (g := _GPU_ROW.match(right.strip())):
                cur.gpu_rows[int(g.group(1))] = _status(g.group(2))
                target = None
            elif target is not None:
                target.append(right)
            continue
        # DCGM 3 prints a deployment test's messages as "Error" rows, the plugins' as "Warning":
        # both say why the test failed (and carry the text the codes are read from).
        if cur is not None and left.lower() in ("warning", "error"):
            cur.warnings.append([right])
            target = cur.warnings[-1]
        elif cur is not None and left.lower() == "info":
            cur.info.append([right])
            target = cur.info[-1]
        else:
            cur = _TextTest(left, section, [right])
            tests.append(cur)
            target = cur.result
    if not seen_table:
        # dcgmi's refusals are one line ("Error: Unable to complete diagnostic ... Host engine is
        # not loaded", "GPU 0's MIG configuration is incompatible ..."): say it.
        first = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
        raise DiagParseError("no dcgmi diag table found" + (f": {first[:200]}" if first else ""))
    # "GPU Device IDs Detected"; later builds say "GPU PCI Device IDs Detected".
    detected = next((v for k, v in meta.items() if "device ids" in k.lower()), "")
    ids = [x for x in re.split(r"[,\s]+", detected) if x]
    entries: list[DiagEntry] = []
    for t in tests:
        entries.extend(_text_entries(t, len(ids), width))
    return DiagReport(tuple(entries), "text", meta.get("DCGM Version", ""), meta.get("Driver Version Detected", ""))


def _text_entries(t: _TextTest, ngpus: int, width: int) -> list[DiagEntry]:
    result = _join(t.result, width)
    warns = [_join(w, width) for w in t.warnings]
    info = tuple(_join(i, width) for i in t.info)
    per_gpu: dict[int, str] = {}
    summary = ""
    for m in _RESULT.finditer(result):
        st, scope = _status(m.group(1)), (m.group(2) or "")
        if scope.lower() == "all":
            per_gpu.update({g: st for g in range(ngpus)})
            summary = st if _RANK.get(st, 0) >= _RANK.get(summary, -1) else summary
        elif scope:
            per_gpu.update({int(g): st for g in re.findall(r"\b[0-9]{1,4}\b", scope)})
        else:
            summary = st
    per_gpu.update(t.gpu_rows)
    if not summary:
        summary = max(per_gpu.values(), key=lambda s: _RANK.get(s, 0), default="")
    if not summary and not per_gpu:
        return []
    by_gpu: dict[int | None, list[DiagWarning]] = {}
    for w in warns:
        g = _GPU_IN_TEXT.search(w)
        gpu = int(g.group(1)) if g and int(g.group(1)) in per_gpu else None
        by_gpu.setdefault(gpu, []).append(DiagWarning(w))
    out = [DiagEntry(t.name, t.category, g, st, tuple(by_gpu.get(g, ())), info) for g, st in sorted(per_gpu.items())]
    worst = max((_RANK.get(e.status, 0) for e in out), default=-1)
    if not out or _RANK.get(summary, 0) > worst or (by_gpu.get(None) and _RANK.get(summary, 0) > 0):
        out.append(DiagEntry(t.name, t.category, None, summary, tuple(by_gpu.get(None, ())), info))
    return out


MAX_JSON_STARTS = 64    # lines opening with "{" tried as the start of the JSON, bounded


def parse(text: str) -> DiagReport:
    """JSON when it looks like JSON, else the text table."""
    text = text.lstrip("\ufeff")     # a byte-order mark from a file saved on Windows
    body = text.strip()
    if body.startswith("{"):
        return parse_json(body)
    # Log lines before the JSON (dcgm logging on stdout, "Executing in Pod ..." from a kubectl
    # wrapper): the object starts at a line that opens with "{". The first that parses wins.
    starts = [m.start() for m in re.finditer(r"^[ \t]*\{", body, re.M)][:MAX_JSON_STARTS]
    for start in starts:
        try:
            return parse_json(body[start:])
        except DiagParseError:
            continue
    return parse_text(text)


# --- judging -----------------------------------------------------------------------------------

# How much of a warning the data file's patterns read. DCGM's messages are a few hundred
# characters; a pattern such as "ECC .*disabled" reads the rest of the text again from every
# "ECC ", so a 64 KiB warning of them took seconds.
MATCH_CHARS = 2048


@dataclass(frozen=True)
class ErrorMap:
    by_id: Mapping[int, str]
    actions: Mapping[str, Action]
    categories: Mapping[int, Action]
    patterns: tuple[tuple[re.Pattern[str], str], ...]
    default_action: Action
    skip_warn_severity: int
    inconclusive: frozenset[str] = frozenset()  # codes with `outcome: unknown`
    node_scope: frozenset[str] = frozenset()  # codes with `scope: node`
    inconclusive_text: tuple[re.Pattern[str], ...] = ()  # messages of unmet preconditions

    def inconclusive_warning(self, code: str, w: DiagWarning) -> bool:
        """The warning says the test could not judge the GPU (its harness, its preconditions)."""
        text = w.text[:MATCH_CHARS]
        return code in self.inconclusive or any(rx.search(text) for rx in self.inconclusive_text)

    def classify(self, w: DiagWarning) -> tuple[str, Action]:
        """(code name or '', action) for one warning."""
        name = self.by_id.get(w.error_id, "") if w.error_id is not None else ""
        if not name and w.error_id is None:
            text = w.text[:MATCH_CHARS]
            name = next((code for rx, code in self.patterns if rx.search(text)), "")
        if name and name in self.actions:
            return name, self.actions[name]
        if w.category is not None and w.category in self.categories:
            return name, self.categories[w.category]
        return name, self.default_action


@lru_cache(maxsize=1)
def error_map() -> ErrorMap:
    text = resources.files("podhealth.checks.data").joinpath("dcgm_errors.yaml").read_text(encoding="utf-8")
    return load_error_map(yamldata.load(text))


def load_error_map(d: Mapping[str, Any]) -> ErrorMap:
    buckets = {k: Action(v) for k, v in d["bucket_actions"].items()}
    by_id: dict[int, str] = {}
    actions: dict[str, Action] = {}
    for name, spec in d["codes"].items():
        spec = spec or {}
        if "id" in spec:
            by_id.setdefault(int(spec["id"]), name)
        if "action" in spec:
            actions[name] = Action(spec["action"])
        elif "nvsentinel" in spec:
            actions[name] = buckets[spec["nvsentinel"]]
    cats = {int(k): Action(v["action"]) for k, v in d["categories"].items()}
    pats = tuple((re.compile(p["pattern"], re.I), str(p["code"])) for p in d["text_patterns"])
    specs = {name: spec or {} for name, spec in d["codes"].items()}
    for name, spec in specs.items():
        if spec.get("outcome", "fail") not in ("fail", "unknown") or spec.get("scope", "gpu") not in ("gpu", "node"):
            raise ValueError(f"dcgm_errors.yaml: codes.{name}: outcome is fail|unknown, scope is gpu|node")
    return ErrorMap(by_id, actions, cats, pats, Action(d["default_action"]), int(d["skip_warn_severity"]),
                    frozenset(n for n, sp in specs.items() if sp.get("outcome") == "unknown"),
                    frozenset(n for n, sp in specs.items() if sp.get("scope") == "node"),
                    tuple(re.compile(str(p), re.I) for p in d.get("inconclusive_text") or ()))


def _slug(test: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", test.lower()).strip("_") or "test"


def results(report: DiagReport, emap: ErrorMap | None = None) -> list[CheckResult]:
    """One CheckResult per (test, GPU); check name `dcgm_diag.<test>`, entity `gpuN` or `node`."""
    emap = emap or error_map()
    out: list[CheckResult] = []
    if report.runtime_error:
        out.append(unknown(CHECK, "node", f"dcgmi diag could not run: {report.runtime_error}",
                           dcgm_version=report.version))
    for e in report.entries:
        check, entity = f"{CHECK}.{_slug(e.test)}", "node" if e.gpu is None else f"gpu{e.gpu}"
        classified = [emap.classify(w) for w in e.warnings]
        codes = [c for c, _ in classified if c]
        action = Action.worst([a for _, a in classified]) if classified else emap.default_action
        ev: dict[str, object] = {"test": e.test, "category": e.category}
        if report.version:
            ev["dcgm_version"] = report.version
        if codes:
            ev["codes"] = ",".join(dict.fromkeys(codes))
        for i, w in enumerate(e.warnings[:3]):
            ev[f"warning{i}"] = w.text
        if e.info:
            ev["info"] = e.info[0]
        first = e.warnings[0].text if e.warnings else ""
        if e.status == "fail" and e.warnings and all(emap.inconclusive_warning(c, w)
                                                     for (c, _), w in zip(classified, e.warnings)):
            out.append(unknown(check, entity, f"{e.test} could not judge the GPU (the diagnostic itself failed; "
                                              f"restart DCGM and rerun): {first}", **ev))
        elif e.status == "fail":
            out.append(fail(check, entity, f"{e.test} failed" + (f": {first}" if first else ""), action, **ev))
        elif e.status == "warn":
            out.append(warn(check, entity, f"{e.test} warned" + (f": {first}" if first else ""), action, **ev))
        elif e.status == "skip" and any((w.severity or 0) > emap.skip_warn_severity for w in e.warnings):
            out.append(warn(check, entity, f"{e.test} skipped: {first}", action, **ev))
        elif e.status in ("pass", "skip", "not run"):
            word = "passed" if e.status == "pass" else e.status.replace("skip", "skipped")
            out.append(ok(check, entity, f"{e.test} {word}" + (f": {first}" if first and e.status != "pass" else ""), **ev))
        else:
            out.append(unknown(check, entity, f"{e.test}: unrecognised status {e.status!r}", **ev))
    out.extend(_untested(report))
    if not out:
        out.append(unknown(CHECK, "node", "dcgmi diag output held no test results", format=report.format))
    return _node_scoped(out, emap)


def _untested(report: DiagReport) -> list[CheckResult]:
    """UNKNOWN for every GPU (or the node) whose hardware tests (all but Deployment) all skipped:
    a MIG-mode GPU, a SKU the diagnostic has no parameters for. Skips are OK one by one, but a
    GPU that no test exercised has not been judged, and an all-skip run must not read as a pass."""
    by_entity: dict[int | None, list[DiagEntry]] = {}
    for e in report.entries:
        if e.category.strip().lower() != "deployment":
            by_entity.setdefault(e.gpu, []).append(e)
    out: list[CheckResult] = []
    for gpu, es in sorted(by_entity.items(), key=lambda kv: -1 if kv[0] is None else kv[0]):
        if gpu is None and report.runtime_error:
            continue        # the node already has its UNKNOWN: the run did not complete
        if es and all(e.status in ("skip", "not run") for e in es):
            first = next((w.text for e in es for w in e.warnings if w.text), "")
            out.append(unknown(CHECK, "node" if gpu is None else f"gpu{gpu}",
                               f"no hardware test ran ({len(es)} skipped)" + (f": {first}" if first else ""),
                               skipped=",".join(e.test for e in es)[:200]))
    return out


def _node_scoped(results_: list[CheckResult], emap: ErrorMap) -> list[CheckResult]:
    """A test that failed on every GPU for a node-wide cause (`scope: node` codes only) becomes one
    node-level result naming the GPUs, instead of one hardware-looking FAIL per GPU."""
    by_check: dict[str, list[CheckResult]] = {}
    for r in results_:
        by_check.setdefault(r.check, []).append(r)
    out: list[CheckResult] = []
    for check, rs in by_check.items():
        fails = [r for r in rs if r.status is Status.FAIL and r.entity.startswith("gpu")]
        codes = [set(str(dict(r.evidence).get("codes", "")).split(",")) - {""} for r in fails]
        if len(fails) < 2 or len(fails) != len([r for r in rs if r.entity.startswith("gpu")]) \
                or not all(c and c <= emap.node_scope for c in codes):
            out.extend(rs)
            continue
        first = fails[0]
        ev = {k: v for k, v in first.evidence if not k.startswith("warning")}
        ev["gpus"] = ",".join(r.entity.removeprefix("gpu") for r in fails)
        ev["warning0"] = dict(first.evidence).get("warning0", "")
        out.extend(r for r in rs if r not in fails)
        out.append(fail(check, "node", f"{dict(ev).get('test', check)} failed on every GPU for a node-wide cause "
                        f"({ev.get('codes', '')}): fix the node (e.g. nvidia-fabricmanager), not the GPUs",
                        Action.worst([r.action for r in fails]), **ev))
    return out


# --- running -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class DiagRun:
    results: tuple[CheckResult, ...]
    argv: tuple[str, ...] = ()
    returncode: int | None = None
    duration_s: float = 0.0
    report: DiagReport | None = None


def _tail(b: bytes, n: int = 400) -> str:
    return b.decode("utf-8", "replace").strip()[-n:]


def run_diag(level: int = 1, dcgmi: str = "dcgmi", timeout_s: float | None = None,
             timeouts: Mapping[int, float] = DEFAULT_TIMEOUTS, extra_args: Sequence[str] = (),
             env: Mapping[str, str] | None = None) -> DiagRun:
    """Run `dcgmi diag -r LEVEL -j` with a timeout and judge what it printed.

    dcgmi exits non-zero when a test fails, so the exit status alone decides nothing: parsable
    output is judged; a missing binary, a timeout, or a non-zero exit without parsable output is
    UNKNOWN with the reason (never OK).
    """
    if level not in timeouts and timeout_s is None:
        raise ValueError(f"run level must be one of {sorted(timeouts)}, got {level}")
    limit = timeout_s if timeout_s is not None else timeouts[level]
    path = dcgmi if os.sep in dcgmi else shutil.which(dcgmi, path=(env or os.environ).get("PATH"))
    if not path or not os.access(path, os.X_OK):
        return DiagRun((unknown(CHECK, "node", f"dcgmi not found ({dcgmi!r}): DCGM is not installed on this node",
                                level=level),))
    argv = (path, "diag", "-r", str(level), "-j", *extra_args)
    # dcgmi gets SIGTERM first at the timeout: it then asks nv-hostengine to stop the diagnostic.
    run = subproc.run(argv, limit, env=env if env is not None else os.environ, max_output=MAX_OUTPUT,
                      cwd=os.getcwd(), term_grace=KILL_GRACE_S)
    if run.timed_out:
        return DiagRun((unknown(CHECK, "node", f"dcgmi diag -r {level} timed out after {limit:g}s", level=level),),
                       argv, None, run.duration)
    rc = run.exit_code if run.exit_code is not None else -run.signal if run.signal is not None else None
    if run.error:
        return DiagRun((unknown(CHECK, "node", f"dcgmi diag -r {level}: {run.error}", level=level),), argv, None,
                       run.duration)
    out, err = run.stdout, run.stderr
    text = out.decode("utf-8", "replace")
    try:
        report = parse(text) if text.strip() else None
    except DiagParseError:
        report = None
    if report is None or (not report.entries and not report.runtime_error):
        why = f"exit {rc}" + (f": {_tail(err) or _tail(out)}" if (err or out) else ", no output")
        return DiagRun((unknown(CHECK, "node", f"dcgmi diag -r {level} gave no parsable result ({why})",
                                level=level, returncode=rc),), argv, rc, run.duration)
    return DiagRun(tuple(results(report)), argv, rc, run.duration, report)


def worst(results_: Sequence[CheckResult]) -> Status:
    return Status.worst([r.status for r in results_])
