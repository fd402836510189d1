"""Flap damping: a condition must hold for N evaluations before it turns FAIL, and recovery too.

N is per check (checks/data/rules.yaml `damping`): noisy values (temperatures, clock reasons, PCIe
link training) need more consecutive readings than checks.damping.fail_after; latched hardware
facts (XID 79, a DBE, a row-remap failure, a lost GPU) are `immediate`.

A grace period after boot or a driver change (checks/passive/grace.py) is applied here too, on top of the
damped state: a non-immediate FAIL is shown as WARN (action NONE) with evidence saying until when,
while its consecutive count keeps running, so a condition that outlasts the grace shows as FAIL
at once when the grace ends instead of starting to count then.

Results keep the time their condition was first seen (`since`), so a damped FAIL still says
when the trouble started, not when the damper let it through.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Mapping

from podhealth.checks.passive.rules import DampRule
from podhealth.vocab import MAX_EVIDENCE_ITEMS, Action, CheckResult, Status


@dataclass(frozen=True)
class Grace:
    until: float     # wall-clock end of the grace period
    why: str         # "boot", "driver change 535.104.05 -> 550.90.07"


@dataclass
class _Track:
    shown: CheckResult
    pending: CheckResult | None = None
    count: int = 0
    first_seen: float = 0.0


class Damper:
    def __init__(self, fail_after: int, recover_after: int, rules: Mapping[str, DampRule] | None = None) -> None:
        self.fail_after = fail_after
        self.recover_after = recover_after
        self.rules: Mapping[str, DampRule] = rules or {}
        self._t: dict[tuple[str, str], _Track] = {}

    def apply(self, raw: CheckResult, now: float, immediate: bool = False, grace: Grace | None = None) -> CheckResult:
        rule = self.rules.get(raw.check)
        immediate = immediate or (rule is not None and rule.immediate)
        # A rule raises the count for a noisy value; it never lowers the site's fail_after.
        fail_after = max(self.fail_after, rule.consecutive if rule is not None else 0)
        shown = self._damp(raw, now, immediate, fail_after)
        if grace is not None and not immediate and shown.status is Status.FAIL and now < grace.until:
            return held(shown, grace)
        return shown

    def _damp(self, raw: CheckResult, now: float, immediate: bool, fail_after: int) -> CheckResult:
        key = (raw.check, raw.entity)
        tr = self._t.get(key)
        if tr is None:
            # First sight: a bad condition still has to hold fail_after times (unless one-off
            # facts like a critical XID say `immediate`), so start from OK-with-pending.
            first = raw if (immediate or raw.status in (Status.OK, Status.UNKNOWN) or fail_after <= 1) else None
            shown = dataclasses.replace(first, since=first.since or now) if first else dataclasses.replace(
                raw, status=Status.OK, action=raw.action.__class__.NONE, evidence=(), summary="", since=now)
            tr = self._t[key] = _Track(shown=shown, first_seen=now)
            if first is None:
                tr.pending, tr.count, tr.first_seen = raw, 1, now
            return tr.shown
        if raw.status is tr.shown.status or immediate or raw.status is Status.UNKNOWN or tr.shown.status is Status.UNKNOWN:
            since = tr.shown.since if raw.status is tr.shown.status else (raw.since or now)
            tr.shown = dataclasses.replace(raw, since=since)
            tr.pending, tr.count = None, 0
            return tr.shown
        # A different status: count it before showing it.
        if tr.pending is not None and tr.pending.status is raw.status:
            tr.count += 1
        else:
            tr.pending, tr.count, tr.first_seen = raw, 1, now
        need = self.recover_after if raw.status is Status.OK else fail_after
        if tr.count >= need:
            tr.shown = dataclasses.replace(raw, since=raw.since or tr.first_seen)
            tr.pending, tr.count = None, 0
        return tr.shown

    def prune(self, keys: set[tuple[str, str]]) -> None:
        for k in list(self._t):
            if k not in keys:
                del self._t[k]


def held(r: CheckResult, grace: Grace) -> CheckResult:
    """A FAIL shown as WARN during the grace period; the evidence says what is held and until when."""
    until = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(grace.until))
    first = (("grace", f"in {grace.why} grace until {until}"), ("held", f"{r.status.value} {r.action.value}"))
    rest = tuple(kv for kv in r.evidence if kv[0] not in ("grace", "held"))
    return dataclasses.replace(r, status=Status.WARN, action=Action.NONE,
                               evidence=(first + rest)[:MAX_EVIDENCE_ITEMS],
                               summary=f"{r.summary} (held as WARN: in {grace.why} grace until {until})")
