"""`podhealth fleet status|history NODE|release NODE --reason|fence NODE --reason|reset-order NODE --reason|
breaker-reset|versions|silence NODE CHECK --for 2h --reason|unsilence NODE CHECK|mark-healthy NODE --reason|
bundle NODE [--id ID] [-o FILE]`.

A thin client of the aggregator's API (stdlib only, so the CLI starts fast). The URL comes from
--url, $PODHEALTH_AGGREGATOR_URL, or the config's aggregator.listen; the admin token from
--token, $PODHEALTH_ADMIN_TOKEN, or the config's aggregator.auth.admin_token.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import ssl
import sys
import time
import urllib.parse
from typing import Any, Callable

from podhealth import cliconfig, config, credentials, httpclient, tls
from podhealth.config_failslow import SHORT
from podhealth.exitcodes import EXIT_FAIL, EXIT_UNKNOWN

API_MAX_BYTES = 64 << 20  # a fleet listing of 100,000 nodes is tens of MB
FILE_MAX_BYTES = 64 << 20  # a stored bundle (bundles.max_bytes is 8 MiB by default)


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("fleet", help="operate the fleet through the aggregator (status, history, fence, release)")
    p.add_argument("--url", default=None,
                   help=f"aggregator base URL (default: ${cliconfig.AGGREGATOR_ENV}, else the --config file's "
                        "aggregator.listen, else http://127.0.0.1:9420)")
    p.add_argument("--token", default=os.environ.get("PODHEALTH_ADMIN_TOKEN"),
                   help="admin token, for the actions that change something (default: $PODHEALTH_ADMIN_TOKEN, "
                        "else the --config file's admin_token or admin_token_file)")
    cliconfig.add_option(p, cliconfig.AGGREGATOR_CONFIG, "the aggregator's config file, for URL and token")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the aggregator")
    p.add_argument("--format", choices=FORMATS, default="table", help="table for people, json: the raw JSON answer")
    p.add_argument("--json", action="store_true", help="deprecated: same as --format json")
    p.add_argument("--federate", nargs="*", metavar="[NAME=]URL", default=None,
                   help="instead of an ACTION: the read-only view of several aggregator sets (one per SuperPOD or "
                        "cluster), each read at once with its own deadline; with no URL, the --config file's "
                        "aggregator.federation.sets. Each set's token comes from those sets (never --token)")
    p.add_argument("--set-timeout", type=float, default=None, metavar="SECONDS",
                   help="seconds each federated set may take (default: the config's aggregator.federation.timeout, "
                        "else 5); one that does not answer is shown as unreachable")
    fs = p.add_subparsers(dest="fleet_cmd", metavar="ACTION", required=False)

    def federate_or_action(args: argparse.Namespace) -> int:
        if args.federate is None:
            p.error("an ACTION or --federate is required")
        return _federate(args)
    p.set_defaults(func=federate_or_action)
    s = fs.add_parser("status", help="fleet counts, breaker, fence budget, and the nodes that are not OK")
    s.add_argument("--all", action="store_true", help="list every node")
    s.set_defaults(func=_status)
    h = fs.add_parser("history", help="a node's verdicts, events and audited actions, newest first")
    h.add_argument("node")
    h.add_argument("--limit", type=int, default=50)
    h.set_defaults(func=_history)
    _node_action(fs, "release", "release a node podhealth fenced (needs a reason)", _release).add_argument(
        "--force", action="store_true", help="release even though the node still reports FAIL (it goes back with its fault)")
    _node_action(fs, "fence", "fence a node now (needs a reason; waits for `release` to return)", _fence)
    v = fs.add_parser("versions", help="which nodes run which driver, VBIOS, HCA firmware, OFED, kernel")
    v.add_argument("--name-few", type=int, default=8, metavar="N",
                   help="name the nodes of a version at most N nodes run (not the most common one); default 8")
    v.set_defaults(func=_versions)
    ol = fs.add_parser("outliers", help="fail-slow: parts slower than their cohort (same profile, driver, firmware) "
                       "or than their own past, and running jobs' stragglers")
    ol.add_argument("--metric", choices=sorted(SHORT.values()), help="one metric (default: all)")
    ol.set_defaults(func=_outliers)
    _node_action(fs, "reset-order", "forget the order of a node's records (after a forged or runaway seq "
                 "left its real reports stale); audited", _reset_order)
    r = fs.add_parser("repairs", help="the repair queue: nodes the remediation ladder handed to a human")
    r.set_defaults(func=_repairs)
    sl = fs.add_parser("silence", help="keep a check on a node from counting toward a fence for a while (audited)")
    sl.add_argument("node")
    sl.add_argument("check", help="the check's name (xid, ib_link, nfs_mount, ...)")
    sl.add_argument("--for", dest="duration", required=True, metavar="DURATION", help="90m, 2h, 1d (at most 30d)")
    sl.add_argument("--reason", required=True)
    sl.set_defaults(func=_silence)
    us = fs.add_parser("unsilence", help="lift a silence before it ends (audited)")
    us.add_argument("node")
    us.add_argument("check")
    us.add_argument("--reason", default="")
    us.set_defaults(func=_unsilence)
    _node_action(fs, "mark-healthy", "vouch for a node: skip the remediation ladder, release podhealth's "
                 "fence, open failures no longer fence it (audited)", _mark_healthy)
    bu = fs.add_parser("bundle", help="download a node's evidence bundle (the tar.gz for an RMA ticket), or list them")
    bu.add_argument("node")
    bu.add_argument("--id", type=int, default=None, help="which bundle (default: the newest)")
    bu.add_argument("-o", "--output", default=None, metavar="FILE",
                    help="where to write it (default NODE-fenceID.tar.gz; '-' = stdout)")
    bu.add_argument("--list", action="store_true", help="list the node's bundles instead")
    bu.set_defaults(func=_bundle)
    b = fs.add_parser("breaker-reset", help="reset a tripped circuit breaker (held observations are NOT replayed)")
    b.add_argument("--reason", default="")
    b.set_defaults(func=_breaker_reset)
    for action in fs.choices.values():  # `fleet status --format json` as well as `fleet --format json status`
        action.add_argument("--format", choices=FORMATS, default=argparse.SUPPRESS, help="table or json")
    return p


FORMATS = ("table", "json")


def _node_action(fs: "argparse._SubParsersAction[argparse.ArgumentParser]", name: str, helptext: str,
                 func: Callable[[argparse.Namespace], int]) -> argparse.ArgumentParser:
    """An audited action on one node: `NODE --reason WHY`, the reason required."""
    a = fs.add_parser(name, help=helptext)
    a.add_argument("node")
    a.add_argument("--reason", required=True)
    a.set_defaults(func=func)
    return a


def _as_json(args: argparse.Namespace) -> bool:
    if args.json and not getattr(args, "_json_warned", False):
        print("podhealth fleet: --json is deprecated, use --format json", file=sys.stderr)
        args._json_warned = True
    return bool(args.json or args.format == "json")


def _shown_as_json(args: argparse.Namespace, answer: Any) -> bool:
    """With --format json: print `answer` as the whole output and say so (the caller prints nothing else)."""
    if not _as_json(args):
        return False
    print(json.dumps(answer, indent=2))
    return True


# The one hint for every auth failure, whichever command met it (a 401 from `bundle` said nothing).
AUTH_HINT = ("pass the aggregator's admin token: --token, $PODHEALTH_ADMIN_TOKEN, or --config naming the "
             "aggregator's config (its aggregator.auth.admin_token or admin_token_file)")


def _http_error(method: str, path: str, status: int, body: bytes) -> "ApiError":
    try:
        msg = json.loads(body[:1 << 16]).get("error", "")
    except (ValueError, AttributeError):
        msg = ""
    text = f"{method} {path}: HTTP {status} {msg}".rstrip()
    return ApiError(f"{text}; {AUTH_HINT}" if status in (401, 403) else text)


class ApiError(Exception):
    """The aggregator answered no (an HTTP error): exit 1."""


class Undecided(ApiError):
    """Nothing could be asked (the aggregator unreachable, no config or token to ask with): exit 2,
    README's "could not decide", as for `check` with an unreachable agent."""


