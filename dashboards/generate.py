"""Generate podhealth's Grafana dashboards (dashboards/*.json) from one readable description.

Run `python dashboards/generate.py` after editing; tests/integration/test_dashboards.py checks
the committed JSON matches this file, is a valid Grafana dashboard model, and that every panel's
query returns data from a real Prometheus scraping a simulated fleet.
Variables: datasource, cluster, partition, node, gpu (cluster/partition come from scrape labels,
which `podhealth simulate fleet` prints in its scrape config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from podhealth.alertrules import first_event_increase

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}
SEL = 'cluster=~"$cluster",partition=~"$partition",node=~"$node"'
NODE_SEL = 'cluster=~"$cluster",partition=~"$partition"'


def _var(name: str, query: str, multi: bool = True, include_all: bool = True) -> dict[str, Any]:
    return {"name": name, "label": name, "type": "query", "datasource": DS, "refresh": 2,
            "query": {"query": query, "refId": f"var-{name}"}, "definition": query,
            "multi": multi, "includeAll": include_all, "allValue": ".*", "current": {}, "sort": 1}


def _templating(gpu: bool = False) -> dict[str, Any]:
    vars_: list[dict[str, Any]] = [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus", "current": {}},
        _var("cluster", "label_values(podhealth_build_info, cluster)"),
        _var("partition", 'label_values(podhealth_build_info{cluster=~"$cluster"}, partition)'),
        _var("node", f"label_values(podhealth_build_info{{{NODE_SEL}}}, node)"),
    ]
    if gpu:
        vars_.append(_var("gpu", f"label_values(podhealth_gpu_up{{{SEL}}}, gpu)"))
    return {"list": vars_}


class Board:
    def __init__(self, uid: str, title: str, tags: list[str], gpu_var: bool = False) -> None:
        self.uid, self.title, self.tags, self.gpu_var = uid, title, tags, gpu_var
        self.panels: list[dict[str, Any]] = []
        self._x = self._y = 0
        self._row_h = 0

    def _place(self, w: int, h: int) -> dict[str, int]:
        if self._x + w > 24:
            self._x, self._y = 0, self._y + self._row_h
            self._row_h = 0
        pos = {"x": self._x, "y": self._y, "w": w, "h": h}
        self._x += w
        self._row_h = max(self._row_h, h)
        return pos

    def add(self, kind: str, title: str, targets: list[tuple[str, str]], w: int = 12, h: int = 8,
            unit: str = "short", desc: str = "", **extra: Any) -> None:
        panel: dict[str, Any] = {
            "id": len(self.panels) + 1, "type": kind, "title": title, "description": desc, "datasource": DS,
            "gridPos": self._place(w, h),
            "targets": [{"refId": chr(65 + i), "datasource": DS, "expr": expr, "legendFormat": legend,
                         "instant": kind in ("stat", "table", "bargauge")}
                        for i, (expr, legend) in enumerate(targets)],
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {},
        }
        if kind == "stat":
            panel["options"] = {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"}
        panel.update(extra)
        self.panels.append(panel)

    def json(self) -> dict[str, Any]:
        return {
            "uid": self.uid, "title": self.title, "tags": ["podhealth", *self.tags], "timezone": "browser",
            "schemaVersion": 39, "version": 1, "editable": True, "graphTooltip": 1,
            "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
            "templating": _templating(self.gpu_var), "annotations": {"list": []}, "links": [
                {"title": "podhealth", "type": "dashboards", "tags": ["podhealth"], "asDropdown": True}],
            "panels": self.panels,
        }


HEALTH_COLOURS = {"mappings": [{"type": "value", "options": {
    "0": {"text": "OK", "color": "green"}, "1": {"text": "WARN", "color": "yellow"},
    "2": {"text": "FAIL", "color": "red"}, "3": {"text": "UNKNOWN", "color": "purple"}}}]}


def fleet() -> Board:
    b = Board("podhealth-fleet", "podhealth / Fleet overview", ["fleet"])
    for i, (name, val) in enumerate((("OK", 0), ("WARN", 1), ("FAIL", 2), ("UNKNOWN", 3))):
        b.add("stat", f"Nodes {name}", [(f"count(podhealth_node_health{{{SEL}}} == {val}) or vector(0)", name)], w=4, h=4)
    b.add("stat", "Breaker", [("max(podhealth_aggregator_breaker_tripped)", "tripped")], w=4, h=4,
          desc="1 = the aggregator stopped fencing: too many nodes turned bad at once.")
    b.add("stat", "Fence budget used", [("max(podhealth_aggregator_fence_cap_used) / max(podhealth_aggregator_fence_cap_limit)", "used")],
          w=4, h=4, unit="percentunit")
    b.add("state-timeline", "Node health", [(f"max by (node) (podhealth_node_health{{{SEL}}})", "{{node}}")], w=24, h=10,
          fieldConfig={"defaults": {"unit": "short", **HEALTH_COLOURS}, "overrides": []})
    b.add("table", "Failing checks", [(f"podhealth_check_status{{{SEL}}} >= 1", "")], w=24, h=8,
          desc="Every (check, entity) that is WARN, FAIL or UNKNOWN, with the action it asks for.",
          transformations=[{"id": "labelsToFields", "options": {}}])
    b.add("timeseries", "Nodes by aggregator state", [("sum by (state) (podhealth_aggregator_nodes)", "{{state}}")], w=12)
    b.add("timeseries", "Fences by check", [(f"sum by (check, action) ({first_event_increase('podhealth_aggregator_fences_total', '1h')})", "{{check}} {{action}}")], w=12)
    b.add("timeseries", "Pending fence actions and held-back fences", [
        ("sum(podhealth_aggregator_pending_actions)", "pending"),
        ("sum by (reason) (podhealth_aggregator_fences_held)", "held: {{reason}}")], w=12)
    b.add("timeseries", "XID events by code (fleet)", [(f"sum by (code) ({first_event_increase(f'podhealth_xid_events_total{{{SEL}}}', '10m')})", "XID {{code}}")], w=12)
    return b


def node() -> Board:
    b = Board("podhealth-node", "podhealth / Node detail", ["node"])
    b.add("stat", "Node verdict", [(f"max(podhealth_node_health{{{SEL}}})", "health")], w=6, h=4,
          fieldConfig={"defaults": {"unit": "short", **HEALTH_COLOURS}, "overrides": []})
    b.add("stat", "GPUs up", [(f"sum(podhealth_gpu_up{{{SEL}}})", "up")], w=6, h=4)
    b.add("stat", "IB ports active", [(f"count(podhealth_infiniband_port_state{{{SEL}}} == 4) or vector(0)", "active")], w=6, h=4)
    b.add("stat", "NFS mounts answering", [(f"sum(podhealth_nfs_probe_ok{{{SEL}}})", "ok")], w=6, h=4)
    b.add("table", "Check results", [(f"podhealth_check_status{{{SEL}}}", "")], w=24, h=10,
          transformations=[{"id": "labelsToFields", "options": {}}],
          fieldConfig={"defaults": {"unit": "short", **HEALTH_COLOURS}, "overrides": []})
    b.add("timeseries", "GPU temperature", [(f"podhealth_gpu_temperature_celsius{{{SEL}}}", "{{node}} gpu{{gpu}}")], unit="celsius")
    b.add("timeseries", "NVLinks up per GPU", [(f"podhealth_nvlink_links_up{{{SEL}}}", "{{node}} gpu{{gpu}}")])
    b.add("timeseries", "InfiniBand port rate", [(f"podhealth_infiniband_port_rate_bytes_per_second{{{SEL}}}", "{{device}}/{{port}}")], unit="Bps")
    b.add("timeseries", "NFS probe latency", [(f"podhealth_nfs_probe_seconds{{{SEL}}}", "{{mountpoint}}")], unit="s")
    # Host errors under the GPUs: AER counts are since boot (a fatal one holds until reboot).
    b.add("timeseries", "PCIe AER errors since boot", [(f"sum by (node, kind, pci, severity) (podhealth_pcie_aer_errors_total{{{SEL}}})", "{{node}} {{kind}} {{pci}} {{severity}}")],
          w=8, desc="aer_dev_* TOTAL per PCI function (gpu, hca, nvswitch, nvme, port). Fatal on a GPU/HCA link drains the node.")
    b.add("timeseries", "Host memory errors (EDAC)", [(f"sum by (node, mc, type) (podhealth_edac_mc_errors_total{{{SEL}}})", "{{node}} {{mc}} {{type}}")],
          w=8, desc="Corrected (ce) and uncorrected (ue) memory errors per memory controller since boot; the check names the DIMM.")
    b.add("timeseries", "NVMe life used / spare", [(f"podhealth_nvme_percentage_used{{{SEL}}}", "used {{node}} {{controller}}"),
                                                    (f"podhealth_nvme_available_spare_percent{{{SEL}}}", "spare {{node}} {{controller}}")],
          w=8, unit="percent", desc="SMART percentage used and available spare (absent without nvme-cli on a real node).")
    b.add("timeseries", "XID events", [(f"sum by (gpu, code) ({first_event_increase(f'podhealth_xid_events_total{{{SEL}}}', '10m')})", "gpu{{gpu}} XID {{code}}")], w=24)
    return b


def gpu() -> Board:
    g = f'{SEL},gpu=~"$gpu"'
    b = Board("podhealth-gpu", "podhealth / GPU", ["gpu"], gpu_var=True)
    b.add("timeseries", "Utilization", [(f"podhealth_gpu_utilization_ratio{{{g}}}", "{{node}} gpu{{gpu}}")], unit="percentunit")
    b.add("timeseries", "Power draw vs limit", [(f"podhealth_gpu_power_watts{{{g}}}", "{{node}} gpu{{gpu}}"),
                                                 (f"podhealth_gpu_power_limit_watts{{{g}}}", "limit {{node}} gpu{{gpu}}")], unit="watt")
    b.add("timeseries", "GPU / memory temperature", [(f"podhealth_gpu_temperature_celsius{{{g}}}", "core {{node}} gpu{{gpu}}"),
                                                      (f"podhealth_gpu_memory_temperature_celsius{{{g}}}", "HBM {{node}} gpu{{gpu}}")], unit="celsius")
    b.add("timeseries", "SM clock vs max", [(f"podhealth_gpu_sm_clock_hertz{{{g}}}", "{{node}} gpu{{gpu}}"),
                                             (f"podhealth_gpu_sm_clock_max_hertz{{{g}}}", "max {{node}} gpu{{gpu}}")], unit="hertz")
    b.add("state-timeline", "Clocks-event reasons active", [(f"podhealth_gpu_clocks_event_active{{{g}}} == 1", "{{node}} gpu{{gpu}} {{reason}}")], w=24)
    b.add("timeseries", "ECC errors (volatile)", [(f'podhealth_gpu_ecc_errors_total{{{g},scope="volatile"}}', "{{node}} gpu{{gpu}} {{type}}")])
    b.add("timeseries", "Remapped rows", [(f"podhealth_gpu_remapped_rows{{{g}}}", "{{node}} gpu{{gpu}} {{type}}"),
                                           (f"podhealth_gpu_remapped_rows_pending{{{g}}}", "pending {{node}} gpu{{gpu}}")])
    b.add("timeseries", "PCIe link width / gen", [(f"podhealth_gpu_pcie_link_width{{{g}}}", "width {{node}} gpu{{gpu}}"),
                                                   (f"podhealth_gpu_pcie_link_gen{{{g}}}", "gen {{node}} gpu{{gpu}}")])
    b.add("timeseries", "PCIe replays", [(f"rate(podhealth_gpu_pcie_replay_total{{{g}}}[5m])", "{{node}} gpu{{gpu}}")], unit="ops")
    b.add("timeseries", "XID events", [(f"sum by (node, gpu, code) ({first_event_increase(f'podhealth_xid_events_total{{{g}}}', '10m')})", "{{node}} gpu{{gpu}} XID {{code}}")], w=24)
    return b


def fabric() -> Board:
    b = Board("podhealth-fabric", "podhealth / Fabric (InfiniBand, NVLink)", ["fabric"])
    b.add("timeseries", "Receive throughput per port", [(f"rate(podhealth_infiniband_port_data_received_bytes_total{{{SEL}}}[5m])", "{{node}} {{device}}")], unit="Bps")
    b.add("timeseries", "Transmit throughput per port", [(f"rate(podhealth_infiniband_port_data_transmitted_bytes_total{{{SEL}}}[5m])", "{{node}} {{device}}")], unit="Bps")
    b.add("table", "Ports not ACTIVE or below rate", [(f"podhealth_infiniband_port_state{{{SEL}}} != 4 or podhealth_infiniband_port_rate_bytes_per_second{{{SEL}}} < 5e10", "")],
          w=24, h=6, transformations=[{"id": "labelsToFields", "options": {}}],
          desc="Empty when every port is ACTIVE at NDR rate; rows name the port and state otherwise.")
    b.add("timeseries", "Port rate", [(f"podhealth_infiniband_port_rate_bytes_per_second{{{SEL}}}", "{{node}} {{device}}")], unit="Bps")
    b.add("timeseries", "Error counters (rate per hour)", [(f'3600 * rate(podhealth_infiniband_port_stat_total{{{SEL},counter=~"symbol_error|link_downed|link_error_recovery|port_rcv_errors|local_link_integrity_errors|excessive_buffer_overrun_errors"}}[5m])', "{{node}} {{device}} {{counter}}")])
    b.add("timeseries", "NVLinks up", [(f"sum by (node) (podhealth_nvlink_links_up{{{SEL}}})", "{{node}}")])
    b.add("timeseries", "NVLink errors (rate per hour)", [(f"3600 * sum by (node, gpu, type) (rate(podhealth_nvlink_gpu_errors_total{{{SEL}}}[5m]))", "{{node}} gpu{{gpu}} {{type}}")])
    return b


def storage() -> Board:
    b = Board("podhealth-storage", "podhealth / Storage (NFS)", ["storage"])
    b.add("stat", "Mounts missing", [(f"count(podhealth_nfs_mount_present{{{SEL}}} == 0) or vector(0)", "missing")], w=8, h=4)
    b.add("stat", "Mounts hung", [(f"count(podhealth_nfs_probe_ok{{{SEL}}} == 0) or vector(0)", "hung")], w=8, h=4)
    b.add("stat", "Slowest stat probe", [(f"max(podhealth_nfs_probe_seconds{{{SEL}}})", "max")], w=8, h=4, unit="s")
    b.add("timeseries", "Average RTT per mount", [(f"podhealth:nfs_rtt_seconds:avg5m{{{SEL}}}", "{{node}} {{mountpoint}}")], unit="s")
    b.add("timeseries", "Retransmissions", [(f"sum by (node, mountpoint) (rate(podhealth_nfs_operation_transmissions_total{{{SEL}}}[5m]) - rate(podhealth_nfs_operation_requests_total{{{SEL}}}[5m]))", "{{node}} {{mountpoint}}")], unit="ops")
    b.add("timeseries", "Read / write throughput", [(f"sum by (node, mountpoint) (rate(podhealth_nfs_read_bytes_total{{{SEL}}}[5m]))", "read {{node}} {{mountpoint}}"),
                                                    (f"sum by (node, mountpoint) (rate(podhealth_nfs_write_bytes_total{{{SEL}}}[5m]))", "write {{node}} {{mountpoint}}")], unit="Bps")
    b.add("timeseries", "Client RPC calls / retransmissions", [(f"rate(podhealth_nfs_rpc_calls_total{{{SEL}}}[5m])", "calls {{node}}"),
                                                               (f"rate(podhealth_nfs_rpc_retransmissions_total{{{SEL}}}[5m])", "retrans {{node}}")], unit="ops")
    b.add("timeseries", "Stat probe latency", [(f"podhealth_nfs_probe_seconds{{{SEL}}}", "{{node}} {{mountpoint}}")], unit="s")
    return b


def itself() -> Board:
    b = Board("podhealth-self", "podhealth / podhealth itself", ["self"])
    b.add("table", "Collectors stale or disabled", [(f"podhealth_collector_stale{{{SEL}}} == 1 or podhealth_collector_enabled{{{SEL}}} == 0", "")],
          w=24, h=6, transformations=[{"id": "labelsToFields", "options": {}}])
    b.add("timeseries", "Collector duration", [(f"podhealth_collector_duration_seconds{{{SEL}}}", "{{node}} {{collector}}")], unit="s")
    b.add("timeseries", "Seconds since last success", [(f"time() - podhealth_collector_last_success_timestamp_seconds{{{SEL}}}", "{{node}} {{collector}}")], unit="s")
    b.add("timeseries", "Collector overruns", [(f"increase(podhealth_collector_overruns_total{{{SEL}}}[10m])", "{{node}} {{collector}}")])
    # Prometheus's own scrape series carry target labels only (no `node`): name the target.
    b.add("timeseries", "Scrape cost", [(f'scrape_duration_seconds{{job="podhealth",{NODE_SEL}}}', "{{instance}}"),
                                        (f'scrape_samples_scraped{{job="podhealth",{NODE_SEL}}} / 1000', "k samples {{instance}}")], unit="s")
    b.add("timeseries", "Heartbeats to the aggregator (10 m)", [(f"sum by (node, result) (increase(podhealth_publish_heartbeats_total{{{SEL}}}[10m]))", "{{node}} {{result}}")])
    b.add("timeseries", "Spool waiting for the aggregator", [(f"podhealth_publish_spool_bytes{{{SEL}}}", "{{node}}")], unit="bytes")
    b.add("timeseries", "Aggregator ingest p99", [("histogram_quantile(0.99, sum by (le, endpoint) (rate(podhealth_aggregator_ingest_duration_seconds_bucket[5m])))", "{{endpoint}}")], unit="s")
    b.add("timeseries", "Aggregator ingest by result", [("sum by (endpoint, result) (rate(podhealth_aggregator_ingest_requests_total[5m]))", "{{endpoint}} {{result}}")], unit="reqps")
    return b


def failslow() -> Board:
    """Fail-slow (docs/failslow.md): the aggregator's judgement of the agents' idle-time probes
    against their cohorts, and the stragglers it names inside running jobs. Every series is the
    aggregator's (a node exports only its own figures; the cohort is the fleet's); $node filters the
    findings (the node page links here for its node), not the cohorts."""
    b = Board("podhealth-failslow", "podhealth / Fail-slow", ["failslow"])
    b.add("stat", "Fail-slow findings", [('count(podhealth_aggregator_failslow_finding_z{node=~"$node"}) or vector(0)',
                                          "findings")],
          w=6, h=4, desc="Parts (GPU, GPU pair, HCA) slower than their cohort or than their own past.")
    b.add("stat", "Draining findings", [('count(podhealth_aggregator_failslow_finding_z{status="FAIL",node=~"$node"}) '
                                         'or vector(0)', "drain")], w=6, h=4,
          desc="Findings past a metric's act_z for act_consecutive probes, where that metric's action is drain.")
    b.add("stat", "Job stragglers now", [("max(podhealth_aggregator_failslow_stragglers)", "stragglers")], w=6, h=4,
          desc="Likely stragglers named in running jobs (alert PodhealthJobStraggler names job and owner).")
    b.add("stat", "Jobs compared", [("max(podhealth_aggregator_failslow_jobs)", "jobs")], w=6, h=4)
    b.add("table", "Findings (robust z against the cohort)",
          [('sort(podhealth_aggregator_failslow_finding_z{node=~"$node"})', "")], w=24, h=8,
          desc="One row per finding: node, entity, metric, cohort (profile, driver) and its z. "
               "`podhealth fleet outliers` and the UI's fail-slow page add the figure and the part's history.",
          transformations=[{"id": "labelsToFields", "options": {}}])
    b.add("timeseries", "Cohort medians", [("podhealth_aggregator_failslow_cohort_median",
                                            "{{metric}} {{profile}} {{driver}} {{firmware}}")], w=12,
          desc="A fleet-wide shift (a driver upgrade) moves these, and flags nobody.")
    b.add("timeseries", "Cohort sizes", [("podhealth_aggregator_failslow_cohort_size",
                                          "{{metric}} {{profile}} {{driver}} {{firmware}}")], w=12,
          desc="Entities with a fresh probe in each cohort; below failslow.judge.min_cohort nobody is judged.")
    b.add("timeseries", "Findings by metric", [('count by (metric, status) (podhealth_aggregator_failslow_finding_z{node=~"$node"})',
                                                "{{metric}} {{status}}")], w=12)
    b.add("timeseries", "Stragglers and jobs", [("max(podhealth_aggregator_failslow_stragglers)", "stragglers"),
                                                ("max(podhealth_aggregator_failslow_jobs)", "jobs compared")], w=12)
    return b


BOARDS = {"fleet": fleet, "node": node, "gpu": gpu, "fabric": fabric, "storage": storage, "self": itself,
          "failslow": failslow}


def render() -> dict[str, str]:
    return {f"podhealth-{name}.json": json.dumps(fn().json(), indent=2, sort_keys=True) + "\n" for name, fn in BOARDS.items()}


if __name__ == "__main__":
    for fname, text in render().items():
        (HERE / fname).write_text(text)
        print("wrote", HERE / fname)
