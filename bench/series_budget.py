"""Series per node at each detail level, and what a real Prometheus pays for them (issue 18 §1).

1. A simulated DGX H100 agent per level (basic = the default, full) and one with
   `exporters.compat: [dcgm-exporter]`: series per node, by family group.
2. Two Prometheus servers scraping at 1 s for --seconds (default 150): one scrapes --nodes
   simulated agents at the default level; the other scrapes the peer set on one simulated node:
   node_exporter 1.5 (infiniband + mountstats + nfs collectors on the same sysfs/procfs tree) and
   the agent's dcgm-exporter families only (a metric_relabel keeps DCGM_FI_*). Each reports its
   own prometheus_tsdb_head_series (per node) and the bytes per sample of its head chunks.

Run from the repository root: `.venv/bin/python bench/series_budget.py [--nodes 3] [--seconds 150]`.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()  # before anything that needs the project's packages

import argparse
import contextlib
import json
import re
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.proc import Service, free_port, http_get, need, service, wait_until  # noqa: E402

AGENT_CONFIG = """
collectors:
  nfs:
    mounts: [{{path: /home, timeout: 1}}, {{path: /cm/shared, timeout: 1}}]
    timeout: 3
    detail: {nfs}
{detail}
exporters:
  compat: [{compat}]
"""
COLLECTORS = ("nvml", "nvlink", "infiniband", "host", "kmsg", "dcgm", "pcie_aer", "edac", "nvme")


def agent_config(level: str, compat: bool) -> str:
    detail = "\n".join(f"  {c}: {{detail: full}}" for c in COLLECTORS if level == "full")
    return AGENT_CONFIG.format(detail=detail, nfs=level, compat="dcgm-exporter" if compat else "")


@contextlib.contextmanager
def agent(tmp: Path, node: str, level: str = "basic", compat: bool = False) -> Iterator[Service]:
    d = tmp / f"{node}-{level}{'-compat' if compat else ''}"
    d.mkdir(parents=True)
    (d / "agent.yaml").write_text(agent_config(level, compat))
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(d / "sim"),
            "--node", node, "--listen", f"127.0.0.1:{port}", "--config", str(d / "agent.yaml")]
    with service(f"agent-{node}", argv, d / "logs", port=port, ready_timeout=90,
                 ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200) as svc:
        yield svc


def series_lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln and not ln.startswith("#")]


def settled_scrape(svc: Service) -> str:
    """A scrape once every collector has reported (the series count stops growing)."""
    last: list[int] = []

    def steady() -> bool:
        text = http_get(svc.url + "/metrics")[1].decode()
        n = len(series_lines(text))
        last.append(n)
        # the checks' series come with the first judgement: on a loaded machine the count can hold
        # still for 4 s before it (a basic total of 861 without its 127 check series)
        return len(last) >= 4 and len(set(last[-4:])) == 1 and n > 100 and "podhealth_check_status{" in text
    wait_until(steady, 90, 1.0, "a steady series count")
    return http_get(svc.url + "/metrics")[1].decode()


def group(name: str) -> str:
    m = re.match(r"podhealth_(nvlink|infiniband|nfs|gpu|check|collector|pcie_aer|edac|nvme|host|systemd)", name)
    return m.group(1) if m else ("DCGM_FI (compat)" if name.startswith("DCGM_FI") else "other")


def levels(tmp: Path) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for level, compat in (("basic", False), ("full", False), ("basic", True)):
        with agent(tmp, "dgx01", level, compat) as svc:
            text = settled_scrape(svc)
        out[f"{level}{' + compat' if compat else ''}"] = Counter(group(ln.split("{")[0].split(" ")[0])
                                                                for ln in series_lines(text))
    return out


@contextlib.contextmanager
def prometheus(tmp: Path, name: str, scrape_configs: str) -> Iterator[str]:
    d = tmp / name
    d.mkdir()
    (d / "prometheus.yml").write_text("global: {scrape_interval: 1s}\nscrape_configs:\n" + scrape_configs)
    port = free_port()
    argv = [need("prometheus"), f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}", "--web.enable-admin-api"]
    url = f"http://127.0.0.1:{port}"
    with service(name, argv, d / "logs", port=port, ready=lambda: http_get(f"{url}/-/ready")[0] == 200):
        yield url


def own_metric(prom: str, name: str) -> float:
    """A value from Prometheus' own /metrics (it does not scrape itself here)."""
    total, found = 0.0, False
    for line in http_get(f"{prom}/metrics")[1].decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
            found = True
    return total if found else float("nan")


