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
interval: CPU per cycle, its breakdown and RSS. The simulator's tree refresh runs in a process of
its own (`agent --sim-no-refresh` and this script's refresher), so the figure is the agent's own;
`--sim-in-process` puts it back in the agent's process (its thread is then subtracted). Its files
are rewritten in place (inodes kept, as in sysfs; `--rename-writes`: by rename). What stays in: the
simulated NVML library (Python callbacks in the collectors' thread; pynvml calls it in the
process), and the NFS probe stand-ins (Python helper processes, children: subtracted). Targets
(issue 3): CPU per cycle <= 1.0x node_exporter, scrape p99 <= 0.5x, agent RSS <= 64 MiB with all
collectors on.

Part 3 (`--defaults SECONDS`, default 180; 0 skips it; `--full-only`: only this part): at the
DEFAULT intervals (no collector settings: kmsg 1 s / 5 s while watched, most others 10 s, some
30-60 s), every process scraped every 15 s as Prometheus would, in the same windows (`--rounds`,
3): the full simulated agent beside node_exporter at its defaults (this machine's /proc and /sys),
gross and net of the simulated NVML library (its callbacks add their thread CPU to a file the
bench reads per window, sim/nvml_cpu.py; `--no-nvml-account` leaves that out, to see its cost),
and the agent's IB+NFS subset (hw_counters off) beside node_exporter's infiniband + mountstats +
nfs on one simulated tree. Prints each round's ratios with the load average, min/median/max, and
the full agent's CPU by part. Targets (issue 32): full agent <= 5x node_exporter's defaults and
<= 0.5% of a core; IB+NFS <= 1.5x.

`--soak SECONDS [--soak-period 600] [--soak-tolerance 1]`: only the full agent at its defaults,
RSS printed every period; exits 1 when RSS grows after the first period (which fills the
checks' history windows) by more than the tolerance (issue 32: <= 64 MiB and flat over >= 1 h).
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


def start(name: str, argv: list[str], port: int, log: Path, ready_path: str,
          env: dict[str, str] | None = None) -> Proc:
    fh = open(log, "wb")
    p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                         env=env)
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
    perfs = {p.name: perf_start(p.popen.pid, n * interval) for p in procs} if perf_usable() else {}
    t0 = time.monotonic()
    for i in range(1, n + 1):
        for p in procs:
            status, _ = get(p.url + "/metrics")
            if status != 200:
                raise SystemExit(f"{p.name}: scrape failed")
        time.sleep(max(0.0, t0 + i * interval - time.monotonic()))
    out = {p.name: cpu_window_end(p.popen.pid, start[p.name], n) for p in procs}
    for name, pp in perfs.items():
        pw = perf_end(pp)
        out[name].perf = None if pw is None else PerfWindow(pw.cpu_s / n, round(pw.switches / n))
    return out


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
    if comm.startswith("collectors"):
        return "collectors (the shared lane)"
    if comm.startswith("nvml"):
        return "NVML lane (nvml, nvlink)"
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
    perf: "PerfWindow | None" = None  # per cycle, from perf stat (every thread, no child process)


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
    ap.add_argument("--defaults", type=float, default=180.0, metavar="SECONDS",
                    help="measure the full agent at its default intervals for SECONDS (0: skip)")
    ap.add_argument("--full-only", action="store_true", help="only part 3 (the full agent at its default intervals)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="part 3: split the window into this many rounds (ratios min/median/max)")
    ap.add_argument("--sim-in-process", action="store_true",
                    help="run the simulator's tree refresh inside the full agent's process, as `agent --simulate` "
                         "does alone (default: a process of its own, so the agent's figure is its own)")
    ap.add_argument("--soak", type=float, default=0.0, metavar="SECONDS",
                    help="only the soak: the full agent at its defaults for SECONDS (>= 3600 for the issue 32 "
                         "figure), RSS every --soak-period; exit 1 when RSS grows")
    ap.add_argument("--soak-period", type=float, default=600.0, metavar="SECONDS",
                    help="seconds between RSS readings in --soak (600; shorter for a trial)")
    ap.add_argument("--soak-tolerance", type=float, default=1.0, metavar="MIB",
                    help="growth of RSS after the first period that still counts as flat (1 MiB)")
    ap.add_argument("--no-nvml-account", action="store_true",
                    help="part 3: do not account the simulated NVML library's CPU (to measure the accounting's cost)")
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

    if args.soak:
        return soak_main(args.soak, args.soak_period, args.soak_tolerance, args.sim_in_process)
    if args.full_only:
        return defaults_main(args.defaults or 180.0, args.rounds, args.sim_in_process, not args.rename_writes,
                             not args.no_nvml_account)
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
    helpers: list[subprocess.Popen[bytes]] = []
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
        full, full_refresher = start_sim_agent("agent-full", tmp / "sim-full", "dgx02", full_cfg, full_port,
                                               tmp / "agent-full.log", args.sim_in_process,
                                               not args.rename_writes)
        procs.append(full)
        helpers.extend(full_refresher)
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
        stop_helpers([refresher, *helpers] if refresher is not None else helpers)
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
    if ne_cpu.perf and ag_cpu.perf and like_cpu.perf:
        print(f"{'  perf, per cycle':24}{ne_cpu.perf.cpu_s:>20.5f}{like_cpu.perf.cpu_s:>20.5f}"
              f"{like_cpu.perf.cpu_s / ne_cpu.perf.cpu_s:>9.2f}x   (target <= 1.0x; like for like, perf stat task-clock: "
              f"ns precision, no child process; all hw_counters: {ag_cpu.perf.cpu_s / ne_cpu.perf.cpu_s:.2f}x; "
              f"context switches per cycle {ne_cpu.perf.switches} / {like_cpu.perf.switches})")
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
    print("full agent (--simulate dgx-h100: nvml, nvlink, infiniband, nfs, host, kmsg; 8 simulated GPUs; "
          + ("the simulator's tree refresh in the agent's process)" if args.sim_in_process
             else "the simulator's tree refresh in a process of its own)"))
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
        defaults_main(args.defaults, args.rounds, args.sim_in_process, not args.rename_writes,
                      not args.no_nvml_account)
    return 0


SCRAPE_EVERY = 15.0  # Prometheus' common scrape interval
MIB = 1024 * 1024


def start_refresher(node_dir: Path, interval: float = 1.0, in_place: bool = False) -> subprocess.Popen[bytes]:
    """The simulator's tree refresh as a process of its own (what `agent --simulate` does in a thread);
    `in_place` keeps each file's inode, as sysfs does."""
    from podhealth.sim.tree_write import IN_PLACE_ENV

    env = {**os.environ, **({IN_PLACE_ENV: "1"} if in_place else {})}
    return subprocess.Popen([sys.executable, __file__, "--_refresh", str(node_dir), str(interval)],
                            stdin=subprocess.DEVNULL, start_new_session=True, env=env)


def stop_helpers(helpers: list[subprocess.Popen[bytes]]) -> None:
    for h in helpers:
        if h.poll() is None:
            os.killpg(h.pid, signal.SIGTERM)
            try:
                h.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait(5)


def start_sim_agent(name: str, root: Path, node_name: str, cfg: Path, port: int, log: Path,
                    in_process: bool, in_place: bool = True,
                    nvml_account: Path | None = None) -> tuple[Proc, list[subprocess.Popen[bytes]]]:
    """`podhealth agent --simulate dgx-h100`; unless `in_process`, its tree refresh runs in a process
    of its own (`--sim-no-refresh`), so the agent's CPU is the agent's. `in_place`: the tree's files
    keep their inodes, as in sysfs (else renamed, as the tests' trees are). The simulated NVML
    library cannot leave the process (pynvml calls it); with `nvml_account` it adds its CPU to that
    file (sim/nvml_cpu.py), which the caller subtracts."""
    from podhealth.sim.node import SimNode
    from podhealth.sim.nvml_cpu import CPU_FILE_ENV
    from podhealth.sim.tree_write import IN_PLACE_ENV

    env = {**os.environ, IN_PLACE_ENV: "1" if in_place else "0"}
    env.pop(CPU_FILE_ENV, None)
    if nvml_account is not None:
        env[CPU_FILE_ENV] = str(nvml_account)
    helpers: list[subprocess.Popen[bytes]] = []
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(root),
            "--node", node_name, "--config", str(cfg), "--listen", f"127.0.0.1:{port}"]
    if not in_process:
        node = SimNode.create(root, node_name, "dgx-h100")
        helpers.append(start_refresher(node.dir, in_place=in_place))
        argv.append("--sim-no-refresh")
    try:
        return start(name, argv, port, log, "/healthz", env), helpers
    except BaseException:
        stop_helpers(helpers)
        raise


def node_exporter_bin() -> str | None:
    return shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")


def scrape_every(procs: list[Proc], seconds: float, every: float = SCRAPE_EVERY) -> float:
    """Scrape each process every `every` s (as Prometheus would) for `seconds`; the wall time."""
    t0 = time.monotonic()
    next_scrape = t0
    while time.monotonic() - t0 < seconds:
        if time.monotonic() >= next_scrape:
            for p in procs:
                if get(p.url + "/metrics")[0] != 200:
                    raise SystemExit(f"{p.name}: scrape failed")
            next_scrape += every
        time.sleep(max(0.0, min(next_scrape, t0 + seconds) - time.monotonic()))
    return time.monotonic() - t0


@dataclass
class PerfWindow:
    """CPU time (ns precision, every thread) and context switches of one process over a window."""

    cpu_s: float
    switches: int


def perf_usable() -> bool:
    """Whether `perf stat -p` can count here (it needs perf_event_paranoid <= 1 or root)."""
    perf = shutil.which("perf")
    if perf is None:
        return False
    r = subprocess.run([perf, "stat", "-x,", "-e", "task-clock", "-p", str(os.getpid()), "--", "sleep", "0.1"],
                       capture_output=True, text=True, timeout=30)
    return r.returncode == 0 and "task-clock" in r.stderr


def perf_start(pid: int, seconds: float) -> subprocess.Popen[str]:
    return subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock,context-switches", "-p", str(pid), "--",
                             "sleep", f"{seconds:.3f}"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True)


def perf_end(p: subprocess.Popen[str]) -> PerfWindow | None:
    _, err = p.communicate(timeout=60)
    values: dict[str, float] = {}
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) >= 3 and parts[2] in ("task-clock", "context-switches"):
            try:
                values[parts[2]] = float(parts[0])
            except ValueError:
                return None  # "<not counted>"
    if len(values) != 2:
        return None
    return PerfWindow(values["task-clock"] / 1e3, int(values["context-switches"]))


