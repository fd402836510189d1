"""`podhealth assets list|export DIR`: the dashboards, alert rules, runbooks and units this
install carries (core/assets.py), for provisioning Grafana, Prometheus and systemd."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from podhealth import alertrules, assets
from podhealth.exitcodes import EXIT_USAGE


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("assets", help="list or export the shipped dashboards, alert rules, runbooks and systemd units")
    asub = p.add_subparsers(dest="assets_cmd", metavar="ACTION", required=True)
    ls = asub.add_parser("list", help="the files this install carries")
    ls.add_argument("--format", choices=["table", "json"], default="table")
    ls.set_defaults(func=_list)
    ex = asub.add_parser("export", help="write them under DIR: dashboards/*.json, alerts/podhealth-rules.yml, "
                                        "alerts/alertmanager.yml, alerts/runbooks/*.md, systemd/*.service")
    ex.add_argument("dir", type=Path)
    ex.add_argument("--force", action="store_true", help="overwrite files that exist")
    ex.add_argument("--job-selector", default=alertrules.DEFAULT_JOB_SELECTOR, metavar="MATCHERS",
                    help="PromQL label matchers that select the agents' scrape job in the alert rules, "
                         f"e.g. 'job=~\"podhealth.*\"' (default: {alertrules.DEFAULT_JOB_SELECTOR})")
    ex.add_argument("--runbook-url", default=alertrules.DEFAULT_RUNBOOK_BASE, metavar="URL",
                    help="where the exported alerts/runbooks/*.md are served; each alert's runbook_url is URL/<name>.md "
                         "(default: the project's GitHub)")
    ex.add_argument("--format", choices=["table", "json"], default="table")
    ex.set_defaults(func=_export)
    return p


def _list(args: argparse.Namespace) -> int:
    try:
        found = assets.files()
    except assets.AssetsMissing as e:
        print(f"podhealth assets: {e}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps([{"path": a.relpath, "source": str(a.source)} for a in found], indent=2))
    else:
        for a in found:
            print(a.relpath)
    return 0


def _export(args: argparse.Namespace) -> int:
    try:
        alertrules.check_job_selector(args.job_selector)
        alertrules.check_runbook_base(args.runbook_url)
    except alertrules.RulesError as e:
        print(f"podhealth assets: {e}", file=sys.stderr)
        return EXIT_USAGE
    try:
        written = assets.export(args.dir, overwrite=args.force, job_selector=args.job_selector,
                                runbook_base=args.runbook_url)
    except (assets.AssetsMissing, FileExistsError, alertrules.RulesError) as e:
        print(f"podhealth assets: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"podhealth assets: cannot write under {args.dir}: {e.strerror or e}", file=sys.stderr)
        return 1
    if args.format == "json":
        print(json.dumps([str(p) for p in written], indent=2))
    else:
        print(f"wrote {len(written)} files under {args.dir}")
    return 0
