"""`podhealth agent`: the per-node daemon (a systemd Type=notify service).

    podhealth agent [--config FILE] [--simulate PROFILE [--sim-root DIR] [--sim-no-refresh]] [--node NAME]
                    [--listen ADDR:PORT] [--compat dcgm-exporter]

Exit codes: 0 after SIGTERM/SIGINT, 2 on a bad config (the message names file:line:key), 64 on
a bad argument (EX_USAGE), 1 when the server cannot start (e.g. the port is taken).
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from podhealth import cliconfig, config, credentials
from podhealth.credentials import CredentialError
from podhealth.exitcodes import EXIT_CANNOT_BIND, EXIT_USAGE
from podhealth.hostnames import node_name_problem
from podhealth.netaddr import parse_listen

if TYPE_CHECKING:
    from podhealth.agent.simmode import SimulatedNode, Simulator

DEFAULT_SIM_NODE = "dgx01"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
               simulator: "Simulator | None" = None) -> argparse.ArgumentParser:
    """The `agent` command; `--simulate` and its options only with a `simulator` (the CLI registers
    the command through sim/cmd_agent.py, which passes one: agent/simmode.py)."""
    p = sub.add_parser("agent", help="run the node agent (/metrics, /healthz, collectors)",
                       description="Run the node agent: collectors on their intervals, Prometheus "
                                   "exposition on /metrics, liveness on /healthz, sd_notify under systemd.")
    cliconfig.add_option(p)
    if simulator is not None:
        sims = simulator.profiles()
        p.add_argument("--simulate", choices=sims, metavar="PROFILE",
                       help=f"run against a simulated node ({', '.join(sims)}); binds 127.0.0.1 by default")
        p.add_argument("--sim-root", type=Path, help="directory of simulated nodes (default $PODHEALTH_SIM_DIR "
                                                     "or /tmp/podhealth-sim-$UID)")
        p.add_argument("--sim-no-refresh", action="store_true",
                       help="with --simulate: leave rewriting the node's trees to another process (the "
                            "benchmarks do, so that the agent's CPU is its own), instead of a thread here")
    else:
        p.set_defaults(simulate=None, sim_root=None, sim_no_refresh=False)
    p.add_argument("--node", help="node name (default: config node.name, else the short hostname; "
                                  f"'{DEFAULT_SIM_NODE}' when simulating)")
    p.add_argument("--listen", metavar="ADDR:PORT", help="override listen.address and listen.port")
    p.add_argument("--compat", choices=["dcgm-exporter"], help="also expose GPU series under these names")
    p.set_defaults(func=lambda args: run(args, simulator))
    return p


MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc malloc.h


def limit_malloc_arenas(n: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (as MALLOC_ARENA_MAX=n would) before any thread starts.

    glibc gives each thread that allocates its own arena, up to 8 per core; with a dozen
    threads (collectors, probes, renderer, checks) allocating in turn, each arena keeps its own
    free pages, which cost the DGX agent ~6 MiB of RSS. Two arenas are plenty for threads that
    mostly wait. An explicit MALLOC_ARENA_MAX in the environment wins; elsewhere than glibc
    this is a no-op. Returns whether the limit was set."""
    if "MALLOC_ARENA_MAX" in os.environ or not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_ARENA_MAX, n))


# The fd limit code is shared with the aggregator (core/fdlimit.py); these names stay for callers.
from podhealth.fdlimit import FD_LIMIT, raise_fd_limit  # noqa: E402,F401


def _fail(msg: str) -> int:
    print(f"podhealth agent: {msg}", file=sys.stderr)
    return 2


def _usage(msg: str) -> int:
    print(f"podhealth agent: {msg}", file=sys.stderr)
    return EXIT_USAGE


