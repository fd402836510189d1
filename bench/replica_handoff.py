#!/usr/bin/env python3
"""Replica hand-off: a FAIL reported to a follower, fenced by the leader, beside one reported to the leader.

    .venv/bin/python bench/replica_handoff.py [--trials 20] [--no-notify]

Two aggregator replicas in this process on one private PostgreSQL (initdb + pg_ctl on loopback,
tests/harness/pg.py), sharing one in-memory fencer that notes when each node's fence call comes.
Each trial posts a FAIL report for a fresh node, alternately to the follower (the leader learns of
it by the follower's NOTIFY, aggregator/pgnotify.py, and reads it back) and to the leader itself
(the peer: the same path without the hand-off). Time from just before the POST to the fence call.
The periodic read-back (SYNC_INTERVAL, 1 s) stays on: without the notify the follower's figure
would be up to that (`--no-notify` shows it: the follower's commits then carry a no-op instead of
the NOTIFY). Target (issue 32 §2): the follower's p99 within 100 ms of the leader's.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()

import argparse  # noqa: E402
import asyncio  # noqa: E402
import contextlib  # noqa: E402
import os  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

_sys.path.insert(0, str(_Path(__file__).resolve().parent.parent))
from tests.harness.agg import MemFencer, config, running  # noqa: E402
from tests.harness.pg import PgServer, missing  # noqa: E402

from benchlib import percentile  # noqa: E402


class TimedFencer(MemFencer):
    """MemFencer that notes when each node's fence call came (monotonic)."""

    def __init__(self) -> None:
        super().__init__()
        self.at: dict[str, float] = {}

    async def fence(self, node: str, reason: Any) -> Any:
        self.at.setdefault(node, time.monotonic())
        return await super().fence(node, reason)


async def run(trials: int, notify: bool) -> int:
    import aiohttp

    if not notify:
        from podhealth.aggregator import pgnotify

        pgnotify.NOTIFY_OP = ("SELECT 1", ())  # read at each commit: the follower wakes no one

    from podhealth.config_aggregator import BreakerConfig, CapsConfig, RateLimitConfig, StoreConfig

    nodes = 2 * trials
    fencer = TimedFencer()
    with PgServer() as pg, tempfile.TemporaryDirectory(prefix="ph-handoff-") as tmp:
        cfg = config(_Path(tmp), nodes=nodes, store=StoreConfig(url=pg.new_database(), lease=5.0),
                     caps=CapsConfig(max_fenced=nodes, max_percent_per_partition=100.0),
                     rate_limit=RateLimitConfig(fences_per_minute=10_000), breaker=BreakerConfig(min_nodes=nodes + 1),
                     decide_interval=1.0)
        async with contextlib.AsyncExitStack() as stack, aiohttp.ClientSession() as http:
            lead, lurl = await stack.enter_async_context(running(cfg, [fencer], housekeeping=5.0))
            deadline = time.monotonic() + 30
            while not (lead.acting() and lead.listener is not None and lead.listener.connects):
                if time.monotonic() > deadline:
                    print("the first replica never led")
                    return 1
                await asyncio.sleep(0.05)
            follower, furl = await stack.enter_async_context(running(cfg, [fencer], housekeeping=5.0))
            assert not follower.acting()
            got: dict[str, list[float | None]] = {"follower": [], "leader": []}
            load_before = os.getloadavg()
            for i in range(nodes):
                node = f"dgx{i + 1:02d}"
                who, url = ("follower", furl) if i % 2 == 0 else ("leader", lurl)
                body = {"node": node, "time": 10.0 + i, "results": [
                    {"check": "xid", "entity": "GPU0", "status": "FAIL", "action": "RESET_GPU"}]}
                t0 = time.monotonic()
                async with http.post(f"{url}/v1/reports", json=body) as r:
                    assert r.status == 200, await r.text()
                end = t0 + 10
                while node not in fencer.at and time.monotonic() < end:
                    await asyncio.sleep(0.002)
                got[who].append(fencer.at[node] - t0 if node in fencer.at else None)
                await asyncio.sleep(0.1)  # each trial on its own (no batch of fences)
            load_after = os.getloadavg()
    print(f"replica_handoff: {trials} trials each, alternating, 2 replicas on one PostgreSQL; "
          f"periodic read-back every 1 s (on); NOTIFY {'on' if notify else 'off'}")
    for who in ("follower", "leader"):
        v = [x for x in got[who] if x is not None]
        lost = len(got[who]) - len(v)
        print(f"  FAIL posted to the {who:<8} -> fence call  n={len(v):2d}  p50 {percentile(v, 50) * 1e3:6.1f} ms  "
              f"p99 {percentile(v, 99) * 1e3:6.1f} ms  max {max(v, default=float('nan')) * 1e3:6.1f} ms"
              + (f"  ({lost} not fenced in 10 s)" if lost else ""))
    f = [x for x in got["follower"] if x is not None]
    ld = [x for x in got["leader"] if x is not None]
    if f and ld:
        d99 = percentile(f, 99) - percentile(ld, 99)
        print(f"  follower / leader  p50 {percentile(f, 50) / percentile(ld, 50):5.2f}x  "
              f"p99 {percentile(f, 99) / percentile(ld, 99):5.2f}x  (p99 {d99 * 1e3:+.0f} ms; target: within 100 ms)")
    print(f"  load average (1, 5, 15 min): before {' '.join(f'{x:.2f}' for x in load_before)}, "
          f"after {' '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20, help="trials per replica")
    ap.add_argument("--no-notify", action="store_true", help="the follower sends no NOTIFY (the 1 s sync alone)")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"replica_handoff needs PostgreSQL: {why}")
        return 2
    return asyncio.run(run(args.trials, not args.no_notify))


if __name__ == "__main__":
    sys_exit = _sys.exit
    sys_exit(main())
