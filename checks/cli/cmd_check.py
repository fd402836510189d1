"""`podhealth check`: the handover report (local or `--node dgx01`), and Slurm HealthCheckProgram mode.

Exit codes: 0 pass, 1 fail, 2 could not decide (UNKNOWN, unreachable agent, wrong token), 64 usage.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import contextlib
import socket
import ssl
import sys
import urllib.parse
from typing import Any, Callable

from podhealth import agentclient, cliconfig, credentials, httpclient, tls
from podhealth import config as config_mod
from podhealth.credentials import CredentialError
from podhealth.checks.handover.report import EXIT_UNKNOWN, SuiteReport, render
from podhealth.config import Config
from podhealth.hostnames import node_name_problem


_EXIT_CODES = """exit codes:
  0   pass (OK, or WARN only)
  1   fail: at least one check FAILed (the node should not go back into service)
  2   could not decide: a check was UNKNOWN, the agent could not be reached or refused the
      token, or the config file is invalid
  64  usage error: the command line makes no sense (unknown option, bad value)"""


def _pod_gpus(text: str) -> object:
    from podhealth.checks.cli import podgpus

    try:
        return podgpus.parse(text) or "all"
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class CheckError(Exception):
    """Could not get a verdict (unreachable, refused): printed as one line, exit 2."""


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> argparse.ArgumentParser:
    p = sub.add_parser("check", help="run the handover suite on this node or on --node NAME",
                       description="Run the handover suite (the checks a repaired node must pass before users get "
                                   "it back) on this node, or ask another node's agent with --node/--url, and print "
                                   "the report (--format table|json|junit). With --slurm-health it is Slurm's "
                                   "HealthCheckProgram: a fast read of the local agent's verdict.",
                       epilog=_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--node", help="ask that node's agent: its URL from config checks.agents, else from the "
                                  "aggregator (--aggregator), else DNS (http://NODE:checks.agent_port)")
    p.add_argument("--url", help="agent base URL (overrides --node's lookup)")
    p.add_argument("--aggregator", default=None,
                   help=f"aggregator base URL that knows each node's agent URL (default: ${cliconfig.AGGREGATOR_ENV}, "
                        "then publish.aggregator_url from config)")
    cliconfig.add_option(p)
    p.add_argument("--token", help="the node's agent key, `podhealth token derive --agent --node NAME`: it signs "
                   "the request and checks the agent's answer, and never crosses the wire "
                   "(default: $PODHEALTH_TOKEN, then auth.token from config, then /etc/podhealth/agent.key)")
    p.add_argument("--format", choices=["table", "json", "junit", "bcm"], default="table",
                   help="bcm: the local agent's verdict as a Base Command Manager health check (PASS/FAIL/UNKNOWN)")
    p.add_argument("-v", "--verbose", action="store_true", help="table: one row per entity, OK ones too")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the suite (default 600)")
    p.add_argument("--slurm-health", action="store_true",
                   help="fast mode for Slurm HealthCheckProgram: reads the local agent's verdict")
    from podhealth.checks.cli.bcm import add_options as add_bcm_options

    add_bcm_options(p.add_argument_group("--format bcm"))
    p.add_argument("--gpus", type=_pod_gpus, default=None, metavar="LIST",
                   help="judge only these GPUs (and the node-wide checks): indices or GPU UUIDs as the NVIDIA "
                        "container runtime gives them, e.g. --gpus \"$NVIDIA_VISIBLE_DEVICES\"; all = every GPU")
    p.add_argument("--preflight", action="store_true",
                   help="a pod's preflight (an init container): read the agent's current verdict (its open "
                        "/health, no token, no tests run) for --gpus; exit 1 only on a FAIL, so an undecided "
                        "node lets the job start, as the Slurm prolog does")
    p.add_argument("--drain-self", action="store_true",
                   help="with --slurm-health: drain this node on FAIL (reason 'podhealth: ...') and resume only nodes podhealth drained")
    p.set_defaults(func=run)
    return p


# Where install-units and the aggregator's unit keep its config: on the aggregator's host the
# cluster secret is there, not in the agent's podhealth.yaml that `check` reads by default.
AGGREGATOR_CONFIG = cliconfig.AGGREGATOR_CONFIG


def _token(args: argparse.Namespace, cfg: Config, node: str) -> str:
    """--token, $PODHEALTH_TOKEN, this host's agent token (auth.token: right for its own node),
    or, on the aggregator's host, what the aggregator would present to `node`'s agent (the token
    derived for it from cluster_secret, or a shared agent_token): from --config, else from the
    aggregator's own config (AGGREGATOR_CONFIG) when this user can read it."""
    if args.token or os.environ.get("PODHEALTH_TOKEN", ""):
        return str(args.token or os.environ["PODHEALTH_TOKEN"])
    try:
        own = cfg.auth.resolved().token  # auth.token, auth.token_file or $PODHEALTH_AGENT_TOKEN
        if own or not node:
            return own
        derived = cfg.aggregator.auth.resolved().agent_token_for(node)
        chosen = getattr(args, "config_chosen", bool(args.config))
        if not derived and not chosen and os.access(AGGREGATOR_CONFIG, os.R_OK):
            derived = config_mod.load(AGGREGATOR_CONFIG).aggregator.auth.resolved().agent_token_for(node)
        # this user's own key for the node: `agent --simulate` made one (credentials.user_key)
        return derived or credentials.user_key(node)
    except (CredentialError, config_mod.ConfigError) as e:
        raise CheckError(str(e)) from None


