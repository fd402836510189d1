#!/usr/bin/env python3
"""CPU per aggregator replica against the replica count, at a fixed fleet (prints figures).

    .venv/bin/python bench/replica_scale.py [--quick] [--nodes 10000] [--interval 30] [--full-interval 300]
                                     [--replicas 1,2,3] [--window 30] [--repeats 3]
                                     [--connections per-node|fresh|pooled]

One set of `podhealth aggregator` processes per replica count (1, 2, 3 by default), each set on
its own private PostgreSQL (tests/harness/pg.py: initdb + postgres on loopback, fsync off), all
sets up at once, so their windows alternate (1, 2, 3, 1, 2, 3, ...): this shared machine's speed
drifts over minutes and only windows taken side by side compare. The fleet is the same for every
set: `--nodes` generators (bench/aggregator_scale.py's `Load`: a heartbeat every `--interval` s,
the full report every `--full-interval` s and a lease between, benchlib's stand-in bodies), each
node pushing to the replica its agent picks (agent/failover.py: a stable hash of its node name
with each URL), each node over its own kept connection as the agents do now (bench/nodeconns.py
`per-node`, opened before each window and let go after it; `--connections fresh`: a new one per
heartbeat, as they did before keep-alive). The first replica of a set is started alone and leads; the others follow.

Per window (a loaded one, `--idle` s without heartbeats, and the peer's, per set): each replica's CPU (utime + stime of its process, /proc/PID/stat), PostgreSQL's (the
postmaster, its live backends and the ones it reaped), the heartbeats each replica took, and the
load average. Printed per replica count: the leader's and each follower's share of a core and CPU
per heartbeat it took (min/median/max over the windows), the replicas' sum, PostgreSQL's, the
total per heartbeat of the fleet. Issue 32 §2: CPU per replica falls with the replica count (about
1/N, the leader's read-back and decisions on top).
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
import gc  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

_sys.path.insert(0, str(_Path(__file__).resolve().parent.parent))
from tests.harness.pg import PgServer, missing  # noqa: E402

from aggregator_scale import TOKEN, Load, Phase  # noqa: E402
from nodeconns import MODES, Mode, raise_fd_limit  # noqa: E402
from benchlib import Aggregator, FloorServer, node_names, tree_cpu_s, workdir  # noqa: E402
from podhealth.agent.failover import Replicas  # noqa: E402


CONNECTIONS = {"per-node": "each node over its own kept connection", "fresh": "a fresh TCP connection per heartbeat",
               "pooled": "a shared pool of kept connections"}


def leads(url: str) -> bool:
    """The replica's podhealth_aggregator_leader gauge is 1."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return any(line.split()[-1] in ("1", "1.0") for line in text.splitlines()
               if line.startswith("podhealth_aggregator_leader "))


def settings(store_url: str) -> dict[str, Any]:
    return {"auth": {"cluster_token": TOKEN, "cluster_token_for_agents": True}, "learn_nodes": True,
            "decide_interval": 1.0, "unreachable_after": 600.0, "heartbeat_interval": 600.0,
            "fencers": {"dryrun": {"enabled": True}}, "store": {"url": store_url, "lease": 8.0}}


@dataclass
class Sample:
    replica_cpu: list[float]  # per replica, seconds
    took: list[int]  # heartbeats each replica took
    pg_cpu: float
    wall: float
    late: int
    load: tuple[float, float, float]


