"""Small constructors so each check reads as its rule, not as CheckResult plumbing."""

from __future__ import annotations

from podhealth.vocab import Action, CheckResult, Status, evidence_of


def ok(check: str, entity: str = "node", summary: str = "", **evidence: object) -> CheckResult:
    return CheckResult(check, Status.OK, entity, evidence_of(**evidence), Action.NONE, summary=summary)


def warn(check: str, entity: str, summary: str, action: Action = Action.NONE, **evidence: object) -> CheckResult:
    return CheckResult(check, Status.WARN, entity, evidence_of(**evidence), action, summary=summary)


def fail(check: str, entity: str, summary: str, action: Action, **evidence: object) -> CheckResult:
    return CheckResult(check, Status.FAIL, entity, evidence_of(**evidence), action, summary=summary)


def unknown(check: str, entity: str, summary: str, **evidence: object) -> CheckResult:
    return CheckResult(check, Status.UNKNOWN, entity, evidence_of(**evidence), Action.NONE, summary=summary)
