"""Handover: ask the node's agent to run the handover suite. Its verdict decides a ladder rung
being verified; a pass on a fenced node releases it (the runner starts that release)."""

from __future__ import annotations

import contextlib
import json

from podhealth import agentclient, httpclient

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.actions.outcome import DONE, FAILED, Outcome
from podhealth.aggregator.store import Store


async def run(p: Pending, ctx: Ctx) -> Outcome:
    rec = ctx.mem.nodes[p.node]
    url = rec.agent_url.rstrip("/") + "/v1/handover"
    passed, detail = False, ""
    try:
        reply = await ctx.ask_agent(p.node, url, {"reason": p.why}, ctx.cfg.handover_timeout)
        body = reply.body.decode(errors="replace")
        detail = f"HTTP {reply.status}: {body[:2000]}"
        if reply.status == 200:
            with contextlib.suppress(ValueError):
                data = json.loads(body)
                # The agent's suite passes on OK, and on WARN with exit code 0 ("PASS (with
                # warnings)", checks/handover/report.py); FAIL and UNKNOWN (undecided) never release.
                passed = isinstance(data, dict) and (
                    data.get("status") == "OK" or (data.get("status") == "WARN" and data.get("exit_code") == 0))
                if isinstance(data, dict) and isinstance(data.get("summary"), str):
                    # the report's own line (FAILs first, then WARNs, then the UNKNOWN count),
                    # the same as `podhealth check` prints, not 2 KB of its JSON
                    detail = f"HTTP {reply.status}: {data['summary'][:1000]}"
    except agentclient.Unproven as e:  # an impostor's "OK" releases nothing
        detail = f"answer not proven: {e}"
    except httpclient.ExchangeError as e:
        detail = f"unreachable: {e.kind}: {e}"
    state = "passed" if passed else "failed"
    return Outcome(DONE if passed else FAILED, f"handover {state}: {detail}",
                   (Store.op_audit(ctx.clock(), p.node, p.who, "handover suite", p.why, ("POST", url), detail, passed,
                                   p.id),),
                   handover=state, step_note="" if passed else f"the handover suite failed ({detail[:300]})")


__all__ = ["run"]
