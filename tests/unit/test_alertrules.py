"""The alert rules for a site's scrape job and runbook host (core/alertrules.py, `podhealth assets export`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from podhealth import alertrules
from tests.conftest import REPO

RULES = REPO / "alerts" / "podhealth-rules.yml"
SITE_SEL = 'job=~"podhealth.*",cluster="a"'
SITE_URL = "https://wiki.example/podhealth"

RULE = """groups:
  - name: g
    rules:
      - alert: A
        expr: up{job="podhealth"} == 0
        labels: {severity: critical}
        annotations:
          runbook_url: https://github.com/podhealth/podhealth/blob/main/alerts/runbooks/agent.md
"""


def rules_of(text: str) -> list[dict[str, object]]:
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"]]


def test_committed_rules_are_the_default_output() -> None:
    text = RULES.read_text()
    assert alertrules.render(text) == text


def test_site_values_replace_every_default_and_nothing_else() -> None:
    text = RULES.read_text()
    out = alertrules.render(text, SITE_SEL, SITE_URL)
    assert alertrules.DEFAULT_JOB_SELECTOR not in out
    assert alertrules.DEFAULT_RUNBOOK_BASE not in out
    before, after = rules_of(text), rules_of(out)
    assert len(before) == len(after)
    for b, a in zip(before, after):
        assert a["expr"] == str(b["expr"]).replace(alertrules.DEFAULT_JOB_SELECTOR, SITE_SEL)
        if "alert" in b:
            name = Path(b["annotations"]["runbook_url"]).name  # type: ignore[index]
            assert a["annotations"]["runbook_url"] == f"{SITE_URL}/{name}"  # type: ignore[index]
            assert a["labels"] == b["labels"]
    # the agent-down and no-agent alerts are the ones that select on the scrape job
    selecting = {str(r["alert"]) for r in after if SITE_SEL in str(r["expr"])}
    assert {"PodhealthAgentDown", "PodhealthAgentsAbsent"} <= selecting


@pytest.mark.parametrize("selector", ["podhealth", "{job=\"podhealth\"}", 'cluster="a"', 'job="a" or vector(1)',
                                      'job=~"a', ""])
def test_bad_selectors_are_refused(selector: str) -> None:
    with pytest.raises(alertrules.RulesError, match="--job-selector"):
        alertrules.render(RULE, selector)


@pytest.mark.parametrize("url", ["wiki/rb", "ftp://x/rb", "https://", "https://a b/"])
def test_bad_runbook_urls_are_refused(url: str) -> None:
    with pytest.raises(alertrules.RulesError, match="--runbook-url"):
        alertrules.render(RULE, runbook_base=url)


def test_a_rule_that_selects_the_job_another_way_is_refused() -> None:
    # It would keep job="podhealth-agent" whatever the site asked for: render() says so instead.
    with pytest.raises(alertrules.RulesError, match="podhealth-agent"):
        alertrules.render(RULE.replace('job="podhealth"', 'job="podhealth-agent"'), SITE_SEL)


def test_a_runbook_elsewhere_is_refused() -> None:
    with pytest.raises(alertrules.RulesError, match="runbook_url not under"):
        alertrules.render(RULE.replace("https://github.com/podhealth/podhealth/blob/main/alerts/runbooks/",
                                       "https://example.com/"), SITE_SEL)


def test_the_default_selector_in_a_comment_is_refused() -> None:
    with pytest.raises(alertrules.RulesError, match="outside rule expressions"):
        alertrules.render("# scrape job=\"podhealth\"\n" + RULE, SITE_SEL)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "assets", *args], capture_output=True, text=True,
                          timeout=60, cwd=REPO)


def test_assets_export_writes_the_site_rules(tmp_path: Path) -> None:
    r = cli("export", str(tmp_path / "out"), "--job-selector", SITE_SEL, "--runbook-url", SITE_URL)
    assert r.returncode == 0, r.stderr
    got = (tmp_path / "out" / "alerts" / "podhealth-rules.yml").read_text()
    assert got == alertrules.render(RULES.read_text(), SITE_SEL, SITE_URL)
    # the runbooks the URLs point at are exported beside them
    names = {Path(str(r["annotations"]["runbook_url"])).name for r in rules_of(got) if "alert" in r}  # type: ignore[index]
    assert names and all((tmp_path / "out" / "alerts" / "runbooks" / n).is_file() for n in names)


def test_assets_export_refuses_a_bad_selector_and_writes_nothing(tmp_path: Path) -> None:
    r = cli("export", str(tmp_path / "out"), "--job-selector", "podhealth")
    assert r.returncode == 64, r.stderr
    assert "--job-selector 'podhealth'" in r.stderr
    assert not (tmp_path / "out").exists()


# Counters whose series are born with their first event, at 1 (a label set nobody can know
# before: GPU x XID code, errno, check x action).
BORN = re.compile(r"increase\(((?:podhealth_xid_events|podhealth_sxid_events|podhealth_publish_spool_errors|"
                  r"podhealth_aggregator_fences|podhealth_aggregator_ingest_throttled)_total(?:\{[^}]*\})?)\[(\w+)\]\)")


def shipped_exprs() -> list[tuple[str, str]]:
    out = [(str(r.get("alert") or r.get("record")), str(r["expr"])) for r in rules_of(RULES.read_text())]
    for board in sorted((REPO / "dashboards").glob("*.json")):
        for p in json.loads(board.read_text())["panels"]:
            out += [(f"{board.stem} / {p['title']}", t["expr"]) for t in p.get("targets", [])]
    return out


def test_every_increase_over_a_born_counter_counts_its_first_appearance() -> None:
    found, bare = 0, []
    for where, expr in shipped_exprs():
        for m in BORN.finditer(expr):
            found += 1
            if alertrules.first_event_increase(m.group(1), m.group(2)) not in expr:
                bare.append(f"{where}: {m.group(0)}")
    assert found >= 7, found  # the XID rule and panels, fences, the spool alerts
    assert not bare, "increase() reads 0 at the first event here:\n" + "\n".join(bare)


def test_the_check_finds_a_bare_increase() -> None:
    assert BORN.search('sum by (code) (increase(podhealth_xid_events_total{node=~"$node"}[10m]))')


def test_assets_export_rewrites_the_dashboards_job_selector(tmp_path: Path) -> None:
    # the "Scrape cost" panel queries Prometheus' own scrape series by job: empty on a site whose
    # agents are scraped as another job (the Kubernetes PodMonitor's) until export rewrote it
    import json

    r = cli("export", str(tmp_path / "out"), "--job-selector", SITE_SEL)
    assert r.returncode == 0, r.stderr
    board = json.loads((tmp_path / "out" / "dashboards" / "podhealth-self.json").read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    scrape = [e for e in exprs if e.startswith("scrape_duration_seconds")]
    assert scrape and all(SITE_SEL in e and 'job="podhealth"' not in e for e in scrape), scrape
    assert not any('job="podhealth"' in e for e in exprs)
    default = tmp_path / "default"
    assert cli("export", str(default)).returncode == 0
    assert (default / "dashboards" / "podhealth-self.json").read_bytes() == (REPO / "dashboards" / "podhealth-self.json").read_bytes()