def _target(args: argparse.Namespace) -> tuple[str, str]:
    url, token = args.url or cliconfig.aggregator_url(), args.token
    if not url or not token:
        cfg = config.load(args.config) if args.config else None
        if cfg is not None:
            listen = cfg.aggregator.listen
            host = "127.0.0.1" if listen.address in ("0.0.0.0", "::", "") else listen.address
            scheme = "https" if cfg.aggregator.tls.enabled else "http"
            url = url or f"{scheme}://{host}:{listen.port}"
            auth = cfg.aggregator.auth  # admin_token_file too: the shipped configs keep the token in a file
            token = token or credentials.read_secret(auth.admin_token, auth.admin_token_file, "PODHEALTH_ADMIN_TOKEN")
    return (url or "http://127.0.0.1:9420").rstrip("/"), token or ""


def _tls(args: argparse.Namespace, url: str) -> ssl.SSLContext | None:
    """How an https:// aggregator is verified: $PODHEALTH_TLS_CA, else the config's tls.ca (or its
    aggregator.tls.ca: on the aggregator's host one site CA signs both), else the system's store.
    Never unverified: the admin token goes only to an aggregator that proved itself."""
    if not url.startswith("https://"):
        return None
    cfg = config.load(args.config) if args.config else None
    if cfg is None:
        return tls.cli_context()
    return tls.cli_context(cfg.tls.ca or cfg.aggregator.tls.ca, cfg.tls.cert, cfg.tls.key)


