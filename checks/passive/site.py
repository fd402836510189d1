"""A site check's verdict from its program's last run (collectors/site.py), within what the
site's config lets it ask for.

The exit code decides, as in node-problem-detector and Base Command Manager: 0 OK, 1 FAIL,
2 UNKNOWN; any other code, a timeout, a kill or a program that cannot start is UNKNOWN (never
FAIL: a broken probe must not fence a node). UNKNOWN only where the answer could change the
action: for a check that may only warn, an answer it cannot give is a WARN, with why in the
evidence. A FAIL asks for the action on the program's JSON
line, capped at the config's `action`; with no action configured (`NONE`, the default) a FAIL is
shown as WARN, with what the program asked for in the evidence: a site's script fences only where
its config says it may. Damping, grace and staleness are the engine's, as for built-in rules.
"""

from __future__ import annotations

from podhealth.checks.passive.context import Context
from podhealth.config_policy import SITE_PREFIX, SiteCheckConfig
from podhealth.vocab import MAX_EVIDENCE_ITEMS, Action, CheckResult, ProgramReport, Status, evidence_of


def judge(name: str, cfg: SiteCheckConfig, ctx: Context) -> list[CheckResult]:
    check = SITE_PREFIX + name
    st = ctx.snapshot.collectors.get(check)
    if st is None or not st.reports:
        return [CheckResult(check, Status.UNKNOWN, "node", summary="the program has not reported yet")]
    r = st.reports[-1]
    entity = r.entity or "node"
    ev: dict[str, object] = {"exit": "none" if r.exit_code is None else r.exit_code,
                             "program": cfg.argv[0], "ran_as": r.ran_as, "seconds": f"{r.duration:.3f}"}
    if r.problem:
        ev["problem"] = r.problem
    summary = r.summary or f"{cfg.argv[0]} exited {r.exit_code}"
    allowed = Action(cfg.action)
    if r.exit_code is None:
        return [_uncertain(check, allowed, entity, f"{cfg.argv[0]}: {r.problem or 'no exit status'}", ev, r)]
    if r.exit_code == 0:
        return [_result(check, Status.OK, entity, summary, ev, r)]
    if r.exit_code == 2:
        return [_uncertain(check, allowed, entity, summary, ev, r)]
    if r.exit_code != 1:
        return [_uncertain(check, allowed, entity, f"exit code {r.exit_code} is not 0/1/2 (OK/FAIL/UNKNOWN): {summary}",
                           ev, r)]
    asked = _asked(r, allowed, ev)
    if allowed is Action.NONE:
        ev["held"] = f"FAIL {asked.value}"
        ev["policy"] = f"checks.site.{name}.action is NONE: this check warns only"
        return [_result(check, Status.WARN, entity, f"{summary} (FAIL shown as WARN: no action configured)", ev, r)]
    if asked.rank > allowed.rank:
        ev["capped"] = f"asked {asked.value}, checks.site.{name}.action allows {allowed.value}"
        asked = allowed
    return [_result(check, Status.FAIL, entity, summary, ev, r, asked)]


def _uncertain(check: str, allowed: Action, entity: str, summary: str, ev: dict[str, object],
               r: ProgramReport) -> CheckResult:
    """UNKNOWN where the answer could change the action; a check that may only warn can at worst
    be a WARN, so that is its answer, with the uncertainty in the evidence (a broken warn-only
    script must not block a handover the way a check that could fence does)."""
    if allowed is not Action.NONE:
        return _result(check, Status.UNKNOWN, entity, summary, ev, r)
    ev = {**ev, "uncertain": "the program could not tell; this check only warns, so WARN is the worst it could be"}
    return _result(check, Status.WARN, entity, f"could not tell: {summary}", ev, r)


def _asked(r: ProgramReport, allowed: Action, ev: dict[str, object]) -> Action:
    """The action the JSON line names (the configured one when it names none or NONE)."""
    if not r.action or r.action == "NONE":
        return allowed
    try:
        return Action(r.action)
    except ValueError:
        ev["problem"] = "; ".join(p for p in (str(ev.get("problem", "")), f"unknown action {r.action[:32]!r} (ignored)") if p)
        return allowed


def _result(check: str, status: Status, entity: str, summary: str, ev: dict[str, object], r: ProgramReport,
            action: Action = Action.NONE) -> CheckResult:
    """podhealth's evidence first, then the program's (bounded; podhealth's keys win)."""
    out = dict(ev)
    for k, v in r.evidence:
        if len(out) >= MAX_EVIDENCE_ITEMS:
            break
        out.setdefault(k, v)
    return CheckResult(check, status, entity, evidence_of(**out), action, summary=summary[:200])
