"""`podhealth token new | derive [--agent] --node NAME`: the cluster secret and each node's own tokens.

The aggregator keeps the secret (auth.cluster_secret_file); each node gets only the tokens
derived for it: the one it reports with (publish.token_file), so a node can speak for itself and
no other, and with --agent the one its agent expects from the aggregator (auth.token_file), so
the GPU-reset and handover API of one node answers nobody who holds only another node's tokens.
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from podhealth import credentials
from podhealth.hostnames import node_name_problem
from podhealth.exitcodes import EXIT_USAGE

SECRET_ENV = "PODHEALTH_CLUSTER_SECRET"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("token", help="make the cluster secret and derive each node's token")
    tsub = p.add_subparsers(dest="token_cmd", metavar="ACTION", required=True)
    n = tsub.add_parser("new", help="print a new random cluster secret (or any token)")
    n.add_argument("--out", default="", help="write it to this file (0640 root:podhealth, else 0600) instead of printing it; "
                   "an existing file is kept unless --force")
    n.add_argument("--force", action="store_true",
                   help="with --out: replace an existing file (a new cluster secret changes every node's tokens)")
    n.set_defaults(func=_new)
    d = tsub.add_parser("derive", help="print the token of one node, derived from the cluster secret")
    d.add_argument("--node", required=True, action="append", help="node name (repeat for several)")
    d.add_argument("--agent", action="store_true",
                   help="the token the aggregator presents to the node's agent (its auth.token_file), "
                        "not the one the node reports with")
    d.add_argument("--secret-file", default="",
                   help=f"file holding the cluster secret (default: ${SECRET_ENV})")
    d.add_argument("--out", default="", help="write the token to this file (0640 root:podhealth, else 0600; one --node only)")
    d.set_defaults(func=_derive)
    return p


def _emit(text: str, out: str) -> int:
    """Print `text`, or write it to `out` readable by its owner only (a shell redirect would
    create it with the umask's mode, usually world-readable)."""
    if not out:
        print(text)
        return 0
    try:
        credentials.write_private(Path(out), text + "\n", group=credentials.SERVICE_GROUP)
    except OSError as e:
        print(f"podhealth token: cannot write {out}: {e.strerror}", file=sys.stderr)
        return 2
    mode = Path(out).stat().st_mode & 0o777
    print(f"wrote {out} (mode {mode:04o})", file=sys.stderr)
    return 0


def _new(args: argparse.Namespace) -> int:
    # Re-running the install step on a head node must not rotate the cluster secret by accident:
    # every node's derived tokens would stop working at once.
    if args.out and not args.force and Path(args.out).exists():
        print(f"podhealth token: {args.out} exists (kept): a new cluster secret there would change every node's "
              "tokens; pass --force to replace it", file=sys.stderr)
        return 2
    return _emit(secrets.token_hex(32), args.out)


def _derive(args: argparse.Namespace) -> int:
    try:
        secret = credentials.read_secret("", args.secret_file, SECRET_ENV)
    except credentials.CredentialError as e:
        print(f"podhealth token: {e}", file=sys.stderr)
        return 2
    if not secret:
        print(f"podhealth token: no cluster secret: pass --secret-file or set ${SECRET_ENV}", file=sys.stderr)
        return 2
    for node in args.node:
        problem = node_name_problem(node)
        if problem:
            print(f"podhealth token: --node: {problem}", file=sys.stderr)
            return EXIT_USAGE
    if args.out and len(args.node) != 1:
        print("podhealth token: --out takes one --node", file=sys.stderr)
        return EXIT_USAGE
    derive = credentials.derive_agent_token if args.agent else credentials.derive_node_token
    if len(args.node) == 1:
        return _emit(derive(secret, args.node[0]), args.out)
    for node in args.node:
        print(f"{node} {derive(secret, node)}")
    return 0
