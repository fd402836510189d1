"""`podhealth aggregator [--config FILE] [--listen HOST:PORT] [--db PATH] [--dry-run]`."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from podhealth import cliconfig, config
from podhealth.credentials import CredentialError
from podhealth.exitcodes import EXIT_USAGE, UsageError
from podhealth.netaddr import parse_listen


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("aggregator", help="run the central aggregator (ingest, policy, fencing, API)")
    cliconfig.add_option(p, cliconfig.AGGREGATOR_CONFIG)
    p.add_argument("--listen", help="HOST:PORT to bind (overrides aggregator.listen)")
    p.add_argument("--db", help="SQLite state file (overrides aggregator.db)")
    p.add_argument("--dry-run", action="store_true", help="decide and log, touch nothing")
    p.set_defaults(func=run)
    return p


def effective_config(args: argparse.Namespace) -> Any:
    cfg = cliconfig.load(args.config)
    agg = cfg.aggregator
    if args.listen:
        try:
            host, port = parse_listen(args.listen, any_host="0.0.0.0")
        except ValueError as e:
            raise UsageError(str(e)) from None
        agg = dataclasses.replace(agg, listen=dataclasses.replace(agg.listen, address=host, port=port))
    if args.db:
        if not os.path.isabs(args.db):
            raise UsageError(f'--db: expected an absolute path, got "{args.db}"')
        agg = dataclasses.replace(agg, db=Path(args.db))
    if args.dry_run:
        agg = dataclasses.replace(agg, dry_run=True)
    # Secrets from *_file / the environment are read once, here (CredentialError names the file).
    agg = dataclasses.replace(agg, auth=agg.auth.resolved(), federation=agg.federation.resolved())
    return cfg, agg


def run(args: argparse.Namespace) -> int:
    try:
        cfg, agg = effective_config(args)
    except UsageError as e:
        print(f"podhealth aggregator: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (config.ConfigError, ValueError, CredentialError) as e:
        print(e, file=sys.stderr)
        return 2
    problem = agg.exposure_problem()  # again: --listen and --dry-run bypass the file's validation
    if problem:
        print(f"podhealth aggregator: aggregator.{problem[0]}: {problem[1]}", file=sys.stderr)
        return 2
    from podhealth import extras

    if not agg.dry_run:  # a fencer that cannot load: refuse to start, as for a config error
        for key, missing in extras.missing(dataclasses.replace(cfg, aggregator=agg)):
            if key.startswith("aggregator."):
                print(f"podhealth aggregator: {key}: {missing}", file=sys.stderr)
                return 2
    from podhealth import log
    log.setup(args.log_level or cfg.log.level, cfg.log.format)
    from podhealth import aioloop
    from podhealth.aggregator.serve import serve
    from podhealth.fdlimit import AGGREGATOR_FD_LIMIT, raise_fd_limit

    raise_fd_limit(AGGREGATOR_FD_LIMIT)  # as the agent does: systemd's soft 1,024 is ~1,000 agents
    try:
        return aioloop.run(serve(agg))
    except (ValueError, ImportError) as e:  # PODHEALTH_EVENT_LOOP names a loop that is not there
        print(f"podhealth aggregator: {e}", file=sys.stderr)
        return 2
