#!/usr/bin/env python3
"""One aggregator, 10,000 simulated nodes reporting every 10 s, plus bursts of events (prints figures).

    .venv/bin/python bench/aggregator_scale.py [--quick] [--nodes 10000] [--interval 10] [--duration 60]
                                     [--full-interval 300] [--burst-duration 30] [--full-duration 30]
                                     [--concurrency 128] [--floor-duration 30]

The nodes are lightweight report generators, not agents, that speak the agent's heartbeat
protocol (agent/heartbeat.py) to POST /v1/reports every `interval` seconds, evenly spread: the
full report of a healthy DGX H100 (the simulated agent's 106 results, ~16 KB, with live readings
-- GPU temperatures, NFS probe time and RTT, request counts -- so no two are alike) when the
node has no digest from the aggregator or its last full report is `full-interval` old, and a
lease (~230 bytes) naming that digest otherwise. They run in this process (asyncio + aiohttp,
bounded concurrency) against one `podhealth aggregator` subprocess (SQLite in a temp
directory, dry-run fencer, cluster token).

Phases: (1) first contact: every node sends its full report, as fast as the aggregator takes
them (each one creates its node row); the nodes' last full reports are then spread over the
past `full-interval`, as in a fleet that has run a while; (2) steady: N/interval reports per
second for `duration` s (one in full-interval/interval a full report); (3) bursts: the same,
and every 2 s 1% of the nodes also post a batch of 20 events; (4) every heartbeat a full
report: what the aggregator pays per report without leases. The peer, aiohttp doing nothing
on the same loop (bench/aiohttp_floor.py), takes the steady load just before and after (2).
Printed per phase: achieved rate, aggregator CPU per request (utime+stime deltas from
/proc/<pid>/stat), client-side latency p50/p99; at the end the SQLite size (db + WAL) and the
aggregator's RSS. Targets (issue 8): <= 200 us CPU per report, p99 <= 50 ms at 1,000 reports/s,
RSS <= 300 MiB; (issue 20) CPU per report <= 1.2x the peer's under the same load, for the lease
mix and for every heartbeat a full report (the peer then takes that load, before and after (4)).
This machine's other load shows up in the latency figures: run it on a quiet box.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()  # before anything that needs the project's packages

import argparse
import asyncio
import gc
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402

from nodeconns import Mode, NodeConnections  # noqa: E402
from benchlib import Aggregator, FloorServer, ReportFactory, event_batch, node_names, percentile, verdict, workdir  # noqa: E402

TOKEN = "bench-cluster-token"


@dataclass
class Phase:
    name: str
    latencies: list[float] = field(default_factory=list)
    event_latencies: list[float] = field(default_factory=list)
    reports: int = 0
    event_posts: int = 0
    events: int = 0
    errors: int = 0
    late: int = 0  # sends that started more than one interval-slot late (the generator fell behind)
    full: int = 0  # of the reports: full ones
    leases: int = 0  # of the reports: leases
    conflicts: int = 0  # leases answered 409 (then sent in full: both counted in reports)
    wall: float = 0.0
    cpu: float = 0.0
    client_cpu: float = 0.0  # this process (the load generator)


class Load:
    """10,000 nodes' heartbeats, sent as agent/heartbeat.py sends them: the full report (live
    readings in it, so never the same text twice) when the node has no digest from the
    aggregator or its last full report is `full_interval` old, a lease naming that digest
    otherwise, the full report again at once when a lease is refused (409)."""

    def __init__(self, url: str, nodes: list[str], concurrency: int, full_interval: float,
                 body: Callable[[str, float], bytes] | None = None, connections: Mode = "pooled",
                 interval: float = 30.0) -> None:
        """`body(node, time)`: the full report to send (default: ReportFactory's live template);
        `connections`: how the nodes connect (bench/nodeconns.py: pooled, fresh or per-node, the
        agents' own); `interval`: their heartbeat interval (the per-node keep-alive follows it)."""
        self.url = url
        self.nodes = nodes
        self.full_interval = full_interval
        self.factory = ReportFactory()
        self.template = self.factory.live_template()  # the node's name is a slot too
        self.body = body
        self.conns = NodeConnections(connections, interval)
        self.concurrency = concurrency
        self.all_full = False  # every heartbeat a full report (what a fleet without leases sends)
        self.rng = random.Random(3)
        self.sem = asyncio.Semaphore(concurrency)
        self.headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        self.last_time: dict[str, float] = {}
        self.digest: dict[str, str] = {}
        self.full_at: dict[str, float] = {}
        self.event_seq = 0
        self.idle_cpu_rate = 0.0  # aggregator CPU seconds per second with no requests

    async def __aenter__(self) -> "Load":
        return self

    async def reconnect(self, connections: Mode) -> None:
        """Go on with other connections (first contact is set-up, pooled is quicker)."""
        await self.conns.close()
        self.conns = NodeConnections(connections, self.conns.interval)

    async def warm(self) -> None:
        """Before a window: every node's own connection open (per-node; else nothing)."""
        await self.conns.warm(self.url, self.nodes, self.concurrency)

    async def __aexit__(self, *exc: object) -> None:
        await self.conns.close()

    def steady_state(self, digest: str | None = None) -> None:
        """Spread the nodes' last full reports evenly over the past `full_interval`, as they are in
        a fleet that has run for a while (first contact made them all at the same moment)."""
        now = time.monotonic()
        for n in self.nodes:
            if digest is not None:
                self.digest[n] = digest
            self.full_at[n] = now - self.rng.uniform(0, self.full_interval)

    def _time(self, node: str) -> float:
        # Report times must increase per node (an equal one is "stale" and skipped).
        t = max(time.time(), self.last_time.get(node, 0.0) + 1e-3)
        self.last_time[node] = t
        return t

    def _full(self, node: str) -> bytes:
        if self.body is not None:
            return self.body(node, self._time(node))
        return self.template.render([json.dumps(node)] + self.factory.live_values(self._time(node), self.rng))

    async def _post(self, node: str, body: bytes, phase: Phase) -> tuple[int, bytes]:
        t0 = time.perf_counter()
        try:
            async with self.conns.session(node).post(f"{self.url}/v1/reports", data=body, headers=self.headers) as r:
                answer = await r.read()
                status = r.status
        except (aiohttp.ClientError, asyncio.TimeoutError):
            status, answer = 0, b""
        phase.latencies.append(time.perf_counter() - t0)
        phase.reports += 1
        return status, answer

    async def report(self, node: str, phase: Phase) -> None:
        async with self.sem:
            digest = self.digest.get(node)
            if (not self.all_full and digest is not None
                    and time.monotonic() - self.full_at.get(node, 0.0) < self.full_interval):
                status, _ = await self._post(node, ReportFactory.lease(node, self._time(node), digest), phase)
                phase.leases += 1
                if status == 200:
                    return
                if status != 409:
                    phase.errors += 1
                    return
                phase.conflicts += 1
            status, answer = await self._post(node, self._full(node), phase)
            phase.full += 1
            if status != 200:
                phase.errors += 1
                return
            got = json.loads(answer).get("digest")
            if isinstance(got, str):
                self.digest[node] = got
            self.full_at[node] = time.monotonic()

    async def events(self, node: str, count: int, phase: Phase) -> None:
        async with self.sem:
            self.event_seq += 1
            body = event_batch(node, self.event_seq, count, time.time())
            t0 = time.perf_counter()
            try:
                async with self.conns.session(node).post(f"{self.url}/v1/events", data=body, headers=self.headers) as r:
                    await r.read()
                    ok = r.status == 200
            except (aiohttp.ClientError, asyncio.TimeoutError):
                ok = False
            phase.event_latencies.append(time.perf_counter() - t0)
            phase.event_posts += 1
            phase.events += count
            if not ok:
                phase.errors += 1

    async def first_contact(self, phase: Phase) -> None:
        await asyncio.gather(*(self.report(n, phase) for n in self.nodes))

    async def steady(self, phase: Phase, interval: float, duration: float, bursts: bool) -> None:
        """Node i reports at offset i*interval/N in every interval; a tick loop starts what is due."""
        n = len(self.nodes)
        slot = interval / n
        tasks: set[asyncio.Task[None]] = set()
        start = time.monotonic()
        sent = 0
        next_burst = start + 1.0
        rng = random.Random(8)
        while True:
            now = time.monotonic()
            if now - start >= duration:
                break
            due = int((now - start) / slot) + 1
            if due - sent > n // 10 + 1:
                phase.late += due - sent - 1
            while sent < due:
                t = asyncio.create_task(self.report(self.nodes[sent % n], phase))
                tasks.add(t)
                t.add_done_callback(tasks.discard)
                sent += 1
            if bursts and now >= next_burst:
                next_burst += 2.0
                for node in rng.sample(self.nodes, max(1, n // 100)):
                    t = asyncio.create_task(self.events(node, 20, phase))
                    tasks.add(t)
                    t.add_done_callback(tasks.discard)
            await asyncio.sleep(0.005)
        if tasks:
            await asyncio.gather(*tasks)


async def run_phase(load: Load, agg: Aggregator, name: str, coro_factory: object) -> Phase:
    phase = Phase(name)
    stats = agg.stats()
    s0, t0, c0 = stats.sample(), time.monotonic(), time.process_time()
    await coro_factory(phase)  # type: ignore[operator]
    s1 = stats.sample()
    phase.wall = time.monotonic() - t0
    phase.cpu = s1.cpu_s - s0.cpu_s
    phase.client_cpu = time.process_time() - c0
    return phase


def show(phase: Phase, target_rate: float | None, idle_rate: float = 0.0) -> None:
    rate = phase.reports / phase.wall if phase.wall else 0.0
    requests = phase.reports + phase.event_posts
    cpu_us = phase.cpu / requests * 1e6 if requests else float("nan")
    p50, p99 = percentile(phase.latencies, 50) * 1e3, percentile(phase.latencies, 99) * 1e3
    mix = (f"; {phase.full} full, {phase.leases} leases" + (f", {phase.conflicts} refused" if phase.conflicts else "")
           if phase.leases else "")
    print(f"\n[{phase.name}] {phase.reports} reports in {phase.wall:.1f} s = {rate:.0f} reports/s{mix}"
          + (f" (asked {target_rate:.0f}/s)" if target_rate else "")
          + (f", {phase.event_posts} event batches ({phase.events} events)" if phase.event_posts else "")
          + (f", {phase.errors} errors" if phase.errors else "")
          + (f", generator fell behind by {phase.late} sends" if phase.late else ""))
    net_us = (phase.cpu - idle_rate * phase.wall) / requests * 1e6 if requests else float("nan")
    print(f"  aggregator CPU   {phase.cpu:.2f} s = {cpu_us:.0f} us per request"
          + (f" ({phase.cpu / phase.wall * 100:.0f}% of one core)" if phase.wall else "")
          + (f"; {net_us:.0f} us net of the idle loops" if idle_rate else ""))
    print(f"  report latency   p50 {p50:.1f} ms   p99 {p99:.1f} ms   max {max(phase.latencies, default=0) * 1e3:.1f} ms"
          f"   (client side; the generator itself used {phase.client_cpu / phase.wall * 100:.0f}% of a core)")
    if phase.event_latencies:
        print(f"  events latency   p50 {percentile(phase.event_latencies, 50) * 1e3:.1f} ms   "
              f"p99 {percentile(phase.event_latencies, 99) * 1e3:.1f} ms (batches of 20)")


async def floor_phase(args: argparse.Namespace, nodes: list[str], when: str, all_full: bool = False) -> Phase:
    """The same load against aiohttp doing nothing (bench/aiohttp_floor.py): the peer; with
    `all_full`, the load of the every-heartbeat-a-full-report phase.

    Run just before and just after the aggregator's phase, because this machine's speed drifts
    by tens of percent over minutes and only figures taken side by side compare."""
    with FloorServer() as fl:
        async with Load(fl.url, nodes, args.concurrency, args.full_interval) as load:
            load.steady_state(digest="0123456789abcdef")  # what the peer answers to a full report
            load.all_full = all_full
            what = "every heartbeat a full report" if all_full else "same load"
            phase = await run_phase(load, fl, f"peer ({when}): aiohttp doing nothing, {what}",  # type: ignore[arg-type]
                                    lambda p: load.steady(p, args.interval, args.floor_duration / 2, False))
    show(phase, args.nodes / args.interval)
    return phase


async def main_async(args: argparse.Namespace, agg: Aggregator) -> list[Phase]:
    nodes = node_names(args.nodes)
    rate = args.nodes / args.interval
    phases: list[Phase] = []
    async with Load(agg.url, nodes, args.concurrency, args.full_interval) as load:
        # The generator's own full GC passes (10,000 nodes' state) would stall its event loop for
        # tens of ms and show up as "aggregator latency": keep what exists now out of them.
        gc.collect()
        gc.freeze()
        phases.append(await run_phase(load, agg, "first contact: every node sends its full report, flat out",
                                      load.first_contact))
        show(phases[-1], None)
        idle = await run_phase(load, agg, "idle", lambda p: asyncio.sleep(5.0))
        print(f"\n[idle, {args.nodes} nodes known] aggregator CPU {idle.cpu / idle.wall * 100:.1f}% of one core "
              "(its decide/housekeeping loops; included in the per-request figures below)")
        load.idle_cpu_rate = idle.cpu / idle.wall
        load.steady_state()
        floor: list[Phase] = []
        if args.floor_duration > 0:
            floor.append(await floor_phase(args, nodes, "before"))
        phases.append(await run_phase(
            load, agg, f"steady: {args.nodes} nodes every {args.interval:g} s, full report every "
                       f"{args.full_interval:g} s, leases between (as agents send them)",
            lambda p: load.steady(p, args.interval, args.duration, False)))
        show(phases[-1], rate, load.idle_cpu_rate)
        if args.floor_duration > 0:
            floor.append(await floor_phase(args, nodes, "after"))
            args.floor = floor
        if args.burst_duration > 0:
            phases.append(await run_phase(load, agg, "steady + event bursts (1% of nodes x 20 events every 2 s)",
                                          lambda p: load.steady(p, args.interval, args.burst_duration, True)))
            show(phases[-1], rate, load.idle_cpu_rate)
        if args.full_duration > 0:
            full_floor: list[Phase] = []
            if args.floor_duration > 0:
                full_floor.append(await floor_phase(args, nodes, "before", all_full=True))
            load.all_full = True
            phases.append(await run_phase(
                load, agg, "every heartbeat a full report (live readings: no two alike), no leases",
                lambda p: load.steady(p, args.interval, args.full_duration, False)))
            show(phases[-1], rate, load.idle_cpu_rate)
            args.full_phase = phases[-1]
            if args.floor_duration > 0:
                full_floor.append(await floor_phase(args, nodes, "after", all_full=True))
                args.full_floor = full_floor
    return phases


def per_request_us(phases: list[Phase]) -> float:
    requests = sum(p.reports + p.event_posts for p in phases)
    return sum(p.cpu for p in phases) / requests * 1e6 if requests else float("nan")


def peer_line(label: str, agg_us: float, floor: list[Phase]) -> None:
    """The issue-20 target: the aggregator's CPU per report <= 1.2x the peer's under the same load."""
    f_us = per_request_us(floor)
    ratio = agg_us / f_us
    print(f"  {label:<24s} aggregator {agg_us:5.0f} us, peer (aiohttp doing nothing) {f_us:5.0f} us per request "
          f"= {ratio:.2f}x   target <= 1.2x  {verdict(ratio <= 1.2)}; {agg_us - f_us:.0f} us of its own work")


def _pg_bytes(url: str) -> int:
    """The size of the bench's PostgreSQL database (its server's CPU is not in the numbers above)."""
    import psycopg
    with psycopg.connect(url, connect_timeout=5) as c:
        row = c.execute("SELECT pg_database_size(current_database())").fetchone()
    return int(row[0]) if row else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 nodes, 15 s phases (a smoke run)")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--interval", type=float, default=10.0, help="seconds between a node's reports")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of the steady phase")
    ap.add_argument("--burst-duration", type=float, default=30.0, help="seconds of the burst phase (0 = skip)")
    ap.add_argument("--concurrency", type=int, default=128, help="requests in flight at most")
    ap.add_argument("--full-interval", type=float, default=300.0,
                    help="seconds between a node's full reports while its verdicts do not change "
                         "(the agent's publish.full_report_interval)")
    ap.add_argument("--full-duration", type=float, default=30.0,
                    help="seconds of a phase where every heartbeat is a full report (0 = skip)")
    ap.add_argument("--store", default="",
                    help="the aggregator's store.url (e.g. postgresql://user@127.0.0.1:5432/bench); default its SQLite file")
    ap.add_argument("--floor-duration", type=float, default=30.0,
                    help="seconds of the peer (aiohttp doing nothing), half before and half after steady (0 = skip)")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.duration, args.burst_duration, args.floor_duration = 1000, 15.0, 10.0, 10.0
        args.full_duration = 10.0
    if args.nodes < 1 or args.interval <= 0 or args.duration <= 0 or args.full_interval <= 0:
        ap.error("--nodes, --interval, --duration and --full-interval must be positive")
    print(f"aggregator_scale: {args.nodes} nodes x 1 report / {args.interval:g} s = "
          f"{args.nodes / args.interval:.0f} reports/s; concurrency {args.concurrency}")
    with workdir("ph-aggscale-") as wd:
        settings = {"auth": {"cluster_token": TOKEN, "cluster_token_for_agents": True}, "learn_nodes": True, "decide_interval": 1.0,
                    "unreachable_after": 600.0, "fencers": {"dryrun": {"enabled": True}}}
        if args.store:
            settings["store"] = {"url": args.store}
        with Aggregator(wd, settings) as agg:
            t0 = time.monotonic()
            phases = asyncio.run(main_async(args, agg))
            end = agg.stats().sample()
            db = agg.db_bytes() if not args.store else _pg_bytes(args.store)
            wal = sum(p.stat().st_size for p in wd.glob("aggregator.db-wal"))
            total = time.monotonic() - t0
        steady = phases[1]
        requests = steady.reports + steady.event_posts
        cpu_us = steady.cpu / requests * 1e6 if requests else float("nan")
        p99 = percentile(steady.latencies, 99) * 1e3
        rate = steady.reports / steady.wall
        where = "PostgreSQL database" if args.store else f"SQLite (of which WAL {wal / 2**20:.1f} MiB)"
        print(f"\n{where} {db / 2**20:.1f} MiB for {args.nodes} nodes; aggregator RSS {end.rss_mib:.0f} MiB "
              f"(peak {end.peak_rss_mib:.0f} MiB); run took {total:.0f} s")
        print(f"\nSummary (steady phase: {steady.full} full reports, {steady.leases} leases):")
        print(f"  CPU per report  {cpu_us:7.0f} us   target <= 200 us    ratio {cpu_us / 200:.2f}  {verdict(cpu_us <= 200)}")
        full = getattr(args, "full_phase", None)
        if full is not None:
            f_us = full.cpu / full.reports * 1e6 if full.reports else float("nan")
            print(f"  CPU per report  {f_us:7.0f} us   when every heartbeat is a full report (no leases; live "
                  f"readings make each one new)   p99 {percentile(full.latencies, 99) * 1e3:.1f} ms")
        # Issue 20: against the peer (same loop, same load, side by side, halves before and after)
        if getattr(args, "floor", []):
            peer_line("lease mix (steady):", cpu_us, args.floor)
        if full is not None and getattr(args, "full_floor", []):
            peer_line("every heartbeat full:", per_request_us([full]), args.full_floor)
        print(f"  p99 latency     {p99:7.1f} ms   target <= 50 ms at {rate:.0f}/s   ratio {p99 / 50:.2f}  "
              f"{verdict(p99 <= 50)}")
        print(f"  RSS (peak)      {end.peak_rss_mib:7.0f} MiB  target <= 300 MiB   ratio {end.peak_rss_mib / 300:.2f}  "
              f"{verdict(end.peak_rss_mib <= 300)}")
        if any(p.errors for p in phases):
            print(f"  errors: {sum(p.errors for p in phases)} requests failed (see the aggregator log)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
