#!/usr/bin/env python3
"""Agent overhead vs node_exporter 1.5 on the same simulated DGX H100 tree (prints figures).

    .venv/bin/python bench/agent_overhead.py [--cycles 30] [--interval 1.0] [--latency-scrapes 200]

Part 1, like for like: `podhealth agent` with only the infiniband and nfs collectors (mountstats
+ /proc/net/rpc/nfs) and node_exporter with only --collector.infiniband, .mountstats and .nfs,
both reading the same simulated sysfs/procfs tree, which a separate process (charged to
neither) rewrites every interval as the simulator does, so counters move as on a busy node. It
writes in place, keeping each file's inode as sysfs does (the agent keeps counter files open and
re-reads them with pread; `--rename-writes` replaces files by rename, as the tests' trees do,
which forces the agent back to open/read/close per file).
One cycle = one scrape per interval for both; for the agent that also means one collection per
collector (node_exporter collects on scrape). CPU is utime+stime from /proc/<pid>/stat for both
processes, plus that of their children, live or reaped (the agent's NFS probe helpers are child
processes; node_exporter does no such probe, so the agent is also shown without them). The agent's CPU is
broken down by thread (/proc/<pid>/task/*/stat; the agent names its threads). Scrape latency is
measured afterwards with back-to-back requests (gzip, text format, as Prometheus asks). RSS at
the end.

Part 2: the full agent (`--simulate dgx-h100`: all collectors, 8 simulated GPUs) on the same
interval: CPU per cycle, its breakdown and RSS. That process also runs the simulator: the tree
refresh (its own thread, subtracted), the NFS probe stand-in (a Python helper per mount that
reads the simulated node's state file per probe, where a real node runs the statfs helper; the
children's CPU is subtracted) and the NVML library
(Python callbacks in the nvml/nvlink threads; not separable, so they stay in). Targets
(issue 3): CPU per cycle <= 1.0x node_exporter, scrape p99 <= 0.5x, agent RSS <= 64 MiB with
all collectors on.

Part 3 (`--defaults SECONDS`, default 120; 0 skips it): the full agent at its DEFAULT intervals
(no collector settings: kmsg 1 s, most others 10 s, some 30-60 s), scraped every 15 s as
Prometheus would, for SECONDS of wall time: CPU as a share of one core, by part. Target (issue
20): <= 0.5% of one core. `--full-only` skips parts 1 and 2.
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()  # before anything that needs the project's packages

import argparse
import os
import shutil
import signal
import socket
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


def cycles(procs: list[Proc], n: int, interval: float) -> dict[str, CpuWindow]:
    """Scrape every process once per interval for n intervals; CPU per cycle of each (from /proc)."""
    start = {p.name: cpu_window_start(p.popen.pid) for p in procs}
    t0 = time.monotonic()
    for i in range(1, n + 1):
        for p in procs:
            status, _ = get(p.url + "/metrics")
            if status != 200:
                raise SystemExit(f"{p.name}: scrape failed")
        time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
    return {p.name: cpu_window_end(p.popen.pid, start[p.name], n) for p in procs}


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


CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # after the comm: state(0) ... utime(11) stime(12) cutime(13) cstime(14)
    return ((int(fields[11]) + int(fields[12])) / CLK_TCK, (int(fields[13]) + int(fields[14])) / CLK_TCK)


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (kernel thread name, utime+stime seconds) of every live thread."""
    out: dict[int, tuple[str, float]] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                comm = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        out[int(tid)] = (comm, (int(fields[11]) + int(fields[12])) / CLK_TCK)
    return out


COLLECTORS = ("nvml", "nvlink", "infiniband", "nfs", "host", "kmsg", "dcgm")


def thread_role(pid: int, tid: int, comm: str) -> str:
    """Which part of the agent a thread is (agent/threadnames.py gives them these names)."""
    if tid == pid:
        return "event loop + HTTP (main thread)"
    if comm in COLLECTORS:
        return f"collector {comm}"
    if comm.startswith("nfs-probe"):
        return "NFS probe threads (spawn + wait)"
    if comm == "render" or comm.startswith("asyncio_"):
        return "rendering /metrics"
    if comm == "health" or comm.startswith("health_"):
        return "checks (verdicts)"
    if comm == "sim-refresh":
        return "SIMULATOR tree refresh"
    return f"other threads ({comm})"


