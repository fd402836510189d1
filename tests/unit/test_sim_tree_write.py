"""TreeWriter in place (PODHEALTH_SIM_IN_PLACE=1, bench/agent_overhead.py's default): what a reader sees."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podhealth.sim.tree_write import IN_PLACE_ENV, TreeWriter


def test_in_place_keeps_the_inode_while_the_text_grows_and_renames_when_it_shrinks(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IN_PLACE_ENV, "1")
    w = TreeWriter(tmp_path)
    f = tmp_path / "ports" / "1" / "counters" / "port_rcv_data"
    w.put(f, "999\n")
    ino = f.stat().st_ino
    w.put(f, "1000\n")  # a counter grows: the same file, as in sysfs
    assert (f.read_text(), f.stat().st_ino) == ("1000\n", ino)
    w.put(f, "7\n")  # shorter: no tail of the old text left behind, by a new file
    assert f.read_text() == "7\n"
    assert f.stat().st_ino != ino


def test_without_the_variable_every_change_is_a_new_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(IN_PLACE_ENV, raising=False)
    w = TreeWriter(tmp_path)
    f = tmp_path / "state"
    w.put(f, "1\n")
    ino = f.stat().st_ino
    w.put(f, "22\n")
    assert f.read_text() == "22\n"
    assert f.stat().st_ino != ino
    assert os.listdir(tmp_path / ".podhealth-tmp") == []
