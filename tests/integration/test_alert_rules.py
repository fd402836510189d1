"""Alert rules and the Alertmanager example, checked by the real promtool and amtool."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

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
        assert rule["labels"]["severity"] in ("page", "ticket"), name
        assert "summary" in ann and "description" in ann, name


def test_amtool_check_config() -> None:
    r = subprocess.run([need("amtool"), "check-config", str(REPO / "alerts" / "alertmanager.yml")],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout
