"""`podhealth simulate`: create simulated DGX nodes and inject faults into them while they run.

    podhealth simulate node dgx01 [--profile dgx-h100 | --from-nvidia-smi FILE] [--from-sysfs DIR]
                                  [--storage bond|ethernet|ib|none] [--force]
    podhealth simulate inject dgx01 xid=79 gpu=3
    podhealth simulate clear dgx01 [KIND]
    podhealth simulate show dgx01
    podhealth simulate list
    podhealth simulate job start dgx01 --gpus 0,1 --id 42 --user alice   (job stop / job list)

Every subcommand takes --root (default $PODHEALTH_SIM_DIR or /tmp/podhealth-sim-$UID). Bad input
exits 64 (EX_USAGE, as every podhealth command's usage errors) with a message and changes nothing. Subcommands are listed in SUBCOMMANDS: add one by
writing `_add_<name>(sub, common)` and an entry there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from podhealth.exitcodes import EXIT_USAGE

if TYPE_CHECKING:
    from podhealth.sim.state import Fault

EXIT_BAD_INPUT = EXIT_USAGE  # a value to change (README: exit codes)


class _BadInput(Exception):
    pass


def _root(args: argparse.Namespace) -> Path:
    from podhealth.sim.node import default_root, root_problem

    if args.root:
        return Path(args.root)
    root = default_root()
    problem = root_problem(root)
    if problem:
        raise _BadInput(problem)
    return root


def _open(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from podhealth.sim.node import SimNode

    try:
        return SimNode.open(_root(args), args.node)
    except (FileNotFoundError, ValueError) as e:
        raise _BadInput(str(e)) from None


def _cmd_node(args: argparse.Namespace) -> int:
    from podhealth.checks import profiles
    from podhealth.sim import from_sysfs, nvidia_smi
    from podhealth.sim.node import SimNode, check_name
    from podhealth.sim.state import default_state

    try:
        check_name(args.name)
        if args.profile is not None:
            profiles.load(args.profile)
    except ValueError as e:
        raise _BadInput(str(e)) from None
    target = _root(args) / args.name / "state.json"
    if target.exists() and not args.force:
        raise _BadInput(f"node {args.name!r} already exists under {_root(args)} (use --force to replace it)")
    seed = None
    if args.from_nvidia_smi:
        path = Path(args.from_nvidia_smi)
        try:
            text = sys.stdin.read() if args.from_nvidia_smi == "-" else path.read_text(encoding="utf-8",
                                                                                       errors="replace")
            capture = nvidia_smi.parse(text)
        except (OSError, ValueError) as e:
            raise _BadInput(f"{args.from_nvidia_smi}: {e}") from None
        for w in capture.warnings:
            print(f"warning: {args.from_nvidia_smi}: {w}", file=sys.stderr)
        if args.profile is None:
            g = nvidia_smi.guess(capture)
            print(f"{'profile' if g.exact else 'warning'}: {args.from_nvidia_smi}: {g.why}", file=sys.stderr)
        seed = nvidia_smi.to_state(capture, args.name, args.profile, storage=args.storage)
    elif args.storage is not None:
        seed = default_state(args.name, args.profile or "dgx-h100", storage=args.storage)
    if args.from_sysfs:
        try:
            ib = from_sysfs.read(Path(args.from_sysfs))
        except (OSError, ValueError) as e:
            raise _BadInput(f"--from-sysfs {args.from_sysfs}: {e}") from None
        for w in ib.warnings:
            print(f"warning: {w}", file=sys.stderr)
        seed = replace(seed or default_state(args.name, args.profile or "dgx-h100"), hcas=ib.hcas)
    node = SimNode.create(_root(args), args.name, profile=args.profile or "dgx-h100", seed=seed)
    st = node.state
    print(f"created {st.name} ({st.profile}, {len(st.gpus)} GPUs, {len(st.hcas)} HCAs, "
          f"driver {st.driver_version}) at {node.dir}")
    return 0


def _cmd_inject(args: argparse.Namespace) -> int:
    from podhealth.sim import faults

    node = _open(args)
    try:
        fault = faults.parse(args.tokens, now=time.time())
        fault = node.inject(fault)
    except ValueError as e:
        raise _BadInput(str(e)) from None
    print(f"{node.name}: injected {fault.describe()} (#{fault.seq})")
    return 0


def xid_holds(removed: Sequence[Fault], now: float, window: float) -> list[str]:
    """What a cleared XID still does: the agent's xid check judges the XIDs of the last `window`
    seconds (checks.rate_window), so clearing the fault does not clear the verdict; it turns OK
    `window` after the last XID on that GPU. One line per (code, GPU) still inside the window."""
    last: dict[tuple[int, int | None], float] = {}
    for f in removed:
        if f.kind == "xid" and f.code is not None:
            key = (f.code, f.gpu)
            last[key] = max(last.get(key, 0.0), f.injected_at)
    out = []
    for (code, gpu), at in sorted(last.items(), key=lambda kv: kv[1]):
        until = at + window
        if until > now:
            where = f"gpu{gpu}" if gpu is not None else "its GPU"
            out.append(f"XID {code} on {where} keeps the xid check FAIL until "
                       f"{time.strftime('%H:%M:%S %Z', time.localtime(until))} (window {window:g} s)")
    return out


def _xid_window(root: Path, node: str) -> float:
    """checks.rate_window of the agent that watches `node`: the fleet's agent config when the node
    belongs to a `simulate fleet`, else the default."""
    from podhealth.config import ChecksConfig, load
    from podhealth.configload import ConfigError

    cfg = root / "_fleet" / "agents" / f"{node}.yml"
    if cfg.is_file():
        with contextlib.suppress(ConfigError, OSError):
            return float(load(cfg).checks.rate_window)
    return float(ChecksConfig().rate_window)


def _cmd_clear(args: argparse.Namespace) -> int:
    node = _open(args)
    before = node.state.faults
    try:
        n = node.clear(args.kind)
    except ValueError as e:
        raise _BadInput(str(e)) from None
    print(f"{node.name}: cleared {n} fault(s)" + (f" of kind {args.kind}" if args.kind else ""))
    removed = [f for f in before if args.kind is None or f.kind == args.kind]
    for line in xid_holds(removed, time.time(), _xid_window(_root(args), node.name)):
        print(f"{node.name}: {line}")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    node = _open(args)
    out = node.state.to_json()
    out["dir"] = str(node.dir)
    print(json.dumps(out, indent=2, sort_keys=True))
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from podhealth.sim.node import SimNode, list_nodes

    root = _root(args)
    for name in list_nodes(root):
        try:
            st = SimNode.open(root, name).state
        except (OSError, ValueError, KeyError, TypeError) as e:
            print(f"{name}\t(unreadable: {e})")
            continue
        # A reboot is done once injected (the node booted then; only its time is kept, for btime):
        # listed as when it booted, never as a fault still on the node.
        faults = ", ".join(f.describe() for f in st.faults if f.kind != "reboot") or "healthy"
        boots = [f.injected_at for f in st.faults if f.kind == "reboot"]
        booted = f"\tbooted {time.strftime('%H:%M:%S', time.localtime(max(boots)))}" if boots else ""
        print(f"{name}\t{st.profile}\t{len(st.gpus)} GPUs\t{faults}{booted}")
    return 0


def _add_node(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    from podhealth.checks import profiles
    from podhealth.sim.topology import STORAGE_MODES

    p = sub.add_parser("node", parents=[common], help="create a simulated node")
    p.add_argument("name", help="node name, e.g. dgx01")
    p.add_argument("--profile", default=None,
                   help=f"hardware profile ({', '.join(profiles.names())}); "
                        "default dgx-h100, or guessed from --from-nvidia-smi")
    p.add_argument("--from-nvidia-smi", metavar="FILE", default=None,
                   help="seed GPUs from an `nvidia-smi -q` capture ('-' reads stdin)")
    p.add_argument("--from-sysfs", metavar="DIR", default=None,
                   help="seed InfiniBand adapters from a captured /sys/class/infiniband tree (DIR is a "
                        "sysfs root, a tree holding sys/class/infiniband, or class/infiniband itself; "
                        "bonding masters are read from the capture's class/net)")
    p.add_argument("--storage", choices=STORAGE_MODES, default=None,
                   help="storage adapters: bond (RoCE pair as one mlx5_bond_0 on bond0), ethernet "
                        "(unbonded RoCE), ib (InfiniBand), none; default: the SKU's (bond on DGX H100/"
                        "H200/B200, ib on DGX A100)")
    p.add_argument("--force", action="store_true", help="replace an existing node of that name")
    p.set_defaults(sim_func=_cmd_node)


def _add_inject(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    from podhealth.sim.faults import kinds_help

    p = sub.add_parser("inject", parents=[common], help="inject a fault into a (running) node",
                       description="Fault kinds: " + kinds_help() + ". Every kind but reboot also takes persist=1: "
                                   "the fault survives fault=reboot, which clears every other fault.")
    p.add_argument("node")
    p.add_argument("tokens", nargs="+", metavar="KEY=VALUE",
                   help="e.g. xid=79 gpu=3, fault=nvlink-crc gpu=0 link=5 rate=50, or fault=fallen-off-bus gpu=3 persist=1")
    p.set_defaults(sim_func=_cmd_inject)


def _add_clear(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("clear", parents=[common], help="remove faults (all, or one kind)")
    p.add_argument("node")
    p.add_argument("kind", nargs="?", default=None, help="fault kind, e.g. xid or nvlink-crc")
    p.set_defaults(sim_func=_cmd_clear)


def _add_show(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("show", parents=[common], help="print a node's state as JSON")
    p.add_argument("node")
    p.set_defaults(sim_func=_cmd_show)


def _add_list(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("list", parents=[common], help="list simulated nodes")
    p.set_defaults(sim_func=_cmd_list)


SUBCOMMANDS: dict[str, Callable[[argparse._SubParsersAction, argparse.ArgumentParser], None]] = {  # type: ignore[type-arg]
    "node": _add_node,
    "inject": _add_inject,
    "clear": _add_clear,
    "show": _add_show,
    "list": _add_list,
    "gpu-reset": lambda sub, common: __import__("podhealth.sim.cmd_gpureset", fromlist=["x"]).add_subcommand(sub, common),
    "fleet": lambda sub, common: __import__("podhealth.sim.fleet", fromlist=["fleet"]).add_subcommand(sub, common),
    "job": lambda sub, common: __import__("podhealth.sim.cmd_job", fromlist=["x"]).add_subcommand(sub, common),
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "simulate", help="simulated DGX nodes: create, inject faults, inspect",
        description=__doc__.split("\n\n")[0] if __doc__ else None)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--root", default=None,
                        help="directory holding simulated nodes (default $PODHEALTH_SIM_DIR or "
                             "/tmp/podhealth-sim-$UID, one per user)")
    sub = parser.add_subparsers(dest="sim_command", metavar="SUBCOMMAND")
    for add in SUBCOMMANDS.values():
        add(sub, common)
    parser.set_defaults(func=lambda args: run(args, parser))
    return parser


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    func = getattr(args, "sim_func", None)
    if func is None:
        parser.print_help()
        return EXIT_BAD_INPUT
    try:
        return int(func(args))
    except _BadInput as e:
        print(f"podhealth simulate {args.sim_command}: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
