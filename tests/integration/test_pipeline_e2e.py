"""The whole pipeline, real components all the way (issue 7, "End to end").

    simulated DGX nodes dgx01..dgx04 (`podhealth agent --simulate`)
      ├─ direct push (publish.aggregator_url) ──────────────────────────┐
      └─ /metrics ─► Prometheus (shipped rules) ─► Alertmanager (shipped  ├─► aggregator ─► loopback Slurm
                     config) ─► pager/ticket sinks + /v1/alertmanager ──┘

dgx01..dgx03 push to the aggregator (publish.aggregator_url) and are pulled by it (agent_url, the
design's backstop that also closes conditions the pushes leave open); dgx04 does neither (a node
the aggregator only hears about through the site's Prometheus), so each path has a node that only
it can drain, and the test times both.

Phase A: XID 79 on dgx02 and dgx04 at once. dgx02 is drained by the push (its Slurm reason
names the agent's `xid` check), dgx04 by the alert (the reason names the alert); the alerts for
dgx02 fire, reach Alertmanager, its pager sink and the aggregator, and dgx02 is fenced once.
Phase B: after both are cleared and released, an NFS outage on every node: the breaker trips,
nothing is drained, and PodhealthBreakerTripped fires.

Time is scaled down by SCALE: the shipped rules' `for:`, Alertmanager's group timings and
Prometheus's alert resend delay are production settings times 1/30 (1m -> 2s), on copies written
to tmp, never the shipped files.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from podhealth.fencing.slurm import SlurmNode, parse_show_node
from tests.harness import stack
from tests.harness.proc import free_port, wait_until
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NODES = ("dgx01", "dgx02", "dgx03", "dgx04")
PUSHING = ("dgx01", "dgx02", "dgx03")
ALERT_ONLY = "dgx04"
DIRECT = "dgx02"
CLUSTER, PARTITION = "e2e", "gpu"  # SlurmCluster's partition is "gpu"
SCALE = 1 / 30
# The agents judge XIDs over this window, so a cleared XID stops failing this long after it was
# logged (production: 300 s); long enough for the alert path to drain dgx04 on a loaded machine.
XID_WINDOW = 15.0
# Lasting conditions (NFS, node health alerts) must persist this long before a fence; XIDs fence
# at once. It also gives the breaker time to see a fleet-wide outage before any node is fenced.
MIN_DURATION = 15.0
PULL_INTERVAL = 10.0  # the aggregator default
TIMEOUT = 60.0  # per wait; generous because ~8 engineers share this machine's 2 cores
NODE_ALERTS = ("PodhealthGPUXidCritical", "PodhealthNodeFailReboot", "PodhealthNodeFailReplace")

slurm = slurm_fixture(scope="module", nodes=len(NODES))


def aggregator_section(slurm_conf: Path, agent_urls: dict[str, str]) -> dict[str, Any]:
    fence_actions = ["RESET_GPU", "DRAIN", "REBOOT", "REPLACE"]
    return {
        "decide_interval": 0.2,
        # Pulls are the backstop; slow enough that the push is what brings an XID in first.
        "pull_interval": PULL_INTERVAL,
        "unreachable_after": 3600.0,
        "rules": [
            {"check": "xid", "min_severity": "critical", "do": "fence", "min_duration": 0.0},
            {"check": "PodhealthGPUXid*", "min_severity": "critical", "do": "fence", "min_duration": 0.0},
            {"check": "*", "actions": fence_actions, "min_severity": "critical", "do": "fence",
             "min_duration": MIN_DURATION},
            {"check": "*", "min_severity": "warning", "do": "notify"},
        ],
        "caps": {"max_fenced": 4, "max_percent_per_partition": 50.0},
        # 3 of 4 nodes turning bad within a minute is an outage: > 50 %, and at least 2 nodes.
        "breaker": {"share_percent": 50.0, "window": 60.0, "min_nodes": 2},
        "manual_release": True,
        "nodes": [{"name": n, "partition": PARTITION, **({"agent_url": agent_urls[n]} if n in agent_urls else {})}
                  for n in NODES],
        "fencers": {"slurm": {"enabled": True, "slurm_conf": str(slurm_conf), "timeout": 10.0}},
    }


def slurm_node(cluster: SlurmCluster, node: str) -> SlurmNode:
    nodes = parse_show_node(cluster.run("scontrol", "show", "node", "-o", node).stdout)
    assert len(nodes) == 1, nodes
    return nodes[0]


def fences(agg: stack.AggregatorProc, node: str) -> list[dict[str, Any]]:
    """Audit lines of fencer calls that fenced `node` (one per fencer per fence)."""
    return [h for h in agg.history(node) if h["type"] == "audit" and h["what"].startswith("fence via") and h["ok"]]


def node_alerts(prom: stack.Prometheus, node: str) -> list[str]:
    return sorted({a["labels"]["alertname"] for a in prom.alerts() if a["labels"].get("node") == node})


@pytest.fixture
def pipeline(tmp_path: Path, slurm: SlurmCluster) -> Iterator[dict[str, Any]]:
    rules = tmp_path / "podhealth-rules.yml"
    rules.write_text(stack.scale_rule_durations(stack.RULES.read_text(), SCALE))
    token_file = tmp_path / "aggregator-token"
    sim_root = tmp_path / "sim"
    ports = {n: free_port() for n in PUSHING}
    urls = {n: f"http://127.0.0.1:{p}" for n, p in ports.items()}
    with stack.WebhookSink() as sink, \
            stack.aggregator(tmp_path / "aggregator", aggregator_section(slurm.conf, urls)) as agg:
        token_file.write_text(agg.cluster_token)
        configs = {n: stack.agent_config(rate_window=XID_WINDOW, publish_url=agg.url, token=agg.node_token(n),
                                         spool_dir=tmp_path / "spool" / n) for n in PUSHING}
        configs[ALERT_ONLY] = stack.agent_config(rate_window=XID_WINDOW)
        am_config = stack.alertmanager_config(
            stack.ALERTMANAGER_CONFIG.read_text(),
            {"pager": sink.url("pager"), "ticket": sink.url("ticket"),
             "podhealth-aggregator": f"{agg.url}/v1/alertmanager"},
            factor=SCALE, credentials_file=token_file)
        with stack.agents(tmp_path / "agents", sim_root, configs, ports=ports) as agents, \
                stack.alertmanager(tmp_path / "alertmanager", am_config) as am, \
                stack.prometheus(tmp_path / "prometheus",
                                 [stack.ScrapeJob("podhealth", agents.targets(), {"cluster": CLUSTER,
                                                                                  "partition": PARTITION}),
                                  stack.ScrapeJob("podhealth-aggregator", (agg.url.removeprefix("http://"),),
                                                  {"cluster": CLUSTER})],
                                 rule_files=[rules], alertmanager=am.url, resend_delay=60 * SCALE) as prom:
            yield {"sink": sink, "agg": agg, "agents": agents, "am": am, "prom": prom, "sim_root": sim_root}


def test_xid_drains_once_by_push_and_alert_and_nfs_outage_trips_breaker(
        pipeline: dict[str, Any], slurm: SlurmCluster) -> None:
    try:
        run_phases(pipeline, slurm)
    except AssertionError as e:
        # Say what the stack looked like: the processes are gone once the fixture ends.
        agents: stack.Agents = pipeline["agents"]
        state = stack.describe(pipeline["agg"], pipeline["prom"], slurm, list(agents.services.values()))
        raise AssertionError(f"{e}\n{state}") from None


def run_phases(pipeline: dict[str, Any], slurm: SlurmCluster) -> None:
    sink: stack.WebhookSink = pipeline["sink"]
    agg: stack.AggregatorProc = pipeline["agg"]
    am: stack.Alertmanager = pipeline["am"]
    prom: stack.Prometheus = pipeline["prom"]
    sim_root: Path = pipeline["sim_root"]
    laps: list[str] = []
    last = [time.monotonic()]

    def lap(what: str) -> None:
        now = time.monotonic()
        laps.append(f"{what} {now - last[0]:.1f}s")
        last[0] = now

    # ---- a healthy fleet, seen by every path ---------------------------------------------------
    prom.wait_scraped("podhealth", len(NODES), samples=2, timeout=TIMEOUT)
    prom.wait_scraped("podhealth-aggregator", 1, samples=2, timeout=TIMEOUT)
    wait_until(lambda: prom.value('count(podhealth_node_health{cluster="e2e"} == 0)') == len(NODES), TIMEOUT, 0.5,
               "every node OK in Prometheus")
    wait_until(lambda: all(agg.node(n)["status"] == "OK" for n in PUSHING), TIMEOUT, 0.2,
               f"the aggregator to see {', '.join(PUSHING)} OK")
    assert agg.metric("podhealth_aggregator_ingest_requests_total", endpoint="events", result="ok") > 0, \
        "the agents pushed nothing to /v1/events"
    assert {n: slurm_node(slurm, n).drained for n in NODES} == {n: False for n in NODES}
    assert not [a for a in prom.alerts() if a["labels"]["alertname"] in NODE_ALERTS]

    lap("healthy fleet")
    # ---- phase A: XID 79 on dgx02 (pushes) and dgx04 (alerts only), at the same time ----------
    stack.simulate_all(sim_root, [("inject", DIRECT, "xid=79", "gpu=3"), ("inject", ALERT_ONLY, "xid=79", "gpu=3")])
    drained_at: dict[str, float] = {}

    def both_drained() -> bool:
        for n in (DIRECT, ALERT_ONLY):
            if n not in drained_at and slurm_node(slurm, n).drained:
                drained_at[n] = time.time()
        return len(drained_at) == 2

    wait_until(both_drained, TIMEOUT, 0.05, f"{DIRECT} and {ALERT_ONLY} drained in Slurm")
    lap("XID -> both drained")
    latency = {n: drained_at[n] - stack.kernel_line_written(sim_root, n) for n in drained_at}
    direct, by_alert = slurm_node(slurm, DIRECT), slurm_node(slurm, ALERT_ONLY)
    assert direct.reason.startswith("podhealth: xid gpu3 "), \
        f"{DIRECT} should be drained by the agent's push (check xid), got reason {direct.reason!r}"
    assert by_alert.reason.startswith("podhealth: Podhealth"), \
        f"{ALERT_ONLY} pushes nothing, so only an alert can drain it; got reason {by_alert.reason!r}"
    # The agent pushed the XID itself (an event) and the verdict; say whether the push or the
    # backstop pull opened the condition behind the fence (a pushed verdict carries its event id).
    pushed = [h["event"]["event"] for h in agg.history(DIRECT) if h["type"] == "event" and "event" in h["event"]]
    assert [e for e in pushed if e.get("kind") == "xid" and e.get("code") == 79], \
        f"{DIRECT} pushed no XID 79 event, only {[(e.get('kind'), e.get('code'), e.get('source')) for e in pushed]}"
    xid_cond = [c for c in agg.node(DIRECT)["conditions"] if c["check"] == "xid"]
    opened_by = "push" if xid_cond and xid_cond[0]["ref"] else "pull"

    # The alert about dgx02 fires in Prometheus, reaches Alertmanager, the pager, and the aggregator.
    wait_until(lambda: set(node_alerts(prom, DIRECT)) & set(NODE_ALERTS), TIMEOUT, 0.2,
               f"an XID / node-fail alert for {DIRECT} firing in Prometheus")
    wait_until(lambda: {a["labels"]["alertname"] for a in am.alerts(node=DIRECT)} & set(NODE_ALERTS), TIMEOUT, 0.2,
               f"Alertmanager to hold the alert for {DIRECT}")
    wait_until(lambda: [a for _, a in sink.alerts("/pager", status="firing")
                        if a["labels"].get("node") == DIRECT and a["labels"]["alertname"] in NODE_ALERTS],
               TIMEOUT, 0.2, f"the pager sink to receive the page for {DIRECT}")
    wait_until(lambda: [h for h in agg.history(DIRECT) if h["type"] == "verdict" and h["source"] == "alertmanager"
                        and h["status"] == "FAIL"],
               TIMEOUT, 0.2, f"the aggregator to receive {DIRECT}'s alert through /v1/alertmanager")
    lap("alert path for dgx02")

    # Nothing is fenced twice: let the policy run on the alert's observation, then count.
    runs = agg.metric("podhealth_aggregator_decisions_total")
    wait_until(lambda: agg.metric("podhealth_aggregator_decisions_total") >= runs + 3, TIMEOUT, 0.2,
               "three more policy runs")
    assert len(fences(agg, DIRECT)) == 1, fences(agg, DIRECT)
    assert len(fences(agg, ALERT_ONLY)) == 1, fences(agg, ALERT_ONLY)
    assert slurm_node(slurm, DIRECT).reason == direct.reason, "the fence reason changed: fenced again?"
    assert slurm_node(slurm, ALERT_ONLY).reason == by_alert.reason
    assert agg.metric("podhealth_aggregator_fences_total") == 2
    assert not any(slurm_node(slurm, n).drained for n in NODES if n not in (DIRECT, ALERT_ONLY))
    lap("fenced once")

    # ---- back to service: clear, wait for the XIDs to age out, release --------------------------
    stack.simulate_all(sim_root, [("clear", DIRECT), ("clear", ALERT_ONLY)])

    def recovered() -> bool:
        return (all(not agg.node(n)["conditions"] for n in (DIRECT, ALERT_ONLY))
                and not [a for a in prom.alerts() if a["labels"].get("node") in (DIRECT, ALERT_ONLY)])

    wait_until(recovered, XID_WINDOW + TIMEOUT, 0.5, "the XIDs to age out and their alerts to resolve")
    lap("recovered")
    for n in (DIRECT, ALERT_ONLY):
        agg.release(n)
    wait_until(lambda: not any(slurm_node(slurm, n).drained for n in NODES), TIMEOUT, 0.1,
               "every node back in service in Slurm")
    fenced_before_b = agg.metric("podhealth_aggregator_fences_total")
    lap("released")

    # ---- phase B: NFS outage on every node at once -> the breaker, not four drains -----------
    t_b = time.time()
    stack.simulate_all(sim_root, [("inject", n, "fault=nfs-hung", "mount=/home") for n in NODES])
    wait_until(lambda: agg.metric("podhealth_aggregator_breaker_tripped") == 1, TIMEOUT, 0.1, "the breaker to trip")
    tripped_after = time.time() - t_b
    lap("NFS outage -> breaker")
    why = agg.fleet()["breaker"]["reason"]
    assert len(re.findall(r"\bdgx0\d\b", why)) >= 3, f"the breaker should name the nodes that turned bad: {why!r}"
    wait_until(lambda: prom.alerts("PodhealthBreakerTripped"), TIMEOUT, 0.2, "PodhealthBreakerTripped to fire")
    wait_until(lambda: sink.alerts("/pager", "PodhealthBreakerTripped", "firing"), TIMEOUT, 0.2,
               "the breaker page to reach the pager sink")
    # Past every node's minimum duration the policy would fence them all; the breaker holds them.
    wait_until(lambda: agg.metric("podhealth_aggregator_fences_held", reason="breaker_holding") >= len(PUSHING),
               MIN_DURATION + TIMEOUT, 0.2, "the policy to hold the fences because of the breaker")
    lap("breaker alert, fences held")
    drained = {n: slurm_node(slurm, n).state for n in NODES if slurm_node(slurm, n).drained}
    assert not drained, f"nodes drained during a fleet-wide outage: {drained}"
    assert agg.metric("podhealth_aggregator_fences_total") == fenced_before_b
    new = {n: [f for f in fences(agg, n) if f["time"] >= t_b] for n in NODES}
    assert not any(new.values()), new

    print(f"\ninjection -> drain: direct {latency[DIRECT]:.2f} s ({DIRECT}, condition opened by the {opened_by}); "
          f"Prometheus -> Alertmanager -> webhook {latency[ALERT_ONLY]:.2f} s ({ALERT_ONLY}); "
          f"NFS outage on {len(NODES)} nodes -> breaker tripped in {tripped_after:.2f} s ({why})\n"
          f"phases: {', '.join(laps)}")


# ---- the rewrites the test relies on (pure; no servers) ---------------------------------------


def test_scaled_rules_keep_every_rule_and_scale_for() -> None:
    shipped = yaml.safe_load(stack.RULES.read_text())
    scaled = yaml.safe_load(stack.scale_rule_durations(stack.RULES.read_text(), SCALE))
    pairs = [(a, b) for ga, gb in zip(shipped["groups"], scaled["groups"]) for a, b in zip(ga["rules"], gb["rules"])]
    assert len(pairs) == sum(len(g["rules"]) for g in shipped["groups"]) > 0
    for a, b in pairs:
        assert {k: v for k, v in a.items() if k != "for"} == {k: v for k, v in b.items() if k != "for"}
        if "for" in a:
            assert stack.parse_duration(b["for"]) == pytest.approx(max(1.0, stack.parse_duration(a["for"]) * SCALE))
    assert stack.format_duration(stack.parse_duration("1h30m") / 30) == "180s"
    assert stack.format_duration(10 / 30) == "333ms"
    with pytest.raises(ValueError):
        stack.parse_duration("5 minutes")


def test_alertmanager_config_sends_everything_to_loopback(tmp_path: Path) -> None:
    token = tmp_path / "token"
    text = stack.alertmanager_config(stack.ALERTMANAGER_CONFIG.read_text(),
                                     {"pager": "http://127.0.0.1:1/pager", "ticket": "http://127.0.0.1:1/ticket",
                                      "podhealth-aggregator": "http://127.0.0.1:2/v1/alertmanager"},
                                     factor=SCALE, credentials_file=token)
    doc = yaml.safe_load(text)
    urls = [h["url"] for r in doc["receivers"] for h in r.get("webhook_configs", [])]
    assert urls and all(u.startswith("http://127.0.0.1:") for u in urls), urls
    agg = next(r for r in doc["receivers"] if r["name"] == "podhealth-aggregator")
    assert agg["webhook_configs"][0]["http_config"]["authorization"]["credentials_file"] == str(token)
    assert stack.parse_duration(doc["route"]["group_wait"]) == pytest.approx(1.0)  # 30s / 30
    with pytest.raises(ValueError, match="no loopback URL"):
        stack.alertmanager_config(stack.ALERTMANAGER_CONFIG.read_text(), {"pager": "http://127.0.0.1:1/"})