@dataclass
class CpuWindow:
    """CPU of one process between two moments, in total and by role."""

    total: float
    children: float
    roles: dict[str, float]


def descendants_cpu(pid: int) -> dict[int, float]:
    """pid -> utime+stime (and what it reaped) of every live descendant: the agent's NFS probe
    helpers live as long as it does, so their CPU never reaches its cutime while it runs."""
    out: dict[int, float] = {}
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return out
    for k in kids:
        try:
            t = k.cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[k.pid] = t.user + t.system + t.children_user + t.children_system
    return out


def descendants_rss(pid: int) -> int:
    total = 0
    for k in psutil.Process(pid).children(recursive=True):
        try:
            total += k.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


Start = tuple[tuple[float, float], dict[int, tuple[str, float]], dict[int, float]]


def cpu_window_start(pid: int) -> Start:
    return proc_cpu(pid), thread_cpu(pid), descendants_cpu(pid)


def cpu_window_end(pid: int, start: Start, n: int) -> CpuWindow:
    (own0, ch0), th0, d0 = start
    own1, ch1 = proc_cpu(pid)
    th1 = thread_cpu(pid)
    d1 = descendants_cpu(pid)
    # Live ones: what they used in the window. Ones that ended in it are in the reaped figure.
    live = sum(cpu - d0.get(p, 0.0) for p, cpu in d1.items())
    ch1 += live
    roles: dict[str, float] = {}
    for tid, (comm, cpu) in th1.items():
        role = thread_role(pid, tid, comm)
        roles[role] = roles.get(role, 0.0) + (cpu - th0.get(tid, (comm, 0.0))[1]) / n
    # The process total less its live threads: threads that ended within the window, and the
    # rounding of each thread's ticks (the kernel rounds every thread and the total separately).
    rest = (own1 - own0) / n - sum(roles.values())
    if abs(rest) >= 0.5 / CLK_TCK / n:
        roles["unattributed (ended threads, tick rounding)"] = rest
    if ch1 > ch0:
        roles["child processes (NFS probe helpers)"] = (ch1 - ch0) / n
    return CpuWindow((own1 - own0 + ch1 - ch0) / n, (ch1 - ch0) / n, roles)


def print_breakdown(w: CpuWindow, indent: str = "    ") -> None:
    for role, v in sorted(w.roles.items(), key=lambda kv: -kv[1]):
        print(f"{indent}{role:42}{v * 1e3:8.2f} ms / cycle")


