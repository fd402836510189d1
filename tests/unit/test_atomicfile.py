"""core/atomicfile.py: the one way podhealth replaces a file whole (job records, dcgm-exporter job
files, evidence bundles, the test fencer's state)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from podhealth.atomicfile import write_atomic


def test_replaces_whole_with_mode_and_no_leftovers(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    p.write_text("old")
    write_atomic(p, "new ✓")
    assert p.read_text(encoding="utf-8") == "new ✓"
    assert stat.S_IMODE(p.stat().st_mode) == 0o644
    write_atomic(p, b"\x00bytes", mode=0o600, fsync=False)
    assert p.read_bytes() == b"\x00bytes" and stat.S_IMODE(p.stat().st_mode) == 0o600
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_a_failed_write_leaves_the_target_and_no_temporary(tmp_path: Path) -> None:
    p = tmp_path / "f.json"
    p.write_text("old")
    with pytest.raises(TypeError):
        write_atomic(p, 12345)  # type: ignore[arg-type]
    assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["f.json"]
    with pytest.raises(OSError):
        write_atomic(tmp_path / "missing-dir" / "f.json", "x")
