"""`podhealth check --slurm-health`: a fast verdict for Slurm's HealthCheckProgram (and prolog/epilog).

Reads the local agent's /health (its verdict is already damped and current) and, only if no agent
answers, collects the fast sources in-process with a tight time cap so the whole run stays
under a few seconds. Prints NHC-style lines. Draining stays with the aggregator unless the site
turns on --drain-self; then it drains with the `podhealth:` reason prefix and only ever resumes
nodes whose reason carries that prefix (LBNL NHC's rule).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import sys

from podhealth import agentclient, credentials, httpclient, tls
from podhealth.checks.handover.report import EXIT_FAIL, EXIT_PASS, EXIT_UNKNOWN
from podhealth.config import Config
from podhealth.vocab import CheckResult, NodeReport, Status

# pcie_aer and edac are a few dozen sysfs reads; nvme may run nvme-cli per drive: left to the agent.
FAST_COLLECTORS = ("nvml", "nvlink", "infiniband", "nfs", "host", "kmsg", "pcie_aer", "edac")
LOCAL_TIME_CAP = 3.0


def _from_agent(cfg: Config, node: str) -> NodeReport | None:
    return agent_report(local_base(cfg), node, agent_key(cfg, node), timeout=1.5, tls=local_tls(cfg))


def local_base(cfg: Config) -> str:
    """This node's agent on loopback: https:// when it serves TLS (tls.serve)."""
    return f"{cfg.tls.scheme}://127.0.0.1:{cfg.listen.port}"


def local_tls(cfg: Config) -> "ssl.SSLContext | None":
    """How the hooks verify their own agent's HTTPS: the site CA, and the certificate must name
    this node (core/agentclient.py checks it by the node name, not 127.0.0.1). None for plain
    HTTP, and when the CA cannot be read (then nothing is proven: UNKNOWN, never a drain)."""
    if not cfg.tls.serve:
        return None
    try:
        return tls.node_caller_context(cfg.tls)
    except (OSError, ssl.SSLError) as e:
        print(f"podhealth: cannot load the TLS files to verify the local agent: {e}", file=sys.stderr)
        return _nothing_trusted()


def _nothing_trusted() -> "ssl.SSLContext":
    """A context that trusts no CA: every handshake fails, so the answer is unproven (UNKNOWN)."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


def agent_key(cfg: Config, node: str) -> str:
    """The key to check this node's agent with: the agent's own (auth.token, token_file,
    $PODHEALTH_AGENT_TOKEN, /etc/podhealth/agent.key: root's hooks can read it, a user cannot),
    else this user's key for the node (the simulator's, credentials.user_key). "" when none."""
    try:
        return cfg.auth.resolved().token or credentials.user_key(node)
    except credentials.CredentialError:
        return ""


def agent_report(base: str, node: str, key: str, timeout: float,
                 tls: "ssl.SSLContext | None" = None) -> NodeReport | None:
    """The verdict of `node`'s agent at `base` (its /health), proven with the node's `key`; None
    when nothing answers (the caller may judge the node itself). An answer that is not proven to
    come from the agent (an impostor that took the port while the agent was down, or no key to
    check with) is an UNKNOWN report: it never drains, resumes or passes anything."""
    url = f"{base.rstrip('/')}/health"
    try:
        reply = agentclient.ask(url, node, key, deadline_s=timeout, signed=False, max_bytes=4 << 20, tls=tls)
        return NodeReport.from_json(json.loads(reply.body))
    except agentclient.Unproven as e:
        return unproven_report(node, str(e))
    except (httpclient.ExchangeError, ValueError, KeyError, TypeError, RecursionError):
        return None


def unproven_report(node: str, why: str) -> NodeReport:
    """What an answer we cannot trust tells: nothing (one UNKNOWN result that says why)."""
    from podhealth import __version__

    return NodeReport(node, __version__, "", (CheckResult(
        "agent", Status.UNKNOWN, "node", summary=f"agent answer not proven, ignored: {why}"[:400]),))


def local_report(cfg: Config, node: str, cap: float = LOCAL_TIME_CAP) -> NodeReport:
    """The fast passive sources collected in this process, each capped at `cap` seconds."""
    from podhealth import __version__
    from podhealth.checks.handover.suite import LocalCollector, run_suite

    src = LocalCollector(cfg, only=FAST_COLLECTORS, timeout_cap=cap)
    rep = asyncio.run(run_suite(cfg, src, node))
    return NodeReport(node, __version__, rep.profile, rep.results)


def line(r: CheckResult) -> str:
    return f"podhealth: {r.check} {r.entity}: {r.summary or r.status.value} [{r.action.value}]"


def run_slurm_health(cfg: Config, drain_self: bool = False) -> int:
    node = os.environ.get("SLURMD_NODENAME") or cfg.node.name or socket.gethostname().split(".")[0]
    return answer(node, _from_agent(cfg, node) or local_report(cfg, node), drain_self)


def answer(node: str, rep: NodeReport, drain: bool) -> int:
    """NHC-style lines for `rep`, the drain or resume when `drain`, and the exit code.

    An undecided node is neither drained nor resumed: UNKNOWN never fences, and it does not
    prove the node good either."""
    fails = [r for r in rep.results if r.status is Status.FAIL]
    unknowns = [r for r in rep.results if r.status is Status.UNKNOWN]
    for r in fails:
        print(f"ERROR: {line(r)}")
    for r in unknowns:
        print(f"WARNING: {line(r)}")
    if drain and (fails or not unknowns):
        from podhealth.checks.cli.selfdrain import drain_or_resume

        msg = drain_or_resume(node, fails[0] if fails else None)
        if msg:
            print(msg, file=sys.stderr)
    if fails:
        return EXIT_FAIL
    if unknowns:
        return EXIT_UNKNOWN
    print(f"OK: podhealth: {len(rep.results)} checks passed on {node}")
    return EXIT_PASS
