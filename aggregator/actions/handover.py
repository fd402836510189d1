"""Handover: ask the node's agent to run the handover suite; a pass on a fenced node releases it
(and decides a ladder attempt being verified)."""

from __future__ import annotations

import contextlib
import json

from podhealth import agentclient, httpclient

from podhealth.aggregator.actions.ctx import Ctx
from podhealth.aggregator.actions.journal import Pending
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.store import Op, Store


async def run(p: Pending, ctx: Ctx) -> None:
    mem = ctx.mem
    rec = mem.nodes[p.node]
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
    now = ctx.clock()
    state = "passed" if passed else "failed"
    ladder: list[Op] = []
    if rec.ladder == "verifying":  # the suite after a reset/reboot decides that attempt
        ladder = [Store.op_ladder_outcome(p.node, state, now, f"the handover suite failed ({detail[:300]})" if not passed else "")
                  ] + mem.set_node(p.node, ladder="", ladder_at=now)
        if not passed:
            mem.ladder_failed(p.node, now)
    await ctx.journal.finish(p, "done" if passed else "failed", f"handover {state}: {detail}",
                             [Store.op_audit(now, p.node, p.who, "handover suite", p.why, ("POST", url), detail, passed,
                                             p.id)]
                             + mem.set_node(p.node, handover=state, handover_at=now) + ladder)
    if passed and rec.fence is FenceMode.FENCED:
        await ctx.release_after_handover(p.node, now)


__all__ = ["run"]
