#!/usr/bin/env python3
"""Agent overhead vs node_exporter 1.5 on the same simulated DGX H100 tree (prints figures).

    python bench/agent_overhead.py [--cycles 30] [--interval 1.0] [--latency-scrapes 200]

Part 1, like for like: `podhealth agent` with only the infiniband and nfs collectors (mountstats
+ /proc/net/rpc/nfs) and node_exporter with only --collector.infiniband, .mountstats and .nfs,
both reading the same simulated sysfs/procfs tree. One cycle = one scrape per interval for both;
for the agent that also means one collection per collector (node_exporter collects on scrape).
CPU is the process's user+system time plus that of its reaped children (the agent's NFS
probes are subprocesses). Scrape latency is measured afterwards with back-to-back requests
(gzip, text format, as Prometheus asks). RSS at the end.

Part 2: the full agent (`--simulate dgx-h100`: all collectors, 8 simulated GPUs) on the same
interval: CPU per cycle and RSS. Its process also runs the simulator (NVML callbacks and the
once-a-second tree refresh); the refresh cost is measured separately and printed so it can be
taken out. Targets (issue 3): CPU per cycle <= 1.0x node_exporter, scrape p99 <= 0.5x,
agent RSS <= 64 MiB with all collectors on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil

HEADERS = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "gzip"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers=HEADERS)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except OSError:
        return 0, b""


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str

    @property
    def ps(self) -> psutil.Process:
        return psutil.Process(self.popen.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system + t.children_user + t.children_system

    def cpu_children(self) -> float:
        t = self.ps.cpu_times()
        return t.children_user + t.children_system

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(5)


def start(name: str, argv: list[str], port: int, log: Path, ready_path: str) -> Proc:
    fh = open(log, "wb")
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    proc = Proc(name, p, f"http://127.0.0.1:{port}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            raise SystemExit(f"{name} exited {p.returncode}: {log.read_text()[-2000:]}")
        if get(proc.url + ready_path, 1.0)[0] == 200:
            return proc
        time.sleep(0.1)
    proc.stop()
    raise SystemExit(f"{name} did not become ready: {log.read_text()[-2000:]}")


def wait_fresh(agent: Proc, timeout: float = 60) -> None:
    """Until every enabled collector has succeeded once and is fresh."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, body = get(agent.url + "/metrics")
        text = decode(body)
        enabled = [ln for ln in text.splitlines() if ln.startswith("podhealth_collector_enabled{") and ln.endswith(" 1.0")]
        fresh = [ln for ln in text.splitlines() if ln.startswith("podhealth_collector_stale{") and ln.endswith(" 0.0")]
        if enabled and len(fresh) == len(enabled):
            return
        time.sleep(0.2)
    raise SystemExit(f"{agent.name}: collectors never all fresh")


def decode(body: bytes) -> str:
    import gzip
    try:
        return gzip.decompress(body).decode()
    except OSError:
        return body.decode(errors="replace")


def cycles(procs: list[Proc], n: int, interval: float) -> tuple[dict[str, float], dict[str, float]]:
    """Scrape every process once per interval for n intervals; CPU seconds per cycle for each
    (all, and the part spent in child processes)."""
    before = {p.name: p.cpu() for p in procs}
    before_children = {p.name: p.cpu_children() for p in procs}
    t0 = time.monotonic()
    for i in range(1, n + 1):
        for p in procs:
            status, _ = get(p.url + "/metrics")
            if status != 200:
                raise SystemExit(f"{p.name}: scrape failed")
        time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
    return ({p.name: (p.cpu() - before[p.name]) / n for p in procs},
            {p.name: (p.cpu_children() - before_children[p.name]) / n for p in procs})


