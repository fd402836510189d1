#!/usr/bin/env python3
"""Fencing under a storm, and fencing throughput, into a real loopback Slurm (prints figures).

    .venv/bin/python bench/storm.py [--quick] [--storm-nodes 1000] [--spread-nodes 200] [--spread-seconds 60]
                          [--no-slurm]

Case 1, storm: `storm-nodes` report-generating nodes (see benchlib.ReportFactory) are known and
healthy; then every one of them reports XID 79 (FAIL, REBOOT) within one second. The aggregator
runs with its default safety settings (cap 10 fenced nodes, 10 fences/min, breaker at > 10% of
nodes turning bad within 300 s). Printed: time from the first failing report to the first
decision to fence (the node turning `fencing` in /api/v1/fleet) and to the first DRAIN visible in
Slurm; how many nodes ended up fenced (must equal the cap); time until the breaker tripped.
Slurm: the storm's nodes are all defined in slurm.conf but only 16 run a slurmd (the others are
UNKNOWN, non-responding, and still drainable); 1,000 slurmd processes would need ~8 GiB here.

Case 2, throughput: `spread-nodes` nodes, each with its own slurmd (200 slurmd start in ~4 s and
take ~1.5 GiB RSS on this machine), with the cap, the rate limit and the breaker raised out of
the way. (a) the nodes fail one after another over `spread-seconds`: per-node latency from the
failing report to DRAIN visible in `sinfo`; (b) all of them fail at once (every failing report
sent together, as fast as the aggregator takes them): fences per second = nodes drained / the
time from the first failing report to the last DRAIN seen in Slurm (NVSentinel's published cordon
throughput is about 2.5 nodes/s; target >= 100 nodes/s). Sending (b)'s reports spread over a
second, as this bench once did, measured their arrival rate (50 nodes over 1 s cannot drain
faster than 50/s), not the fencer's.

Without Slurm (not installed, or --no-slurm) the aggregator's dry-run fencer stands in and the
Slurm figures are not printed.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()  # before anything that needs the project's packages

import argparse
import asyncio
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import aiohttp  # noqa: E402

from benchlib import Aggregator, ReportFactory, http_json, percentile, verdict, workdir  # noqa: E402

TOKEN = "bench-cluster-token"
ADMIN = "bench-admin-token"
STORM_DAEMONS = 16


@dataclass
class Timeline:
    first_fencing: float | None = None
    first_drain: float | None = None
    breaker: float | None = None
    drained_at: dict[str, float] | None = None


def _slurm_usable(no_slurm: bool) -> bool:
    from podhealth.sim.slurmcluster import missing_binaries
    return not no_slurm and not missing_binaries() and os.geteuid() == 0


def _drained(env: dict[str, str]) -> set[str]:
    r = subprocess.run(["sinfo", "-N", "-h", "-t", "drain,draining,drained", "-o", "%N"], env=env,
                       capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    return {line.strip() for line in r.stdout.splitlines() if line.strip()}


class Watcher:
    """Polls the aggregator (and Slurm) in a thread-free loop and stamps first times."""

    def __init__(self, agg_url: str, slurm_env: dict[str, str] | None, t0: float) -> None:
        self.agg_url = agg_url
        self.env = slurm_env
        self.t0 = t0
        self.tl = Timeline(drained_at={})

    async def run(self, until: "asyncio.Event", want_drains: int | None) -> Timeline:
        loop = asyncio.get_running_loop()
        while not until.is_set():
            fleet = await loop.run_in_executor(None, http_json, f"{self.agg_url}/api/v1/fleet")
            now = time.monotonic()  # after the answer: an upper bound, never early
            if self.tl.first_fencing is None and fleet["fence_budget"]["used"] > 0:
                self.tl.first_fencing = now - self.t0
            if self.tl.breaker is None and fleet["breaker"]["tripped"]:
                self.tl.breaker = now - self.t0
            if self.env is not None:
                drained = await loop.run_in_executor(None, _drained, self.env)
                stamp = time.monotonic() - self.t0
                assert self.tl.drained_at is not None
                for n in drained:
                    self.tl.drained_at.setdefault(n, stamp)
                if drained and self.tl.first_drain is None:
                    self.tl.first_drain = stamp
                if want_drains is not None and len(self.tl.drained_at) >= want_drains:
                    break
            await asyncio.sleep(0.05)
        return self.tl


async def post_reports(session: aiohttp.ClientSession, url: str, bodies: list[bytes], over: float,
                       sent_at: list[float] | None = None) -> int:
    """Send the bodies evenly over `over` seconds (all at once when 0); returns how many got 200."""
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    sem = asyncio.Semaphore(64)
    ok = 0
    start = time.monotonic()

    async def one(i: int, body: bytes) -> None:
        nonlocal ok
        if over:
            await asyncio.sleep(max(0.0, start + i * over / len(bodies) - time.monotonic()))
        async with sem:
            if sent_at is not None:
                sent_at[i] = time.monotonic()
            async with session.post(f"{url}/v1/reports", data=body, headers=headers) as r:
                await r.read()
                ok += r.status == 200

    await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    return ok


STORE_ADMIN = ""
_stores = 0


def _fresh_store() -> dict[str, Any]:
    """store.url: a new database on the --store-admin server, or {} (SQLite) without one."""
    global _stores
    if not STORE_ADMIN:
        return {}
    import urllib.parse

    import psycopg
    _stores += 1
    name = f"ph_storm_{os.getpid()}_{_stores}"
    with psycopg.connect(STORE_ADMIN, autocommit=True, connect_timeout=5) as c:
        c.execute(f"CREATE DATABASE {name}")  # type: ignore[arg-type]  # a name made here
    return {"store": {"url": urllib.parse.urlsplit(STORE_ADMIN)._replace(path=f"/{name}").geturl()}}


def agg_settings(names: list[str], fencer: dict[str, Any], raised: bool) -> dict[str, Any]:
    s: dict[str, Any] = {
        **_fresh_store(),
        # One shared token for every simulated node (the unsafe migration switch): a bench, not a site.
        "auth": {"cluster_token": TOKEN, "cluster_token_for_agents": True, "admin_token": ADMIN},
        "learn_nodes": False,
        "unreachable_after": 600.0,
        "nodes": [{"name": n, "partition": "gpu"} for n in names],
        "fencers": fencer,
        "retries": {"attempts": 3, "backoff": 0.2},
    }
    if raised:
        s.update(caps={"max_fenced": len(names), "max_percent_per_partition": 100.0},
                 rate_limit={"fences_per_minute": 100_000},
                 breaker={"share_percent": 100.0, "window": 300.0, "min_nodes": 1})
    return s


async def storm_case(agg: Aggregator, names: list[str], slurm_env: dict[str, str] | None) -> tuple[Timeline, int, dict[str, Any]]:
    f = ReportFactory()
    async with aiohttp.ClientSession() as s:
        await post_reports(s, agg.url, [ReportFactory.body(f.healthy_parts(n), time.time()) for n in names], 0)
        await asyncio.sleep(1.5)  # let the first-contact ops settle; the storm starts on a quiet aggregator
        fail_t = time.time()
        bodies = [ReportFactory.body(f.failing_parts(n, fail_t), fail_t + 0.5) for n in names]
        t0 = time.monotonic()
        stop = asyncio.Event()
        watcher = Watcher(agg.url, slurm_env, t0)
        wtask = asyncio.create_task(watcher.run(stop, None))
        sent = await post_reports(s, agg.url, bodies, 1.0)
        send_time = time.monotonic() - t0
        # Wait for things to settle: the breaker trips, and the fences in flight finish.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            fleet = http_json(f"{agg.url}/api/v1/fleet")
            if fleet["breaker"]["tripped"] and fleet["pending_actions"] == 0 and time.monotonic() - t0 > 3:
                break
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
        stop.set()
        tl = await wtask
        fleet = http_json(f"{agg.url}/api/v1/fleet")
        fleet["_sent"] = sent
        fleet["_send_time"] = send_time
    fenced_slurm = len(_drained(slurm_env)) if slurm_env is not None else -1
    return tl, fenced_slurm, fleet


async def spread_case(agg: Aggregator, names: list[str], slurm_env: dict[str, str],
                      over: float) -> tuple[list[float], float, int, float]:
    """Fail the nodes one by one over `over` s (all at once when 0); latency per node from its
    report to DRAIN in Slurm, the last drain, how many drained, the first drain (seconds after
    the first failing report)."""
    f = ReportFactory()
    async with aiohttp.ClientSession() as s:
        await post_reports(s, agg.url, [ReportFactory.body(f.healthy_parts(n), time.time()) for n in names], 0)
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        sent_at = [0.0] * len(names)
        fail_t = time.time()
        bodies = [ReportFactory.body(f.failing_parts(n, fail_t), fail_t + 0.5) for n in names]
        stop = asyncio.Event()
        watcher = Watcher(agg.url, slurm_env, t0)
        wtask = asyncio.create_task(watcher.run(stop, len(names)))
        await post_reports(s, agg.url, bodies, over, sent_at)
        try:
            await asyncio.wait_for(asyncio.shield(wtask), 60)
        except asyncio.TimeoutError:
            stop.set()
        tl = await wtask
    assert tl.drained_at is not None
    lat = [tl.drained_at[n] - (sent_at[i] - t0) for i, n in enumerate(names) if n in tl.drained_at]
    last = max(tl.drained_at.values(), default=float("nan"))
    first = min(tl.drained_at.values(), default=float("nan"))
    return lat, last, len(tl.drained_at), first


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="300-node storm, 50 nodes over 10 s")
    ap.add_argument("--storm-nodes", type=int, default=1000)
    ap.add_argument("--spread-nodes", type=int, default=200)
    ap.add_argument("--spread-seconds", type=float, default=60.0)
    ap.add_argument("--no-slurm", action="store_true", help="use the dry-run fencer even if Slurm is installed")
    ap.add_argument("--store-admin", default="",
                    help="a PostgreSQL URL to create a fresh database on for each case (the aggregator's store.url); "
                         "default each case's own SQLite file")
    args = ap.parse_args()
    global STORE_ADMIN
    STORE_ADMIN = args.store_admin
    if args.quick:
        args.storm_nodes, args.spread_nodes, args.spread_seconds = 300, 50, 10.0
    use_slurm = _slurm_usable(args.no_slurm)
    from podhealth.sim.slurmcluster import SlurmCluster, node_names

    # ---- case 1: the storm ---------------------------------------------------------------------
    print(f"storm: {args.storm_nodes} nodes turn FAIL (XID 79 -> REBOOT) within 1 s; default safety settings "
          f"(cap 10, 10 fences/min, breaker > 10% within 300 s)")
    names = list(node_names(args.storm_nodes))
    with workdir("ph-storm-") as wd:
        cluster = SlurmCluster(nodes=args.storm_nodes, daemons=STORM_DAEMONS, start_timeout=60) if use_slurm else None
        try:
            if cluster is not None:
                cluster.start()
                print(f"  loopback Slurm: {args.storm_nodes} nodes in slurm.conf, {STORM_DAEMONS} with a slurmd, "
                      f"started in {cluster.started_in:.1f} s")
                fencer: dict[str, Any] = {"slurm": {"enabled": True, "slurm_conf": str(cluster.conf), "timeout": 10.0}}
            else:
                fencer = {"dryrun": {"enabled": True}}
                print("  Slurm not used (not installed, not root, or --no-slurm): dry-run fencer")
            with Aggregator(wd, agg_settings(names, fencer, raised=False)) as agg:
                tl, fenced_slurm, fleet = asyncio.run(storm_case(agg, names, cluster.env if cluster else None))
        finally:
            if cluster is not None:
                cluster.stop()
    cap = 10
    used = fleet["fence_budget"]["used"]
    print(f"  {fleet['_sent']} failing reports accepted in {fleet['_send_time']:.2f} s")
    print(f"  first decision to fence   {_ms(tl.first_fencing)} after the first failing report")
    if use_slurm:
        print(f"  first DRAIN in Slurm      {_ms(tl.first_drain)}")
    print(f"  breaker tripped           {_ms(tl.breaker)}   ({fleet['breaker']['reason'][:90]}...)")
    print(f"  fenced by podhealth       {used} (aggregator)" + (f", {fenced_slurm} drained in Slurm" if use_slurm else "")
          + f"   cap {cap}: {'equals the cap' if used == cap and (not use_slurm or fenced_slurm == cap) else 'DOES NOT equal the cap'}")
    held: dict[str, int] = {}
    for n in fleet["last_decision"]["notes"]:
        held[n["kind"]] = held.get(n["kind"], 0) + 1
    print(f"  last decision's notes     {dict(sorted(held.items()))} (first 200 notes)")

    # ---- case 2: throughput ---------------------------------------------------------------------
    if not use_slurm:
        print("\nthroughput: skipped (needs the loopback Slurm)")
        return 0
    print(f"\nthroughput: {args.spread_nodes} nodes, one slurmd each; cap, rate limit and breaker raised")
    names = list(node_names(args.spread_nodes))
    for label, over in ((f"(a) failing one after another over {args.spread_seconds:g} s", args.spread_seconds),
                        ("(b) all failing at once", 0.0)):
        with workdir("ph-spread-") as wd, SlurmCluster(nodes=args.spread_nodes, start_timeout=120) as cluster:
            fencer = {"slurm": {"enabled": True, "slurm_conf": str(cluster.conf), "timeout": 10.0}}
            with Aggregator(wd, agg_settings(names, fencer, raised=True)) as agg:
                lat, last, drained, first = asyncio.run(spread_case(agg, names, cluster.env, over))
        print(f"  {label}: {drained}/{len(names)} drained; report -> DRAIN p50 {percentile(lat, 50) * 1e3:.0f} ms, "
              f"p99 {percentile(lat, 99) * 1e3:.0f} ms, max {max(lat, default=float('nan')) * 1e3:.0f} ms; "
              f"first drain {first:.2f} s, last drain {last:.2f} s after the first failing report")
        if over == 0:
            # From the first failing report, not the first drain: the decide and read-before-drain
            # time counts, and the bench's 50 ms sinfo polling makes the last drain a late bound.
            rate = drained / last if last > 0 else float("nan")
            print(f"      fences per second {rate:.0f}   target >= 100/s   ratio {rate / 100:.2f}  {verdict(rate >= 100)}; "
                  f"{rate / 2.5:.0f}x NVSentinel's ~2.5 nodes/s (first to last drain: {last - first:.2f} s)")
    return 0


def _ms(v: float | None) -> str:
    return "never" if v is None else f"{v * 1e3:.0f} ms"


if __name__ == "__main__":
    sys.exit(main())
