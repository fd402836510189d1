"""Log lines carry journald priorities when stderr is the journal, so `journalctl -p warning` works."""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Iterator

import pytest
import structlog

from podhealth import log


@pytest.fixture(autouse=True)
def _logging_restored() -> Iterator[None]:
    """log.setup() is process-wide: left pointing at this test's closed temporary files, every
    later log line raised "I/O operation on closed file" (it killed the publisher's tasks in the
    tests that ran after this one). Put back what was there before."""
    saved = structlog.get_config()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    structlog.configure(**saved)
    root.handlers[:] = handlers
    root.setLevel(level)


def test_priority_prefix_only_on_the_journal_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    with tempfile.TemporaryFile("w+") as journal, tempfile.TemporaryFile("w+") as other:
        st = os.fstat(journal.fileno())
        monkeypatch.setenv("JOURNAL_STREAM", f"{st.st_dev}:{st.st_ino}")
        log.setup("debug", "auto", journal)
        lg = log.get("t")
        lg.debug("d")
        lg.info("i")
        lg.warning("w")
        lg.error("e")
        journal.seek(0)
        assert [line[:3] for line in journal.read().splitlines()] == ["<7>", "<6>", "<4>", "<3>"]
        log.setup("info", "auto", other)  # stderr redirected to a file: plain JSON lines
        log.get("t").warning("w")
        other.seek(0)
        assert other.read().startswith("{")