def refresher_main(node_dir: str, interval: float) -> int:
    """--_refresh: rewrite a simulated node's trees every interval (run as its own process, so
    that the rewriting is charged to neither the agent nor node_exporter)."""
    from podhealth.sim.node import SimNode

    d = Path(node_dir)
    node = SimNode.open(d.parent, d.name)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    t0 = time.monotonic()
    i = 0
    while True:
        node.refresh()
        i += 1
        time.sleep(max(0.0, t0 + i * interval - time.monotonic()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cycles", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0)
    ap.add_argument("--latency-scrapes", type=int, default=200)
    ap.add_argument("--rename-writes", action="store_true",
                    help="rewrite the tree by rename (new inodes) instead of in place as sysfs does")
    ap.add_argument("--defaults", type=float, default=120.0, metavar="SECONDS",
                    help="measure the full agent at its default intervals for SECONDS (0: skip)")
    ap.add_argument("--full-only", action="store_true", help="only part 3 (the full agent at its default intervals)")
    ap.add_argument("--_refresh", nargs=2, metavar=("NODE_DIR", "INTERVAL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._refresh:
        return refresher_main(args._refresh[0], float(args._refresh[1]))
    ne_bin = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
    if ne_bin is None:
        print("prometheus-node-exporter is not installed", file=sys.stderr)
        return 2
    from podhealth.sim.node import SimNode
    from podhealth.sim.tree_write import IN_PLACE_ENV

    if args.full_only:
        return defaults_main(args.defaults or 120.0)
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
    # Like for like: the same agent reading only the files node_exporter 1.5 reads (no hw_counters/).
    cfg_like = tmp / "agent-ib-nfs-like.yaml"
    cfg_like.write_text(cfg.read_text().replace(f"infiniband: {{interval: {iv}, timeout: {to}}}",
                                                f"infiniband: {{interval: {iv}, timeout: {to}, hw_counters: false}}"))
    assert cfg_like.read_text() != cfg.read_text()
    procs: list[Proc] = []
    refresher: subprocess.Popen[bytes] | None = None
    try:
        # Files keep their inodes, as in sysfs, unless --rename-writes (the simulator's default,
        # atomic for the tests, but it makes every kept fd stale and is nothing like a real node).
        env = {**os.environ, IN_PLACE_ENV: "0" if args.rename_writes else "1"}
        refresher = subprocess.Popen([sys.executable, __file__, "--_refresh", str(node.dir), str(iv)],
                                     stdin=subprocess.DEVNULL, start_new_session=True, env=env)
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
        like_port = free_port()
        like = start("agent-like", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg_like), "--node",
                                    "dgx01", "--listen", f"127.0.0.1:{like_port}"], like_port, tmp / "agent-like.log",
                     "/healthz")
        procs.append(like)
        wait_fresh(agent)
        wait_fresh(like)
        ne_series = sum(1 for ln in decode(get(ne.url + "/metrics")[1]).splitlines()
                        if ln.startswith(("node_infiniband_", "node_mountstats_", "node_nfs_")))
        ag_series = sum(1 for ln in decode(get(agent.url + "/metrics")[1]).splitlines()
                        if ln.startswith(("podhealth_infiniband_", "podhealth_nfs_")))
        rss_start = agent.rss()
        ib_files = {sub: sum(1 for _ in (node.sys_root / "class" / "infiniband").glob(f"*/ports/*/{sub}/*"))
                    for sub in ("counters", "hw_counters")}
        cpu = cycles([ne, agent, like], args.cycles, args.interval)
        lat = latencies([ne, agent], args.latency_scrapes)
        rss = {p.name: p.rss() for p in (ne, agent)}
        helpers_rss = descendants_rss(agent.popen.pid)
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
        full_rss_start = full.rss()
        full_cpu = cycles([full], args.cycles, args.interval)["agent-full"]
        full_rss = full.rss()
        full_p = latencies([full], args.latency_scrapes)["agent-full"]
        full.stop()
        procs.clear()
    finally:
        for p in procs:
            p.stop()
        if refresher is not None and refresher.poll() is None:
            os.killpg(refresher.pid, signal.SIGTERM)
            refresher.wait(10)
        if not os.environ.get("PODHEALTH_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)

    mib = 1024 * 1024
    ne_cpu, ag_cpu = cpu["node_exporter"], cpu["agent"]
    print(f"cycles: {args.cycles} at {args.interval:g}s; latency: {args.latency_scrapes} sequential scrapes each "
          f"(text format, gzip); {os.cpu_count()} CPUs, shared machine; CPU from /proc/<pid>/stat "
          f"({1e3 / CLK_TCK / args.cycles:.2f} ms/cycle resolution)")
    print()
    print("IB + mountstats + nfs on the simulated DGX H100 tree (10 HCA ports, 2 NFS mounts), "
          "rewritten every interval by a separate process, "
          + ("by rename (new inodes)" if args.rename_writes else "in place (inodes kept, as in sysfs)"))
    print(f"{'':24}{'node_exporter 1.5':>20}{'podhealth agent':>20}{'ratio':>10}")
    print(f"{'series':24}{ne_series:>20}{ag_series:>20}   (both read the {ib_files['counters']} ports/*/counters "
          f"files; the agent also reads and exports the {ib_files['hw_counters']} hw_counters files, node_exporter 1.5 "
          "does not)")
    print(f"{'CPU s / cycle':24}{ne_cpu.total:>20.4f}{ag_cpu.total:>20.4f}"
          f"{ag_cpu.total / ne_cpu.total:>9.2f}x   (target <= 1.0x)")
    like_cpu = cpu["agent-like"]
    print(f"{'  like for like':24}{ne_cpu.total:>20.4f}{like_cpu.total:>20.4f}{like_cpu.total / ne_cpu.total:>9.2f}x   "
          "(a second agent, same cycles, with collectors.infiniband.hw_counters: false: the files node_exporter "
          "reads, plus its NFS probes)")
    no_probe = ag_cpu.total - ag_cpu.children
    print(f"{'  without NFS probes':24}{ne_cpu.total:>20.4f}{no_probe:>20.4f}{no_probe / ne_cpu.total:>9.2f}x   "
          "(node_exporter does not probe mounts; the agent's statfs helper processes)")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        a, n = pct(lat["agent"], q), pct(lat["node_exporter"], q)
        target = "   (target <= 0.5x)" if label == "p99" else ""
        print(f"{'scrape ' + label + ' ms':24}{n * 1e3:>20.2f}{a * 1e3:>20.2f}{a / n:>9.2f}x{target}")
    print(f"{'RSS MiB':24}{rss['node_exporter'] / mib:>20.1f}{rss['agent'] / mib:>20.1f}"
          f"{rss['agent'] / rss['node_exporter']:>9.2f}x   (agent: {rss_start / mib:.1f} before the cycles; "
          f"its NFS probe helpers, separate processes, {helpers_rss / mib:.1f} more)")
    print("  agent CPU by part:")
    print_breakdown(ag_cpu)
    print()
    print("full agent (--simulate dgx-h100: nvml, nvlink, infiniband, nfs, host, kmsg; 8 simulated GPUs)")
    sim_refresh = full_cpu.roles.get("SIMULATOR tree refresh", 0.0)
    alone = full_cpu.total - sim_refresh - full_cpu.children
    print(f"  series                 {full_series}")
    print(f"  CPU s / cycle          {full_cpu.total:.4f}  (everything in the process, simulator included)")
    print(f"  agent alone            {alone:.4f}  (less the simulator's tree refresh thread, {sim_refresh:.4f}, "
          f"and its NFS probe stand-ins, Python helper processes, {full_cpu.children:.4f}; the simulated NVML "
          "library's callbacks stay in)")
    print(f"  scrape p50 / p99 ms    {pct(full_p, 0.5) * 1e3:.2f} / {pct(full_p, 0.99) * 1e3:.2f}")
    print(f"  RSS MiB                {full_rss / mib:.1f}  (target <= 64; {full_rss_start / mib:.1f} before the "
          "cycles: the checks' counter history grows until it holds checks.rate_window of evaluations)")
    print("  CPU by part:")
    print_breakdown(full_cpu)
    if args.defaults > 0:
        print()
        defaults_main(args.defaults)
    return 0


SCRAPE_EVERY = 15.0  # Prometheus' common scrape interval


def defaults_main(seconds: float) -> int:
    """Part 3: the full simulated agent at its default intervals; CPU as a share of one core."""
    tmp = Path(tempfile.mkdtemp(prefix="podhealth-bench-defaults-"))
    port = free_port()
    cfg = tmp / "agent.yaml"
    cfg.write_text("log: {level: warning}\n")
    full = start("agent-defaults", [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100",
                                    "--sim-root", str(tmp / "sim"), "--node", "dgx03", "--config", str(cfg),
                                    "--listen", f"127.0.0.1:{port}"], port, tmp / "agent.log", "/healthz")
    try:
        wait_fresh(full, timeout=120)
        time.sleep(5.0)  # past the start-up burst (first collections, first full report)
        n = max(1, int(round(seconds)))
        begin = cpu_window_start(full.popen.pid)
        t0 = time.monotonic()
        next_scrape = t0
        while time.monotonic() - t0 < n:
            if time.monotonic() >= next_scrape:
                if get(full.url + "/metrics")[0] != 200:
                    raise SystemExit("agent-defaults: scrape failed")
                next_scrape += SCRAPE_EVERY
            time.sleep(max(0.0, min(next_scrape, t0 + n) - time.monotonic()))
        wall = time.monotonic() - t0
        w = cpu_window_end(full.popen.pid, begin, 1)
        rss = full.rss()
    finally:
        full.stop()
        if not os.environ.get("PODHEALTH_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    sim = w.roles.get("SIMULATOR tree refresh", 0.0) + w.children
    print(f"full agent at its default intervals (--simulate dgx-h100, 8 GPUs; scraped every {SCRAPE_EVERY:g} s; "
          f"{wall:.0f} s of wall time; CPU ticks of {1e3 / CLK_TCK:.0f} ms)")
    print(f"  share of one core      {w.total / wall * 100:.3f} %  (everything in the process, simulator included)")
    print(f"  agent alone            {(w.total - sim) / wall * 100:.3f} %  (less the simulator's tree refresh "
          f"and its NFS probe stand-ins, {sim / wall * 100:.3f} %; the simulated NVML library's callbacks stay in)"
          f"   target <= 0.5 %")
    print(f"  RSS MiB                {rss / (1024 * 1024):.1f}")
    print("  CPU by part (share of one core):")
    for role, v in sorted(w.roles.items(), key=lambda kv: -kv[1]):
        print(f"    {role:42}{v / wall * 100:8.3f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
