"""`podhealth-bcm-healthcheck` / `podhealth check --format bcm`: the node's verdict as an NVIDIA
Base Command Manager (BCM) health check.

BCM 11 Administrator Manual, 10.2.4 "Health Check": a health check answers PASS, FAIL or
UNKNOWN ("did not succeed, did not fail"); a standalone script may put a severity after the word
("FAIL 40", "UNKNOWN 10"), which overrides the trigger's (defaults: FAIL 15, UNKNOWN 10, PASS 0).
Appendix G.2 (the rogueprocess check): besides the response to CMDaemon, a script may return
details on file descriptor 3 ("InfoMessages"). So: the word (and severity) is the one line on
stdout; the information text goes to fd 3 when CMDaemon opened it as a pipe, else to stderr.

The verdict is the local agent's (/health on 127.0.0.1:listen.port, already damped and current):
  OK -> PASS;  WARN -> PASS (the warnings in the information text: BCM's FAIL triggers
  actions such as Drain, and a warning must not drain);  FAIL -> FAIL;  UNKNOWN -> UNKNOWN;
  no agent, a refused connection, a garbled answer, or no answer within the budget -> UNKNOWN.
There is no in-process fallback: BCM samples this every interval on every node, and when the
agent is away BCM's own gpu_health_* checks still cover the GPUs; UNKNOWN tells the
administrator the agent is down. The whole read has one deadline (core/httpclient.py), so an
agent that accepts and never answers (or trickles bytes) cannot stretch the run past it; and
the answer counts only with the proof of the node's agent key (root reads
/etc/podhealth/agent.key): whatever else holds the port gives UNKNOWN.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import socket
import ssl
import sys
from dataclasses import dataclass
from typing import TextIO

from podhealth import agentclient, httpclient
from podhealth.config import Config
from podhealth.vocab import NodeReport, Status

DEFAULT_BUDGET = 5.0
MAX_INFO = 1024  # one line of information text; the full report is on the agent's /health
INFO_FD = 3


@dataclass(frozen=True)
class BcmAnswer:
    word: str  # PASS | FAIL | UNKNOWN
    severity: int | None
    info: str

    @property
    def line(self) -> str:
        return self.word if self.severity is None else f"{self.word} {self.severity}"


def _item(check: str, entity: str, summary: str, action: str) -> str:
    tail = f" [{action}]" if action != "NONE" else ""
    return f"{check} {entity}: {summary}{tail}"


def answer(report: NodeReport | None, why: str = "", fail_severity: int | None = None,
           unknown_severity: int | None = None) -> BcmAnswer:
    """The BCM response for a node report (None: the agent could not be asked; `why` says why). Pure."""
    if report is None:
        return BcmAnswer("UNKNOWN", unknown_severity, f"podhealth: no verdict from the local agent: {why}"[:MAX_INFO])
    status = report.status
    by = {s: [r for r in report.results if r.status is s] for s in Status}
    if status is Status.FAIL:
        word, sev, shown = "FAIL", fail_severity, by[Status.FAIL]
    elif status is Status.UNKNOWN:
        word, sev, shown = "UNKNOWN", unknown_severity, by[Status.UNKNOWN]
    else:
        word, sev, shown = "PASS", None, by[Status.WARN]
    head = f"podhealth {report.node}: {status.value}"
    if status is Status.FAIL:
        head += f" (action {report.action.value})"
    if not shown:
        info = f"{head}: {len(report.results)} checks passed"
    else:
        items = "; ".join(_item(r.check, r.entity, r.summary or r.status.value, r.action.value) for r in shown)
        info = f"{head}: {items}"
        if status is Status.WARN:
            info = f"{head} (warnings only, not failing): {items}"
    return BcmAnswer(word, sev, " ".join(info.split())[:MAX_INFO])


def fetch(url: str, node: str, key: str, budget: float,
          tls: "ssl.SSLContext | None" = None) -> tuple[NodeReport | None, str]:
    """GET url within `budget` seconds for the whole exchange (core/httpclient.py), the answer
    proven with the node's agent key (core/agentclient.py): an impostor on the port is UNKNOWN."""
    try:
        reply = agentclient.ask(url, node, key, deadline_s=budget, signed=False, max_bytes=4 << 20, tls=tls)
        return NodeReport.from_json(json.loads(reply.body)), ""
    except agentclient.Unproven as e:
        return None, f"answer not proven, ignored: {e}"
    except httpclient.ExchangeError as e:
        return None, str(e)
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        return None, f"{url}: not a verdict: {type(e).__name__}: {e}"


