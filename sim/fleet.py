"""`podhealth simulate fleet`: a simulated SuperPOD on this machine, in the foreground.

    podhealth simulate fleet --nodes 16 --profile dgx-h100 [--root DIR] [--base-port P] [--no-slurm]
                             [--storage bond,ib]

Starts N agents on simulated nodes dgx01..dgxNN (each its own process and port), one aggregator
(SQLite under <root>/_fleet), and, when Slurm is installed, a loopback Slurm cluster with the same
node names that the aggregator drains through its Slurm fencer (else the dry-run fencer, and it
says so). Prints the URLs and a Prometheus scrape config, then waits for Ctrl-C/SIGTERM and stops
everything it started: every child runs in its own process group with a pidfile under
<root>/_fleet/run, and a fleet that died without cleaning up is swept on the next start (only
processes whose command line names this root are touched). `podhealth simulate inject|clear
--root <root>` drive the running fleet.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, TextIO

from podhealth import cliconfig, httpclient
from podhealth.configload import ConfigError
from podhealth.credentials import write_private
from podhealth.exitcodes import EXIT_UNKNOWN, EXIT_USAGE
from podhealth.sim.fleet_config import (
    AgentPlan, FencerChoice, FleetPlan, agent_config, aggregator_config, check_agent_config,
    check_aggregator_config, reboot_program, scrape_config,
)
from podhealth.sim.procs import alive, cmdline

MAX_NODES = 256
HOME = "_fleet"
AGENT_START_TIMEOUT = 90.0  # 16 agents on 2 busy cores come up in ~15 s; a loaded CI box is slower
AGG_START_TIMEOUT = 30.0
STOP_TIMEOUT = 8.0
EXIT_BAD_INPUT = EXIT_USAGE  # a value to change (README: exit codes)


class FleetError(Exception):
    """Start-up failed; the message says what and where its log is. Everything started is stopped."""


class _Interrupted(Exception):
    pass


@dataclass(frozen=True)
class FleetOptions:
    nodes: int
    profile: str
    root: Path
    base_port: int | None
    slurm: bool
    cluster: str
    partition: str
    # storage builds (podhealth.sim.topology.STORAGE_MODES) node i gets storage[i % len]; () = the SKU's
    storage: tuple[str, ...] = ()


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    pidfile: Path
    reported_exit: bool = False

    def log_tail(self, n: int = 15) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()[-n:]
        except OSError:
            return f"(no log at {self.log})"
        return "\n".join("    " + line for line in lines)


@dataclass
class Fleet:
    opts: FleetOptions
    out: TextIO = field(default_factory=lambda: sys.stdout)
    stop_requested: threading.Event = field(default_factory=threading.Event)
    plan: FleetPlan | None = None
    children: dict[str, Child] = field(default_factory=dict)
    slurm: object | None = None  # podhealth.sim.slurmcluster.SlurmCluster when running
    fencer: FencerChoice | None = None
    _logs: list[IO[bytes]] = field(default_factory=list)
    _claimed: bool = False

    # ---- output ----------------------------------------------------------------------------

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    # ---- start -----------------------------------------------------------------------------

    def start(self) -> None:
        t0 = time.monotonic()
        plan = self.plan = make_plan(self.opts)
        _claim(plan)
        self._claimed = True
        _reset(plan)
        self.say(f"podhealth: starting a simulated pod of {self.opts.nodes} x {self.opts.profile} "
                 f"under {plan.root}")
        self._create_nodes(plan)
        self._write_agent_configs(plan)
        for a in plan.agents:  # all at once: they import and initialise in parallel
            self._spawn(f"agent-{a.node}", [sys.executable, "-m", "podhealth", "agent", "--config", str(a.config),
                                            "--simulate", self.opts.profile, "--node", a.node,
                                            "--sim-root", str(plan.root), "--listen", f"127.0.0.1:{a.port}"])
        ports = (f"ports {plan.agents[0].port}..{plan.agents[-1].port}" if self.opts.base_port
                 else "on free loopback ports")
        self.say(f"  started {len(plan.agents)} agents ({ports})")
        self.fencer = self._start_slurm(plan)
        text = aggregator_config(plan, self.fencer)
        check_aggregator_config(text, str(plan.aggregator_config))
        write_private(plan.aggregator_config, text)
        self._spawn("aggregator", [sys.executable, "-m", "podhealth", "aggregator", "--config",
                                   str(plan.aggregator_config)])
        self._wait_ready("aggregator", [self.children["aggregator"]], lambda c: _answers(f"{plan.aggregator_url}/healthz"),
                         AGG_START_TIMEOUT)
        self._wait_ready("agents", [self.children[f"agent-{a.node}"] for a in plan.agents],
                         lambda c: _answers(f"{_agent_of(plan, c).url}/metrics"), AGENT_START_TIMEOUT)
        (plan.home / "prometheus.yml").write_text(scrape_config(plan))
        write_private(plan.home / "fleet.json", json.dumps(self.describe(), indent=2))  # the admin token
        self.say(f"  pod ready in {time.monotonic() - t0:.1f} s")

    def _create_nodes(self, plan: FleetPlan) -> None:
        from podhealth.sim.node import SimNode

        # Fresh nodes every start: faults injected into a previous run must not fence this one.
        from podhealth.sim.state import default_state

        for i, name in enumerate(plan.nodes):
            storage = self.opts.storage[i % len(self.opts.storage)] if self.opts.storage else None
            SimNode.create(plan.root, name, self.opts.profile,
                           seed=default_state(name, self.opts.profile, storage=storage) if storage else None)
        self.say(f"  created {len(plan.nodes)} simulated nodes {plan.nodes[0]}..{plan.nodes[-1]} (healthy)")

    def _write_agent_configs(self, plan: FleetPlan) -> None:
        for a in plan.agents:
            text = agent_config(plan, a)
            check_agent_config(text, str(a.config))
            write_private(a.config, text)
            a.spool.mkdir(parents=True, exist_ok=True)

    def _start_slurm(self, plan: FleetPlan) -> FencerChoice:
        from podhealth.sim import slurmcluster

        if not self.opts.slurm:
            return FencerChoice(None, "dry-run fencer (--no-slurm): fences are recorded by the aggregator, "
                                      "nothing is drained")
        missing = slurmcluster.missing_binaries()
        if missing:
            return FencerChoice(None, f"dry-run fencer: Slurm is not installed ({', '.join(missing)} missing), so "
                                      "fences are recorded by the aggregator and nothing is drained")
        if os.geteuid() != 0:
            return FencerChoice(None, "dry-run fencer: the loopback Slurm cluster needs root (munged, slurmd); "
                                      "fences are recorded by the aggregator and nothing is drained")
        self.say(f"  starting a loopback Slurm cluster (slurmctld + {len(plan.nodes)} slurmd) ...")
        program = plan.home / "reboot-program.sh"
        program.write_text(reboot_program(plan, sys.executable))
        program.chmod(0o755)
        cluster = slurmcluster.SlurmCluster(nodes=len(plan.nodes), prefix="dgx", partition=plan.partition,
                                            start_timeout=60.0,
                                            extra_conf=f"RebootProgram={program}\nResumeTimeout=300\n")
        if cluster.node_names != plan.nodes:
            raise FleetError(f"Slurm node names {cluster.node_names[:2]}... differ from the pod's {plan.nodes[:2]}...")
        self.slurm = cluster
        try:
            cluster.start()
        except slurmcluster.SlurmClusterError as e:
            self.slurm = None
            raise FleetError(f"the loopback Slurm cluster did not start (use --no-slurm to go without):\n{e}") from None
        (plan.home / "slurm-root").write_text(str(cluster.root))
        return FencerChoice(cluster.conf, f"Slurm fencer (scontrol) on the loopback cluster, "
                                          f"SLURM_CONF={cluster.conf}")

    def _spawn(self, name: str, argv: list[str]) -> None:
        assert self.plan is not None
        log = self.plan.home / "logs" / f"{name}.log"
        fh = open(log, "wb")
        self._logs.append(fh)
        env = dict(os.environ)
        env.pop("PODHEALTH_CONFIG", None)
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
        pidfile = self.plan.home / "run" / f"{name}.pid"
        pidfile.write_text(f"{proc.pid}\n")
        self.children[name] = Child(name, proc, log, pidfile)

    def _wait_ready(self, what: str, children: list[Child], ready: Callable[[Child], bool], timeout: float) -> None:
        t0 = time.monotonic()
        pending = list(children)
        shown = -1
        tty = self.out.isatty()
        while pending:
            if self.stop_requested.is_set():
                raise _Interrupted()
            for c in list(pending):
                if c.proc.poll() is not None:
                    c.reported_exit = True
                    hint = self._port_hint(c)
                    raise FleetError(hint or f"{c.name} exited with code {c.proc.returncode} while starting "
                                             f"(log {c.log}):\n{c.log_tail()}")
                if ready(c):
                    pending.remove(c)
            done = len(children) - len(pending)
            elapsed = time.monotonic() - t0
            if len(children) > 1 and done != shown:
                shown = done
                line = f"  {what} up: {done}/{len(children)} ({elapsed:.1f} s)"
                if tty:
                    self.out.write("\r" + line + ("\n" if not pending else ""))
                    self.out.flush()
                else:
                    self.say(line)
            if not pending:
                break
            if elapsed > timeout:
                names = ", ".join(c.name for c in pending)
                raise FleetError(f"not ready after {timeout:.0f} s: {names}\n(log {pending[0].log}):\n"
                                 f"{pending[0].log_tail()}")
            time.sleep(0.2)
        if len(children) == 1:
            self.say(f"  {what} up ({time.monotonic() - t0:.1f} s)")

    def _port_hint(self, c: Child) -> str | None:
        """The one line to say when `c` died because its port was taken (which option to change),
        instead of its log's traceback; None when it died of something else."""
        try:
            log = c.log.read_text(errors="replace")
        except OSError:
            return None
        if "address already in use" not in log.lower():
            return None
        plan = self.plan
        assert plan is not None
        port = plan.aggregator_port if c.name == "aggregator" else _agent_of(plan, c).port
        if self.opts.base_port:
            return (f"{c.name}: port {port} is already in use by another program: choose another --base-port "
                    f"(the pod needs {len(plan.agents) + 1} ports in a row), or leave it out and free ports are picked")
        return (f"{c.name}: port {port} was taken by another program between picking it and starting: run "
                "again, or give the pod a fixed range with --base-port")

    # ---- run and stop ----------------------------------------------------------------------

    def watch(self) -> int:
        """Until a stop is requested: report children that die; the aggregator dying ends the fleet."""
        while not self.stop_requested.wait(0.5):
            for c in self.children.values():
                if c.proc.poll() is not None and not c.reported_exit:
                    c.reported_exit = True
                    self.say(f"podhealth: {c.name} exited with code {c.proc.returncode} (log {c.log}):\n"
                             f"{c.log_tail()}")
                    if c.name == "aggregator":
                        return 1
        return 0

    def stop(self) -> None:
        """Stop everything this fleet started (process groups by pid), also after a failed start."""
        procs = list(self.children.values())
        for c in procs:
            if c.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for c in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(max(0.0, deadline - time.monotonic()))
        for c in procs:
            # The group too: anything an agent forked (NFS probes) goes with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(c.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                c.proc.wait(2)
            with contextlib.suppress(OSError):
                c.pidfile.unlink()
        self.children.clear()
        if self.slurm is not None:
            self.slurm.stop()  # type: ignore[attr-defined]
            self.slurm = None
            if self.plan is not None:
                with contextlib.suppress(OSError):
                    (self.plan.home / "slurm-root").unlink()
        for fh in self._logs:
            with contextlib.suppress(OSError):
                fh.close()
        self._logs.clear()
        if self.plan is not None and self._claimed:
            with contextlib.suppress(OSError):
                (self.plan.home / "run" / "fleet.pid").unlink()

    # ---- what to print ---------------------------------------------------------------------

    def describe(self) -> dict[str, object]:
        plan = self.plan
        assert plan is not None and self.fencer is not None
        return {
            "root": str(plan.root), "home": str(plan.home), "profile": self.opts.profile,
            "cluster": plan.cluster, "partition": plan.partition,
            "aggregator": {"url": plan.aggregator_url, "ui": f"{plan.aggregator_url}/ui",
                           "api": f"{plan.aggregator_url}/api/v1/nodes", "metrics": f"{plan.aggregator_url}/metrics",
                           "config": str(plan.aggregator_config), "db": str(plan.db),
                           "pid": self.children["aggregator"].proc.pid},
            "agents": [{"node": a.node, "url": a.url, "metrics": f"{a.url}/metrics",
                        "pid": self.children[f"agent-{a.node}"].proc.pid} for a in plan.agents],
            "slurm_conf": str(self.fencer.slurm_conf) if self.fencer.slurm_conf else None,
            "slurm_pids": _slurm_pids(self.slurm),
            "fencer": "slurm" if self.fencer.slurm_conf else "dryrun",
            "admin_token": plan.admin_token,
            "prometheus_config": str(plan.home / "prometheus.yml"),
            "fleet_pid": os.getpid(),
        }

    def banner(self) -> str:
        plan = self.plan
        assert plan is not None and self.fencer is not None
        agg = plan.aggregator_url
        ui_note = "" if _answers(f"{agg}/ui") else "   (this build has no UI yet)"
        root_arg = root_option(plan.root)
        first = plan.nodes[min(2, len(plan.nodes) - 1)]
        ph = cli_command()
        lines = [
            "",
            f"Simulated pod {plan.cluster!r}: {len(plan.nodes)} x {self.opts.profile}, partition {plan.partition}",
            f"  UI              {agg}/ui{ui_note}",
            f"  aggregator API  {agg}/api/v1/nodes    (fleet: {agg}/api/v1/fleet)",
            f"  aggregator      {agg}/metrics",
            f"  fencing         {self.fencer.note}",
            f"  admin token     {plan.admin_token}    (fence/release in the UI and API)",
            f"  sim root        {plan.root}",
            f"  logs, configs   {plan.home}",
            "",
            "Agents (/metrics, /health):",
        ]
        lines += [f"  {a.node:<8} {a.url}/metrics" for a in plan.agents]
        lines += ["", "Try it (the export line first: `fleet` finds this pod's aggregator through it):",
                  f"  export {cliconfig.AGGREGATOR_ENV}={agg} PODHEALTH_ADMIN_TOKEN={plan.admin_token}",
                  f"  {ph} fleet status",
                  f"  {ph} simulate inject {first} xid=79 gpu=3{root_arg}    # GPU fell off the bus",
                  f"  {ph} simulate inject {first} fault=slow-gpu gpu=3 pct=7{root_arg}"
                  f"    # 7% slower: {agg}/ui/failslow after the next probe round (5 min)",
                  f"  curl -s {agg}/api/v1/nodes/{first}"]
        if self.fencer.slurm_conf:
            lines.append(f"  SLURM_CONF={self.fencer.slurm_conf} sinfo -N -o '%N %T %E'")
        lines += [f"  PODHEALTH_TOKEN={plan.agent_token(first)} {ph} check --node {first} --aggregator {agg}"
                  "    # the handover report (exit 1 = fail)",
                  f"  {ph} simulate clear {first}{root_arg}",
                  "",
                  f"Prometheus scrape config (also in {plan.home / 'prometheus.yml'}):",
                  ""]
        lines += ["  " + line for line in scrape_config(plan).splitlines()]
        lines += ["", "Ctrl-C (or SIGTERM) stops the whole pod."]
        return "\n".join(lines)


