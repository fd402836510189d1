"""What a site check's program printed, as a ProgramReport: pure (bytes and an exit code in).

The protocol is node-problem-detector's and Base Command Manager's: the exit code is the verdict
(0 OK, 1 FAIL, 2 UNKNOWN; checks/passive/site.py reads it), the first line of stdout is the
summary. One optional line may be a JSON object carrying what the first line cannot:

    {"entity": "gpu3", "action": "DRAIN", "evidence": {"module": "nvidia_peermem", "state": "absent"}}

Anything else in the JSON line (another key, a nested value, a malformed object) is reported as
a problem in the evidence and ignored: the exit code still decides, so a typo in a site's script
never turns into a verdict it did not mean.
"""

from __future__ import annotations

import json
import re

from podhealth.vocab import MAX_EVIDENCE_ITEMS, ProgramReport, evidence_of

SUMMARY_CHARS = 200
_JSON_KEYS = frozenset({"entity", "action", "evidence"})
_ENTITY = re.compile(r"^[A-Za-z0-9_.:/-]{1,64}$")
_KEY = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def parse(exit_code: int | None, stdout: bytes, problem: str = "", ran_as: str = "",
          duration: float = 0.0) -> ProgramReport:
    # Control characters (a colour escape, a carriage return) would reach logs, the UI and
    # terminals verbatim: a script's words are shown, never interpreted.
    text = _CONTROL.sub("", stdout.decode("utf-8", "replace"))
    summary, payload = "", None
    for line in text.splitlines():
        s = line.strip()
        if not s:
            continue
        if s.startswith("{") and payload is None:
            payload = s
        elif not summary:
            summary = s[:SUMMARY_CHARS]
    entity, action, evidence, bad = _payload(payload) if payload is not None else ("", "", (), "")
    problems = "; ".join(p for p in (problem, bad) if p)
    return ProgramReport(exit_code, summary, entity, action, evidence, problems, ran_as, duration)


def _payload(line: str) -> tuple[str, str, tuple[tuple[str, str], ...], str]:
    """(entity, action, evidence, what was wrong) from the JSON line."""
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):
        return "", "", (), "JSON line is not valid JSON (ignored)"
    if not isinstance(obj, dict):
        return "", "", (), "JSON line is not an object (ignored)"
    bad: list[str] = []
    extra = sorted(set(obj) - _JSON_KEYS)
    if extra:
        bad.append(f"JSON line: unknown keys {', '.join(map(str, extra))[:80]} (known: action, entity, evidence)")
    entity = obj.get("entity", "")
    if not isinstance(entity, str) or (entity and not _ENTITY.match(entity)):
        bad.append("JSON line: entity must be a name of letters, digits and _.:/- (ignored)")
        entity = ""
    action = obj.get("action", "")
    if not isinstance(action, str):
        bad.append("JSON line: action must be a string (ignored)")
        action = ""
    raw = obj.get("evidence", {})
    items: dict[str, object] = {}
    if not isinstance(raw, dict):
        bad.append("JSON line: evidence must be an object (ignored)")
    else:
        for k, v in list(raw.items())[:MAX_EVIDENCE_ITEMS]:
            if not _KEY.match(str(k)) or isinstance(v, (dict, list)):
                bad.append(f"JSON line: evidence.{str(k)[:32]} must be a name with a scalar value (ignored)")
                continue
            items[str(k)] = "" if v is None else _CONTROL.sub("", v) if isinstance(v, str) else v \
                if isinstance(v, (int, float)) else str(v)
    return entity, action.strip().upper(), evidence_of(**items), "; ".join(bad)
