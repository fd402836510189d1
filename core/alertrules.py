"""The shipped alert rules (alerts/podhealth-rules.yml) for a site's own scrape job and runbook host.

The committed file is the readable source and the default output at once: it selects the agents
with DEFAULT_JOB_SELECTOR and links runbooks under DEFAULT_RUNBOOK_BASE. `render()` swaps those two
for the site's values (`podhealth assets export --job-selector ... --runbook-url ...`,
deploy/kubernetes/monitoring/generate.py for the PodMonitor's job), so nobody edits the rules with
sed. The swap is checked, not blind: every `job` matcher in an expression must be the default
selector and every runbook_url must start with the default base, or render() refuses, so a new
rule written another way cannot silently keep the default.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

DEFAULT_JOB_SELECTOR = 'job="podhealth"'
DEFAULT_RUNBOOK_BASE = "https://github.com/podhealth/podhealth/blob/main/alerts/runbooks/"

# One PromQL label matcher: name, operator, double-quoted value (escapes allowed).
_MATCHER = r'[A-Za-z_][A-Za-z0-9_]*\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"'
_SELECTOR = re.compile(rf"^\s*{_MATCHER}(?:\s*,\s*{_MATCHER})*\s*$")
_JOB_MATCHER = re.compile(r'\bjob\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"')
_RUNBOOK_LINE = re.compile(r"^([ \t]*runbook_url:[ \t]*)(\S+)[ \t]*$", re.M)


def first_event_increase(counter: str, window: str) -> str:
    """PromQL for increase(counter[window]) that also counts a series' first appearance.

    podhealth's event counters (XIDs per GPU and code, spool errors per reason, the aggregator's
    fences per check) are born with their first event, at 1: increase() over a series that starts
    at 1 and stays there is 0, so the first XID 79, usually the only one, never shows. A series
    with fewer samples in the window than its target had successful scrapes (`up` summed) appeared
    during the window while its target was being scraped: all of its value is new. The `up`
    comparison keeps series that merely reappear (the target was down, Prometheus restarted) from
    counting their old totals again. Used by alerts/podhealth-rules.yml and dashboards/generate.py.
    """
    born = f"count_over_time({counter}[{window}]) < on (job, instance) group_left sum_over_time(up[{window}])"
    return f"(increase({counter}[{window}]) unless {born}) or ({counter} and {born})"


class RulesError(ValueError):
    """A selector or URL that cannot be used, or a rules file the swap cannot be checked on."""


def check_job_selector(selector: str) -> str:
    """The selector without surrounding blanks; RulesError unless it is one or more label
    matchers (`job="podhealth"`, `job=~"podhealth-.*",cluster="a"`) that select on `job`."""
    s = selector.strip()
    if not _SELECTOR.match(s):
        raise RulesError(f"--job-selector {selector!r}: expected PromQL label matchers such as "
                         f'job="podhealth" or job=~"podhealth.*",cluster="a" (no braces)')
    if not _JOB_MATCHER.search(s):
        raise RulesError(f"--job-selector {selector!r}: must match on the job label")
    return s


def check_runbook_base(url: str) -> str:
    """The base URL ending in `/` (runbook file names are appended); RulesError unless http(s)."""
    u = url.strip()
    if not re.match(r"^https?://[^\s/]+(/\S*)?$", u):
        raise RulesError(f"--runbook-url {url!r}: expected an http(s) URL of the folder holding the runbooks")
    return u if u.endswith("/") else u + "/"


def _rules(text: str) -> list[dict[str, Any]]:
    doc = yaml.safe_load(text)
    return [r for g in doc["groups"] for r in g["rules"]]


def _runbooks(rules: list[dict[str, Any]]) -> list[str]:
    return [str(r.get("annotations", {}).get("runbook_url", "")) for r in rules if "alert" in r]


def render(text: str, job_selector: str = DEFAULT_JOB_SELECTOR, runbook_base: str = DEFAULT_RUNBOOK_BASE) -> str:
    """The rules file `text` with the site's job selector and runbook base; comments and layout kept."""
    sel = check_job_selector(job_selector)
    base = check_runbook_base(runbook_base)
    rules = _rules(text)
    exprs = [str(r["expr"]) for r in rules]
    foreign = sorted({m for e in exprs for m in _JOB_MATCHER.findall(e) if m != DEFAULT_JOB_SELECTOR})
    if foreign:
        raise RulesError(f"rules select on job other than through {DEFAULT_JOB_SELECTOR}: {foreign}; "
                         "write the default selector so it can be replaced")
    in_exprs = sum(e.count(DEFAULT_JOB_SELECTOR) for e in exprs)
    if text.count(DEFAULT_JOB_SELECTOR) != in_exprs:
        raise RulesError(f"{DEFAULT_JOB_SELECTOR} appears outside rule expressions (a comment?): rename it there")
    stray = [u for u in _runbooks(rules) if not u.startswith(DEFAULT_RUNBOOK_BASE)]
    if stray:
        raise RulesError(f"runbook_url not under {DEFAULT_RUNBOOK_BASE}: {stray}")

    out = text.replace(DEFAULT_JOB_SELECTOR, sel)
    out = _RUNBOOK_LINE.sub(lambda m: m.group(1) + base + m.group(2).removeprefix(DEFAULT_RUNBOOK_BASE), out)
    # The result must still be the same rules: a selector holding `"` or `#` that YAML reads
    # differently would show here, not in Prometheus.
    got = _rules(out)
    if len(got) != len(rules) or sum(str(r["expr"]).count(sel) for r in got) != in_exprs:
        raise RulesError(f"--job-selector {job_selector!r} does not survive YAML quoting in the rules file")
    if not all(u.startswith(base) for u in _runbooks(got)):
        raise RulesError("a runbook_url is not a plain `runbook_url: URL` line: write it unquoted on one line")
    return out


def render_dashboard(text: str, job_selector: str = DEFAULT_JOB_SELECTOR) -> str:
    """A Grafana dashboard (JSON) with the site's job selector in its queries: the panels on
    Prometheus' own series about the scrape (`scrape_duration_seconds`, `up`) select the agents
    by job, and stayed empty on a site whose job is not `podhealth` (the Kubernetes PodMonitor's).
    Only `expr` strings change; the default selector returns `text` as it is."""
    import json

    sel = check_job_selector(job_selector)
    if sel == DEFAULT_JOB_SELECTOR:
        return text
    doc = json.loads(text)

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: (v.replace(DEFAULT_JOB_SELECTOR, sel) if k == "expr" and isinstance(v, str) else walk(v))
                    for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node
    return json.dumps(walk(doc), indent=2) + "\n"
