"""Credentials: private files, `podhealth token`, install-units' modes."""

from __future__ import annotations

import grp
import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from podhealth import credentials
from podhealth.cli import main

SECRET = "unit-test-cluster-secret-0123456789"


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _private(p: Path) -> bool:
    """0600, or 0640 with the group podhealth (as root where that group exists)."""
    mode = _mode(p)
    return mode == 0o600 or (mode == 0o640 and grp.getgrgid(p.stat().st_gid).gr_name == credentials.SERVICE_GROUP)


def test_write_private_is_0600_even_over_a_world_readable_file(tmp_path: Path) -> None:
    p = tmp_path / "agent.yml"
    p.write_text("old")
    os.chmod(p, 0o644)
    credentials.write_private(p, "publish: {token: abc}\n")
    assert (p.read_text(), _mode(p)) == ("publish: {token: abc}\n", 0o600)
    assert [x.name for x in tmp_path.iterdir()] == ["agent.yml"]  # no temporary left behind
    # a group that does not exist leaves it the owner's alone
    credentials.write_private(p, "x", group="no-such-group-podhealth")
    assert _mode(p) == 0o600


def test_install_units_writes_config_and_environment_files_private(tmp_path: Path) -> None:
    assert main(["install-units", "--root", str(tmp_path), "--exe", "/usr/bin/podhealth"]) == 0
    for rel in ("etc/podhealth/podhealth.yaml", "etc/default/podhealth-agent", "etc/default/podhealth-aggregator"):
        assert _private(tmp_path / rel), rel
    assert _mode(tmp_path / "etc/systemd/system/podhealth-agent.service") == 0o644  # no secrets in units


def test_install_units_provisions_the_agent_key_closed_by_default(tmp_path: Path, monkeypatch: Any,
                                                                  capsys: Any) -> None:
    """Without a key the agent's handover, reset and bundle routes are closed and no hook can tell
    it from an impostor: install-units puts one in place, derived when the cluster secret is at
    hand, and keeps an existing one."""
    monkeypatch.delenv("PODHEALTH_CLUSTER_SECRET", raising=False)
    key = tmp_path / "a" / "etc/podhealth/agent.key"
    assert main(["install-units", "--root", str(tmp_path / "a"), "--exe", "/usr/bin/podhealth"]) == 0
    random_key = key.read_text().strip()
    assert _private(key) and len(random_key) == 64 and "token derive --agent" in capsys.readouterr().out
    assert main(["install-units", "--root", str(tmp_path / "a"), "--exe", "/usr/bin/podhealth"]) == 0
    assert key.read_text().strip() == random_key  # kept: replacing it would lock the aggregator out
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    key = tmp_path / "b" / "etc/podhealth/agent.key"
    assert main(["install-units", "--root", str(tmp_path / "b"), "--exe", "/usr/bin/podhealth",
                 "--node", "dgx07", "--secret-file", str(f)]) == 0
    assert key.read_text().strip() == credentials.derive_agent_token(SECRET, "dgx07") and _private(key)