def head_stats(prom: str, tsdb: Path) -> tuple[float, float, float]:
    """(head series, samples appended, bytes per sample). Prometheus 2.42 exports no head-chunk
    size, so the head is written out as a block (admin API snapshot, head included) and the
    bytes of its chunks and index are divided by the samples its meta.json counts."""
    series = own_metric(prom, "prometheus_tsdb_head_series")
    samples = own_metric(prom, "prometheus_tsdb_head_samples_appended_total")
    req = urllib.request.Request(f"{prom}/api/v1/admin/tsdb/snapshot?skip_head=false", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        name = json.loads(r.read())["data"]["name"]
    size, block_samples = 0, 0
    for meta in (tsdb / "snapshots" / name).glob("*/meta.json"):
        block_samples += int(json.loads(meta.read_text())["stats"]["numSamples"])
        size += sum(f.stat().st_size for f in meta.parent.rglob("*") if f.is_file() and f.name != "meta.json")
    return series, samples, size / block_samples if block_samples else float("nan")


def node_exporter(sim: Path, logs: Path) -> tuple[list[str], int]:
    port = free_port()
    argv = [need("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}",
            f"--path.sysfs={sim / 'sys'}", f"--path.procfs={sim / 'proc'}", f"--path.rootfs={sim}",
            "--collector.disable-defaults", "--collector.infiniband", "--collector.mountstats", "--collector.nfs"]
    return argv, port


def fleet(tmp: Path, nodes: int, seconds: float) -> dict[str, tuple[float, float, float]]:
    with contextlib.ExitStack() as stack:
        agents = [stack.enter_context(agent(tmp, f"fleet{i + 1:02d}")) for i in range(nodes)]
        peer = stack.enter_context(agent(tmp, "peer01", compat=True))
        sim = tmp / "peer01-basic-compat" / "sim" / "peer01"
        ne_argv, ne_port = node_exporter(sim, tmp / "ne-logs")
        stack.enter_context(service("node_exporter", ne_argv, tmp / "ne-logs", ne_port,
                                    ready=lambda: http_get(f"http://127.0.0.1:{ne_port}/metrics", timeout=2)[0] == 200))
        targets = ", ".join(f"'127.0.0.1:{a.port}'" for a in agents)
        ours = stack.enter_context(prometheus(tmp, "prom-podhealth", (
            f"  - job_name: podhealth\n    static_configs: [{{targets: [{targets}]}}]\n")))
        theirs = stack.enter_context(prometheus(tmp, "prom-peer", (
            f"  - job_name: dcgm\n    static_configs: [{{targets: ['127.0.0.1:{peer.port}']}}]\n"
            "    metric_relabel_configs: [{source_labels: [__name__], regex: 'DCGM_FI_.*', action: keep}]\n"
            f"  - job_name: node\n    static_configs: [{{targets: ['127.0.0.1:{ne_port}']}}]\n")))
        print(f"scraping {nodes} podhealth agents and the peer set for {seconds:.0f} s ...", flush=True)
        time.sleep(seconds)
        return {"podhealth (basic)": head_stats(ours, tmp / "prom-podhealth" / "tsdb"),
                "peer (dcgm-exporter set + node_exporter)": head_stats(theirs, tmp / "prom-peer" / "tsdb")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--seconds", type=float, default=150.0)
    p.add_argument("--no-prometheus", action="store_true")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="podhealth-series-") as td:
        tmp = Path(td)
        counts = levels(tmp)
        groups = sorted({g for c in counts.values() for g in c})
        print(f"\nseries per simulated DGX H100 node\n{'family group':<18}" + "".join(f"{k:>16}" for k in counts))
        for g in groups:
            print(f"{g:<18}" + "".join(f"{c.get(g, 0):>16}" for c in counts.values()))
        print(f"{'total':<18}" + "".join(f"{sum(c.values()):>16}" for c in counts.values()))
        if args.no_prometheus:
            return 0
        stats = fleet(tmp, args.nodes, args.seconds)
        print("\nPrometheus head (from each server's own /metrics)")
        for what, (series, samples, bps) in stats.items():
            per_node = series / (args.nodes if what.startswith("podhealth") else 1)
            print(f"{what:<42} head series {series:>7.0f}  per node {per_node:>7.0f}  "
                  f"samples {samples:>9.0f}  bytes/sample (head as a block) {bps:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
