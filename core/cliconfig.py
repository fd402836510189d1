"""Where a command finds its config: the one lookup every `podhealth` command (and the Slurm and
BCM hooks) uses, and the two default paths, written here and nowhere else. Also the one
environment variable that names the aggregator for the commands that ask it (`fleet`, `check`).

Lookup: `--config FILE`, else `$PODHEALTH_CONFIG`, else the command's default file when it exists
(the agent's for node-side commands, the aggregator's for `aggregator` and `fleet`), else the
built-in defaults. `core/cli.py main()` resolves it once, before the command runs, so a command
only ever sees `args.config` as a path or None.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Mapping, TextIO

from podhealth import config as config_mod
from podhealth.config import Config

# Where `install-units` and the units put them (systemd/*.service pass the same paths).
AGENT_CONFIG = "/etc/podhealth/podhealth.yaml"
AGGREGATOR_CONFIG = "/etc/podhealth/aggregator.yaml"
ENV = "PODHEALTH_CONFIG"

_DEFAULT_KEY = "config_default"

# `fleet` read $PODHEALTH_AGGREGATOR_URL and `check --node` $PODHEALTH_AGGREGATOR: one name now,
# the other still read (deprecated) so existing shells and units keep working.
AGGREGATOR_ENV = "PODHEALTH_AGGREGATOR_URL"
AGGREGATOR_ENV_DEPRECATED = "PODHEALTH_AGGREGATOR"


def add_option(p: argparse.ArgumentParser, default: str = AGENT_CONFIG, what: str = "config file") -> None:
    """`--config FILE` with the shared lookup; main() fills `args.config` from it."""
    p.add_argument("--config", metavar="FILE",
                   help=f"{what} (default: ${ENV}, else {default} when it exists, else the built-in defaults)")
    p.set_defaults(**{_DEFAULT_KEY: default})


def locate(explicit: str | os.PathLike[str] | None, default: str = AGENT_CONFIG,
           env: Mapping[str, str] | None = None) -> str | None:
    """The config file to read, or None for the built-in defaults."""
    if explicit:
        return os.fspath(explicit)
    env = os.environ if env is None else env
    if env.get(ENV, ""):
        return env[ENV]
    return default if os.path.exists(default) else None


def resolve(args: argparse.Namespace) -> None:
    """main()'s step: replace `args.config` by the file the lookup finds (commands that took
    `add_option`; others are left alone)."""
    default = getattr(args, _DEFAULT_KEY, None)
    if default is not None:
        given = getattr(args, "config", None) or os.environ.get(ENV, "")
        args.config = locate(getattr(args, "config", None), default)
        args.config_chosen = bool(given)  # named by the caller (--config or $PODHEALTH_CONFIG), not found


def load(path: str | os.PathLike[str] | None) -> Config:
    """The config at `path`, or the defaults for None (ConfigError names file, line and key)."""
    return config_mod.load(Path(path)) if path else Config()


def aggregator_url(env: Mapping[str, str] | None = None, warn: "TextIO | None" = None) -> str:
    """The aggregator's base URL from the environment, '' when none is set. The deprecated name is
    read when the new one is unset, with one line on `warn` (stderr) saying which to set."""
    env = os.environ if env is None else env
    url = env.get(AGGREGATOR_ENV, "")
    if url:
        return url
    old = env.get(AGGREGATOR_ENV_DEPRECATED, "")
    if old:
        print(f"podhealth: ${AGGREGATOR_ENV_DEPRECATED} is deprecated: set ${AGGREGATOR_ENV} instead",
              file=warn or sys.stderr)
    return old