def agent_url(cfg: Config, node: str, aggregator: str = "", token: str = "") -> str:
    """Where `node`'s agent answers, found as a cluster finds it: the config's checks.agents,
    then the aggregator (which has each node's agent_url), then DNS."""
    if node_name_problem(node):
        raise CheckError(f"invalid node name: {node_name_problem(node)}")
    if node in cfg.checks.agents:
        return cfg.checks.agents[node]
    if aggregator:
        found = _agent_url_from_aggregator(aggregator, node, token, cfg)
        if found:
            return found
    return f"{cfg.tls.scheme}://{node}:{cfg.checks.agent_port}"


def _agent_url_from_aggregator(base: str, node: str, token: str, cfg: Config | None = None) -> str:
    url = f"{base.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node)}"
    headers = {"Accept": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    try:
        # https:// is verified (the config's tls.ca, $PODHEALTH_TLS_CA, else the system's store).
        ctx = None
        if url.startswith("https://"):
            ctx = tls.cli_context(cfg.tls.ca, cfg.tls.cert, cfg.tls.key) if cfg is not None else tls.cli_context()
        r = httpclient.exchange("GET", url, deadline_s=5.0, headers=headers, tls=ctx)
        if r.status == 404:
            return ""  # not a node the aggregator knows: DNS may still find it
        if r.status != 200:
            raise CheckError(f"aggregator {base} answered HTTP {r.status} for {node}")
        return str(json.loads(r.body).get("agent_url") or "")
    except (httpclient.ExchangeError, ValueError, AttributeError) as e:
        raise CheckError(f"cannot ask the aggregator {base} for {node}'s agent: {e}") from None


def _unreachable(url: str, e: Exception) -> str:
    if "cannot resolve" in str(e):
        return (f"{e}: pass --url, list the node under checks.agents in the config, or name the aggregator with "
                "--aggregator")
    return f"cannot reach the agent at {url}: {e}"


def agent_tls(cfg: Config, url: str, check_name: bool = True) -> "ssl.SSLContext | None":
    """How an https:// agent is verified: the site CA ($PODHEALTH_TLS_CA, else tls.ca), the
    certificate checked against the node name (core/agentclient.py); None for http://.
    `check_name=False` only for node_at, which asks the name and sends nothing."""
    if not url.startswith("https://"):
        return None
    try:
        ctx = tls.node_caller_context(cfg.tls)
    except (OSError, ssl.SSLError) as e:
        raise CheckError(f"cannot load the CA to verify {url} with (tls.ca, $PODHEALTH_TLS_CA): {e}") from None
    ctx.check_hostname = check_name  # the chain is verified either way (CERT_REQUIRED)
    return ctx


def node_at(url: str, ctx: "ssl.SSLContext | None" = None) -> str:
    """The node the agent at `url` says it is (GET /healthz): only to pick the key to check its
    answers with, which then proves or disproves the claim. Over https:// `ctx` verifies the
    chain but not the name (the name is what is asked; nothing is sent): the exchanges that
    follow check the certificate against the node named, and the answer's proof against its key."""
    try:
        r = httpclient.exchange("GET", url.rstrip("/") + "/healthz", deadline_s=5.0, max_bytes=64 * 1024, tls=ctx)
        node = json.loads(r.body).get("node") if r.status == 200 else None
    except (httpclient.ExchangeError, ValueError, AttributeError) as e:
        raise CheckError(_unreachable(url, e)) from None
    if not isinstance(node, str) or node_name_problem(node):
        raise CheckError(f"{url} does not say which node it is (GET /healthz): not a podhealth agent?")
    return node


def fetch_handover(url: str, node: str, key: str, timeout: float,
                   progress: Callable[[dict[str, Any]], None] | None, tls_ctx: "ssl.SSLContext | None" = None) -> SuiteReport:
    """POST <url>/v1/handover, signed with the node's agent key, and read the NDJSON stream:
    progress lines as they come, then the report, believed only once the stream's proof checks
    out (core/agentclient.py), all within `timeout` seconds."""
    def on_line(raw: bytes) -> None:
        with contextlib.suppress(ValueError, AttributeError):
            msg = json.loads(raw)
            if msg.get("type") == "progress" and progress:
                progress(msg)
    try:
        r = agentclient.ask(url.rstrip("/") + "/v1/handover", node, key, "POST", deadline_s=timeout, body=b"{}",
                            headers={"Accept": "application/x-ndjson", "Content-Type": "application/json"},
                            max_bytes=16 << 20, on_line=on_line, tls=tls_ctx)
    except agentclient.Unproven as e:
        if not key:
            if tls_ctx is None:
                node_at(url)  # unreachable (an unresolvable name) says so first: the key is the next thing
            raise CheckError(f"no agent key for {node}: pass --token or set PODHEALTH_TOKEN to the node's agent key "
                             "(`podhealth token derive --agent --node NAME`), run it as root on the node "
                             f"(/etc/podhealth/agent.key), or where the aggregator's config can be read "
                             f"({AGGREGATOR_CONFIG}, or --config FILE)") from None
        if e.status == 401:  # most likely our key is not the node's (the agent cannot prove to a wrong key either)
            raise CheckError(f"{url} refused the request (HTTP 401, unproven): the key is not {node}'s agent key: pass "
                             f"--token or set PODHEALTH_TOKEN to `podhealth token derive --agent --node {node}`") from None
        raise CheckError(f"the answer is not proven to come from {node}'s agent, ignored: {e}") from None
    except httpclient.ExchangeError as e:
        raise CheckError(_unreachable(url, e)) from None
    if r.status == 401:
        raise CheckError(f"{url} refused the signature (HTTP 401: {r.body[:300].decode(errors='replace')}): the key "
                         f"is not {node}'s agent key (`podhealth token derive --agent --node {node}`)")
    if r.status != 200:
        raise CheckError(f"{url} answered HTTP {r.status}: {r.body[:500].decode(errors='replace').strip()}")
    report = None
    for line in r.body.splitlines():
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
        except json.JSONDecodeError:
            raise CheckError(f"{url} sent a line that is not JSON: {line[:80]!r}") from None
        if msg.get("type") == "report":
            report = SuiteReport.from_json(msg["report"])
        elif msg.get("type") == "error":
            raise CheckError(f"{url}: {msg.get('error')}")
    if report is None:
        raise CheckError(f"{url} closed the stream before sending a report")
    return report


def _progress_printer(fmt: str) -> tuple[Callable[[dict[str, Any]], None], Callable[[], None]]:
    if not sys.stderr.isatty():
        return (lambda msg: None), (lambda: None)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from podhealth.console import console as make_console

    prog = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), transient=True, console=make_console(stderr=True))
    prog.start()
    task = prog.add_task("handover", total=None)

    def on(msg: dict[str, Any]) -> None:
        prog.update(task, description=f"handover: {msg.get('step', '')}", completed=msg.get("done", 0),
                    total=msg.get("total"))
    return on, prog.stop


