"""The aggregator's own /metrics (podhealth_aggregator_*), documented in docs/metrics.md.

Counters and the latency histogram are updated where things happen; the fleet gauges (nodes by
state, cap, breaker, pending actions) are computed from memory at scrape time, so they can never
drift from what the API shows.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from podhealth.aggregator.state import OURS_STATES, STATES, Memory

P = "podhealth_aggregator_"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
GC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # First in the registry, so first in every scrape (CollectorRegistry.collect walks its
        # collectors in registration order): the batched ingest metrics are folded in before
        # the metrics they feed are read.
        self._tallies: dict[str, IngestTally] = {}
        r.register(_FlushFirst(self._tallies))
        self.ingest_requests = Counter(P + "ingest_requests", "Ingest requests by endpoint and result "
                                       "(ok, bad_request, unauthorized, forbidden, too_large, unavailable; conflict: a\n"
                                       "lease the aggregator could not match, answered 409).",
                                       ["endpoint", "result"], registry=r)
        self.ingest_throttled = Counter(P + "ingest_throttled", "Pushes from a node answered 429 (Retry-After) because\n"
                                        "it was over its cap, by node and reason: rate (node_ingest.rate), stored\n"
                                        "(node_ingest.stored_bytes). Its FAIL transitions were applied all the same.",
                                        ["node", "reason"], registry=r)
        self.ingest_events = Counter(P + "ingest_events", "Ingested items by result (applied, duplicate, stale, unchanged).",
                                     ["result"], registry=r)
        self.ingest_latency = Histogram(P + "ingest_duration_seconds", "Ingest request handling time, commit included.",
                                        ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.actions = Counter(P + "actions", "Actions executed by kind (fence, release, handover, notify, reset_gpu, reboot,\n"
                               "repair) and result.",
                               ["kind", "result"], registry=r)
        self.fences = Counter(P + "fences", "Nodes newly fenced by podhealth, by the check and action behind them.",
                              ["check", "action"], registry=r)
        self.breaker_trips = Counter(P + "breaker_trips", "Times the circuit breaker tripped.", registry=r)
        self.pulls = Counter(P + "pulls", "Agent /health pulls by result (ok, unreachable, bad, unproven: an answer without the node's proof).", ["result"], registry=r)
        self.decisions = Counter(P + "decisions", "Policy runs.", registry=r)
        self.clock_ahead = Counter(P + "clock_ahead", "Agent records (and Alertmanager alerts' startsAt) whose time\n"
                                   "claim ran more than max_clock_skew ahead of the aggregator's clock (the claim orders\n"
                                   "and times nothing; the sender's clock is wrong).",
                                   registry=r)
        self.flap_holds = Counter(P + "flap_holds", "Nodes held fenced for an operator because they flapped\n"
                                  "(flap_hold.cycles fence/release cycles within flap_hold.window).", registry=r)
        self.stale_marks = Counter(P + "stale_marks", "podhealth marks left by a deposed leader (an older lease epoch)\n"
                                   "on nodes the journal released since: undone by reconcile, never adopted.", registry=r)
        self.repairs = Counter(P + "repairs", "Nodes handed to repair by the remediation ladder (ladder.max_attempts\n"
                               "failed resets/reboots within ladder.window); they wait for an operator.", registry=r)
        self.http_refused = Counter(P + "http_connections_refused", "Connections refused because max connections\n"
                                    "were open, or the client's share of them (idle and slow connections time out).", registry=r)
        self.http_open = Gauge(P + "http_connections", "HTTP connections open now: one per node (agents keep theirs\n"
                               "between heartbeats), plus the UI's and scrapers'. Each is a file descriptor.", registry=r)
        self.http_max = Gauge(P + "http_connections_max", "Connections the aggregator keeps open at most\n"
                              "(connections.max, else 3/4 of the open-file limit); one more is refused.", registry=r)
        self.lease_epoch = Gauge(P + "store_lease_epoch", "Epoch of this process's exclusive lease on the state\n"
                                 "store (one more per start: the fencing token).", registry=r)
        self.leader = Gauge(P + "leader", "1 while this aggregator decides and acts (the leader of the replicas on\n"
                            "one PostgreSQL; always 1 with SQLite), 0 while it only ingests and serves.", registry=r)
        self.lease_age = Gauge(P + "lease_age_seconds", "Seconds since this replica last saw the lease row (its\n"
                               "renewal as leader, its look as follower); grows when the database does not answer.",
                               registry=r)
        self.housekeeping_visits = Counter(P + "housekeeping_visits", "Nodes the housekeeping passes looked at\n"
                                           "(those heard since the last pass, fallen silent, or on their way to\n"
                                           "node_unreachable): it follows what changed, not the fleet's size.", registry=r)
        self.housekeeping_last = Gauge(P + "housekeeping_last_visits", "Nodes the last housekeeping pass looked at.",
                                       registry=r)
        self.gc_pause = Histogram(P + "gc_pause_seconds", "Pauses of Python's cyclic garbage collector, by generation\n"
                                  "(2: a full pass; aggregator.gc_freeze keeps those short).",
                                  ["generation"], buckets=GC_BUCKETS, registry=r)
        self.gc_frozen = Gauge(P + "gc_frozen_objects", "Objects moved out of the collector's full passes (gc.freeze).",
                               registry=r)
        self.loop_lag = Histogram(P + "loop_lag_seconds", "How late the event loop ran a 50 ms timer: a stall (a\n"
                                  "long handler, a GC pause) shows here, as every request in flight waits for it.",
                                  buckets=LAG_BUCKETS, registry=r)
        self.loop_busy = Histogram(P + "loop_busy_seconds", "Of each loop lag, the part the loop spent running (its own\n"
                                   "work: a long handler, a GC pause), not waiting for a CPU (a loaded machine).",
                                   buckets=LAG_BUCKETS, registry=r)
        self.loop_lag_max = Gauge(P + "loop_lag_max_seconds", "The longest event-loop lag seen since the start.",
                                  registry=r)
        self._lag_max = 0.0
        self._gc_children = [self.gc_pause.labels(str(g)) for g in range(3)]
        self._ingest: dict[str, tuple[Any, Any]] = {}
        self._results: dict[str, Any] = {}

    def observe_gc(self, generation: int, seconds: float) -> None:
        """One collection's pause (handed over by gcwatch.Freezer.drain)."""
        self._gc_children[min(2, max(0, generation))].observe(seconds)

    def observe_lag(self, seconds: float, busy: float) -> None:
        """One look of the loop-lag probe (looplag.probe)."""
        self.loop_lag.observe(seconds)
        self.loop_busy.observe(busy)
        if seconds > self._lag_max:
            self._lag_max = seconds
            self.loop_lag_max.set(seconds)

    def ingest_children(self, endpoint: str) -> tuple[Any, Any]:
        """(latency histogram, ok counter) of an endpoint, looked up once: this is the hot path."""
        c = self._ingest.get(endpoint)
        if c is None:
            c = self._ingest[endpoint] = (self.ingest_latency.labels(endpoint),
                                          self.ingest_requests.labels(endpoint, "ok"))
        return c

    def ingest_result(self, result: str) -> Any:
        """The ingest_events child for `result`, looked up once (hot path, like ingest_children)."""
        c = self._results.get(result)
        if c is None:
            c = self._results[result] = self.ingest_events.labels(result)
        return c

    def ingest_tally(self, endpoint: str) -> "IngestTally":
        """The batched ok-path metrics of an endpoint (IngestTally), one per endpoint."""
        t = self._tallies.get(endpoint)
        if t is None:
            latency, ok = self.ingest_children(endpoint)
            t = self._tallies[endpoint] = IngestTally(latency, ok, self.ingest_result)
        return t

    def add_fleet(self, mem: Callable[[], Memory | None], cap: int, pending: Callable[[], int],
                  held: Callable[[], dict[str, int]]) -> None:
        self.registry.register(_Fleet(mem, cap, pending, held))


