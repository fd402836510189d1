"""IMEX: the daemon that holds a multi-node NVLink domain's shared memory up (GB200 NVL72).

Judged only on a profile whose NVLink domain needs it (profiles.yaml `nvlink_domain.imex`). This
node's daemon is what this node answers for: READY is OK; a daemon still coming up
(INITIALIZING ... INIT_GPU, waiting for its peers) cannot take multi-node jobs yet: WARN; one that
is UNAVAILABLE or SHUTTING_DOWN (or says a word IMEX never printed) fails the tray: DRAIN. The
domain's own state is the rack's: a DEGRADED or DOWN domain while this daemon is READY names the
peers that are not, as a WARN here (their own agents fail them), never a fence of this node.
An unreadable state is UNKNOWN (the nvidia-imex.service unit's own check says when it is stopped).
"""

from __future__ import annotations

from podhealth.checks.passive.context import Context
from podhealth.checks.passive.result import fail, ok, unknown, warn
from podhealth.collectors.imex_parse import DAEMON_STATES
from podhealth.vocab import Action, CheckResult

_COMING_UP = frozenset(DAEMON_STATES[:5])  # INITIALIZING .. INIT_GPU


def imex(ctx: Context) -> list[CheckResult]:
    if not ctx.profile.nvlink_domain.imex:
        return []
    states = [s.label("state") for s in ctx.samples("imex_daemon_state_info")]
    out: list[CheckResult] = []
    if not states:
        out.append(unknown("imex", "node", "IMEX daemon state not reported (nvidia-imex-ctl -q)"))
    elif states[0] == "READY":
        out.append(ok("imex", "node", state="READY"))
    elif states[0] in _COMING_UP:
        out.append(warn("imex", "node", f"IMEX daemon {states[0]}: multi-node NVLink jobs cannot start here yet",
                        state=states[0]))
    else:
        out.append(fail("imex", "node", f"IMEX daemon {states[0]}: the NVLink domain's memory is not shared here",
                        Action.DRAIN, state=states[0]))
    domain = [s.label("state") for s in ctx.samples("imex_domain_state_info")]
    nodes = {s.label("status"): int(s.value) for s in ctx.samples("imex_domain_nodes")}
    if domain and domain[0] != "UP":
        others = ", ".join(f"{n} {st}" for st, n in sorted(nodes.items()) if st != "READY") or "none listed"
        out.append(warn("imex", "domain", f"IMEX domain {domain[0]} (nodes not READY: {others})",
                        state=domain[0], nodes=" ".join(f"{st}={n}" for st, n in sorted(nodes.items()))))
    elif domain:
        out.append(ok("imex", "domain", state="UP", nodes=" ".join(f"{st}={n}" for st, n in sorted(nodes.items()))))
    return out
