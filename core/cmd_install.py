"""`podhealth install-units`: put the systemd units, their environment files, a default config and
this node's agent key in place.

Existing config, environment and key files are never overwritten (a site's edits survive
upgrades); unit files are, since they belong to the package.

The agent key (/etc/podhealth/agent.key, 0640 root:podhealth) closes the agent's handover,
GPU-reset and bundle routes to everyone who does not hold it, and lets root's hooks on the node
tell the agent from an impostor on its port (docs/security.md). With the cluster secret at hand
(--secret-file or $PODHEALTH_CLUSTER_SECRET) it is the key the aggregator derives for this node;
without, a random one that keeps the node closed until the site puts the derived key there (the
one step `podhealth token derive --agent --node NAME --out /etc/podhealth/agent.key`).
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
    p.add_argument("--node", default="", help="this node's name for its agent key (default: node.name from the "
                   "installed config, else the short host name)")
    p.add_argument("--secret-file", default="", help="the cluster secret, to derive this node's agent key as the "
                   "aggregator does (default: $PODHEALTH_CLUSTER_SECRET; without one, a random key)")
    p.set_defaults(func=run)
    return p


def _exe() -> str:
    found = shutil.which("podhealth")
    return found or str(Path(sys.executable).with_name("podhealth"))


def _agent_key(root: Path, args: argparse.Namespace) -> str:
    """Write this node's agent key unless one is there; a line for what the operator must still do."""
    import secrets
    import socket

    path = root / credentials.DEFAULT_AGENT_KEY_FILE.lstrip("/")
    if path.exists():
        print(f"kept     {path} (exists)")
        return ""
    node = args.node or socket.gethostname().split(".")[0]
    secret = credentials.read_secret("", args.secret_file, "PODHEALTH_CLUSTER_SECRET")
    key = credentials.derive_agent_token(secret, node) if secret else secrets.token_hex(32)
    print(f"{'would write' if args.dry_run else 'wrote'}    {path} (this node's agent key, "
          f"{'derived for ' + node if secret else 'random'})")
    if args.dry_run:
        return ""
    path.parent.mkdir(parents=True, exist_ok=True)
    credentials.write_private(path, key + "\n", group=credentials.SERVICE_GROUP)
    if secret:
        return ""
    return (f"\nThe agent key is random: the agent is closed to everyone else, but the aggregator cannot reach it "
            f"until it holds the key derived for {node}. On the aggregator's host:\n"
            f"      podhealth token derive --agent --node {node} --secret-file CLUSTER_SECRET_FILE\n"
            f"and put it in {credentials.DEFAULT_AGENT_KEY_FILE} here (0640 root:podhealth), or re-run "
            "install-units with --secret-file (docs/security.md).")


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
    try:
        key_note = _agent_key(root, args)
    except (credentials.CredentialError, OSError) as e:
        print(f"podhealth install-units: no agent key written: {e}", file=sys.stderr)
        return 2
    if not args.dry_run:
        if key_note:
            print(key_note)
        print("\nNext: useradd --system --no-create-home --shell /usr/sbin/nologin podhealth\n"
              "      chgrp podhealth /etc/podhealth/podhealth.yaml && chmod 0640 /etc/podhealth/podhealth.yaml\n"
              "      systemctl daemon-reload && systemctl enable --now podhealth-agent")
    return 0