def latencies(procs: list[Proc], n: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {p.name: [] for p in procs}
    for _ in range(n):
        for p in procs:
            t = time.perf_counter()
            status, _ = get(p.url + "/metrics")
            out[p.name].append(time.perf_counter() - t)
            if status != 200:
                raise SystemExit(f"{p.name}: scrape failed")
    return out


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def refresh_cost(root: Path, repeats: int = 20) -> float:
    """CPU seconds of one simulator tree refresh (what the --simulate agent does every second)."""
    from podhealth.sim.node import SimNode

    node = SimNode.create(root, "refreshbench", "dgx-h100")
    node.refresh()
    t = time.process_time()
    for _ in range(repeats):
        node.refresh()
    return (time.process_time() - t) / repeats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--latency-scrapes", type=int, default=200)
    args = ap.parse_args()
    ne_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if ne_bin is None:
        print("prometheus-node-exporter is not installed", file=sys.stderr)
        return 2
    from podhealth.sim.node import SimNode

    tmp = Path(tempfile.mkdtemp(prefix="podhealth-bench-"))
    node = SimNode.create(tmp / "sim", "dgx01", "dgx-h100")
    iv, to = args.interval, max(args.interval * 2, 2.0)
    nfs_to = to  # the NFS probes (to/2 each) must fit inside one nfs collection
    cfg = tmp / "agent-ib-nfs.yaml"
    cfg.write_text(
        f"paths: {{sysfs_root: {node.sys_root}, procfs_root: {node.proc_root}, kmsg: {node.kmsg_path}}}\n"
        "collectors:\n"
        "  nvml: {enabled: false}\n  nvlink: {enabled: false}\n  host: {enabled: false}\n"
        "  kmsg: {enabled: false}\n  dcgm: {enabled: false}\n"
        f"  infiniband: {{interval: {iv}, timeout: {to}}}\n"
        f"  nfs: {{interval: {iv}, timeout: {nfs_to}, mounts: [{{path: /home, timeout: {to / 2:g}}}, "
        f"{{path: /cm/shared, timeout: {to / 2:g}}}]}}\n"
        "log: {level: warning}\n")
    procs: list[Proc] = []
    try:
        ne_port, ag_port = free_port(), free_port()
        ne = start("node_exporter", [ne_bin, f"--path.sysfs={node.sys_root}", f"--path.procfs={node.proc_root}",
                                     f"--path.rootfs={tmp}", "--collector.disable-defaults",
                                     "--collector.infiniband", "--collector.mountstats", "--collector.nfs",
                                     f"--web.listen-address=127.0.0.1:{ne_port}"],
                   ne_port, tmp / "node_exporter.log", "/metrics")
        procs.append(ne)
        agent = start("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--node", "dgx01",
                                "--listen", f"127.0.0.1:{ag_port}"], ag_port, tmp / "agent.log", "/healthz")
        procs.append(agent)
        wait_fresh(agent)
        ne_series = sum(1 for ln in decode(get(ne.url + "/metrics")[1]).splitlines()
                        if ln.startswith(("node_infiniband_", "node_mountstats_", "node_nfs_")))
        ag_series = sum(1 for ln in decode(get(agent.url + "/metrics")[1]).splitlines()
                        if ln.startswith(("podhealth_infiniband_", "podhealth_nfs_")))
        cpu, cpu_children = cycles([ne, agent], args.cycles, args.interval)
        lat = latencies([ne, agent], args.latency_scrapes)
        rss = {p.name: p.rss() for p in (ne, agent)}
        for p in list(procs):
            p.stop()
        procs.clear()

        full_port = free_port()
        full_cfg = tmp / "agent-full.yaml"
        full_cfg.write_text("collectors:\n" + "".join(
            f"  {c}: {{interval: {iv}, timeout: {to}}}\n"
            for c in ("nvml", "nvlink", "infiniband", "host", "kmsg", "dcgm"))
            + f"  nfs: {{interval: {iv}, timeout: {nfs_to}, mounts: [{{path: /home, timeout: {to / 2:g}}}, "
              f"{{path: /cm/shared, timeout: {to / 2:g}}}]}}\n"
            + "log: {level: warning}\n")
        full = start("agent-full", [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100",
                                    "--sim-root", str(tmp / "sim-full"), "--node", "dgx02", "--config", str(full_cfg),
                                    "--listen", f"127.0.0.1:{full_port}"], full_port, tmp / "agent-full.log", "/healthz")
        procs.append(full)
        wait_fresh(full)
        full_series = sum(1 for ln in decode(get(full.url + "/metrics")[1]).splitlines() if ln and ln[0] != "#")
        full_cpu = cycles([full], args.cycles, args.interval)[0]["agent-full"]
        full_rss = full.rss()
        full_p = latencies([full], args.latency_scrapes)["agent-full"]
        full.stop()
        procs.clear()
        refresh = refresh_cost(tmp / "sim-refresh")
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    mib = 1024 * 1024
    print(f"cycles: {args.cycles} at {args.interval:g}s; latency: {args.latency_scrapes} sequential scrapes each "
          f"(text format, gzip); {os.cpu_count()} CPUs, shared machine")
    print()
    print("IB + mountstats + nfs on the simulated DGX H100 tree (10 HCA ports, 2 NFS mounts)")
    print(f"{'':24}{'node_exporter 1.5':>20}{'podhealth agent':>20}{'ratio':>10}")
    print(f"{'series':24}{ne_series:>20}{ag_series:>20}")
    print(f"{'CPU s / cycle':24}{cpu['node_exporter']:>20.4f}{cpu['agent']:>20.4f}"
          f"{cpu['agent'] / cpu['node_exporter']:>9.2f}x   (target <= 1.0x)")
    print(f"{'  of which children':24}{cpu_children['node_exporter']:>20.4f}{cpu_children['agent']:>20.4f}"
          "   (the agent's NFS stat probes)")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        a, n = pct(lat["agent"], q), pct(lat["node_exporter"], q)
        target = "   (target <= 0.5x)" if label == "p99" else ""
        print(f"{'scrape ' + label + ' ms':24}{n * 1e3:>20.2f}{a * 1e3:>20.2f}{a / n:>9.2f}x{target}")
    print(f"{'RSS MiB':24}{rss['node_exporter'] / mib:>20.1f}{rss['agent'] / mib:>20.1f}"
          f"{rss['agent'] / rss['node_exporter']:>9.2f}x")
    print()
    print("full agent (--simulate dgx-h100: nvml, nvlink, infiniband, nfs, host, kmsg; 8 simulated GPUs)")
    print(f"  series                 {full_series}")
    print(f"  CPU s / cycle          {full_cpu:.4f}  (includes the simulator: NVML callbacks + tree refresh)")
    print(f"  sim refresh s / cycle  {refresh * args.interval:.4f}  (measured separately; agent alone ~= "
          f"{max(0.0, full_cpu - refresh * args.interval):.4f})")
    print(f"  scrape p50 / p99 ms    {pct(full_p, 0.5) * 1e3:.2f} / {pct(full_p, 0.99) * 1e3:.2f}")
    print(f"  RSS MiB                {full_rss / mib:.1f}  (target <= 64)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