def _call(args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None,
          admin: bool = False) -> Any:
    url, token = _target(args)
    headers = {"Accept": "application/json"}
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if admin:
        if not token:
            raise Undecided(f"an admin token is needed: {AUTH_HINT}")
        headers["Authorization"] = f"Bearer {token}"
    r = _exchange(args, url, method, path, data or b"", headers, API_MAX_BYTES)
    try:
        return json.loads(r.body)
    except ValueError:
        raise Undecided(f"{method} {path}: the answer is not JSON: {r.body[:80]!r}") from None


def _exchange(args: argparse.Namespace, url: str, method: str, path: str, body: bytes, headers: dict[str, str],
              max_bytes: int) -> httpclient.Reply:
    """One exchange with the aggregator within --timeout for the whole of it (core/httpclient.py),
    an https:// one verified (_tls)."""
    try:
        ctx = _tls(args, url)
    except (OSError, ssl.SSLError) as e:
        raise Undecided(f"cannot load the TLS files to verify {url}: {getattr(e, 'strerror', None) or e}") from None
    try:
        r = httpclient.exchange(method, url + path, deadline_s=args.timeout, body=body, headers=headers,
                                max_bytes=max_bytes, tls=ctx)
    except httpclient.ExchangeError as e:
        raise Undecided(f"cannot reach the aggregator at {url}: {e}") from None
    if r.status >= 400:
        raise _http_error(method, path, r.status, r.body)
    return r


def _run(fn: Any) -> Any:
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return int(fn(args))
        except (Undecided, config.ConfigError, credentials.CredentialError) as e:
            print(f"podhealth fleet: {e}", file=sys.stderr)
            return EXIT_UNKNOWN
        except ApiError as e:
            print(f"podhealth fleet: {e}", file=sys.stderr)
            return EXIT_FAIL
    return wrapped


def _when(t: float | None) -> str:
    if not t:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@_run
def _status(args: argparse.Namespace) -> int:
    fleet = _call(args, "GET", "/api/v1/fleet")
    nodes = _call(args, "GET", "/api/v1/nodes")
    if _shown_as_json(args, {"fleet": fleet, "nodes": nodes["nodes"]}):
        return 0
    counts = " ".join(f"{k}={v}" for k, v in fleet["counts"].items() if v)
    b = fleet["breaker"]
    print(f"nodes: {fleet['nodes']}  {counts}")
    rp = fleet.get("replica")
    if rp and rp.get("role") != "single":
        print(f"leader: {rp['leader'] or 'none'} (epoch {rp['epoch']}, since {_when(rp['since'])}); "
              f"this replica: {rp['role']}")
    print(f"breaker: {'TRIPPED since ' + _when(b['tripped_at']) + ': ' + b['reason'] if b['tripped'] else 'ok'}")
    fb, rl = fleet["fence_budget"], fleet["rate_limit"]
    print(f"fence budget: {fb['used']}/{fb['limit']}  rate: {rl['used']}/{rl['limit']} per minute  "
          f"pending actions: {fleet['pending_actions']}{'  DRY RUN' if fleet['dry_run'] else ''}")
    rows = [n for n in nodes["nodes"] if args.all or n["state"] != "OK"]
    if rows:
        print(f"\n{'NODE':<20} {'STATE':<10} {'PARTITION':<12} CHECKS")
        for n in rows:
            print(f"{n['name']:<20} {n['state']:<10} {n['partition'] or '-':<12} {','.join(n['checks']) or '-'}")
            why = _why_out(n)
            if why:
                print(f"{'':22}{why}")
    return 0


