"""Shared plumbing of the active-test commands (`burnin`, `dcgm-diag`, `nccl`): config, profile,
report rendering and exit codes (0 pass, 1 fail, 2 could not decide — checks/handover/report.py)."""

from __future__ import annotations

import argparse
import functools
import socket
import sys
import time
from typing import Callable, Sequence

from podhealth import cliconfig
from podhealth import config as config_mod
from podhealth.checks import profiles
from podhealth.checks.handover.report import SuiteReport, render
from podhealth.config import Config
from podhealth.exitcodes import EXIT_USAGE
from podhealth.vocab import CheckResult

# What an active test does once its config and profile are loaded: the exit code.
Run = Callable[[argparse.Namespace, Config, profiles.Profile], int]


def add_command(p: argparse.ArgumentParser, run: Run, *, progress: bool = False) -> argparse.ArgumentParser:
    """The options every active test takes (and --progress-every with `progress`), and `run` as
    the command behind the one prologue: config and profile loaded, or exit 2 with the reason."""
    add_common(p)
    if progress:
        add_progress_option(p)
    p.set_defaults(func=functools.partial(_prologue, run))
    return p


def _prologue(run: Run, args: argparse.Namespace) -> int:
    got = setup(args)
    if isinstance(got, int):
        return got
    return run(args, *got)


def add_common(p: argparse.ArgumentParser) -> None:
    cliconfig.add_option(p)
    p.add_argument("--profile", choices=profiles.names(), help="hardware profile (default: node.profile from config)")
    p.add_argument("--format", choices=["table", "json", "junit"], default="table")


def add_progress_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--progress-every", type=_positive_seconds, default=30.0, metavar="SECONDS",
                   help="when stderr is not a terminal: a plain progress line this often (default 30)")


def _positive_seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = 0.0
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return v


def setup(args: argparse.Namespace) -> tuple[Config, profiles.Profile] | int:
    """(config, profile), or exit code 2 after printing a clear error."""
    try:
        cfg = cliconfig.load(args.config)
        prof = profiles.load(args.profile, cfg.checks.overrides) if args.profile else profiles.of_config(cfg)
    except (config_mod.ConfigError, profiles.ProfileError, OSError) as e:
        print(f"podhealth: {e}", file=sys.stderr)
        return 2
    return cfg, prof


def parse_gpus(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    try:
        gpus = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--gpus expects indices like 0,1,3; got {text!r}") from None
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise argparse.ArgumentTypeError(f"--gpus expects distinct non-negative indices; got {text!r}")
    return gpus


def finish(cfg: Config, prof: profiles.Profile, results: Sequence[CheckResult], fmt: str, check: str,
           started: float, notes: Sequence[str] = ()) -> int:
    node = cfg.node.name or socket.gethostname().split(".")[0]
    rep = SuiteReport(node=node, profile=prof.name, results=tuple(results),
                      durations=((check, time.time() - started),), started=started, finished=time.time(),
                      notes=tuple(notes))
    render(rep, fmt, sys.stdout)  # the table prints the notes itself (escaped: rich markup eats `[burnin]`)
    return rep.exit_code


def usage_error(command: str, message: str) -> int:
    """An argument that makes no sense: one line, exit 64 (EX_USAGE), as argparse's own errors."""
    print(f"podhealth {command}: {message}", file=sys.stderr)
    return EXIT_USAGE
