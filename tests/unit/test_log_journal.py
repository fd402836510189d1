"""Log lines carry journald priorities when stderr is the journal, so `journalctl -p warning` works."""

from __future__ import annotations

import os
import tempfile

import pytest

from podhealth import log


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
