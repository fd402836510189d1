"""Alert rules and the Alertmanager example, checked by the real promtool and amtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from podhealth import alertrules
from tests.conftest import REPO
from tests.harness.proc import need

RULES = REPO / "alerts" / "podhealth-rules.yml"
TESTS = REPO / "alerts" / "tests" / "podhealth-rules.test.yml"


def test_promtool_check_rules() -> None:
    r = subprocess.run([need("promtool"), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_promtool_unit_tests_pass() -> None:
    r = subprocess.run([need("promtool"), "test", "rules", TESTS.name], cwd=TESTS.parent,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alerts = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    fires: set[str] = set()
    quiet: set[str] = set()
    for t in yaml.safe_load(TESTS.read_text())["tests"]:
        for case in t.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
    assert set(alerts) - fires == set(), "alerts never shown firing"
    assert set(alerts) - quiet == set(), "alerts never shown quiet"
    for name, rule in alerts.items():
        ann = rule.get("annotations", {})
        assert ann.get("runbook_url", "").endswith(".md"), name
        runbook = REPO / "alerts" / "runbooks" / Path(ann["runbook_url"]).name
        assert runbook.exists(), f"{name}: {runbook} missing"
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert "summary" in ann and "description" in ann, name


def test_amtool_check_config() -> None:
    r = subprocess.run([need("amtool"), "check-config", str(REPO / "alerts" / "alertmanager.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


# Where each severity goes (alertmanager.yml); podhealth's node-scoped alerts also reach the
# aggregator, a site's alert with a node label does not.
ROUTES = {
    ("alertname=PodhealthGPULost", "severity=critical", "node=dgx01"): "podhealth-aggregator,pager",
    ("alertname=PodhealthIBPortDegraded", "severity=warning", "node=dgx01"): "podhealth-aggregator,ticket",
    ("alertname=PodhealthGPUXidRate", "severity=info", "node=dgx01"): "podhealth-aggregator,none",
    ("alertname=SiteDiskFull", "severity=critical", "node=dgx01"): "pager",
    ("alertname=NodeFilesystemAlmostOutOfSpace", "severity=warning", "node=dgx01"): "ticket",
    ("severity=critical",): "pager",
    ("severity=warning",): "ticket",
    ("severity=info",): "none",
}


@pytest.mark.parametrize("labels", sorted(ROUTES), ids=" ".join)
def test_amtool_routes_each_severity(labels: tuple[str, ...]) -> None:
    want = ROUTES[labels]
    r = subprocess.run([need("amtool"), "config", "routes", "test", "--config.file",
                        str(REPO / "alerts" / "alertmanager.yml"), f"--verify.receivers={want}", *labels],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"{labels}: want {want}, got {r.stdout.strip()} {r.stderr.strip()}"


def test_amtool_route_test_can_fail() -> None:
    r = subprocess.run([need("amtool"), "config", "routes", "test", "--config.file",
                        str(REPO / "alerts" / "alertmanager.yml"), "--verify.receivers=pager", "severity=warning"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stdout


def test_every_rule_severity_has_a_route() -> None:
    """A severity the rules use but alertmanager.yml does not route would fall to the default."""
    am = yaml.safe_load((REPO / "alerts" / "alertmanager.yml").read_text())
    routed = {m.split("=", 1)[1].strip('"') for r in am["route"]["routes"] for m in r.get("matchers", [])
              if m.startswith("severity=")}
    used = {r["labels"]["severity"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
            if "alert" in r}
    assert used <= routed, used - routed


def test_rules_for_a_site_pass_promtool(tmp_path: Path) -> None:
    """The generator's output for another job and runbook host is still valid, and selects what it was told."""
    out = tmp_path / "rules.yml"
    out.write_text(alertrules.render(RULES.read_text(), 'job=~"podhealth-.*",cluster="a"', "https://wiki.example/rb"))
    r = subprocess.run([need("promtool"), "check", "rules", str(out)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    rules = [r for g in yaml.safe_load(out.read_text())["groups"] for r in g["rules"]]
    ups = [r["expr"] for r in rules if "up{" in r["expr"] and "sum_over_time(up[" not in r["expr"]]
    assert ups and all('up{job=~"podhealth-.*",cluster="a"}' in e for e in ups), ups
    assert all(r["annotations"]["runbook_url"].startswith("https://wiki.example/rb/") for r in rules if "alert" in r)
