#!/usr/bin/env python3
"""Capacity: one aggregator at the agents' real behaviour, beside the empty aiohttp handler (prints figures).

    python bench/capacity.py [--quick] [--nodes 10000 [--nodes 100000]] [--interval 30]
                             [--full-interval 300] [--window 30] [--repeats 3] [--report-source simulator|factory]
                             [--connections per-node|fresh|both]

What the agents really do, at their defaults (core/config.py `publish`):
- a heartbeat every `report_interval` (30 s): the full report when a verdict changed, and every
  `full_report_interval` (300 s); a ~230-byte lease naming its digest otherwise (agent/heartbeat.py);
- its connection (`--connections`, bench/nodeconns.py): `per-node` (default), each node keeps
  its own from one heartbeat to the next, made by the agent's own session factory, as agents do
  now; `fresh`, a new TCP connection per heartbeat, closed after the answer: what they did while
  aiohttp's 15 s keep-alive closed it before the next 30 s heartbeat (the same accept and close
  per heartbeat); `both`: the two in turns against the same aggregator, window by window, and
  their ratio (before/after in one sitting);
- real report bodies: captured from a simulated DGX H100 agent (`podhealth agent --simulate`,
  its /health: 126 results, ~24 KB), several captures a few seconds apart (live readings), with
  each node's name and time filled in (`--report-source factory`: bench/benchlib.py's stand-in).

Each fleet size gets its own aggregator (a subprocess, SQLite, dry-run fencer) and the peer,
bench/aiohttp_floor.py (aiohttp on the same loop, reading the body and answering what the
aggregator answers, nothing else, the same loop-lag probe), under the same mix in alternating
windows: peer, aggregator, peer, aggregator, ..., peer (`--repeats` aggregator windows). First
contact (every node's full report) goes over pooled connections: it is set-up, not measured.
Printed per size: the rate asked and reached (the generator shares this machine's cores: where
it cannot reach the agents' rate it says so, and the figures are at the rate it reached), CPU per
heartbeat of each and their ratio (min/median/max over the windows, each against the mean of
the peer windows beside it), the aggregator's share of a core, client p99 of both, event-loop
stalls (podhealth_aggregator_loop_lag_seconds: how many over 50 ms, the longest), full GC
pauses (podhealth_aggregator_gc_pause_seconds{generation="2"}) with `gc_freeze` on and, in a
second aggregator, off, the nodes housekeeping visited per pass, and the load average.

`--quick` (under 5 minutes): 10,000 nodes, 2 windows of 20 s, GC on/off at 10,000 nodes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregator_scale import TOKEN, Load, Phase, run_phase  # noqa: E402
from nodeconns import raise_fd_limit  # noqa: E402
from benchlib import REPO, Aggregator, FloorServer, ReportFactory, Template, free_ports, node_names, percentile, workdir  # noqa: E402

CONNECTIONS = {"per-node": "each node keeps its own across heartbeats (the agents now)",
               "fresh": "a new TCP connection per heartbeat (the agents before, aiohttp's 15 s keep-alive)"}
LAG_STALL = 0.05  # an event-loop stall worth counting (issue 32: none over 50 ms)


# ---- real report bodies -----------------------------------------------------------------------


def capture_reports(wd: Path, count: int = 3, gap: float = 3.0, timeout: float = 90.0) -> list[bytes]:
    """`count` /health bodies of a simulated DGX H100 agent, `gap` s apart (its live readings move)."""
    port = free_ports(1)[0]
    cfg = wd / "capture-agent.yml"
    cfg.write_text(f"log: {{level: warning, format: json}}\npublish: {{spool_dir: {wd / 'spool'}}}\n")
    log = open(wd / "capture-agent.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate",
                             "dgx-h100", "--node", "capture01", "--sim-root", str(wd / "sim"),
                             "--listen", f"127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            cwd=REPO)
    bodies: list[bytes] = []
    try:
        deadline = time.monotonic() + timeout
        while len(bodies) < count:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulated agent gave no full report (see {wd / 'capture-agent.log'})")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
                    body = r.read()
            except OSError:
                body = b""
            doc = json.loads(body) if body else {}
            # A full judgement: every collector has reported (no start-up placeholders left).
            if len(doc.get("results", ())) >= 100 and not any(x.get("status") == "UNKNOWN" for x in doc["results"]):
                bodies.append(body)
                time.sleep(gap)
            else:
                time.sleep(0.5)
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(15)
        log.close()
    return bodies


def templates_of(bodies: list[bytes]) -> list[Template]:
    """Each capture with its node name and times left open."""
    out = []
    for b in bodies:
        doc = json.loads(b)
        doc["node"] = ReportFactory.SLOT
        doc["time"] = ReportFactory.SLOT
        if "evaluated_at" in doc:
            doc["evaluated_at"] = ReportFactory.SLOT
        out.append(Template(doc, ReportFactory.SLOT))
    return out


def body_maker(templates: list[Template]) -> Callable[[str, float], bytes]:
    rng = random.Random(32)

    def body(node: str, t: float) -> bytes:
        tpl = templates[rng.randrange(len(templates))]
        return tpl.render([json.dumps(node)] + [repr(t)] * (tpl.slots - 1))
    return body


# ---- the aggregator's own figures (its /metrics) --------------------------------------------------


@dataclass
class Scrape:
    lag_buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    busy_buckets: dict[float, float] = field(default_factory=dict)  # the part of each lag the loop ran
    lag_max: float = 0.0
    gc2_buckets: dict[float, float] = field(default_factory=dict)
    gc2_count: float = 0.0
    visits: float = 0.0
    passes: float = 0.0  # housekeeping passes are not counted by the aggregator: visits / windows' 5 s


def scrape(url: str) -> Scrape:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    s = Scrape()
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name == "podhealth_aggregator_loop_lag_seconds_bucket":
                s.lag_buckets[float(smp.labels["le"])] = smp.value
            elif smp.name == "podhealth_aggregator_loop_busy_seconds_bucket":
                s.busy_buckets[float(smp.labels["le"])] = smp.value
            elif smp.name == "podhealth_aggregator_loop_lag_max_seconds":
                s.lag_max = smp.value
            elif smp.name == "podhealth_aggregator_gc_pause_seconds_bucket" and smp.labels.get("generation") == "2":
                s.gc2_buckets[float(smp.labels["le"])] = smp.value
            elif smp.name == "podhealth_aggregator_gc_pause_seconds_count" and smp.labels.get("generation") == "2":
                s.gc2_count = smp.value
            elif smp.name == "podhealth_aggregator_housekeeping_visits_total":
                s.visits = smp.value
    return s


def over(before: dict[float, float], after: dict[float, float], bound: float) -> tuple[int, str]:
    """Between two scrapes of a histogram: (observations above `bound`, the bucket the longest fell in)."""
    delta = {le: after[le] - before.get(le, 0.0) for le in sorted(after)}
    total = delta.get(float("inf"), 0.0)
    if not total:
        return 0, "none"
    within = next((c for le, c in delta.items() if le >= bound), total)
    le_max = next(le for le, c in delta.items() if c >= total)
    return int(total - within), (f"<= {le_max * 1e3:g} ms" if le_max != float("inf") else "beyond the last bucket")


# ---- one fleet size ---------------------------------------------------------------------------


@dataclass
class Window:
    phase: Phase
    lag_over: int = 0
    lag_longest: str = ""
    busy_over: int = 0  # of those, stalls of the loop's own work (not waiting for a CPU)
    busy_longest: str = ""
    gc2: int = 0
    gc2_longest: str = ""
    visits: float = 0.0
    load: tuple[float, float, float] = (0.0, 0.0, 0.0)

    @property
    def per_beat_us(self) -> float:
        return self.phase.cpu / self.phase.reports * 1e6 if self.phase.reports else float("nan")


def settings(freeze: bool) -> dict[str, Any]:
    return {"auth": {"cluster_token": TOKEN, "cluster_token_for_agents": True}, "learn_nodes": True,
            "decide_interval": 1.0, "unreachable_after": 600.0,
            # No node goes silent in the peer's windows, when this aggregator hears nothing.
            "heartbeat_interval": 600.0,
            "fencers": {"dryrun": {"enabled": True}}, "gc_freeze": freeze}


ByMode = dict[str, tuple[list[Window], list[Window]]]  # connections -> (aggregator windows, peer windows)


async def aggregator_windows(args: argparse.Namespace, wd: Path, nodes: list[str], body: Callable[[str, float], bytes],
                             freeze: bool, floor: FloorServer, windows: int) -> tuple[ByMode, Scrape, Scrape]:
    """An aggregator's first contact, then `windows` windows alternating with the peer's (peer
    first and last), for each of `args.modes` in turn (the same sitting: before and after side by
    side). Returns the windows by connections, and its scrapes at start and end."""
    by_mode: ByMode = {m: ([], []) for m in args.modes}
    with Aggregator(wd / f"agg-{len(nodes)}-{'freeze' if freeze else 'nofreeze'}", settings(freeze)) as agg:
        start = scrape(agg.url)
        async with Load(agg.url, nodes, args.concurrency, args.full_interval, body=body, interval=args.interval) as load, \
                contextlib.AsyncExitStack() as stack:
            peers = {m: await stack.enter_async_context(Load(floor.url, nodes, args.concurrency, args.full_interval,
                                                             body=body, connections=m, interval=args.interval))
                     for m in args.modes}
            first = await run_phase(load, agg, "first contact", load.first_contact)  # type: ignore[arg-type]
            print(f"  first contact: {first.reports} full reports in {first.wall:.1f} s (pooled connections)")
            load.steady_state()
            for peer in peers.values():
                peer.steady_state(digest="0123456789abcdef")
            await asyncio.sleep(6)  # a housekeeping pass after the load: the freeze, if on

            def steady(on: Load) -> Callable[[Phase], Any]:
                return lambda p: on.steady(p, args.interval, args.window, False)

            async def floor_window(m: str) -> None:
                peer = peers[m]
                await peer.warm()  # per-node connections: open before the window, let go after it
                ph = await run_phase(peer, floor, "peer", steady(peer))  # type: ignore[arg-type]
                await peer.reconnect(m)  # type: ignore[arg-type]
                by_mode[m][1].append(Window(ph, load=os.getloadavg()))

            for m in args.modes * windows:
                await floor_window(m)
                await load.reconnect(m)
                rss_before = agg.stats().sample().rss_mib
                await load.warm()
                if m == "per-node" and not by_mode[m][0]:
                    args.rss_warm = (rss_before, agg.stats().sample().rss_mib)
                s0 = scrape(agg.url)
                ph = await run_phase(load, agg, "aggregator", steady(load))
                s1 = scrape(agg.url)
                await load.reconnect("pooled")  # per-node: let them go
                lag_n, lag_long = over(s0.lag_buckets, s1.lag_buckets, LAG_STALL)
                busy_n, busy_long = over(s0.busy_buckets, s1.busy_buckets, LAG_STALL)
                gc_n = int(s1.gc2_count - s0.gc2_count)
                _, gc_long = over(s0.gc2_buckets, s1.gc2_buckets, 0.0)
                by_mode[m][0].append(Window(ph, lag_n, lag_long, busy_n, busy_long, gc_n, gc_long,
                                            s1.visits - s0.visits, os.getloadavg()))
            for m in args.modes:
                await floor_window(m)
        end = scrape(agg.url)
    return by_mode, start, end


def mmm(values: list[float], fmt: str = "{:.2f}") -> str:
    if not values:
        return "-"
    return "/".join(fmt.format(v) for v in (min(values), statistics.median(values), max(values)))


def report_size(args: argparse.Namespace, n: int, runs: dict[bool, tuple[ByMode, Scrape, Scrape]], mode: str) -> None:
    asked = n / args.interval
    by_mode, start, end = runs[True]
    agg_w, floor_w = by_mode[mode]
    ratios = []
    for i, w in enumerate(agg_w):  # against the mean of the peer windows on either side
        peer_us = statistics.mean([floor_w[i].per_beat_us, floor_w[i + 1].per_beat_us])
        ratios.append(w.per_beat_us / peer_us)
    reached = [w.phase.reports / w.phase.wall for w in agg_w]
    late = sum(w.phase.late for w in agg_w + floor_w)
    share = [w.phase.cpu / w.phase.wall * 100 for w in agg_w]
    p99a = [percentile(w.phase.latencies, 99) * 1e3 for w in agg_w]
    p99f = [percentile(w.phase.latencies, 99) * 1e3 for w in floor_w]
    gen = [w.phase.client_cpu / w.phase.wall * 100 for w in agg_w]
    print(f"\n== {n:,} nodes, a heartbeat every {args.interval:g} s (full report every {args.full_interval:g} s), "
          f"connections: {CONNECTIONS[mode]}")
    print(f"  rate asked {asked:,.0f}/s; reached {mmm(reached, '{:,.0f}')}/s (min/median/max)"
          + ("" if min(reached) >= 0.95 * asked else
             f"  -- NOT the agents' rate: the load generator could not reach it on this machine (load average "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; the generator used {statistics.median(gen):.0f}% of "
             f"a core, {args.concurrency} heartbeats in flight at most, fell behind by {late} sends): the figures are "
             f"at the rate reached"))
    print(f"  | figure | aggregator | peer (empty aiohttp handler) | ratio (min/median/max) |")
    print(f"  |---|---|---|---|")
    print(f"  | CPU per heartbeat | {mmm([w.per_beat_us for w in agg_w], '{:.0f}')} us | "
          f"{mmm([w.per_beat_us for w in floor_w], '{:.0f}')} us | {mmm(ratios)}x (guard <= 1.5x) |")
    print(f"  | share of one core | {mmm(share, '{:.1f}')}% | {mmm([w.phase.cpu / w.phase.wall * 100 for w in floor_w], '{:.1f}')}% | |")
    print(f"  | client p99 | {mmm(p99a, '{:.1f}')} ms | {mmm(p99f, '{:.1f}')} ms | {mmm([a / b for a, b in zip(p99a, p99f)])}x |")
    print(f"  | event-loop lag > 50 ms | {sum(w.lag_over for w in agg_w)} in {len(agg_w)} windows; longest "
          f"{', '.join(w.lag_longest for w in agg_w)}; since start {end.lag_max * 1e3:.0f} ms | | |")
    print(f"  | of which the loop's own work | {sum(w.busy_over for w in agg_w)}; longest "
          f"{', '.join(w.busy_longest for w in agg_w)} | | target: none over 50 ms (the rest is waiting for a CPU) |")
    per_pass = [w.visits / max(1.0, w.phase.wall / 5.0) for w in agg_w]
    print(f"  | housekeeping: nodes visited per pass (5 s) | {mmm(per_pass, '{:.0f}')} | | "
          f"heartbeats per pass ~{asked * 5:,.0f} at the asked rate |")
    off = runs.get(False)
    gc_on = f"{end.gc2_count - start.gc2_count:.0f} full GCs over the run; in windows {sum(w.gc2 for w in agg_w)}, " \
            f"longest {', '.join(w.gc2_longest for w in agg_w)}"
    print(f"  | full GC pauses, gc_freeze on | {gc_on} | | |")
    if off is not None and mode in off[0]:
        o_by, o_start, o_end = off
        o_agg = o_by[mode][0]
        print(f"  | full GC pauses, gc_freeze off | {o_end.gc2_count - o_start.gc2_count:.0f} full GCs over the run; in "
              f"windows {sum(w.gc2 for w in o_agg)}, longest {', '.join(w.gc2_longest for w in o_agg)} | | |")
        print(f"  | CPU per heartbeat, gc_freeze off | {mmm([w.per_beat_us for w in o_agg], '{:.0f}')} us | | |")
    if mode == "per-node" and getattr(args, "rss_warm", None):
        before, after = args.rss_warm
        print(f"  aggregator RSS {before:.0f} MiB before every node's connection was open, {after:.0f} MiB with "
              f"them open: ~{(after - before) * 1024 / n:.1f} KiB per kept connection")
    loads = [w.load for w in agg_w + floor_w]
    print(f"  load average (1 min) during the windows: {mmm([x[0] for x in loads])}; "
          f"{os.cpu_count()} CPUs on this machine")


async def run_size(args: argparse.Namespace, wd: Path, n: int, body: Callable[[str, float], bytes]) -> None:
    nodes = node_names(n)
    runs: dict[bool, tuple[ByMode, Scrape, Scrape]] = {}
    with FloorServer() as floor:
        for freeze in ([True, False] if args.gc_off else [True]):
            print(f"\n[{n:,} nodes, gc_freeze {'on' if freeze else 'off'}]")
            runs[freeze] = await aggregator_windows(args, wd, nodes, body, freeze, floor,
                                                    args.repeats if freeze else 1)
    for mode in args.modes:
        report_size(args, n, runs, mode)
    if len(args.modes) == 2:
        compare(runs[True][0])


def compare(by_mode: ByMode) -> None:
    """Kept against fresh connections, window by window (each pair minutes apart at most)."""
    (a_f, p_f), (a_k, p_k) = by_mode["fresh"], by_mode["per-node"]
    agg = [k.per_beat_us / f.per_beat_us for k, f in zip(a_k, a_f)]
    peer = [k.per_beat_us / f.per_beat_us for k, f in zip(p_k, p_f)]
    print(f"\n== before/after, the same sitting: CPU per heartbeat with each node's connection kept, over a new "
          f"connection per heartbeat (window by window, min/median/max)")
    print(f"  aggregator {mmm(agg)}x; peer (empty handler) {mmm(peer)}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10,000 nodes, 2 windows of 20 s (under 5 minutes)")
    ap.add_argument("--nodes", type=int, action="append", help="fleet size (repeatable; default 10,000 and 100,000)")
    ap.add_argument("--interval", type=float, default=30.0, help="seconds between heartbeats (publish.report_interval)")
    ap.add_argument("--full-interval", type=float, default=300.0, help="publish.full_report_interval")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per measured window")
    ap.add_argument("--repeats", type=int, default=3, help="aggregator windows per size (peer windows around each)")
    ap.add_argument("--concurrency", type=int, default=512, help="heartbeats in flight at most")
    ap.add_argument("--no-gc-off", dest="gc_off", action="store_false",
                    help="skip the second aggregator with gc_freeze off")
    ap.add_argument("--connections", choices=("per-node", "fresh", "both"), default="per-node",
                    help="each node keeps its connection across heartbeats, as agents do now (default), a new one "
                         "per heartbeat, as they did with aiohttp's 15 s keep-alive (before), or both in turns")
    ap.add_argument("--report-source", choices=("simulator", "factory"), default="simulator",
                    help="full reports captured from a simulated agent (default) or benchlib's stand-in")
    args = ap.parse_args()
    if args.quick:
        args.nodes, args.window, args.repeats = args.nodes or [10_000], 20.0, 2
    args.nodes = args.nodes or [10_000, 100_000]
    if min(args.nodes) < 1 or args.interval <= 0 or args.window <= 0 or args.repeats < 1:
        ap.error("--nodes, --interval, --window and --repeats must be positive")
    args.modes = ["fresh", "per-node"] if args.connections == "both" else [args.connections]
    fds = raise_fd_limit()
    if "per-node" in args.modes and fds < max(args.nodes) + 1024:
        ap.error(f"per-node connections need {max(args.nodes) + 1024} open files here and in the server; "
                 f"the hard limit is {fds} (ulimit -Hn)")
    t0 = time.monotonic()
    with workdir("ph-capacity-") as wd:
        if args.report_source == "simulator":
            bodies = capture_reports(wd)
            body = body_maker(templates_of(bodies))
            print(f"capacity: full reports from a simulated DGX H100 agent: {len(bodies)} captures, "
                  f"{min(map(len, bodies)):,}-{max(map(len, bodies)):,} bytes")
        else:
            factory = ReportFactory()
            tpl, rng = factory.live_template(), random.Random(3)
            body = lambda node, t: tpl.render([json.dumps(node)] + factory.live_values(t, rng))  # noqa: E731
            print("capacity: full reports from benchlib.ReportFactory (a stand-in)")
        gc.collect()
        gc.freeze()  # the generator's own full GCs would count as the aggregator's latency
        for n in args.nodes:
            asyncio.run(run_size(args, wd, n, body))
    print(f"\nrun took {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