def test_token_derive_prints_the_hmac_of_the_node(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    want = hmac.new(SECRET.encode(), b"podhealth-node:dgx01", hashlib.sha256).hexdigest()
    f = tmp_path / "secret"
    f.write_text(SECRET + "\n")
    assert main(["token", "derive", "--node", "dgx01", "--secret-file", str(f)]) == 0
    assert capsys.readouterr().out.strip() == want
    monkeypatch.setenv("PODHEALTH_CLUSTER_SECRET", SECRET)
    assert main(["token", "derive", "--node", "dgx01", "--node", "dgx02"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"dgx01 {want}", f"dgx02 {credentials.derive_node_token(SECRET, 'dgx02')}"]
    assert main(["token", "new"]) == 0 and len(capsys.readouterr().out.strip()) == 64
    # --out writes 0600 files (a shell redirect would follow the umask)
    out = tmp_path / "dgx01.token"
    assert main(["token", "derive", "--node", "dgx01", "--out", str(out)]) == 0
    assert out.read_text() == want + "\n" and _private(out)
    assert main(["token", "new", "--out", str(tmp_path / "cluster.secret")]) == 0
    assert _private(tmp_path / "cluster.secret")
    assert len(credentials.read_secret("", str(tmp_path / "cluster.secret"), "")) == 64


def test_token_new_keeps_an_existing_file_unless_forced(tmp_path: Path, capsys: Any) -> None:
    """Running `token new --out` again (a re-run install step) must not rotate the cluster secret:
    every node's derived tokens would stop working."""
    out = tmp_path / "cluster.secret"
    assert main(["token", "new", "--out", str(out)]) == 0
    first = out.read_text()
    assert main(["token", "new", "--out", str(out)]) == 2
    assert out.read_text() == first and "exists (kept)" in capsys.readouterr().err
    assert main(["token", "new", "--out", str(out), "--force"]) == 0
    assert out.read_text() != first and len(out.read_text().strip()) == 64 and _private(out)


def test_token_derive_agent_prints_the_agents_own_token(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """The token the aggregator presents to dgx01's agent: its own HMAC, apart from the token
    dgx01 reports with, and what AggAuthConfig presents to dgx01 when no shared token is set."""
    from podhealth.config_aggregator import AggAuthConfig

    want = hmac.new(SECRET.encode(), b"podhealth-agent:dgx01", hashlib.sha256).hexdigest()
    monkeypatch.setenv("PODHEALTH_CLUSTER_SECRET", SECRET)
    assert main(["token", "derive", "--agent", "--node", "dgx01"]) == 0
    assert capsys.readouterr().out.strip() == want != credentials.derive_node_token(SECRET, "dgx01")
    assert main(["token", "derive", "--agent", "--node", "dgx01", "--node", "dgx02"]) == 0
    assert capsys.readouterr().out.splitlines() == [f"dgx01 {want}",
                                                    f"dgx02 {credentials.derive_agent_token(SECRET, 'dgx02')}"]
    assert AggAuthConfig(cluster_secret=SECRET).agent_token_for("dgx01") == want
    assert AggAuthConfig(cluster_secret=SECRET, agent_token="shared").agent_token_for("dgx01") == "shared"
    assert AggAuthConfig().agent_token_for("dgx01") == ""  # nothing to present: agents serve their own host only


@pytest.mark.parametrize(("argv", "err", "code"), [
    (["--node", "dgx01", "--secret-file", "/nonexistent/secret"], "cannot read /nonexistent/secret", 2),
    (["--node", "dgx01"], "no cluster secret", 2),
    (["--node", "a;b", "--secret-file", "SECRET"], "--node: expected a node name", 64),  # usage (EX_USAGE)
    (["--node", "a", "--node", "b", "--out", "x", "--secret-file", "SECRET"], "--out takes one --node", 64),
])
def test_token_derive_bad_input(argv: list[str], err: str, code: int, tmp_path: Path, capsys: Any,
                                monkeypatch: Any) -> None:
    monkeypatch.delenv("PODHEALTH_CLUSTER_SECRET", raising=False)
    f = tmp_path / "secret"
    f.write_text(SECRET)
    argv = [str(f) if a == "SECRET" else a for a in argv]
    assert main(["token", "derive", *argv]) == code
    captured = capsys.readouterr()
    assert err in captured.err and captured.out == ""


def test_a_users_key_ring_is_trusted_only_when_private(tmp_path: Path, monkeypatch: Any) -> None:
    """`agent --simulate` keeps its node's key where `podhealth check` finds it; a key someone else
    could have planted (a directory others may write, a file others may read) vouches for nothing."""
    root = tmp_path / "sim"
    root.mkdir(mode=0o700)
    monkeypatch.setenv("PODHEALTH_SIM_DIR", str(root))
    key = credentials.ensure_user_key("dgx01")
    assert len(key) == 64 and credentials.user_key("dgx01") == key == credentials.ensure_user_key("dgx01")
    assert credentials.user_key("dgx02") == ""
    f = root / "_keys" / "dgx01.key"
    f.chmod(0o644)
    assert credentials.user_key("dgx01") == ""
    f.chmod(0o600)
    (root / "_keys").chmod(0o777)
    assert credentials.user_key("dgx01") == ""
    (root / "_keys").chmod(0o700)
    root.chmod(0o777)
    assert credentials.user_key("dgx01") == ""
    root.chmod(0o700)
    assert credentials.user_key("dgx01") == key