def port_holder(port: int, procfs_root: Path = Path("/proc")) -> str:
    """Who listens on TCP `port` here, from /proc/net/tcp{,6} (readable by any user, unlike the
    owner's /proc/PID/fd): "uid 1000 (alice)", or "" when it cannot be told."""
    import pwd

    for name in ("tcp", "tcp6"):
        try:
            lines = (procfs_root / "net" / name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            if len(f) > 7 and f[3] == "0A" and f[1].rsplit(":", 1)[-1] == f"{port:04X}":  # 0A: LISTEN
                uid = int(f[7])
                try:
                    return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
                except KeyError:
                    return f"uid {uid}"
    return ""


def _cannot_bind(agent: Any, cfg: config.Config, e: OSError) -> int:
    """The agent cannot listen: say why, and who holds the port. A port taken while the agent was
    down may be a process waiting to answer in its place (it cannot prove it is the agent, so
    nothing believes it, but nothing hears the node either): exit EXIT_CANNOT_BIND, which the
    unit's RestartPreventExitStatus= keeps from looping, so `systemctl status` shows it and
    PodhealthAgentDown pages, instead of a restart every 5 s forever."""
    from podhealth import log

    listen = f"{cfg.listen.address}:{cfg.listen.port}"
    in_use = e.errno == errno.EADDRINUSE
    holder = port_holder(cfg.listen.port) if in_use and cfg.listen.port else ""
    why = f"cannot listen on {listen}: {e.strerror or e}" + (f"; the port is held by {holder}" if holder else "")
    log.get("podhealth.agent.cmd").error(
        "cannot start the HTTP server", error=str(e), listen=listen, holder=holder,
        **({"hint": "another process listens there: stop it (or find out why it took the agent's port), or choose "
                    "another port with --listen ADDR:PORT (listen.port in the config)"} if in_use else {}))
    agent.notifier.send(f"STATUS={why}", f"ERRNO={e.errno or 0}")
    print(f"podhealth agent: {why}", file=sys.stderr)
    return EXIT_CANNOT_BIND


def run(args: argparse.Namespace, simulator: "Simulator | None" = None) -> int:
    from podhealth import log

    if args.sim_no_refresh and not args.simulate:
        return _usage("--sim-no-refresh goes with --simulate")

    try:
        cfg = cliconfig.load(args.config)
        # Tokens from token_file / the environment are read once, here.
        cfg = replace(cfg, publish=cfg.publish.resolved(), auth=cfg.auth.resolved())
    except config.ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    except CredentialError as e:
        return _fail(str(e))
    log.setup(args.log_level or cfg.log.level, cfg.log.format)
    from podhealth.checks import profiles

    try:
        # a bad site profile (checks.profile_file) or override: file, line and key, not a traceback
        profiles.of_config(replace(cfg, node=replace(cfg.node, profile=args.simulate)) if args.simulate else cfg)
    except profiles.ProfileError as e:
        print(e, file=sys.stderr)
        return 2
    if args.simulate and cfg.listen.address == config.ListenConfig().address and not args.listen:
        cfg = replace(cfg, listen=replace(cfg.listen, address="127.0.0.1"))
    if args.listen:
        try:
            host, port = parse_listen(args.listen)
        except ValueError as e:
            return _usage(str(e))
        cfg = replace(cfg, listen=replace(cfg.listen, address=host, port=port))
    # PODHEALTH_NODE: the DaemonSet passes spec.nodeName (the pod's hostname is not the node's).
    node = args.node or cfg.node.name or os.environ.get("PODHEALTH_NODE", "") or (DEFAULT_SIM_NODE if args.simulate else "")
    if node and node_name_problem(node):
        # from --node it is a usage error; from the config or $PODHEALTH_NODE, a config error
        return (_usage if args.node else _fail)(f"invalid node name: {node_name_problem(node)}")
    limit_malloc_arenas()
    raise_fd_limit()
    try:
        return asyncio.run(_main(args, cfg, node or None, simulator))
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace, cfg: config.Config, node: str | None,
                simulator: "Simulator | None") -> int:
    from podhealth import log
    from podhealth.agent.metrics import compat
    from podhealth.agent import simmode, threadnames
    from podhealth.agent.agent import Agent
    from podhealth.agent.plugin import Families

    _log = log.get("podhealth.agent.cmd")
    threadnames.install()
    seams: dict[str, dict[str, Any]] = {}
    refresher: asyncio.Task[None] | None = None
    sim: "SimulatedNode | None" = None
    if args.simulate and simulator is not None:
        assert node is not None
        try:
            sim = simulator.setup(cfg, args.simulate, args.sim_root or simulator.default_root(), node)
        except (ValueError, OSError) as e:
            return _fail(f"--simulate: {e}")
        cfg, seams = sim.cfg, sim.seams
        if not cfg.auth.token:
            # The simulated node gets its own agent key in this user's key ring, where `podhealth
            # check` (and the hooks) run by the same user find it: no step for a newcomer.
            try:
                cfg = replace(cfg, auth=replace(cfg.auth, token=credentials.ensure_user_key(node)))
            except (CredentialError, OSError) as e:
                return _fail(f"--simulate: no agent key for {node}: {e}")
            _log.info("agent key of the simulated node", node=node, file=str(credentials.user_key_dir() / f"{node}.key"))
        if not args.sim_no_refresh:
            refresher = asyncio.get_running_loop().create_task(simmode.refresher(sim.refresh), name="sim-refresh")
    try:
        agent = Agent(cfg, node=node, seams=seams)
    except ValueError as e:
        return _fail(str(e))
    if not cfg.auth.token:
        _log.warning("no agent key (auth.token_file, /etc/podhealth/agent.key): the handover, GPU-reset and bundle "
                     "routes are closed and no caller can trust this agent's answers; `podhealth install-units` "
                     "provisions the key (docs/security.md)", node=agent.node)
    # exporters.compat in the config, or --compat on the command line (either turns a mode on).
    for mode in dict.fromkeys((*cfg.exporters.compat, *([args.compat] if args.compat else []))):
        agent.add_plugin(Families(f"compat-{mode}", compat.source(
            mode, agent.node, hostname_label=cfg.exporters.dcgm_exporter.hostname_label)))
    from podhealth.agent import wiring

    spool = sim.dir / "spool" if sim is not None else None
    wiring.install(agent, spool_dir=spool)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await agent.start()
    except OSError as e:
        await agent.stop()
        return _cannot_bind(agent, cfg, e)
    # Everything built so far (modules, config, collectors) lives as long as the process: keep
    # it out of the cyclic GC's view, or every full collection walks all of it again (~40 ms
    # each on a DGX agent, several per minute). The thresholds stay as they are: raising the
    # young generation's to 10,000 saved ~0.5 ms per cycle but made single collections long
    # enough (with several collector threads waiting on the GIL) to push /metrics past 100 ms.
    gc.freeze()
    print(f"podhealth agent serving {agent.url}/metrics and {agent.url}/health (node {agent.node})", flush=True)
    try:
        await stop.wait()
    finally:
        _log.info("stopping")
        await agent.stop()
        if refresher is not None:
            refresher.cancel()
            await asyncio.gather(refresher, return_exceptions=True)
    return 0