@dataclass
class ReplicaSet:
    """`n` replicas on one PostgreSQL and the fleet's generators, one `Load` per replica."""

    n: int
    pg: PgServer
    aggs: list[Aggregator]
    floors: list[FloorServer]  # the peer: one empty aiohttp handler per replica, the same share each
    loads: list[Load] = field(default_factory=list)
    floor_loads: list[Load] = field(default_factory=list)
    windows: list[Sample] = field(default_factory=list)
    idle: list[Sample] = field(default_factory=list)  # windows without heartbeats: what a replica costs itself
    peer: list[Sample] = field(default_factory=list)
    leader: int = 0

    async def window(self, interval: float, seconds: float, kind: str, connections: Mode = "pooled") -> Sample:
        """kind: "loaded" (the replicas take the fleet), "idle" (no heartbeats), "peer" (the
        empty handlers take it, each the share of its replica)."""
        phases = [Phase(f"replica {i}") for i in range(self.n)]
        stats = [a.stats() for a in (self.floors if kind == "peer" else self.aggs)]
        loads = self.floor_loads if kind == "peer" else self.loads
        if kind != "idle":
            for ld in loads:  # per-node: every node's connection open before the window
                await ld.reconnect(connections)
                await ld.warm()
        pg_pid = self.pg.proc.pid if self.pg.proc is not None else 0
        c0, p0, t0 = [s.sample().cpu_s for s in stats], tree_cpu_s(pg_pid), time.monotonic()
        if kind == "idle":
            await asyncio.sleep(seconds)
        else:
            await asyncio.gather(*(ld.steady(ph, interval, seconds, False) for ld, ph in zip(loads, phases)))
        c1, p1, t1 = [s.sample().cpu_s for s in stats], tree_cpu_s(pg_pid), time.monotonic()
        if kind != "idle":
            for ld in loads:  # let them go: one set's worth of connections held at a time
                await ld.reconnect("pooled")
        if kind != "peer":
            self.leader = next((i for i, a in enumerate(self.aggs) if leads(a.url)), -1)
        w = Sample([b - a for a, b in zip(c0, c1)], [p.reports for p in phases], p1 - p0, t1 - t0,
                   sum(p.late for p in phases), os.getloadavg())
        {"loaded": self.windows, "idle": self.idle, "peer": self.peer}[kind].append(w)
        return w


async def start_set(n: int, nodes: list[str], wd: Path, args: argparse.Namespace, stack: contextlib.ExitStack) -> ReplicaSet:
    pg = stack.enter_context(PgServer())
    store = pg.new_database()
    aggs: list[Aggregator] = []
    for i in range(n):
        aggs.append(stack.enter_context(Aggregator(wd / f"set{n}-agg{i}", settings(store), log_level="warning")))
        if i == 0:  # the first leads: wait for it, so the others start as followers
            deadline = time.monotonic() + 30
            while not leads(aggs[0].url):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"set of {n}: the first replica never led\n{aggs[0].log_tail()}")
                await asyncio.sleep(0.1)
    rs = ReplicaSet(n, pg, aggs, [stack.enter_context(FloorServer()) for _ in range(n if args.peer else 0)])
    urls = [a.url for a in aggs]
    share: dict[str, list[str]] = {u: [] for u in urls}
    for node in nodes:  # where each node's agent pushes (agent/failover.py)
        share[Replicas(urls, "", node).url].append(node)
    for u in urls:
        rs.loads.append(await Load(u, share[u], args.concurrency, args.full_interval,
                                   interval=args.interval).__aenter__())
    for u, fl in zip(urls, rs.floors):
        rs.floor_loads.append(await Load(fl.url, share[u], args.concurrency, args.full_interval,
                                         interval=args.interval).__aenter__())
        rs.floor_loads[-1].steady_state(digest="0123456789abcdef")  # what the peer answers to a full report
    await asyncio.gather(*(ld.first_contact(Phase("first contact")) for ld in rs.loads))
    for ld in rs.loads:
        ld.steady_state()
    print(f"  {n} replica(s) on PostgreSQL :{pg.port}: nodes per replica {', '.join(str(len(share[u])) for u in urls)}")
    return rs


def mmm(values: list[float], fmt: str = "{:.1f}") -> str:
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values))) if values else "-"


