"""The commands `simulate fleet` prints call the podhealth that runs the pod.

README's way in is `bash scripts/setup.sh && scripts/podhealth ...`, which runs ./.venv/bin/podhealth
with no `podhealth` on PATH: a bare `podhealth` in the banner was "command not found", or another
install driving the pod with other code.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest

from podhealth.sim.fleet import cli_command, root_option


def _script(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    p = d / "podhealth"
    p.write_text("#!/bin/sh\n")
    p.chmod(0o755)
    return p


def test_a_script_not_on_path_is_called_by_its_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    venv = _script(tmp_path / "clone" / ".venv" / "bin")
    other = _script(tmp_path / "elsewhere")
    monkeypatch.setenv("PATH", f"{other.parent}{os.pathsep}/usr/bin")
    assert cli_command(str(venv)) == str(venv.resolve())
    monkeypatch.setenv("PATH", "/nonexistent")
    assert cli_command(str(venv)) == str(venv.resolve())


def test_the_script_on_path_is_called_podhealth(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _script(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{mine.parent}{os.pathsep}/usr/bin")
    assert cli_command(str(mine)) == "podhealth"


def test_python_dash_m_is_called_with_this_interpreter() -> None:
    assert cli_command("/x/podhealth/__main__.py") == f"{shlex.quote(sys.executable)} -m podhealth"
    assert shlex.split(cli_command("/x/podhealth/__main__.py"))[1:] == ["-m", "podhealth"]


def test_the_printed_commands_name_a_root_chosen_by_the_environment(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A pod under $PODHEALTH_SIM_DIR: the inject/clear commands it prints carry --root, so they
    reach its nodes from a shell without that variable; the per-user default needs none."""
    monkeypatch.setenv("PODHEALTH_SIM_DIR", str(tmp_path / "my sims"))
    assert shlex.split(root_option(tmp_path / "my sims")) == ["--root", str(tmp_path / "my sims")]
    assert root_option(Path(f"/tmp/podhealth-sim-{os.getuid()}")) == ""