# The ladder's steps as the node page words them (aggregator/static/node.js).
_LADDER_STEP = {"acting": "in flight", "verifying": "done, waiting for the handover suite",
                "repair": "handed to a human (fleet repairs)"}


def _why_out(n: dict[str, Any]) -> str:
    """Why a node is out of service, for the rows whose checks no longer say it: a fenced node whose
    verdict is OK again during its reboot showed nothing at all."""
    parts = []
    if n.get("fence_reason"):
        parts.append(f"fence: {n['fence_reason']}")
    if n.get("hold_reason"):
        parts.append(f"held: {n['hold_reason']}")
    ladder = n.get("ladder") or {}
    if ladder.get("step"):
        rung = str(ladder.get("remedy") or "").lower().replace("_", " ")
        parts.append(f"ladder: {rung + ' ' if rung else ''}{_LADDER_STEP.get(ladder['step'], ladder['step'])}"
                     + (f" since {_when(ladder['since'])}" if ladder.get("since") else ""))
    return "; ".join(parts)


@_run
def _repairs(args: argparse.Namespace) -> int:
    out = _call(args, "GET", "/api/v1/repairs")
    if _shown_as_json(args, out):
        return 0
    if not out["repairs"]:
        print("repair queue: empty")
        return 0
    print(f"{'NODE':<20} {'SINCE':<20} REASON")
    for r in out["repairs"]:
        print(f"{r['node']:<20} {_when(r['since']):<20} {r['reason']}")
        for a in r["attempts"]:
            outcome = a["outcome"] or a["state"]
            print(f"{'':22}{_when(a['created'])}  {a['kind']:<9} {outcome:<9} {a['result'][:300]}")
    print("\nafter the repair: `podhealth fleet release NODE --reason ...` (the ladder starts afresh)")
    return 0


@_run
def _history(args: argparse.Namespace) -> int:
    q = urllib.parse.urlencode({"limit": args.limit})
    h = _call(args, "GET", f"/api/v1/nodes/{urllib.parse.quote(args.node)}/history?{q}")
    if _shown_as_json(args, h):
        return 0
    for it in h["items"]:
        when = _when(it["time"])
        if it["type"] == "verdict":
            print(f"{when}  verdict  {it['check']} {it['entity']} -> {it['status']} {it['action']} "
                  f"({it['source']}) {it['summary']}".rstrip())
        elif it["type"] == "event":
            print(f"{when}  event    {it['kind']} {json.dumps(it['event'].get('event', it['event']))[:120]}")
        else:
            ok = "" if it["ok"] else "  FAILED"
            cmd = " ".join(it["command"])
            print(f"{when}  action   {it['what']} by {it['who']}: {it['why']}{ok}"
                  + (f"\n{'':21}$ {cmd}" if cmd else "") + (f"\n{'':21}{it['output'][:200]}" if it["output"] else ""))
    return 0


def _who() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "cli"


def _print_action(args: argparse.Namespace, out: dict[str, Any]) -> int:
    if not _shown_as_json(args, out):
        print(f"{out.get('node', '')}: {out.get('kind', '')} {out.get('state', '')}: {out.get('result', '')}".strip())
    return 0 if out.get("state") in ("done", "unchanged") else 1


def _node_action_call(args: argparse.Namespace, verb: str, **fields: Any) -> Any:
    """POST an audited action on args.node, with its reason and who asks (admin token)."""
    return _call(args, "POST", f"/api/v1/nodes/{urllib.parse.quote(args.node)}/{verb}",
                 {**fields, "reason": args.reason, "who": _who()}, admin=True)


@_run
def _release(args: argparse.Namespace) -> int:
    if not args.force:
        # As the node page warns before it releases: a node still failing goes back to its users
        # with the fault. Asked first, so nothing changes without --force.
        node = _call(args, "GET", f"/api/v1/nodes/{urllib.parse.quote(args.node)}")
        failing = sorted({f"{c.get('check')}:{c.get('entity')}" for c in node.get("conditions") or []
                          if c.get("status") == "FAIL"})
        if node.get("status") == "FAIL":  # the node page asks on the same test
            print(f"podhealth fleet: {args.node} still reports FAIL ({', '.join(failing) or 'its verdict'}); released, "
                  "it goes back into service with that fault. Release it anyway with --force.", file=sys.stderr)
            return EXIT_FAIL
    out = _node_action_call(args, "release")
    return _print_action(args, out)