def _local_agent_listening(cfg: Config) -> str | None:
    port = cfg.listen.port
    if not port:
        return None
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return f"{cfg.tls.scheme}://127.0.0.1:{port}"
    except OSError:
        return None


def run(args: argparse.Namespace) -> int:
    try:
        cfg = cliconfig.load(args.config)
    except config_mod.ConfigError as e:
        if args.format == "bcm":
            from podhealth.checks.cli.bcm import config_unknown

            return config_unknown(e, args.unknown_severity, args.info_fd)
        print(e, file=sys.stderr)
        return EXIT_UNKNOWN
    if args.format == "bcm":
        from podhealth.checks.cli.bcm import run_bcm

        return run_bcm(cfg, args.budget, args.fail_severity, args.unknown_severity, args.info_fd)
    if args.slurm_health:
        from podhealth.checks.cli.slurm_health import run_slurm_health

        return run_slurm_health(cfg, drain_self=args.drain_self)
    if args.preflight:
        return _preflight(cfg, args)
    on_progress, stop = _progress_printer(args.format)
    try:
        aggregator = args.aggregator or cliconfig.aggregator_url() or next(iter(cfg.publish.urls()), "")
        url = args.url or (agent_url(cfg, args.node, aggregator) if args.node
                           else _local_agent_listening(cfg))
        if url:
            ctx = agent_tls(cfg, url)
            node = args.node or node_at(url, agent_tls(cfg, url, check_name=False))
            rep = fetch_handover(url, node, _token(args, cfg, node), args.timeout, on_progress, ctx)
        else:
            from podhealth.checks.handover.suite import LocalCollector, run_suite

            node = cfg.node.name or socket.gethostname().split(".")[0]
            rep = asyncio.run(run_suite(cfg, LocalCollector(cfg), node,
                                        lambda step, done, total: on_progress({"step": step, "done": done, "total": total})))
    except CheckError as e:
        stop()
        print(f"podhealth check: {e}", file=sys.stderr)
        return EXIT_UNKNOWN
    stop()
    rep = _for_pod(rep, args.gpus)
    render(rep, args.format, sys.stdout, args.verbose)
    if args.format != "table":
        print(rep.summary(), file=sys.stderr)
    return rep.exit_code


