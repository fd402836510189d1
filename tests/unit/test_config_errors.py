"""`podhealth config check` reports every error in a file (each naming file, line and key), and
the optional packages (pip extras) a config turns on but this install lacks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podhealth import config, configload, extras

pytestmark = pytest.mark.timeout(120)

BAD = """\
listen:
  port: nope
collectors:
  nfs:
    interval: 10
    timeout: abc
  bogus: 1
aggregator:
  caps:
    max_fenced: many
  nodes:
    - name: dgx01
    - name: dgx01
      colour: red
exporters:
  influxdb:
    enabled: maybe
"""

WANT = [
    'agent.yaml:2: listen.port: expected a port >= 0 and a port <= 65535, got "nope"',
    'agent.yaml:6: collectors.nfs.timeout: expected seconds > 0, got "abc"',
    "agent.yaml:7: collectors.bogus: unknown key (known: ",
    'agent.yaml:10: aggregator.caps.max_fenced: expected a count >= 0, got "many"',
    "agent.yaml:14: aggregator.nodes[1].colour: unknown key (known: ",
    'agent.yaml:17: exporters.influxdb.enabled: expected true or false, got "maybe"',
]


def test_every_error_in_file_order() -> None:
    errors = configload.check_text(config.Config, BAD, "agent.yaml")
    assert len(errors) == len(WANT), [str(e) for e in errors]
    for e, want in zip(errors, WANT):
        assert str(e).startswith(want), (str(e), want)
    assert [e.line for e in errors] == [2, 6, 7, 10, 14, 17]


def test_the_single_error_api_still_raises_the_first() -> None:
    with pytest.raises(config.ConfigError) as e:
        config.loads(BAD, "agent.yaml")
    assert str(e.value) == WANT[0]
    assert configload.check_text(config.Config, "listen:\n  port: 9410\n", "ok.yaml") == []


def test_a_validate_problem_is_reported_once_the_fields_are_right() -> None:
    # the duplicate node is AggregatorConfig.validate()'s finding: it only runs on a mapping whose keys loaded
    text = "aggregator:\n  nodes:\n    - name: dgx01\n    - name: dgx01\n"
    errors = configload.check_text(config.Config, text, "a.yaml")
    assert [str(e) for e in errors] == ["a.yaml:3: aggregator.nodes: duplicate node dgx01"]


def test_yaml_syntax_error_is_one_error() -> None:
    errors = configload.check_text(config.Config, "listen: [\n", "x.yaml")
    assert len(errors) == 1 and "invalid YAML" in str(errors[0])


def test_cli_lists_them_all_and_exits_2(tmp_path: Path) -> None:
    f = tmp_path / "agent.yaml"
    f.write_text(BAD)
    r = subprocess.run([sys.executable, "-m", "podhealth", "config", "check", str(f)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == len(WANT) + 1 and lines[-1] == f"{f}: {len(WANT)} errors"
    assert all(line.startswith(want) for line, want in zip(lines, WANT))


# ---- extras ----------------------------------------------------------------------------------


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # import of kubernetes fails as if not installed
    with pytest.raises(extras.MissingExtra) as e:
        extras.require("kubernetes")
    assert isinstance(e.value, ImportError)
    assert str(e.value) == ("the Kubernetes fencer needs the kubernetes package, which is not installed: "
                            "pip install 'podhealth[kubernetes]'")
    extras.require("influx")  # installed here: no error


def test_needed_and_missing_follow_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = config.loads("exporters:\n  influxdb:\n    enabled: true\naggregator:\n  auth:\n    cluster_secret: "
                       "0123456789abcdef0123456789abcdef\n  fencers:\n    kubernetes:\n      enabled: true\n")
    assert extras.needed_by(cfg) == [("exporters.influxdb.enabled", "influx"),
                                     ("aggregator.fencers.kubernetes.enabled", "kubernetes")]
    assert extras.needed_by(config.Config()) == []
    assert extras.missing(cfg) == []
    monkeypatch.setitem(sys.modules, "influxdb_client", None)
    assert [(k, e.extra.name) for k, e in extras.missing(cfg)] == [("exporters.influxdb.enabled", "influx")]


def _without(tmp_path: Path, *modules: str) -> dict[str, str]:
    """An environment whose Python cannot import `modules` (a shadowing package that fails as a
    missing one does), for the commands run as subprocesses."""
    import os

    shadow = tmp_path / "shadow"
    for m in modules:
        (shadow / m).mkdir(parents=True)
        (shadow / m / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{m}'\", name={m!r})\n")
    return {**os.environ, "PYTHONPATH": f"{shadow}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_config_check_and_aggregator_say_which_extra_is_missing(tmp_path: Path) -> None:
    f = tmp_path / "podhealth.yaml"
    f.write_text("exporters:\n  influxdb:\n    enabled: true\naggregator:\n  auth:\n    cluster_secret: "
                 "0123456789abcdef0123456789abcdef\n  fencers:\n    kubernetes:\n      enabled: true\n")
    env = _without(tmp_path, "kubernetes", "influxdb_client")
    r = subprocess.run([sys.executable, "-m", "podhealth", "config", "check", str(f)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.splitlines()[:2] == [
        "podhealth.yaml:3: exporters.influxdb.enabled: InfluxDB export needs the influxdb-client package, "
        "which is not installed: pip install 'podhealth[influx]'",
        "podhealth.yaml:9: aggregator.fencers.kubernetes.enabled: the Kubernetes fencer needs the kubernetes "
        "package, which is not installed: pip install 'podhealth[kubernetes]'"]
    r = subprocess.run([sys.executable, "-m", "podhealth", "aggregator", "--config", str(f), "--db",
                        str(tmp_path / "agg.db"), "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and r.stderr.strip() == (
        "podhealth aggregator: aggregator.fencers.kubernetes.enabled: the Kubernetes fencer needs the kubernetes "
        "package, which is not installed: pip install 'podhealth[kubernetes]'")
    assert not (tmp_path / "agg.db").exists()  # refused before touching anything