def spread(xs: list[float]) -> str:
    s = sorted(xs)
    return f"{s[0]:.2f} / {s[len(s) // 2]:.2f} / {s[-1]:.2f}"


def defaults_main(seconds: float, rounds: int, in_process: bool, in_place: bool = True,
                  account_nvml: bool = True) -> int:
    """Part 3: at the default intervals, in the same windows, scraped every 15 s: the full simulated
    agent beside node_exporter at its defaults (this machine's /proc and /sys), and the agent's
    IB+NFS subset beside node_exporter's infiniband+mountstats+nfs on one simulated tree."""
    ne_bin = node_exporter_bin()
    if ne_bin is None:
        print("prometheus-node-exporter is not installed", file=sys.stderr)
        return 2
    from podhealth.sim.node import SimNode
    from podhealth.sim.nvml_cpu import read as read_nvml

    tmp = Path(tempfile.mkdtemp(prefix="podhealth-bench-defaults-"))
    procs: list[Proc] = []
    helpers: list[subprocess.Popen[bytes]] = []
    rows: list[dict[str, float]] = []
    try:
        cfg = tmp / "agent.yaml"
        cfg.write_text("log: {level: warning}\n")
        account = tmp / "nvml-cpu" if account_nvml else None
        full, hs = start_sim_agent("agent-defaults", tmp / "sim", "dgx03", cfg, free_port(), tmp / "agent.log",
                                   in_process, in_place, account)
        procs.append(full)
        helpers.extend(hs)
        ne_port = free_port()
        ne = start("node_exporter", [ne_bin, f"--web.listen-address=127.0.0.1:{ne_port}"], ne_port,
                   tmp / "node_exporter.log", "/metrics")
        procs.append(ne)
        # The IB+NFS subset at its default intervals (10 s), reading the files node_exporter reads.
        node = SimNode.create(tmp / "sim-ibnfs", "dgx04", "dgx-h100")
        helpers.append(start_refresher(node.dir, in_place=True))
        sub_cfg = tmp / "agent-ib-nfs.yaml"
        sub_cfg.write_text(
            f"paths: {{sysfs_root: {node.sys_root}, procfs_root: {node.proc_root}, kmsg: {node.kmsg_path}}}\n"
            "collectors:\n" + "".join(f"  {c}: {{enabled: false}}\n" for c in (
                "nvml", "nvlink", "host", "kmsg", "dcgm", "pcie_aer", "edac", "nvme", "jobs"))
            + "  infiniband: {hw_counters: false}\n"
            "log: {level: warning}\n")
        sub_port = free_port()
        sub = start("agent-ib-nfs", [sys.executable, "-m", "podhealth", "agent", "--config", str(sub_cfg),
                                     "--node", "dgx04", "--listen", f"127.0.0.1:{sub_port}"],
                    sub_port, tmp / "agent-ib-nfs.log", "/healthz")
        procs.append(sub)
        ne_sub_port = free_port()
        ne_sub = start("node_exporter-ib-nfs", [
            ne_bin, f"--path.sysfs={node.sys_root}", f"--path.procfs={node.proc_root}", f"--path.rootfs={tmp}",
            "--collector.disable-defaults", "--collector.infiniband", "--collector.mountstats", "--collector.nfs",
            f"--web.listen-address=127.0.0.1:{ne_sub_port}"], ne_sub_port, tmp / "node_exporter-ib-nfs.log", "/metrics")
        procs.append(ne_sub)
        wait_fresh(full, timeout=120)
        wait_fresh(sub, timeout=120)
        time.sleep(5.0)  # past the start-up burst (first collections, first full report)
        per_round = max(1.0, seconds / max(1, rounds))
        use_perf = perf_usable()
        for _ in range(max(1, rounds)):
            begin = {p.name: cpu_window_start(p.popen.pid) for p in procs}
            nvml0 = read_nvml(account) if account else (0.0, 0)
            perfs = {p.name: perf_start(p.popen.pid, per_round) for p in procs} if use_perf else {}
            wall = scrape_every(procs, per_round)
            w = {p.name: cpu_window_end(p.popen.pid, begin[p.name], 1) for p in procs}
            nvml1 = read_nvml(account) if account else (0.0, 0)
            pw = {name: perf_end(pp) for name, pp in perfs.items()}
            sim = w["agent-defaults"].roles.get("SIMULATOR tree refresh", 0.0) + w["agent-defaults"].children
            sub_w = w["agent-ib-nfs"]
            row = {
                "wall": wall, "load1": os.getloadavg()[0],
                "full": (w["agent-defaults"].total - sim) / wall, "sim": sim / wall,
                "ne": w["node_exporter"].total / wall,
                "sub": (sub_w.total - sub_w.children) / wall, "sub_probes": sub_w.children / wall,
                "ne_sub": w["node_exporter-ib-nfs"].total / wall, "nvml": (nvml1[0] - nvml0[0]) / wall,
                "nvml_calls": (nvml1[1] - nvml0[1]) / wall,
            }
            if pw and all(v is not None for v in pw.values()):
                # perf counts every thread of the process to the nanosecond, and no child process
                # (the NFS probe helpers, the refresher): the agent's own figure. The tree refresh
                # thread of --sim-in-process stays in it.
                full_p, ne_p = pw["agent-defaults"], pw["node_exporter"]
                sub_p, ne_sub_p = pw["agent-ib-nfs"], pw["node_exporter-ib-nfs"]
                assert full_p and ne_p and sub_p and ne_sub_p
                row.update(full=full_p.cpu_s / wall, ne=ne_p.cpu_s / wall, sub=sub_p.cpu_s / wall,
                           ne_sub=ne_sub_p.cpu_s / wall, perf=1.0,
                           full_cs=full_p.switches / wall * 60, ne_cs=ne_p.switches / wall * 60,
                           sub_cs=sub_p.switches / wall * 60, ne_sub_cs=ne_sub_p.switches / wall * 60)
            rows.append(row)
            last = w["agent-defaults"]
        rss = full.rss()
    finally:
        for p in procs:
            p.stop()
        stop_helpers(helpers)
        if not os.environ.get("PODHEALTH_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    where = "in the agent's process" if in_process else "in a process of its own"
    how = ("perf stat task-clock, every thread, no child process" if all("perf" in r for r in rows)
           else f"/proc ticks of {1e3 / CLK_TCK:.0f} ms")
    print(f"at the default intervals, in the same windows ({len(rows)} rounds of {rows[0]['wall']:.0f} s, each "
          f"process scraped every {SCRAPE_EVERY:g} s; CPU: {how}; simulator {where}; its tree rewritten "
          + ("in place (inodes kept, as in sysfs)" if in_place else "by rename (new inodes)") + "; simulated "
          + ("NVML library accounted (sim/nvml_cpu.py)" if account_nvml else "NVML library NOT accounted") + ")")
    print(f"{'round':>6}{'load1':>7}{'full agent %':>14}{'net of NVML sim %':>19}{'node_exp. %':>13}{'gross':>8}"
          f"{'net':>8}{'IB+NFS agent %':>16}{'node_exp. IB+NFS %':>20}{'ratio':>8}")
    for i, r in enumerate(rows, 1):
        net = r['full'] - r['nvml']
        print(f"{i:>6}{r['load1']:>7.2f}{r['full'] * 100:>14.3f}{net * 100:>19.3f}{r['ne'] * 100:>13.3f}"
              f"{r['full'] / r['ne']:>7.2f}x{net / r['ne']:>7.2f}x"
              f"{r['sub'] * 100:>16.3f}{r['ne_sub'] * 100:>20.3f}{r['sub'] / r['ne_sub']:>7.2f}x")
    print(f"  full agent / node_exporter defaults, min / median / max: "
          f"{spread([r['full'] / r['ne'] for r in rows])}x gross   (target <= 5x; full agent <= 0.5% of a core)")
    if account_nvml:
        print(f"  full agent net of the simulated NVML library / node_exporter:  "
              f"{spread([(r['full'] - r['nvml']) / r['ne'] for r in rows])}x   (the library's Python, "
              f"{statistics.median(r['nvml'] for r in rows) * 100:.3f} % of a core median, is C in libnvidia-ml "
              "on a real node; taken as free there)")
        print(f"    simulated NVML calls per second, median: {statistics.median(r['nvml_calls'] for r in rows):.0f} "
              "(the timing's own cost outside the timed span stays in the net figure, an upper bound: "
              "bench/README.md, 'Net of the simulated NVML library')")
    print(f"  IB+NFS subset / node_exporter's infiniband+mountstats+nfs:  "
          f"{spread([r['sub'] / r['ne_sub'] for r in rows])}x   (target <= 1.5x; hw_counters off, the files "
          "node_exporter reads; the agent's NFS probe helpers left out: node_exporter does not probe)")
    if all("perf" in r for r in rows):
        print("  context switches per minute (each a thread hand-off or wake-up), median: full agent "
              f"{statistics.median(r['full_cs'] for r in rows):.0f}, node_exporter "
              f"{statistics.median(r['ne_cs'] for r in rows):.0f}; IB+NFS agent "
              f"{statistics.median(r['sub_cs'] for r in rows):.0f}, node_exporter IB+NFS "
              f"{statistics.median(r['ne_sub_cs'] for r in rows):.0f}")
    print(f"  simulator charged to the full agent's process and left out: "
          f"{statistics.median(r['sim'] for r in rows) * 100:.3f} % (its NFS probe stand-ins"
          + (", its tree refresh" if in_process else "") + ")")
    print(f"  full agent RSS MiB     {rss / MIB:.1f}")
    print("  full agent CPU by part, last round (share of one core):")
    for role, v in sorted(last.roles.items(), key=lambda kv: -kv[1]):
        print(f"    {role:42}{v / rows[-1]['wall'] * 100:8.3f} %")
    return 0


def soak_main(seconds: float, period: float, tolerance_mib: float, in_process: bool) -> int:
    """--soak: the full simulated agent at its defaults, scraped every 15 s; RSS every `period`;
    exit 1 when RSS after the first period (the checks' history windows fill in it) grows by more
    than `tolerance_mib`."""
    tmp = Path(tempfile.mkdtemp(prefix="podhealth-bench-soak-"))
    procs: list[Proc] = []
    helpers: list[subprocess.Popen[bytes]] = []
    readings: list[tuple[float, int]] = []
    try:
        cfg = tmp / "agent.yaml"
        cfg.write_text("log: {level: warning}\n")
        full, hs = start_sim_agent("agent-soak", tmp / "sim", "dgx05", cfg, free_port(), tmp / "agent.log", in_process)
        procs.append(full)
        helpers.extend(hs)
        wait_fresh(full, timeout=120)
        t0 = time.monotonic()
        print(f"soak: the full agent at its defaults (--simulate dgx-h100), {seconds:.0f} s, RSS every {period:g} s",
              flush=True)
        print(f"{'minutes':>8}{'RSS MiB':>10}{'load1':>7}", flush=True)
        while time.monotonic() - t0 < seconds - 1e-6:
            scrape_every([full], min(period, seconds - (time.monotonic() - t0)))
            rss = full.rss()
            readings.append((time.monotonic() - t0, rss))
            print(f"{readings[-1][0] / 60:>8.1f}{rss / MIB:>10.2f}{os.getloadavg()[0]:>7.2f}", flush=True)
    finally:
        for p in procs:
            p.stop()
        stop_helpers(helpers)
        if not os.environ.get("PODHEALTH_BENCH_KEEP"):
            shutil.rmtree(tmp, ignore_errors=True)
    if len(readings) < 3:
        print("soak: fewer than 3 readings; nothing to judge (make --soak at least 3x --soak-period)")
        return 2
    # The first period fills the histories (checks.rate_window, 300 s): growth is judged after it.
    settled = readings[1:]
    growth = (settled[-1][1] - settled[0][1]) / MIB
    hours = (settled[-1][0] - settled[0][0]) / 3600
    peak = max(r for _, r in settled) / MIB
    print(f"soak: RSS {settled[0][1] / MIB:.2f} -> {settled[-1][1] / MIB:.2f} MiB after the first period "
          f"({growth:+.2f} MiB, {growth / hours if hours else 0.0:+.2f} MiB/h), peak {peak:.2f} MiB "
          f"(target <= 64 MiB and flat; tolerance {tolerance_mib:g} MiB)")
    if growth > tolerance_mib:
        print("soak: FAIL: RSS grows")
        return 1
    print("soak: flat")
    return 0


if __name__ == "__main__":
    sys.exit(main())
