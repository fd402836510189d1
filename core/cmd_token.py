"""`podhealth token new | derive --node NAME`: the cluster secret and each node's own token.

The aggregator keeps the secret (auth.cluster_secret_file); each node gets only the token
derived for it (publish.token_file), so a node can speak for itself and no other.
"""

from __future__ import annotations

import argparse
import secrets
import sys

from podhealth import credentials
from podhealth.aggregator.config import node_name_problem

SECRET_ENV = "PODHEALTH_CLUSTER_SECRET"


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("token", help="make the cluster secret and derive each node's token")
    tsub = p.add_subparsers(dest="token_cmd", metavar="ACTION", required=True)
    n = tsub.add_parser("new", help="print a new random cluster secret (or any token)")
    n.set_defaults(func=_new)
    d = tsub.add_parser("derive", help="print the token of one node, derived from the cluster secret")
    d.add_argument("--node", required=True, action="append", help="node name (repeat for several)")
    d.add_argument("--secret-file", default="",
                   help=f"file holding the cluster secret (default: ${SECRET_ENV})")
    d.set_defaults(func=_derive)
    return p


def _new(args: argparse.Namespace) -> int:
    print(secrets.token_hex(32))
    return 0


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
            return 2
    for node in args.node:
        token = credentials.derive_node_token(secret, node)
        print(token if len(args.node) == 1 else f"{node} {token}")
    return 0