def _info_stream() -> TextIO | None:
    """fd 3 when CMDaemon opened it as a pipe (its InfoMessages); None otherwise. An fd 3 that
    is an inherited file or socket is not ours to write to."""
    try:
        mode = os.fstat(INFO_FD).st_mode
    except OSError:
        return None
    if not stat.S_ISFIFO(mode):
        return None
    return os.fdopen(os.dup(INFO_FD), "w", encoding="utf-8")


def emit(ans: BcmAnswer, out: TextIO, info_fd: str = "auto") -> None:
    out.write(ans.line + "\n")
    out.flush()
    stream = _info_stream() if info_fd == "auto" else None
    if stream is not None:
        try:
            with stream:
                stream.write(ans.info + "\n")
        except OSError:
            pass  # CMDaemon closed its end: the word on stdout is what counts
    elif info_fd != "none":
        print(ans.info, file=sys.stderr)


def run_bcm(cfg: Config, budget: float = DEFAULT_BUDGET, fail_severity: int | None = None,
            unknown_severity: int | None = None, info_fd: str = "auto", out: TextIO | None = None) -> int:
    """Always exits 0 once an answer is printed: BCM reads the word, not the exit status."""
    if not cfg.listen.port:
        rep, why = None, "listen.port is 0 (the agent picks a port): this script cannot find it"
    else:
        from podhealth.checks.cli.slurm_health import agent_key, local_base, local_tls

        node = cfg.node.name or socket.gethostname().split(".")[0]
        rep, why = fetch(f"{local_base(cfg)}/health", node, agent_key(cfg, node), budget, tls=local_tls(cfg))
    ans = answer(rep, why, fail_severity, unknown_severity)
    emit(ans, out or sys.stdout, info_fd)
    return 0


def config_unknown(e: Exception, unknown_severity: int | None, info_fd: str) -> int:
    emit(BcmAnswer("UNKNOWN", unknown_severity, f"podhealth: cannot load the config: {e}"[:MAX_INFO]),
         sys.stdout, info_fd)
    return 0


def _severity(text: str) -> int:
    v = int(text)
    if not 0 <= v <= 100:
        raise argparse.ArgumentTypeError("a BCM severity is 0..100 (suggested: 0, 10, 20, 30, 40, 50)")
    return v


def _budget(text: str) -> float:
    v = float(text)
    if not 0 < v <= 60:
        raise argparse.ArgumentTypeError("the budget is 0 < seconds <= 60")
    return v


def add_options(p: "argparse._ActionsContainer") -> None:
    p.add_argument("--budget", type=_budget, default=DEFAULT_BUDGET,
                   help=f"seconds the whole run may take (default {DEFAULT_BUDGET:g})")
    p.add_argument("--fail-severity", type=_severity, default=None,
                   help="severity printed after FAIL (default: none, the trigger's own, 15)")
    p.add_argument("--unknown-severity", type=_severity, default=None,
                   help="severity printed after UNKNOWN (default: none, the trigger's own, 10)")
    p.add_argument("--info-fd", choices=["auto", "stderr", "none"], default="auto",
                   help="information text: auto = fd 3 when it is a pipe (BCM InfoMessages), else stderr")


def main(argv: list[str] | None = None) -> int:
    from podhealth import cliconfig, log

    p = argparse.ArgumentParser(prog="podhealth-bcm-healthcheck",
                                description="The local podhealth agent's verdict as a BCM health check (PASS/FAIL/UNKNOWN).")
    cliconfig.add_option(p)
    add_options(p)
    args = p.parse_args(argv)
    log.setup("warning", "auto", sys.stderr)  # stdout is BCM's PASS/FAIL line
    try:
        cfg = cliconfig.load(cliconfig.locate(args.config))
    except Exception as e:  # noqa: BLE001 - a bad config is an UNKNOWN for BCM, with the reason
        return config_unknown(e, args.unknown_severity, args.info_fd)
    return run_bcm(cfg, args.budget, args.fail_severity, args.unknown_severity, args.info_fd)