FLUSH_AT = 4096  # answered requests held before they are folded into the metrics (~4 s at 1,000/s)


class IngestTally:
    """An ingest endpoint's answered requests, folded into its prometheus metrics (latency
    histogram, ok counter, ingest_events by result) in batches: before every scrape and every
    FLUSH_AT requests. At ~1,000 reports/s a histogram observe and two counter increments per
    request (each a Python call that takes a lock) were a good part of the handler's own cost;
    one list append is what is left on the request path. Single-threaded: the event loop both
    records and scrapes."""

    def __init__(self, latency: Any, ok: Any, result: Callable[[str], Any]) -> None:
        self._latency, self._ok, self._result = latency, ok, result
        self._pending: list[tuple[float, str]] = []

    def ok(self, seconds: float, result: str) -> None:
        """One request answered 200 in `seconds`; its one ingested item came out as `result`."""
        pending = self._pending
        pending.append((seconds, result))
        if len(pending) >= FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        counts: dict[str, int] = {}
        observe = self._latency.observe
        for seconds, result in pending:
            observe(seconds)
            counts[result] = counts.get(result, 0) + 1
        self._ok.inc(len(pending))
        for result, n in counts.items():
            self._result(result).inc(n)


class _FlushFirst(Collector):
    """Yields nothing: collected first in every scrape, it folds the tallies into the metrics
    the scrape is about to read."""

    def __init__(self, tallies: dict[str, IngestTally]) -> None:
        self.tallies = tallies

    def collect(self) -> Iterator[Metric]:
        for t in self.tallies.values():
            t.flush()
        return iter(())


class _Fleet(Collector):
    def __init__(self, mem: Callable[[], Memory | None], cap: int, pending: Callable[[], int],
                 held: Callable[[], dict[str, int]]) -> None:
        self.mem, self.cap, self.pending, self.held = mem, cap, pending, held

    def collect(self) -> Iterator[Metric]:
        m = self.mem()
        if m is None:
            return
        nodes = GaugeMetricFamily(P + "nodes", "Nodes by state (OK, WARN, FAIL, UNKNOWN, fenced, returning, drained, repair).",
                                  labels=["state"])
        counts = m.counts()
        for state, n in counts.items():
            nodes.add_metric([state], n)
        yield nodes
        # A node podhealth fences (fence.ours) is in one of these states, and no other is: the
        # counts' walk gives the cap's use without a second walk of every node per scrape.
        used = sum(counts.get(s, 0) for s in OURS_STATES)
        yield GaugeMetricFamily(P + "fence_cap_used", "Nodes podhealth has fenced (or is fencing) now.", value=used)
        yield GaugeMetricFamily(P + "fence_cap_limit", "The cap on nodes fenced by podhealth (caps.max_fenced).",
                                value=self.cap)
        yield GaugeMetricFamily(P + "pending_actions", "Fence/release actions recorded but not yet confirmed.",
                                value=self.pending())
        yield GaugeMetricFamily(P + "breaker_tripped", "1 while the circuit breaker holds all new fences.",
                                value=int(m.breaker.tripped))
        held = GaugeMetricFamily(P + "fences_held", "Nodes the last policy run wanted to fence but held back, by why.",
                                 labels=["reason"])
        for reason, n in sorted(self.held().items()):
            held.add_metric([reason], n)
        yield held
        yield GaugeMetricFamily(P + "open_conditions", "Open non-OK conditions across the fleet.",
                                value=len(m.conditions))


__all__ = ["Metrics", "STATES"]
