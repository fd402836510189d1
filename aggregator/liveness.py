"""Whether nodes are heard from: pulling agents' /health, and silence -> UNKNOWN -> unreachable.

Agents with an `agent_url` are pulled every pull_interval (pull_concurrency at once, each GET
bounded by pull_timeout); push-only agents go missing by silence. A node nobody hears from is
UNKNOWN, never FAIL: silence says nothing about the hardware, so it never fences by itself.
"""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Collection, Sequence

import aiohttp

from podhealth import agentclient, httpclient, log as plog

from podhealth.aggregator import ingest
from podhealth.config_aggregator import AggregatorConfig
from podhealth.aggregator.metrics import Metrics
from podhealth.aggregator.context import Context
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Op, Store

log = plog.get("podhealth.aggregator")
PULL_MAX_BYTES = 4 << 20  # a node's /health: a few KB on a DGX, far more only from something broken


class Liveness:
    def __init__(self, cfg: AggregatorConfig, context: Callable[[], Context], metrics: Metrics,
                 session: aiohttp.ClientSession,
                 commit: Callable[[Sequence[Op]], Awaitable[None]], poke: Callable[[], None], *,
                 clock: Callable[[], float], mono: Callable[[], float]) -> None:
        self.cfg = cfg
        self._context = context  # the current one: a takeover builds a new one (aggregator/context.py)
        self.metrics = metrics
        self.session = session
        self.commit = commit
        self.poke = poke
        self.clock = clock
        self.mono = mono
        self._unproven: set[str] = set()  # nodes whose last answer was not proven (logged once)

    @property
    def mem(self) -> Memory:
        return self._context().mem

    # ---- pulling agents --------------------------------------------------------------------------

    async def pull_loop(self, running: Callable[[], bool]) -> None:
        sem = asyncio.Semaphore(self.cfg.pull_concurrency)
        while running():
            started = self.mono()
            targets = [r.name for r in self.mem.nodes.values() if r.agent_url]
            if targets:
                await asyncio.gather(*(self.pull_one(n, sem) for n in targets), return_exceptions=True)
            await asyncio.sleep(max(0.05, self.cfg.pull_interval - (self.mono() - started)))

    async def pull_one(self, node: str, sem: asyncio.Semaphore) -> None:
        mem = self.mem
        rec = mem.nodes.get(node)
        if rec is None or not rec.agent_url:
            return
        url = rec.agent_url.rstrip("/") + "/health"
        # No credential goes with the pull (GET /health is open): a nonce, and the answer counts
        # only with the proof that the node's agent key made it (core/agentclient.py). An
        # impostor's {"status": "OK"} on the port is "could not tell", never a verdict.
        async with sem:
            try:
                reply = await agentclient.ask_async(self.session, url, node, self.cfg.auth.agent_token_for(node),
                                                    deadline_s=self.cfg.pull_timeout, signed=False,
                                                    max_bytes=PULL_MAX_BYTES)
                raw, status = reply.body, reply.status
            except agentclient.Unproven as e:
                self.metrics.pulls.labels("unproven").inc()
                if node not in self._unproven:  # the change is news; every pull after it is not
                    self._unproven.add(node)
                    log.warning("agent answer not proven: ignored (an impostor on the port, or a key that does "
                                "not match)", node=node, error=str(e))
                await self.commit(mem.mark_unreachable(node, self.clock(), self.cfg.unreachable_after,
                                                       f"GET /health: answer not proven: {e}"))
                self.poke()
                return
            except httpclient.ExchangeError as e:
                self.metrics.pulls.labels("unreachable").inc()
                now = self.clock()
                await self.commit(mem.mark_unreachable(node, now, self.cfg.unreachable_after,
                                                       f"GET /health: {e.kind}: {e}"))
                self.poke()
                return
        now = self.clock()
        try:
            if status not in (200, 503):
                raise ingest.BadRequest(f"HTTP {status}")
            # The configured name wins over what the agent calls itself.
            rep = ingest.read_report(raw, node=node)
        except ingest.BadRequest as e:
            self.metrics.pulls.labels("bad").inc()
            await self.commit(mem.mark_unreachable(node, now, self.cfg.unreachable_after, f"bad /health: {e}"))
            return
        self.metrics.pulls.labels("ok").inc()
        if node in self._unproven:
            self._unproven.discard(node)
            log.info("agent answers proven again", node=node)
        _, ops = ingest.apply_report(mem, rep, now)
        if ops:
            await self.commit(ops)
            self.poke()

    # ---- silence ---------------------------------------------------------------------------------

    def silence_ops(self, now: float, started_at: float) -> list[Op]:
        """Push-only nodes go missing by silence: UNKNOWN once a node has sent nothing for 2.5
        heartbeat intervals (one late heartbeat is not news), node_unreachable after
        unreachable_after. Silence is counted from this process's start (`started_at`) at the
        earliest: after a restart, nodes get their intervals to report before they are called missing.

        Only the nodes that fell silent since the last pass and those still on their way to
        node_unreachable are looked at (aggregator/heard.py), not the fleet."""
        mem = self.mem
        silent_after = min(2.5 * self.cfg.heartbeat_interval, self.cfg.unreachable_after)
        ops: list[Op] = []
        for name, _ in mem.heard.lapsing(now, silent_after, started_at):
            rec = mem.nodes.get(name)
            if rec is not None and not rec.agent_url and rec.unreachable_since is None:
                ops += mem.mark_unreachable(name, now, self.cfg.unreachable_after,
                                            f"silent for {now - rec.last_seen:.0f}s", since=max(rec.last_seen, started_at))
        for name in mem.heard.take_watch():
            rec = mem.nodes.get(name)
            if rec is None or rec.unreachable_since is None:
                mem.heard.watch.discard(name)
            elif rec.agent_url:
                ops += mem.mark_unreachable(name, now, self.cfg.unreachable_after, "still unreachable")
            else:
                ops += mem.mark_unreachable(name, now, self.cfg.unreachable_after,
                                            f"silent for {now - rec.last_seen:.0f}s")
        return ops

    def forget_ops(self, now: float, busy: Collection[str]) -> list[Op]:
        """Learned nodes that stopped reporting are forgotten after forget_learned_after (a node
        renamed or retired, or a name that only ever arrived once), so they stay off the UI and
        out of the fleet; one that reports again is learned again. `busy`: nodes with an action
        pending, never forgotten under it."""
        after = self.cfg.forget_learned_after
        if not after:
            return []
        ops: list[Op] = []
        for name in self.mem.forget_stale_learned(now, after, busy=set(busy)):
            log.info("forgot a learned node that stopped reporting", node=name, after=after)
            ops += Store.ops_node_forget(name)
            ops.append(Store.op_audit(now, name, "podhealth", "forget", f"learned node silent for {after:g}s"))
        return ops