@_run
def _fence(args: argparse.Namespace) -> int:
    out = _node_action_call(args, "fence")
    return _print_action(args, out)


@_run
def _versions(args: argparse.Namespace) -> int:
    from podhealth.aggregator.versions import lines

    view = _call(args, "GET", "/api/v1/fleet/versions")
    if _shown_as_json(args, view):
        return 0
    for line in lines(view, args.name_few):
        print(line)
    print(f"({view['reporting']} nodes report versions"
          + (f"; {len(view['not_reported'])} do not: {', '.join(view['not_reported'][:20])}"
             + (" ..." if len(view["not_reported"]) > 20 else "") if view["not_reported"] else "") + ")")
    return 0


@_run
def _outliers(args: argparse.Namespace) -> int:
    q = f"?metric={urllib.parse.quote(args.metric)}" if args.metric else ""
    out = _call(args, "GET", f"/api/v1/failslow/outliers{q}")
    strag = _call(args, "GET", "/api/v1/failslow/stragglers")
    if _shown_as_json(args, {**out, **strag}):
        return 0
    print(f"judged {_when(out['scored_at'])}; cohorts:")
    for c in out["cohorts"]:
        judged = "" if c["judged"] else "  (too small to judge)"
        print(f"  {c['metric']:<14} {c['profile']:<10} {c['driver']:<12} {c['firmware'] or '-':<16} "
              f"n={c['size']:<5} median {c['median']:.1f}{judged}")
    if out["findings"]:
        print(f"\n{'NODE':<20} {'STATUS':<6} {'ACTION':<6} FINDING")
        for f in out["findings"]:
            print(f"{f['node']:<20} {f['status']:<6} {f['action']:<6} {f['summary']}")
    else:
        print("\nno outliers")
    for s in strag["stragglers"]:
        print(f"straggler: {s['summary']}")
    return 0


@_run
def _reset_order(args: argparse.Namespace) -> int:
    out = _node_action_call(args, "reset-order")
    if not _shown_as_json(args, out):
        was = out["was"]
        print(f"{out['node']}: order reset (was boot {was['boot_id'] or '-'} seq {was['seq']}); "
              "its next record starts afresh")
    return 0


@_run
def _silence(args: argparse.Namespace) -> int:
    out = _node_action_call(args, "silence", check=args.check, duration=args.duration)
    if not _shown_as_json(args, out):
        print(f"{out['node']}: {out['check']} silenced until {_when(out['until'])} by {out['who']}: {out['reason']}")
    return 0


@_run
def _unsilence(args: argparse.Namespace) -> int:
    out = _node_action_call(args, "unsilence", check=args.check)
    if not _shown_as_json(args, out):
        print(f"{out['node']}: {out['check']} counts again")
    return 0


@_run
def _mark_healthy(args: argparse.Namespace) -> int:
    out = _node_action_call(args, "mark-healthy")
    return _print_action(args, out)


def _fetch(args: argparse.Namespace, path: str) -> tuple[bytes, dict[str, str]]:
    """GET a file with the admin token (bundles hold logs and serial numbers)."""
    url, token = _target(args)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = _exchange(args, url, "GET", path, b"", headers, FILE_MAX_BYTES)
    return r.body, dict(r.headers)


@_run
def _bundle(args: argparse.Namespace) -> int:
    import hashlib

    base = f"/api/v1/nodes/{urllib.parse.quote(args.node)}/bundles"
    listing = json.loads(_fetch(args, base)[0])
    if args.list or (_as_json(args) and args.output is None):
        if _shown_as_json(args, listing):
            return 0
        print(f"{'ID':>6} {'FENCE':>6} {'WHEN':<20} {'BYTES':>9} SHA256")
        for b in listing["bundles"]:
            what = f"NOT STORED: {b['error']}" if b.get("error") else b["sha256"]
            print(f"{b['id']:>6} {b['fence_id']:>6} {_when(b['time']):<20} {b['size']:>9} {what}")
        return 0
    rows = listing["bundles"]
    chosen = next((b for b in rows if b["id"] == args.id), None) if args.id is not None else (rows[0] if rows else None)
    if chosen is None:
        raise ApiError(f"no bundle {args.id} of {args.node}" if args.id is not None else f"{args.node} has no bundles")
    if chosen.get("error"):  # the newest fence's evidence was refused: say so, never fall back silently
        raise ApiError(f"bundle {chosen['id']} of {args.node} (fence {chosen['fence_id']}) was not stored: "
                       f"{chosen['error']}")
    body, headers = _fetch(args, f"{base}/{chosen['id']}")
    digest = hashlib.sha256(body).hexdigest()
    if digest != chosen["sha256"]:
        raise ApiError(f"bundle {chosen['id']} arrived damaged: sha256 {digest}, recorded {chosen['sha256']}")
    if args.output == "-":
        sys.stdout.buffer.write(body)
        return 0
    out = args.output or f"{args.node}-fence{chosen['fence_id']}.tar.gz"
    with open(out, "wb") as f:
        f.write(body)
    print(f"{out}: {len(body)} bytes, sha256 {digest} (bundle {chosen['id']}, fence {chosen['fence_id']}, "
          f"{_when(chosen['time'])})", file=sys.stderr)
    return 0


