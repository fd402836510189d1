"""main()'s prologue (issue 30 §5): one config lookup for every command (--config, then
$PODHEALTH_CONFIG, then the command's default file when it exists, then the built-in defaults),
the default paths written once (core/cliconfig.py), and logs on stderr for every command."""

from __future__ import annotations

import argparse
import ast
import io
import json
from pathlib import Path

import pytest
import structlog

from podhealth import cli, cliconfig, log
from tests.conftest import REPO


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(cliconfig.ENV, raising=False)


def test_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = tmp_path / "podhealth.yaml"
    assert cliconfig.locate(None, str(default)) is None  # absent default: built-in defaults
    default.write_text("{}\n")
    assert cliconfig.locate(None, str(default)) == str(default)
    monkeypatch.setenv(cliconfig.ENV, "/from/env.yaml")
    assert cliconfig.locate(None, str(default)) == "/from/env.yaml"
    assert cliconfig.locate("/given.yaml", str(default)) == "/given.yaml"
    assert cliconfig.locate(None, str(default), env={}) == str(default)


def _parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    out: dict[tuple[str, ...], argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        out[path] = p
        for s in [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]:
            for name, sp in s.choices.items():
                walk(sp, (*path, name))
    walk(cli.build_parser(), ())
    return out


def test_every_config_option_uses_the_one_lookup() -> None:
    with_config = {path: p for path, p in _parsers().items() if any("--config" in a.option_strings for a in p._actions)}
    assert len(with_config) >= 9
    for path, p in with_config.items():
        default = p.get_default("config_default")
        assert default in (cliconfig.AGENT_CONFIG, cliconfig.AGGREGATOR_CONFIG), path
    assert with_config[("aggregator",)].get_default("config_default") == cliconfig.AGGREGATOR_CONFIG
    assert with_config[("fleet",)].get_default("config_default") == cliconfig.AGGREGATOR_CONFIG
    assert with_config[("check",)].get_default("config_default") == cliconfig.AGENT_CONFIG


def test_main_resolves_the_config_before_the_command_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[argparse.Namespace] = []
    from podhealth.checks.cli import cmd_check

    monkeypatch.setattr(cmd_check, "run", lambda args: seen.append(args) or 0)
    monkeypatch.setenv(cliconfig.ENV, str(tmp_path / "env.yaml"))
    assert cli.main(["check"]) == 0
    assert seen[-1].config == str(tmp_path / "env.yaml") and seen[-1].config_chosen
    monkeypatch.delenv(cliconfig.ENV)
    assert cli.main(["check", "--config", "x.yaml"]) == 0
    assert seen[-1].config == "x.yaml"


def test_the_default_paths_are_written_once() -> None:
    # "/etc/podhealth/podhealth.yaml" as a string literal lives in core/cliconfig.py only (help
    # texts and docstrings aside): a second copy is how `check` and `profile` came to disagree.
    hits = []
    for folder in ("core", "agent", "aggregator", "checks", "sim", "collectors", "fencing"):
        for path in (REPO / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and node.value in (cliconfig.AGENT_CONFIG, cliconfig.AGGREGATOR_CONFIG):
                    hits.append(str(path.relative_to(REPO)))
    assert sorted(set(hits)) == ["core/cliconfig.py"], hits


def test_logs_go_to_stderr_and_log_level_works_after_the_command(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from podhealth.checks.cli import cmd_check

    def noisy(args: argparse.Namespace) -> int:
        log.get("podhealth.test").info("a log line")
        print(json.dumps({"ok": True}))
        return 0
    monkeypatch.setattr(cmd_check, "run", noisy)
    try:
        assert cli.main(["check", "--log-level", "info", "--format", "json"]) == 0
        out, err = capsys.readouterr()
        assert json.loads(out) == {"ok": True}
        assert "a log line" in err
        assert cli.main(["check", "--format", "json"]) == 0  # default warning: info is dropped
        out, err = capsys.readouterr()
        assert json.loads(out) == {"ok": True} and "a log line" not in err
    finally:
        log.setup("warning", "auto", io.StringIO())
        structlog.reset_defaults()