# ---- planning ----------------------------------------------------------------------------------


def make_plan(opts: FleetOptions) -> FleetPlan:
    from podhealth.sim.slurmcluster import node_names

    root = opts.root.resolve()
    home = root / HOME
    names = node_names(opts.nodes, "dgx")
    ports = _ports(opts.base_port, opts.nodes + 1)
    for d in ("logs", "run", "agents"):
        (home / d).mkdir(parents=True, exist_ok=True)
    db = home / "aggregator.db"
    agents = tuple(AgentPlan(node=n, port=p, config=home / "agents" / f"{n}.yml", spool=home / "spool" / n)
                   for n, p in zip(names, ports[1:]))
    return FleetPlan(root=root, home=home, profile=opts.profile, cluster=opts.cluster, partition=opts.partition,
                     agents=agents, aggregator_port=ports[0], aggregator_config=home / "aggregator.yml", db=db,
                     cluster_secret=secrets.token_hex(32), admin_token=secrets.token_urlsafe(18))


def _reset(plan: FleetPlan) -> None:
    """A fresh pod every start: an old database would "reconcile" fences the new Slurm never saw,
    and an old spool would replay the last run's events."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{plan.db}{suffix}")
    shutil.rmtree(plan.home / "spool", ignore_errors=True)
    (plan.home / "spool").mkdir()


def _ports(base: int | None, n: int) -> list[int]:
    if base is None:
        from podhealth.sim.slurmcluster import free_ports

        return free_ports(n)
    if not 1024 <= base <= 65535 - n:
        raise ValueError(f"--base-port: expected 1024..{65535 - n} for {n} ports, got {base}")
    taken = []
    for p in range(base, base + n):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                taken.append(p)
    if taken:
        raise ValueError(f"--base-port {base}: port(s) {', '.join(map(str, taken[:5]))} already in use "
                         f"(the pod needs {base}..{base + n - 1}): choose another --base-port, or leave it "
                         "out and free ports are picked")
    return list(range(base, base + n))


def _claim(plan: FleetPlan) -> None:
    """One fleet per root; sweep what a fleet that died uncleanly left running."""
    run = plan.home / "run"
    me = run / "fleet.pid"
    with contextlib.suppress(OSError, ValueError):
        pid = int(me.read_text().strip())
        if pid != os.getpid() and alive(pid) and "simulate" in cmdline(pid) and "fleet" in cmdline(pid):
            raise FleetError(f"a fleet is already running on {plan.root} (pid {pid}); stop it first")
    marker = str(plan.root)
    for pidfile in run.glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if pid > 1 and pid != os.getpid() and alive(pid) and marker in cmdline(pid):
                _kill_group(pid)
        with contextlib.suppress(OSError):
            pidfile.unlink()
    stale_slurm = plan.home / "slurm-root"
    if stale_slurm.is_file():
        _sweep_slurm(Path(stale_slurm.read_text().strip()))
        with contextlib.suppress(OSError):
            stale_slurm.unlink()
    me.write_text(f"{os.getpid()}\n")


def _sweep_slurm(root: Path) -> None:
    """Daemons of a loopback Slurm cluster a crashed fleet left behind (their command lines name `root`)."""
    if not root.is_absolute() or not (root / "slurm.conf").is_file():
        return
    for pidfile in (root / "run").glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pidfile.read_text().strip())
            if pid > 1 and alive(pid) and str(root) in cmdline(pid):
                _kill_group(pid)
    shutil.rmtree(root, ignore_errors=True)


def _kill_group(pid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        if not alive(pid):
            return


def _answers(url: str, timeout: float = 1.0) -> bool:
    try:
        return 200 <= httpclient.exchange("GET", url, deadline_s=timeout).status < 300
    except httpclient.ExchangeError:
        return False


def _agent_of(plan: FleetPlan, child: Child) -> AgentPlan:
    node = child.name.removeprefix("agent-")
    return next(a for a in plan.agents if a.node == node)


def _slurm_pids(cluster: object | None) -> list[int]:
    procs = getattr(cluster, "_procs", None) or {}
    return [p.pid for p in procs.values()]


def cli_command(argv0: str | None = None) -> str:
    """How the banner's commands call this podhealth: `podhealth` when that name on PATH is the
    running script, else the running script's path (the ./.venv that scripts/podhealth runs, where
    no `podhealth` is on PATH), else `<python> -m podhealth`. A bare `podhealth` could be missing,
    or another install driving this pod with other code."""
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    if script.name == "podhealth":
        found = shutil.which("podhealth")
        if found and Path(found).resolve() == script.resolve():
            return "podhealth"
        return shlex.quote(str(script.resolve()))
    return f"{shlex.quote(sys.executable)} -m podhealth"


def root_option(root: Path) -> str:
    """` --root DIR` for the commands the banner prints, unless DIR is the per-user default: they
    are pasted into other shells, which may not have the $PODHEALTH_SIM_DIR that chose DIR."""
    from podhealth.sim.node import user_root
    return "" if root.resolve() == user_root().resolve() else f" --root {shlex.quote(str(root))}"


def _default_root() -> Path:
    from podhealth.sim.node import default_root
    return default_root().resolve()


# ---- the CLI -----------------------------------------------------------------------------------


def add_subcommand(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    from podhealth.sim.state import simulated_profiles

    p = sub.add_parser("fleet", parents=[common], help="run a simulated pod: agents, aggregator, loopback Slurm",
                       description="Start N simulated DGX nodes with their agents, an aggregator and (when Slurm "
                                   "is installed) a loopback Slurm cluster; stay in the foreground until Ctrl-C.")
    p.add_argument("--nodes", type=int, default=16, help=f"number of nodes, 1..{MAX_NODES} (default 16)")
    p.add_argument("--profile", choices=simulated_profiles(), default="dgx-h100",
                   help=f"hardware profile: {', '.join(simulated_profiles())} (default dgx-h100)")
    p.add_argument("--base-port", type=int, default=None,
                   help="aggregator on this port, agents on the next N (default: free ports)")
    p.add_argument("--no-slurm", action="store_true", help="do not start Slurm; use the dry-run fencer")
    p.add_argument("--cluster", default="simpod", help="cluster label in the scrape config (default simpod)")
    p.add_argument("--partition", default="gpu", help="Slurm partition / node pool (default gpu)")
    p.add_argument("--storage", default=None, metavar="MODE[,MODE...]",
                   help="storage adapter builds (bond, ethernet, ib, none) given to the nodes in turn, "
                        "e.g. bond,ib: a pod of both documented builds (default: the SKU's)")
    p.set_defaults(sim_func=run)


def options(args: argparse.Namespace) -> FleetOptions:
    from podhealth.hostnames import node_name_problem
    from podhealth.sim.topology import STORAGE_MODES

    if not 1 <= args.nodes <= MAX_NODES:
        raise ValueError(f"--nodes: expected 1..{MAX_NODES}, got {args.nodes}")
    for flag, value in (("--cluster", args.cluster), ("--partition", args.partition)):
        problem = node_name_problem(value)
        if problem:
            raise ValueError(f"{flag}: {problem.replace('node name', 'name')}")
    storage = tuple(m.strip() for m in args.storage.split(",")) if args.storage else ()
    bad = [m for m in storage if m not in STORAGE_MODES]
    if bad:
        raise ValueError(f"--storage: {bad[0]!r} is not one of {', '.join(STORAGE_MODES)}")
    if args.root:
        root = Path(args.root)
    else:
        from podhealth.sim.node import root_problem

        root = _default_root()
        problem = root_problem(root)
        if problem:
            raise ValueError(problem)
    return FleetOptions(nodes=args.nodes, profile=args.profile, root=root, base_port=args.base_port,
                        slurm=not args.no_slurm, cluster=args.cluster, partition=args.partition,
                        storage=storage)


def run(args: argparse.Namespace) -> int:
    try:
        opts = options(args)
    except ValueError as e:
        print(f"podhealth simulate fleet: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    fleet = Fleet(opts)
    previous = {sig: signal.signal(sig, lambda *_: fleet.stop_requested.set())
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    rc = 0
    try:
        fleet.start()
        fleet.say(fleet.banner())
        rc = fleet.watch()
    except ValueError as e:  # a --base-port clash: an option to change
        print(f"podhealth simulate fleet: error: {e}", file=sys.stderr)
        rc = EXIT_BAD_INPUT
    except ConfigError as e:  # a config the loader refused: a bad config file, as everywhere
        print(f"podhealth simulate fleet: error: {e}", file=sys.stderr)
        rc = EXIT_UNKNOWN
    except FleetError as e:
        print(f"podhealth simulate fleet: error: {e}", file=sys.stderr)
        rc = 1
    except _Interrupted:
        rc = 130
    finally:
        started = bool(fleet.children or fleet.slurm)
        if started:
            fleet.say("\npodhealth: stopping the pod ...")
        fleet.stop()
        if started:
            fleet.say("podhealth: stopped")
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return rc