def report(sets: list[ReplicaSet], args: argparse.Namespace) -> None:
    asked = args.nodes / args.interval
    print(f"\n== {args.nodes:,} nodes, a heartbeat every {args.interval:g} s (full report every "
          f"{args.full_interval:g} s), {CONNECTIONS[args.connections]}; "
          f"asked {asked:,.0f} heartbeats/s; {args.window:g} s windows; figures min/median/max over the windows")
    print("| replicas | heartbeats/s reached | leader: % of a core (us/heartbeat it took) | each follower: % of a core "
          "(us/heartbeat) | replicas' sum % | PostgreSQL % | total us per fleet heartbeat (replicas + PG) | load avg (1 min) |")
    print("|---|---|---|---|---|---|---|---|")
    for rs in sets:
        ws = rs.windows
        lead = rs.leader if rs.leader >= 0 else 0
        rate = [sum(w.took) / w.wall for w in ws]
        share = [[w.replica_cpu[i] / w.wall * 100 for w in ws] for i in range(rs.n)]
        per = [[w.replica_cpu[i] / w.took[i] * 1e6 if w.took[i] else float("nan") for w in ws] for i in range(rs.n)]
        followers = "; ".join(f"{mmm(share[i])} ({mmm(per[i], '{:.0f}')})" for i in range(rs.n) if i != lead) or "-"
        total = [sum(w.replica_cpu) for w in ws]
        print(f"| {rs.n} | {mmm(rate, '{:.0f}')} | {mmm(share[lead])} ({mmm(per[lead], '{:.0f}')}) | {followers} | "
              f"{mmm([t / w.wall * 100 for t, w in zip(total, ws)])} | {mmm([w.pg_cpu / w.wall * 100 for w in ws])} | "
              f"{mmm([(t + w.pg_cpu) / sum(w.took) * 1e6 for t, w in zip(total, ws)], '{:.0f}')} | "
              f"{mmm([w.load[0] for w in ws], '{:.2f}')} |")
        late = sum(w.late for w in ws)
        if min(rate) < 0.95 * asked or late:
            print(f"  ({rs.n} replica(s): {min(rate):.0f}/s reached at least, {late} sends started late; the "
                  f"figures are at the rate reached)")
    print(f"  leader: the replica whose podhealth_aggregator_leader was 1 after each window; {os.cpu_count()} CPUs here")
    if any(rs.peer for rs in sets):
        print("\nThe peer: one empty aiohttp handler per replica (bench/aiohttp_floor.py), each given its replica's "
              "share, in windows beside the replicas' (its cost per request rises as its rate falls):")
        print("| replicas | peer: each process % of a core | peer us per heartbeat | replicas us per heartbeat "
              "(no PG) | ratio replicas / peer | replicas less peer, us per heartbeat |")
        print("|---|---|---|---|---|---|")
        for rs in sets:
            if not rs.peer:
                continue
            peer_us = [sum(w.replica_cpu) / sum(w.took) * 1e6 for w in rs.peer]
            agg_us = [sum(w.replica_cpu) / sum(w.took) * 1e6 for w in rs.windows]
            each = [c / w.wall * 100 for w in rs.peer for c in w.replica_cpu]
            print(f"| {rs.n} | {mmm(each)} | {mmm(peer_us, '{:.0f}')} | {mmm(agg_us, '{:.0f}')} | "
                  f"{mmm([a / b for a, b in zip(agg_us, peer_us)], '{:.2f}')}x | "
                  f"{mmm([a - b for a, b in zip(agg_us, peer_us)], '{:.0f}')} |")
    if not any(rs.idle for rs in sets):
        return
    print("\nWithout heartbeats (the same sets, windows between the loaded ones): what a replica costs itself "
          "(decide, housekeeping, lease, read-back); and the loaded share less it (ingest):")
    print("| replicas | idle: leader % | idle: each follower % | idle: PostgreSQL % | loaded less idle (median): "
          "leader % | each follower % |")
    print("|---|---|---|---|---|---|")
    for rs in sets:
        lead = rs.leader if rs.leader >= 0 else 0
        idle = [[w.replica_cpu[i] / w.wall * 100 for w in rs.idle] for i in range(rs.n)]
        busy = [[w.replica_cpu[i] / w.wall * 100 for w in rs.windows] for i in range(rs.n)]
        net = [statistics.median(busy[i]) - statistics.median(idle[i]) for i in range(rs.n)]
        others = [i for i in range(rs.n) if i != lead]
        print(f"| {rs.n} | {mmm(idle[lead])} | {'; '.join(mmm(idle[i]) for i in others) or '-'} | "
              f"{mmm([w.pg_cpu / w.wall * 100 for w in rs.idle])} | {net[lead]:.1f} | "
              f"{'; '.join(f'{net[i]:.1f}' for i in others) or '-'} |")


