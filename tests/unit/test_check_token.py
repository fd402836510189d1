"""`podhealth check --node NAME` on the aggregator's host: the node's agent token is derived from
the aggregator's own config (/etc/podhealth/aggregator.yaml), which is not the agent config
`check` reads by default."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from podhealth import credentials
from podhealth.checks.cli import cmd_check
from podhealth.config import Config

SECRET = "0123456789abcdef" * 4


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in ("PODHEALTH_TOKEN", "PODHEALTH_AGENT_TOKEN", "PODHEALTH_CLUSTER_SECRET"):
        monkeypatch.delenv(var, raising=False)
    # this user's key ring (credentials.user_key) is where every `agent --simulate` on the machine
    # leaves a key: an earlier test's dgx07 must not answer for this one
    monkeypatch.setenv("PODHEALTH_SIM_DIR", str(tmp_path / "sim"))


def _args(config: str | None = None, token: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(config=config, token=token)


def _head_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> Path:
    path = tmp_path / "aggregator.yaml"
    path.write_text(text)
    monkeypatch.setattr(cmd_check, "AGGREGATOR_CONFIG", str(path))
    return path


def test_without_config_the_aggregators_own_config_gives_the_nodes_agent_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret_file = tmp_path / "cluster.secret"
    secret_file.write_text(SECRET + "\n")
    _head_config(tmp_path, monkeypatch, f"aggregator:\n  auth:\n    cluster_secret_file: {secret_file}\n")
    want = credentials.derive_agent_token(SECRET, "dgx07")
    assert cmd_check._token(_args(), Config(), "dgx07") == want
    assert want != credentials.derive_agent_token(SECRET, "dgx08")
    assert cmd_check._token(_args(token="given"), Config(), "dgx07") == "given"  # --token wins
    # an explicit --config is the one asked; the local check (no --node) presents no node's token
    assert cmd_check._token(_args(config=str(tmp_path / "other.yaml")), Config(), "dgx07") == ""
    assert cmd_check._token(_args(), Config(), "") == ""


def test_no_aggregator_config_means_no_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cmd_check, "AGGREGATOR_CONFIG", str(tmp_path / "absent.yaml"))
    assert cmd_check._token(_args(), Config(), "dgx07") == ""


def test_a_broken_aggregator_config_is_one_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _head_config(tmp_path, monkeypatch, "aggregator:\n  auth:\n    cluster_secret_file: /nonexistent/secret\n")
    with pytest.raises(cmd_check.CheckError, match="/nonexistent/secret"):
        cmd_check._token(_args(), Config(), "dgx07")
    path.write_text("aggregator:\n  auth: [not, a, map]\n")
    with pytest.raises(cmd_check.CheckError, match="aggregator.yaml"):
        cmd_check._token(_args(), Config(), "dgx07")
