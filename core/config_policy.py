"""A site's own checks and policy, in config: `checks.site` (programs the agent runs) and
`checks.policy` (per-code XID/SXid decisions and rule thresholds over what podhealth ships).

The schema lives here, in core, so `podhealth config check` refuses a wrong code, action or
threshold with file:line like any other key; the codes and threshold names are read as data from
checks/data (the XID/SXid catalogs, profiles.yaml), as core/config.py reads the profile names.
`apply_code` is the one statement of what a code policy does to a verdict: checks/passive/xid.py
applies it to every finding and `podhealth config show --effective` prints it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Annotated, Literal, Mapping

from podhealth import yamldata
from podhealth.configload import Ge, Gt, Seconds, doc
from podhealth.vocab import Action

if TYPE_CHECKING:
    ActionName = str
else:
    ActionName = Literal[tuple(a.value for a in Action)]

Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[str, ...] = ("info", "warning", "critical")
SITE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,39}$")
SITE_PREFIX = "site_"  # a site check's verdicts are named site_<name>: never a built-in check's name


@dataclass(frozen=True)
class SiteCheckConfig:
    argv: tuple[str, ...] = doc(
        "The program and its arguments, run without a shell; argv[0] is an absolute path.", ())
    interval: Seconds = doc("Seconds between runs.", 60.0)
    timeout: Seconds = doc("Seconds a run may take; then its process group is killed and the verdict is UNKNOWN.", 10.0)
    env: Mapping[str, str] = doc(
        "Environment of the program (nothing of the agent's is passed on; PATH, and\n"
        "PODHEALTH_SYSFS_ROOT / PODHEALTH_PROCFS_ROOT / PODHEALTH_NODE from the agent, are set unless given here).",
        factory=dict)
    user: str = doc("Run as this user when the agent runs as root (name or uid); elsewhere as the agent's user.",
                    "nobody")
    action: ActionName = doc(
        "The most a FAIL (exit 1) may ask for: NONE = the check only warns (a FAIL is shown as WARN);\n"
        "DRAIN / REBOOT / ... = it may fence. An action on the program's JSON line is capped to this.", "NONE")
    consecutive: Annotated[int, Ge(0, "a count")] = doc(
        "Consecutive failing runs before it shows (0 = checks.damping.fail_after).", 0)
    immediate: bool = doc("Show a FAIL at once and never hold it in the boot/driver grace (like rules.yaml immediate).",
                          False)
    max_output: Annotated[int, Gt(0, "bytes")] = doc("Bytes of stdout / stderr read per run (the rest is dropped).",
                                                     65536)
    enabled: bool = doc("Run this check.", True)

    def validate(self) -> tuple[str, str] | None:
        if not self.argv:
            return ("argv", "expected the program's argv (a list whose first item is an absolute path), got none")
        if not self.argv[0].startswith("/"):
            return ("argv", f'expected an absolute path as argv[0] (no shell, no PATH search), got "{self.argv[0]}"')
        if self.timeout > self.interval:
            return ("timeout", f"expected seconds <= interval ({self.interval:g}), got {self.timeout:g}")
        if self.immediate and self.consecutive:
            return ("immediate", "immediate and consecutive contradict each other: give one")
        for k in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                return (f"env.{k}", "expected an environment variable name")
        return None


@dataclass(frozen=True)
class CodePolicy:
    action: ActionName | None = doc(
        "What the code asks for when it fails (replaces the catalog's action); null = the catalog's.", None)
    fence: Literal["catalog", "never", "now"] = doc(
        "catalog: the catalog decides whether it fails; never: at most WARN (shown with its action);\n"
        "now: FAIL at the first incident, asking for `action` (DRAIN when neither it nor the catalog names one).",
        "catalog")
    count: Annotated[int, Ge(1, "a count")] | None = doc(
        "FAIL once this many incidents (bursts of lines) of the code hit one GPU / switch within `window`;\n"
        "fewer are at most WARN.", None)
    window: Seconds | None = doc("Seconds `count` is counted over (null = checks.rate_window).", None)

    def validate(self) -> tuple[str, str] | None:
        if self.fence == "never" and self.count is not None:
            return ("count", "fence: never and a count contradict each other: give one")
        if self.fence == "now" and self.count is not None:
            return ("count", "fence: now fails at the first incident; a count says when instead: give one")
        if self.window is not None and self.count is None:
            return ("window", "a window needs a count")
        if self.action is None and self.fence == "catalog" and self.count is None:
            return ("action", "states nothing: give action, fence or count")
        return None

    def describe(self) -> str:
        parts = [f"fence {self.fence}"] if self.fence != "catalog" else []
        if self.count is not None:
            parts.append(f"{self.count} in {self.window:g}s" if self.window else f"{self.count} in the rate window")
        if self.action is not None:
            parts.append(f"action {self.action}")
        return ", ".join(parts)


@lru_cache(maxsize=1)
def catalog_codes() -> tuple[frozenset[int], frozenset[int]]:
    """(XID codes, SXid codes) of the shipped catalogs."""
    x = frozenset(int(d["code"]) for d in yamldata.shipped("xid_catalog.yaml")["xids"])
    s = frozenset(int(d["code"]) for d in yamldata.shipped("sxid_catalog.yaml")["sxids"])
    return x, s


@lru_cache(maxsize=1)
def shipped_thresholds() -> Mapping[str, float]:
    """The rule thresholds every profile starts from (profiles.yaml defaults.thresholds)."""
    return dict(yamldata.shipped("profiles.yaml")["defaults"]["thresholds"])


@dataclass(frozen=True)
class PolicyConfig:
    xid: Mapping[int, CodePolicy] = doc(
        "Per XID code: the site's decision over NVIDIA's catalog (checks/data/xid_catalog.yaml),\n"
        "e.g. {31: {count: 3, window: 3600, action: RESET_GPU}, 63: {fence: never}, 94: {fence: now, action: DRAIN}}.",
        factory=dict)
    sxid: Mapping[int, CodePolicy] = doc("Per NVSwitch SXid code, the same (checks/data/sxid_catalog.yaml).",
                                         factory=dict)
    thresholds: Mapping[str, float] = doc(
        "Rule thresholds over the profile's (profiles.yaml `thresholds`), e.g. {gpu_temp_warn_c: 80};\n"
        "a verdict a site threshold changed says so in its evidence.", factory=dict)

    def validate(self) -> tuple[str, str] | None:
        xids, sxids = catalog_codes()
        for what, table, known in (("xid", self.xid, xids), ("sxid", self.sxid, sxids)):
            for code in table:
                if code not in known:
                    return (f"{what}.{code}", f"{'XID' if what == 'xid' else 'SXid'} {code} is not in the shipped "
                            f"catalog (checks/data/{what}_catalog.yaml)")
        names = shipped_thresholds()
        for key in self.thresholds:
            if key not in names:
                return (f"thresholds.{key}", f"unknown threshold (known: {', '.join(sorted(names))})")
        return None

    def __bool__(self) -> bool:
        return bool(self.xid or self.sxid or self.thresholds)


def apply_code(action: str, severity: str, policy: CodePolicy, incidents: int) -> tuple[str, str]:
    """(action, severity) of a finding after the site's policy for its code; `incidents` are the
    code's incidents on that entity within the policy's window. Pure; the one statement of it."""
    if policy.action is not None:
        action = policy.action
    wanted = action if action != "NONE" else "DRAIN"
    if policy.fence == "never":
        return action, "warning" if severity == "critical" else severity
    if policy.fence == "now":
        return wanted, "critical"
    if policy.count is not None:
        if incidents >= policy.count:
            return wanted, "critical"
        return action, "warning" if severity == "critical" else severity
    return action, severity
