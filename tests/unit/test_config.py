from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podhealth import config
from podhealth.config import ConfigError


def _err(text: str) -> str:
    with pytest.raises(ConfigError) as ei:
        config.loads(text, "agent.yaml")
    return str(ei.value)


def test_defaults_round_trip() -> None:
    cfg = config.loads(config.default_yaml(), "default.yaml")
    assert cfg == config.Config()
    assert cfg.collectors.nfs.mounts[0].path == "/home"


def test_empty_document_is_all_defaults() -> None:
    assert config.loads("", "x.yaml") == config.Config()


@pytest.mark.parametrize(
    "text, message",
    [
        ("collectors:\n  nfs:\n    mounts:\n      - path: /home\n      - path: /x\n        timeout: abc\n",
         'agent.yaml:6: collectors.nfs.mounts[1].timeout: expected seconds > 0, got "abc"'),
        ("collectors:\n  nvml:\n    interval: -1\n", "agent.yaml:3: collectors.nvml.interval: expected seconds > 0, got -1"),
        ("collectors:\n  nvml:\n    intervall: 3\n", "agent.yaml:3: collectors.nvml.intervall: unknown key (known: detail, enabled, families, interval, timeout)"),
        ("listen:\n  port: 70000\n", "agent.yaml:2: listen.port: expected a port <= 65535, got 70000"),
        ("log:\n  level: loud\n", "agent.yaml:2: log.level: expected one of 'debug', 'info', 'warning', 'error', got \"loud\""),
        ("node:\n  profile: dgx-z9\n", "agent.yaml:2: node.profile: expected one of 'generic', 'dgx-a100', 'dgx-h100', 'dgx-h200', 'dgx-b200', 'hgx-h100', 'hgx-h200', 'h100-nvl', 'h100-pcie', 'l40s', 'gh200', 'gb200-nvl72', got \"dgx-z9\""),  # profiles.yaml's order
        ("paths:\n  sysfs_root: relative/sys\n", 'agent.yaml:2: paths.sysfs_root: expected an absolute path, got "relative/sys"'),
        ("collectors:\n  host:\n    enabled: maybe\n", 'agent.yaml:3: collectors.host.enabled: expected true or false, got "maybe"'),
        ("collectors:\n  nfs:\n    mounts: /home\n", 'agent.yaml:3: collectors.nfs.mounts: expected a list, got "/home"'),
        ("collectors:\n  nvml:\n    interval: 1\n    timeout: 60\n", "agent.yaml:4: collectors.nvml.timeout: expected seconds <= 10x interval (10), got 60"),
        ("listen: [\n", "agent.yaml:2: invalid YAML: expected the node content, but found '<stream end>'"),
        ("node: {}\nnode: {}\n", "agent.yaml:2: node: duplicate key"),
    ],
)
def test_errors_name_file_line_and_key(text: str, message: str) -> None:
    assert _err(text) == message


def test_models_are_frozen() -> None:
    cfg = config.Config()
    with pytest.raises(Exception):
        cfg.listen.port = 1  # type: ignore[misc]


def test_cli_default_then_check(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "podhealth", "config", "default"], capture_output=True, text=True, check=True)
    assert "# Seconds between collections." in out.stdout
    chk = subprocess.run([sys.executable, "-m", "podhealth", "config", "check", "-"], input=out.stdout,
                         capture_output=True, text=True)
    assert chk.returncode == 0, chk.stderr


def test_cli_broken_config_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "agent.yaml"
    bad.write_text("listen:\n  port: nope\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "config", "check", str(bad)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == 'agent.yaml:2: listen.port: expected a port >= 0 and a port <= 65535, got "nope"'


def test_nfs_probe_must_fit_in_the_collection() -> None:
    assert _err("collectors:\n  nfs:\n    timeout: 4\n") == (
        "agent.yaml:3: collectors.nfs.timeout: expected seconds > mounts[0].timeout (5), got 4: "
        "a hung mount must be reported as hung, not as a stale collector")
