"""`podhealth config show --effective`: what the site's policy makes of the shipped decisions.

Pure text from data: the shipped catalogs and profiles (read as data, as core/config.py reads the
profile names), the site's config, and config_policy.apply_code, the one statement of what a code
policy does. A node's site profile file or checks.overrides may move a threshold further; the
agent's evidence names the value it judged with.
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from podhealth import yamldata
from podhealth.config import Config
from podhealth.config_policy import SITE_PREFIX, CodePolicy, apply_code


def _catalog(name: str, key: str) -> dict[int, Mapping[str, Any]]:
    return {int(d["code"]): d for d in yamldata.shipped(name)[key]}


def _code(entry: Mapping[str, Any], p: CodePolicy) -> dict[str, str]:
    action, severity = str(entry.get("action", "NONE")), str(entry.get("severity", "info"))
    out = {"catalog": f"{action} {severity}", "site": p.describe()}
    if p.count is not None:
        a1, s1 = apply_code(action, severity, p, p.count)
        a0, s0 = apply_code(action, severity, p, p.count - 1)
        out["effective"] = f"{a1} {s1} from {p.count} incidents, else {a0} {s0}"
    else:
        a, s = apply_code(action, severity, p, 1)
        out["effective"] = f"{a} {s}"
    return out


def profile_thresholds(profile: str) -> dict[str, float]:
    raw = yamldata.shipped("profiles.yaml")
    return {**raw["defaults"]["thresholds"], **((raw["profiles"].get(profile) or {}).get("thresholds") or {})}


def effective(cfg: Config) -> dict[str, Any]:
    pol = cfg.checks.policy
    out: dict[str, Any] = {}
    if pol.xid:
        cat = _catalog("xid_catalog.yaml", "xids")
        out["xid"] = {c: _code(cat[c], p) for c, p in sorted(pol.xid.items())}
    if pol.sxid:
        cat = _catalog("sxid_catalog.yaml", "sxids")
        out["sxid"] = {c: _code(cat[c], p) for c, p in sorted(pol.sxid.items())}
    if pol.thresholds:
        shipped = profile_thresholds(cfg.node.profile)
        out["thresholds"] = {k: {"profile": shipped.get(k), "site": v} for k, v in sorted(pol.thresholds.items())}
    if cfg.checks.site:
        out["site_checks"] = {
            SITE_PREFIX + n: {"argv": list(sc.argv), "every": f"{sc.interval:g}s", "timeout": f"{sc.timeout:g}s",
                              "user": sc.user, "enabled": sc.enabled,
                              "a FAIL asks for": sc.action if sc.action != "NONE" else "nothing: shown as WARN",
                              "damping": "immediate" if sc.immediate else
                              f"{max(sc.consecutive, cfg.checks.damping.fail_after)} runs"}
            for n, sc in cfg.checks.site.items()}
    return out


def render(cfg: Config) -> str:
    doc = effective(cfg)
    head = ("# the site's policy over what podhealth ships (checks.policy, checks.site)\n"
            "# severity: critical = FAIL (may fence), warning = WARN, info = OK; a catalog workflow\n"
            "# (XID 13/31 spread, 48 with 63/64, 154) may ask less than the code's entry before the policy applies\n")
    if not doc:
        return head + "# none: the shipped catalogs, thresholds and checks apply as they are\n"
    return head + yaml.safe_dump({"effective": doc}, sort_keys=False, width=120)
