"""`podhealth profile`: a site golden profile from a node known to be good, and how a node differs.

    podhealth profile capture [--simulate PROFILE | --url URL | --node NAME] > site-profile.yaml
    podhealth profile diff [FILE] [--simulate PROFILE | --url URL | --node NAME] [--format table|json]

The node is read by the agent's own collectors, once (checks/handover/suite.py LocalCollector): on this
node by default, on a simulated node with --simulate (as `podhealth agent --simulate`), or from a
running agent's /metrics with --url / --node. It lives beside the agent because --simulate reads
the node through the agent's simulator seam (agent/simmode.py), which the CLI fills by registering
the command through sim/cmd_profile.py.

diff exits 0 when the node matches every value the profile states, 1 when one differs, 2 when it
cannot tell (a stated value could not be read, the agent is unreachable, a bad profile file).
FILE defaults to checks.profile_file from the config (else node.profile).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from podhealth import cliconfig
from podhealth import config as config_mod
from podhealth.config import Config

if TYPE_CHECKING:
    from podhealth.agent.simmode import Simulator
    from podhealth.checks.profiles.capture import Observation
    from podhealth.checks.profiles import Profile
    from podhealth.snapshot import Snapshot

EXIT_UNKNOWN = 2
# What a profile describes; kmsg and dcgm have nothing to say about it.
COLLECTORS = ("nvml", "nvlink", "infiniband", "nfs", "host")


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
               simulator: "Simulator | None" = None) -> argparse.ArgumentParser:
    """The `profile` command; `--simulate` only with a `simulator` (agent/simmode.py)."""
    p = sub.add_parser("profile", help="capture a site golden profile from a good node; diff a node against one",
                       description="Site golden profiles: `capture` writes what a known-good node shows as a "
                                   "profile that extends the closest shipped one; `diff` shows how a node differs.")
    psub = p.add_subparsers(dest="profile_command", metavar="SUBCOMMAND")
    for name, helptext in (("capture", "write this node's profile (YAML) to stdout"),
                           ("diff", "compare a node with a profile: exit 0 same, 1 differs, 2 cannot tell")):
        sp = psub.add_parser(name, help=helptext)
        if name == "diff":
            sp.add_argument("file", nargs="?", help="site profile (default: checks.profile_file, else node.profile)")
            sp.add_argument("--format", choices=["table", "json"], default="table")
            sp.add_argument("-v", "--verbose", action="store_true", help="table: the values that match too")
        src = sp.add_mutually_exclusive_group()
        if simulator is not None:
            src.add_argument("--simulate", choices=simulator.profiles(), metavar="PROFILE",
                             help="read a simulated node (created if absent, as `podhealth agent --simulate`)")
        src.add_argument("--url", help="read a running agent's /metrics at this base URL")
        src.add_argument("--node", help="read that node's agent (URL from checks.agents, else DNS)")
        if simulator is not None:
            sp.add_argument("--sim-root", type=Path, help="directory of simulated nodes (default "
                                                          "$PODHEALTH_SIM_DIR or /tmp/podhealth-sim-$UID)")
            sp.add_argument("--sim-node", default="dgx01", help="simulated node's name (default dgx01)")
        else:
            sp.set_defaults(simulate=None)
        cliconfig.add_option(sp)
        sp.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the node (default 30)")
        if name == "capture":
            sp.add_argument("--nccl", metavar="FILE",
                            help="output of a healthy multi-node all_reduce_perf run on this site's fabric: "
                                 "states its multi-node busbw gate (80%% of what it measured)")
        sp.set_defaults(func=lambda args: run(args, simulator))
    def usage(args: argparse.Namespace) -> int:
        p.print_help()
        return EXIT_UNKNOWN

    p.set_defaults(func=usage)
    return p


class _Stop(Exception):
    """A message for stderr and exit 2."""


def _read_node(args: argparse.Namespace, cfg: Config, simulator: "Simulator | None") -> "tuple[Snapshot, str, str]":
    """(snapshot, node name, where it came from)."""
    from podhealth.checks.handover.suite import LocalCollector

    if args.url or args.node:
        from podhealth.checks.cli.cmd_check import CheckError, agent_url
        from podhealth.checks.profiles.source import SourceError, fetch_metrics, snapshot_from_metrics

        try:
            url = args.url or agent_url(cfg, args.node)
            snap, node = snapshot_from_metrics(fetch_metrics(url, args.timeout))
        except (CheckError, SourceError) as e:
            raise _Stop(str(e)) from None
        return snap, node or args.node or url, f"the agent at {url}"
    seams = None
    if args.simulate and simulator is not None:
        try:
            sim = simulator.setup(cfg, args.simulate, args.sim_root or simulator.default_root(), args.sim_node)
            sim.refresh()
        except (ValueError, OSError) as e:
            raise _Stop(f"--simulate: {e}") from None
        cfg, seams = sim.cfg, sim.seams
        node, origin = args.sim_node, f"simulated {args.simulate} node {args.sim_node} ({sim.dir})"
    else:
        node = cfg.node.name or socket.gethostname().split(".")[0]
        origin = f"{node}'s collectors"
    snap = LocalCollector(cfg, seams, only=COLLECTORS, timeout_cap=args.timeout).collect_sync()
    return snap, node, origin


def _observe(snap: "Snapshot", node: str, prof: "Profile") -> "Observation":
    from podhealth.checks.profiles import capture as profile_capture, network as profile_network

    roles, notes = profile_network.observe_roles(snap, prof)
    obs = profile_capture.observe(snap, roles, node)
    return profile_capture.Observation(obs.values, obs.notes + tuple(notes), node)


def _capture(args: argparse.Namespace, cfg: Config, simulator: "Simulator | None") -> int:
    from podhealth.checks import profiles
    from podhealth.checks.profiles import capture as profile_capture, network as profile_network, render as profile_render

    gate = _nccl_gate(args.nccl, profiles.of_config(cfg)) if args.nccl else None
    snap, node, origin = _read_node(args, cfg, simulator)
    # classify ports with the rules of the profile the node resembles, then state that profile
    first = profile_capture.observe(snap, None, node)
    tied = profile_capture.candidates(first)
    # GPUs alike (a DGX H100 and an OEM HGX H100): the one whose required adapters the node has
    extends, why = next(((n, w) for n, w in tied if profile_capture.fits_adapters(
        profiles.load(n), profile_network.observe_roles(snap, profiles.load(n))[0])), tied[-1])
    obs = _observe(snap, node, profiles.load(extends))
    sys.stdout.write(profile_render.capture_yaml(obs, extends, why, origin, nccl_gate=gate))
    unreadable = [k for k, v in obs.values.items() if v is None]
    if unreadable:
        # the YAML says "not readable on this node, not stated" for each: say the same here
        print(f"podhealth profile capture: not stated (not readable on this node; inherited from {extends}): "
              f"{', '.join(unreadable)}", file=sys.stderr)
    return 0


MAX_NCCL_BYTES = 16 << 20  # an all_reduce_perf log is a few KiB; a runaway file is refused, not read


def _nccl_gate(path: str, prof: "Profile") -> tuple[float, str]:
    from podhealth.checks.profiles import nccl as profile_nccl

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_NCCL_BYTES + 1)
    except OSError as e:
        raise _Stop(f"--nccl {path}: {e.strerror or e}") from None
    if len(raw) > MAX_NCCL_BYTES:
        raise _Stop(f"--nccl {path}: larger than {MAX_NCCL_BYTES >> 20} MiB: not an all_reduce_perf log")
    try:
        g = profile_nccl.measured_gate(raw.decode("utf-8", "replace"), path,
                                       int(prof.thresholds.get("nccl_multinode_min_bytes", 0)))
    except ValueError as e:
        raise _Stop(f"--nccl: {e}") from None
    return g.gate_gbps, g.comment


def _diff(args: argparse.Namespace, cfg: Config, simulator: "Simulator | None") -> int:
    from podhealth.checks import profiles
    from podhealth.checks.profiles import capture as profile_capture, render as profile_render

    try:
        prof = profiles.of_config(cfg, args.file)
    except profiles.ProfileError as e:
        raise _Stop(str(e)) from None
    snap, node, _ = _read_node(args, cfg, simulator)
    d = profile_capture.diff(_observe(snap, node, prof), prof)
    if args.format == "json":
        json.dump(d.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        profile_render.diff_table(d, sys.stdout, args.verbose)
    return d.exit_code


def run(args: argparse.Namespace, simulator: "Simulator | None" = None) -> int:
    # stdout is the profile (or the diff): main()'s prologue sent logs to stderr
    try:
        cfg = cliconfig.load(args.config)
        if args.profile_command == "diff" and args.file and not Path(args.file).is_file():
            raise _Stop(f"{args.file}: no such file")
        read = _capture if args.profile_command == "capture" else _diff
        return read(args, cfg, simulator)
    except config_mod.ConfigError as e:
        print(e, file=sys.stderr)
        return EXIT_UNKNOWN
    except _Stop as e:
        print(f"podhealth profile {args.profile_command}: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