def _for_pod(rep: SuiteReport, gpus: object) -> SuiteReport:
    """The report narrowed to a pod's GPUs (--gpus), with a note saying so."""
    from dataclasses import replace

    from podhealth.checks.cli import podgpus

    if not isinstance(gpus, podgpus.PodGpus):
        return rep
    results, why = podgpus.for_pod(rep.results, gpus)
    note = why or f"judged for GPUs {gpus.describe()} and the node-wide checks only (--gpus)"
    return replace(rep, results=tuple(results), notes=(*rep.notes, note))


def _preflight(cfg: Config, args: argparse.Namespace) -> int:
    """`check --preflight --gpus LIST`: the agent's current verdict for a pod's GPUs. A FAIL stops
    the pod (exit 1); no answer or UNKNOWN lets it start (exit 0, said on stderr): a preflight that
    blocks every pod while an agent restarts would take the node out more surely than a fence."""
    import time

    from podhealth.checks.cli.slurm_health import agent_report, line

    try:
        url = args.url or (agent_url(cfg, args.node, args.aggregator or cliconfig.aggregator_url())
                           if args.node else f"{cfg.tls.scheme}://127.0.0.1:{cfg.listen.port}")
        ctx, anon = agent_tls(cfg, url), agent_tls(cfg, url, check_name=False)
    except CheckError as e:
        print(f"podhealth check --preflight: undecided, the pod may start: {e}", file=sys.stderr)
        return 0
    started = time.time()
    node = args.node or cfg.node.name or os.environ.get("PODHEALTH_NODE", "")
    try:
        key = _token(args, cfg, node) if node else ""
    except CheckError:
        key = ""
    timeout = min(args.timeout, 10.0)
    # With the node's agent key the answer is proven (slurm_health.agent_report); a pod has no
    # such key, so by default its preflight reads the open /health unproven: that answer can only
    # stop this pod (never move the node), and an impostor's OK is no worse than no agent.
    node_rep = agent_report(url, node, key, timeout, tls=ctx) if key else _unproven_health(url, timeout, anon)
    if node_rep is None:
        print(f"podhealth check --preflight: no verdict from the agent at {url}: undecided, the pod may start",
              file=sys.stderr)
        return 0
    rep = _for_pod(SuiteReport(node=node_rep.node, profile=node_rep.profile, results=node_rep.results,
                               started=started, finished=time.time()), args.gpus)
    render(rep, args.format, sys.stdout, args.verbose)
    for r in rep.results:
        if r.status.value in ("FAIL", "UNKNOWN"):
            print(f"podhealth check --preflight: {'undecided: ' if r.status.value == 'UNKNOWN' else ''}{line(r)}",
                  file=sys.stderr)
    return 1 if rep.exit_code == 1 else 0


def _unproven_health(url: str, timeout: float, ctx: "ssl.SSLContext | None" = None) -> "Any":
    """The agent's /health (a NodeReport) read without proof, bounded, within `timeout`; None
    without an answer."""
    from podhealth import httpclient
    from podhealth.vocab import NodeReport

    try:
        reply = httpclient.exchange("GET", url.rstrip("/") + "/health", deadline_s=timeout, max_bytes=4 << 20,
                                    tls=ctx)
        if reply.status != 200:
            return None
        return NodeReport.from_json(json.loads(reply.body))
    except (httpclient.ExchangeError, ValueError, KeyError, TypeError, RecursionError):
        return None