async def run(args: argparse.Namespace) -> int:
    nodes = node_names(args.nodes)
    with workdir("ph-replscale-") as wd, contextlib.ExitStack() as stack:
        sets = [await start_set(n, nodes, wd, args, stack) for n in args.replicas]
        gc.collect()
        gc.freeze()  # the generator's own full GCs would stall its sends
        await asyncio.sleep(6)  # a housekeeping pass after first contact
        for r in range(args.repeats):
            for rs in sets:
                kinds = ["loaded"] + (["idle"] if args.idle else []) + (["peer"] if args.peer else [])
                for kind in kinds:
                    w = await rs.window(args.interval, args.idle if kind == "idle" else args.window, kind,
                                        args.connections)
                    print(f"  window {r + 1}, {rs.n} replica(s), {kind}: "
                          f"{sum(w.took) / w.wall:.0f} heartbeats/s; {'peers' if kind == 'peer' else 'replicas'} "
                          f"{', '.join(f'{c / w.wall * 100:.1f}%' for c in w.replica_cpu)}"
                          f"{'' if kind == 'peer' else f' (leader #{rs.leader})'}; "
                          f"PostgreSQL {w.pg_cpu / w.wall * 100:.1f}%; load {w.load[0]:.2f}", flush=True)
        for rs in sets:
            for ld in rs.loads + rs.floor_loads:
                await ld.__aexit__(None, None, None)
        report(sets, args)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 nodes every 10 s, 2 windows of 10 s (a smoke run)")
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between heartbeats (publish.report_interval)")
    ap.add_argument("--full-interval", type=float, default=300.0, help="publish.full_report_interval")
    ap.add_argument("--replicas", default="1,2,3", help="replica counts, comma-separated")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per measured window")
    ap.add_argument("--repeats", type=int, default=3, help="windows per replica count")
    ap.add_argument("--concurrency", type=int, default=512, help="heartbeats in flight at most, per replica")
    ap.add_argument("--idle", type=float, default=10.0,
                    help="seconds without heartbeats after each loaded window (0: none)")
    ap.add_argument("--no-peer", dest="peer", action="store_false",
                    help="skip the peer windows (one empty aiohttp handler per replica, the same share each)")
    ap.add_argument("--connections", choices=MODES, default="per-node",
                    help="per-node: each node keeps its own (the agents now); fresh: one per heartbeat; pooled: shared")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.interval, args.window, args.repeats, args.idle = 1000, 10.0, 10.0, 2, 5.0
    args.replicas = [int(x) for x in args.replicas.split(",")]
    if args.nodes < 1 or min(args.replicas) < 1 or args.window <= 0 or args.repeats < 1:
        ap.error("--nodes, --replicas, --window and --repeats must be positive")
    why = missing()
    if why:
        print(f"replica_scale needs PostgreSQL: {why}")
        return 2
    raise_fd_limit()  # per-node: one socket per node (the subprocesses inherit the limit)
    t0 = time.monotonic()
    rc = asyncio.run(run(args))
    print(f"run took {time.monotonic() - t0:.0f} s")
    return rc


if __name__ == "__main__":
    _sys.exit(main())
