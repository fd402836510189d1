"""podhealth.aioloop: which event loop the daemons run on, and a clear error for a bad choice."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from podhealth import aioloop


async def _which() -> str:
    await asyncio.sleep(0)
    return aioloop.running_loop_name()


@pytest.mark.parametrize(("env", "want"), [("asyncio", "asyncio"), ("uvloop", "uvloop"), ("auto", "uvloop"),
                                            ("", "uvloop"), (" UVLOOP ", "uvloop")])
def test_the_chosen_loop_runs(env: str, want: str, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv(aioloop.ENV, env)
    assert aioloop.run(_which()) == want


def test_a_bad_choice_is_refused_and_nothing_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(aioloop.ENV, "trio")
    ran = []

    async def main() -> None:
        ran.append(1)

    with pytest.raises(ValueError, match="PODHEALTH_EVENT_LOOP='trio': expected one of auto, uvloop, asyncio"):
        aioloop.run(main())
    assert ran == []


def test_the_aggregator_says_what_is_wrong_with_the_choice(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "agg.yaml"
    cfg.write_text(f"aggregator:\n  db: {tmp_path / 'agg.db'}\n  listen: {{address: 127.0.0.1, port: 0}}\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "aggregator", "--config", str(cfg)],
                       env={"PODHEALTH_EVENT_LOOP": "trio", "PATH": "/usr/bin:/bin"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "PODHEALTH_EVENT_LOOP='trio'" in r.stderr
