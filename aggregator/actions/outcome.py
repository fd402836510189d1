"""What an executor returns: what happened, never a write. The journal's end (journal.py) makes
it the action's record and the node's state: the fence lifecycle's moves through
lifecycle.settle, the handover and ladder fields beside them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from podhealth.aggregator.lifecycle import Outcome as FenceMove
from podhealth.aggregator.store import Op

DONE, FAILED, SKIPPED = "done", "failed", "skipped"  # how the journal records its end
RETRY = "retry"  # not ended: left pending and tried again after the backoff (result: the error)


@dataclass(frozen=True)
class Outcome:
    state: str  # DONE, FAILED, SKIPPED or RETRY
    result: str  # the journal's result line (RETRY: the error)
    audit: tuple[Op, ...] = ()  # the executor's own lines (audit, drain events), committed with the end
    moves: tuple[FenceMove, ...] = ()  # the node's fence lifecycle moves, settled in this order
    handover: str = ""  # the handover suite's verdict, "passed" or "failed" (it decides a verifying rung)
    step: str = ""  # a reset/reboot "verifying" (carried out) or "failed" (a failed attempt on the ladder)
    step_note: str = ""  # why the verifying rung failed, for the ladder's record
    jobs: tuple[dict[str, Any], ...] | None = None  # the jobs now on the node (its page), None: not looked at
    evacuated_jobs: int | None = None  # how many jobs an evacuation moved off
    cooldown: bool = False  # a fence that failed for good: not planned again for a while
    changed: bool = False  # a fence that a backend made now (not one already there)


def retry(error: str, audit: list[Op] | tuple[Op, ...] = ()) -> Outcome:
    return Outcome(RETRY, error, tuple(audit))


__all__ = ["DONE", "FAILED", "RETRY", "SKIPPED", "Outcome", "retry"]
