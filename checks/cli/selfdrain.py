"""`--drain-self` for Slurm HealthCheckProgram mode: drain this node on FAIL, resume only our own drains.

Uses the aggregator's SlurmFencer, so the reason format (`podhealth: <check> <entity> <action>`),
name validation and the "only resume what we drained" rule are the same everywhere.
"""

from __future__ import annotations

import asyncio
import hashlib
import os

from podhealth.fencing.fence import FenceError, FenceReason
from podhealth.fencing.slurm import SlurmFencer, SlurmUnavailable
from podhealth.vocab import CheckResult


def drain_or_resume(node: str, failing: CheckResult | None, fencer: SlurmFencer | None = None) -> str:
    """Drain `node` for `failing`, or resume it when nothing fails and the drain is podhealth's.

    Returns a one-line note for stderr (empty when nothing changed).
    """
    f = fencer or SlurmFencer(slurm_conf=os.environ.get("SLURM_CONF") or None, timeout=3.0)
    return asyncio.run(_apply(f, node, failing))


async def _apply(f: SlurmFencer, node: str, failing: CheckResult | None) -> str:
    try:
        state = await f.read(node)
    except (SlurmUnavailable, ValueError) as e:
        return f"podhealth: drain-self: cannot read {node} from Slurm: {e}"
    if failing is not None:
        if state.fenced:
            return "" if state.ours else f"podhealth: drain-self: {node} already drained by someone else; left alone"
        rid = hashlib.sha1(f"{failing.check}|{failing.entity}|{failing.since}".encode()).hexdigest()[:8]
        try:
            await f.fence(node, FenceReason(failing.check, failing.entity, failing.action.value, rid))
        except FenceError as e:
            return f"podhealth: drain-self: drain failed: {_told(e)}"
        return f"podhealth: drain-self: drained {node}"
    if state.fenced and state.ours:
        try:
            await f.release(node)
        except FenceError as e:
            return f"podhealth: drain-self: resume failed: {_told(e)}"
        return f"podhealth: drain-self: resumed {node}"
    return ""


def _told(e: FenceError) -> str:
    """The fencer's words on a call it could not do; one it ran no command for (slurmctld stopped
    answering mid-call) is not a note here: it goes up, as it always has."""
    if not e.command:
        raise e
    return e.error
