"""The run ends with its skips counted by reason (tests/conftest.py), so a tool that a fresh
machine could not install shows as one counted line (issue 31 §1)."""

from __future__ import annotations

from types import SimpleNamespace

from tests.conftest import skip_reasons


def test_skips_are_counted_by_reason_without_their_file_and_line() -> None:
    reports = [SimpleNamespace(longrepr=("tests/a.py", 3, "Skipped: kubectl is not installed")),
               SimpleNamespace(longrepr=("tests/b.py", 9, "Skipped: kubectl is not installed")),
               SimpleNamespace(longrepr=("tests/c.py", 1, "hardware: needs a real NVIDIA GPU"))]
    assert skip_reasons(reports).most_common() == [("kubectl is not installed", 2),
                                                   ("hardware: needs a real NVIDIA GPU", 1)]
