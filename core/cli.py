"""The `podhealth` command. Each subcommand lives in its own module, listed here literally.

A command module exposes `add_parser(subparsers) -> argparse.ArgumentParser`; the parser's
`func` default takes the parsed args and returns the exit code. Modules are imported when the
CLI starts, so they keep heavy imports (pynvml, aiohttp, torch) inside their functions.
`agent` and `profile` are registered through the simulator's modules, which give the agent's
commands their `--simulate` (agent/simmode.py): the agent never imports the simulator.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn, Sequence

from podhealth import __version__, cliconfig, log
from podhealth.exitcodes import EXIT_USAGE

LOG_LEVELS = ["debug", "info", "warning", "error"]

# name -> module; order is the order in --help.
COMMANDS: dict[str, str] = {
    "config": "podhealth.cmd_config",
    "agent": "podhealth.sim.cmd_agent",  # agent/cmd.py with --simulate (agent/simmode.py)
    "check": "podhealth.checks.cli.cmd_check",
    "install-units": "podhealth.cmd_install",
    "assets": "podhealth.cmd_assets",
    "token": "podhealth.cmd_token",
    "simulate": "podhealth.sim.cmd",
    "aggregator": "podhealth.aggregator.cmd",
    "fleet": "podhealth.aggregator.cmd_fleet",
    "burnin": "podhealth.checks.cli.cmd_burnin",
    "dcgm-diag": "podhealth.checks.cli.cmd_dcgm",
    "nccl": "podhealth.checks.cli.cmd_nccl",
    "perfprobe": "podhealth.checks.cli.cmd_perfprobe",
    "profile": "podhealth.sim.cmd_profile",  # agent/cmd_profile.py with --simulate
}


class Parser(argparse.ArgumentParser):
    """argparse exits 2 on a bad command line, which podhealth means as "could not decide" (and
    the systemd units as "config error, do not restart"): usage errors exit 64 (EX_USAGE) here.
    Subcommand parsers are made with the parent's class, so this covers every subcommand."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="podhealth",
        description="Fleet health for NVIDIA DGX clusters: node agent, checks, aggregator.",
    )
    parser.add_argument("--version", action="version", version=f"podhealth {__version__}")
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=None,
                        help="log level (logs go to stderr; default: warning, the config's log.level for "
                             "the agent and the aggregator)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in COMMANDS.items():
        importlib.import_module(module).add_parser(sub)
    for leaf in _leaves(parser):
        # also after the command (`podhealth check --log-level debug`); SUPPRESS keeps the top one
        leaf.add_argument("--log-level", choices=LOG_LEVELS, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return parser


def _leaves(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for s in subs for p in dict.fromkeys(s.choices.values()) for leaf in _leaves(p)]


def prologue(args: argparse.Namespace) -> None:
    """What every command gets before it runs: logs on stderr (stdout is the command's output,
    and `--format json|junit` must parse), and its config file found by the one lookup. The
    agent and the aggregator set up logging again from their config (level, json/console)."""
    # No stream named: log.setup writes to whatever sys.stderr is at each line. Binding the one
    # found now broke every later line in a process that outlives it (tests calling main()).
    log.setup(args.log_level or "warning", "auto")
    cliconfig.resolve(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    prologue(args)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
