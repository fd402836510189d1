"""The remediation ladder's rungs: reset one GPU through the node's agent, reboot through the
schedulers, or hand the node to repair. A reset or reboot carried out is verified by the
handover suite within ladder.verify_within; one that cannot be is a failed attempt. Each returns
what happened (Outcome: the rung `verifying` or `failed`); the journal's end records it."""

from __future__ import annotations

from podhealth import agentclient, httpclient

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Marked, Pending
from podhealth.aggregator.actions.outcome import DONE, FAILED, Outcome, retry
from podhealth.aggregator.policy import gpu_index
from podhealth.aggregator.store import Op, Store
from podhealth.fencing.fence import FenceError, FenceOutcome, Refused, Remediator, Transient, render_reason


def refused(p: Pending, error: str) -> Outcome:
    """A reset/reboot that could not be carried out: a failed attempt (the next rung, or REPAIR)."""
    return Outcome(FAILED, error, step="failed")


def _step_done(result: str, ops: list[Op]) -> Outcome:
    """Carried out: the node is verified by the handover suite within ladder.verify_within."""
    return Outcome(DONE, result, tuple(ops), step="verifying")


async def reset(p: Marked, ctx: Ctx) -> Outcome:
    """Ask the node's agent to reset one GPU (POST /v1/gpu-reset, the agent token). The agent
    refuses (409) while processes use the GPU: that is "later", not a failed attempt."""
    rec = ctx.mem.nodes[p.node]
    gpu = gpu_index(p.rule or p.reason.entity)
    if not rec.agent_url or gpu is None:
        raise Refused("no agent_url to ask for the reset" if gpu is not None
                      else f"no single GPU to reset in {p.rule!r}")
    url = rec.agent_url.rstrip("/") + "/v1/gpu-reset"
    if ctx.cfg.dry_run:  # a dry run touches nothing, not even through the agent
        return _step_done(f"would reset GPU {gpu} (dry run)", [Store.op_audit(
            ctx.clock(), p.node, p.who, "gpu reset via agent (dry run)", p.why, ("POST", url, f"gpu={gpu}"),
            "would reset (dry run)")])
    try:
        reply = await ctx.ask_agent(p.node, url, {"gpu": gpu, "reason": p.why}, ctx.cfg.ladder.reset_timeout)
        body, status = reply.body.decode(errors="replace")[:2000], reply.status
    except agentclient.Unproven as e:  # whatever answered is not the node's agent: try later
        raise Transient(f"POST {url}: answer not proven: {e}") from None
    except httpclient.ExchangeError as e:
        raise Transient(f"POST {url}: {e.kind}: {e}") from None
    audit = Store.op_audit(ctx.clock(), p.node, p.who, "gpu reset via agent", p.why, ("POST", url, f"gpu={gpu}"),
                           f"HTTP {status}: {body}", status == 200, p.id)
    if status == 200:
        return _step_done(f"GPU {gpu} reset: {body}", [audit])
    if status in (409, 503):  # processes use the GPU / the agent cannot tell yet: try later
        return retry(f"agent: HTTP {status}: {body}", [audit])
    return Outcome(FAILED, f"agent: HTTP {status}: {body}", (audit,), step="failed")


async def reboot(p: Marked, ctx: Ctx) -> Outcome:
    """Reboot through each scheduler that knows the node (Slurm's RebootProgram, the Kubernetes
    reboot annotation); the node stays fenced until the handover suite passes."""
    ops: list[Op] = []
    asked = 0
    for f, st in await ctx.read_all(p.node):
        if not isinstance(f, Remediator) or not st.exists:
            continue
        target = ctx.target(f, p.node)
        reason = ctx.marked(p.reason)
        try:
            o = await ctx.call(f, f"{f.name} reboot {target}", lambda f=f, t=target: f.reboot(t, reason))  # type: ignore[misc]
        except (Transient, Refused) as e:  # a failed attempt, whichever: the ladder's next rung
            return Outcome(FAILED, ctx.not_done(p, f, "reboot", target, e, ops), tuple(ops), step="failed")
        ops.append(ctx.audit_outcome(p, f, "reboot", o))
        asked += 1
    if not asked:
        return Outcome(FAILED, "no fencer that knows the node can reboot it", tuple(ops), step="failed")
    return _step_done(f"reboot requested from {asked} scheduler(s)", ops)


async def repair(p: Marked, ctx: Ctx) -> Outcome:
    """Put the REPAIR reason on podhealth's fence in every backend (best effort: the hold and
    the repair queue are in the store either way)."""
    ops: list[Op] = []
    for f, st in await ctx.read_all(p.node):
        if not isinstance(f, Remediator) or not (st.exists and st.fenced and st.ours):
            continue
        target = ctx.target(f, p.node)
        reason = ctx.marked(p.reason)
        try:
            o: FenceOutcome | FenceError = await ctx.call(
                f, f"{f.name} remark {target}", lambda f=f, t=target: f.remark(t, reason))  # type: ignore[misc]
        except (Transient, Refused) as e:
            if not e.command:
                raise
            o = e  # best effort: audited, and the node goes to repair all the same
        ops.append(ctx.audit_outcome(p, f, "repair reason", o))
    return Outcome(DONE, f"handed to repair: {render_reason(p.reason)}", tuple(ops))


__all__ = ["reboot", "refused", "repair", "reset"]
