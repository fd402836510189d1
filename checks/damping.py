"""Flap damping: a condition must hold for N evaluations before it turns FAIL, and recovery too.

Results keep the time their condition was first seen (`since`), so a damped FAIL still says
when the trouble started, not when the damper let it through.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from podhealth.vocab import CheckResult, Status


@dataclass
class _Track:
    shown: CheckResult
    pending: CheckResult | None = None
    count: int = 0
    first_seen: float = 0.0


class Damper:
    def __init__(self, fail_after: int, recover_after: int) -> None:
        self.fail_after = fail_after
        self.recover_after = recover_after
        self._t: dict[tuple[str, str], _Track] = {}

    def apply(self, raw: CheckResult, now: float, immediate: bool = False) -> CheckResult:
        key = (raw.check, raw.entity)
        tr = self._t.get(key)
        if tr is None:
            # First sight: a bad condition still has to hold fail_after times (unless one-off
            # facts like a critical XID say `immediate`), so start from OK-with-pending.
            first = raw if (immediate or raw.status in (Status.OK, Status.UNKNOWN) or self.fail_after <= 1) else None
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
        need = self.recover_after if raw.status is Status.OK else self.fail_after
        if tr.count >= need:
            tr.shown = dataclasses.replace(raw, since=raw.since or tr.first_seen)
            tr.pending, tr.count = None, 0
        return tr.shown

    def prune(self, keys: set[tuple[str, str]]) -> None:
        for k in list(self._t):
            if k not in keys:
                del self._t[k]
