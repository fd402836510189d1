"""`podhealth install-units`: put the systemd units, their environment files and a default config in place.

Existing config and environment files are never overwritten (a site's edits survive upgrades);
unit files are, since they belong to the package.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from importlib import resources
from pathlib import Path

from podhealth import config, credentials

ENV_FILES = {
    "etc/default/podhealth-agent": "# Extra flags for `podhealth agent`, e.g. --log-level debug\nPODHEALTH_AGENT_FLAGS=\n",
    "etc/default/podhealth-aggregator": "# Extra flags for `podhealth aggregator`, e.g. --dry-run\nPODHEALTH_AGGREGATOR_FLAGS=\n",
}


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("install-units", help="install the systemd units and a default config")
    p.add_argument("--root", default="/", help="install under this root (default /)")
    p.add_argument("--exe", default=None, help="path of the podhealth executable for ExecStart (default: this one)")
    p.add_argument("--dry-run", action="store_true", help="print what would be written")
    p.set_defaults(func=run)
    return p


def _exe() -> str:
    found = shutil.which("podhealth")
    return found or str(Path(sys.executable).with_name("podhealth"))


def run(args: argparse.Namespace) -> int:
    root = Path(args.root)
    exe = args.exe or _exe()
    plan: list[tuple[Path, str, bool, bool]] = []  # path, content, overwrite, private
    units = resources.files("podhealth.units")
    for name in ("podhealth-agent.service", "podhealth-aggregator.service"):
        text = units.joinpath(name).read_text().replace("/usr/local/bin/podhealth", exe)
        plan.append((root / "etc/systemd/system" / name, text, True, False))
    # Config and environment files hold tokens (publish.token, PODHEALTH_NODE_TOKEN=...): never
    # world-readable. 0640 root:podhealth where that group exists (the service reads the config
    # as user podhealth), else 0600 until the operator hands it over.
    for rel, text in ENV_FILES.items():
        plan.append((root / rel, text, False, True))
    plan.append((root / "etc/podhealth/podhealth.yaml", config.default_yaml(), False, True))
    for path, text, overwrite, private in plan:
        if path.exists() and not overwrite:
            print(f"kept     {path} (exists)")
            continue
        print(f"{'would write' if args.dry_run else 'wrote'}    {path}")
        if not args.dry_run:
            path.parent.mkdir(parents=True, exist_ok=True)
            if private:
                credentials.write_private(path, text, group=credentials.SERVICE_GROUP)
            else:
                path.write_text(text)
    if not args.dry_run:
        print("\nNext: useradd --system --no-create-home --shell /usr/sbin/nologin podhealth\n"
              "      chgrp podhealth /etc/podhealth/podhealth.yaml && chmod 0640 /etc/podhealth/podhealth.yaml\n"
              "      systemctl daemon-reload && systemctl enable --now podhealth-agent")
    return 0