@_run
def _breaker_reset(args: argparse.Namespace) -> int:
    out = _call(args, "POST", "/api/v1/breaker/reset", {"reason": args.reason, "who": _who()}, admin=True)
    if not _shown_as_json(args, out):
        print("breaker reset" + (f" (was tripped: {out['was_reason']})" if out["was_tripped"] else " (was not tripped)")
              + "; observations from before now must be seen again before anything is fenced")
    return 0


# ---- the federated view (aggregator/federation.py) ------------------------------------------------


def _federated_sets(args: argparse.Namespace) -> tuple[list[Any], float]:
    """The sets to read, each with the token its own config entry gives (matched by URL or name),
    and the per-set deadline. Raises Undecided on a bad [NAME=]URL."""
    from podhealth.config_federation import FederatedSet, FederationConfig, set_name_problem, set_url_problem

    fed = FederationConfig()
    if args.config:
        fed = config.load(args.config).aggregator.federation
    known = {s.url.rstrip("/"): s for s in fed.sets}
    by_name = {s.name: s for s in fed.sets}
    chosen: list[FederatedSet] = []
    for item in args.federate or []:
        name, sep, url = item.partition("=")
        if not sep or "://" in name:
            name, url = "", item
        problem = set_url_problem(url) or (set_name_problem(name) if name else None)
        if problem:
            raise Undecided(f"--federate {item}: {problem}")
        entry = known.get(url.rstrip("/")) or (by_name.get(name) if name else None)
        if entry is not None and entry.url.rstrip("/") != url.rstrip("/"):
            entry = None  # a name from the config with another URL: its token stays with its own URL
        chosen.append(entry if entry is not None else FederatedSet(name=name or urllib.parse.urlsplit(url).netloc,
                                                                    url=url))
    if args.federate == []:
        chosen = list(fed.sets)
    if not chosen:
        raise Undecided("--federate: no sets (give URLs, or --config with aggregator.federation.sets)")
    return chosen, args.set_timeout if args.set_timeout is not None else fed.timeout


@_run
def _federate(args: argparse.Namespace) -> int:
    import asyncio

    from podhealth.aggregator import federation

    sets, timeout = _federated_sets(args)
    if not timeout > 0:
        raise Undecided("--set-timeout: expected a positive number of seconds")

    async def read() -> list[federation.SetView]:
        readers = [federation.SetReader(s, s.read_token()) for s in sets]
        try:
            return await federation.read_all(readers, timeout)
        finally:
            for r in readers:
                await r.close()

    try:
        views = asyncio.run(read())
    except federation.SetError as e:
        raise Undecided(str(e)) from None
    if not _shown_as_json(args, {"sets": [v.to_json() for v in views]}):
        for v in views:
            if not v.ok:
                print(f"{v.name:<16} {v.url}  UNREACHABLE: {v.error}")
                continue
            counts = " ".join(f"{k}={n}" for k, n in v.counts.items() if n)
            extra = (f"  leader {v.leader}" if v.leader else "") + ("  DRY RUN" if v.dry_run else "")
            print(f"{v.name:<16} {v.url}  nodes {v.nodes}  {counts}  fenced {v.fenced}/{v.cap}  "
                  f"breaker {'TRIPPED: ' + v.breaker if v.breaker else 'ok'}{extra}")
            for pr in v.problems:
                print(f"  {pr.node:<20} {pr.state:<10} {','.join(pr.checks) or '-'}")
            if v.more:
                print(f"  ... and {v.more} more")
    return 0 if all(v.ok for v in views) else EXIT_UNKNOWN
