"""The README's two commands work out of the box with the agent closed by default.

`podhealth agent --simulate dgx-h100` makes its node's agent key in the user's key ring, and
`podhealth check --url http://127.0.0.1:PORT` (no token, no config) finds it there, signs the
handover request and checks the proof: a newcomer does no extra step. Someone without that key
(another user's ring) gets no handover run and a clear message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.proc import free_port, http_get, service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_agent_simulate_then_check_url_needs_no_step(tmp_path: Path) -> None:
    ring = tmp_path / "ring"
    ring.mkdir(mode=0o700)
    env = {**os.environ, "PODHEALTH_SIM_DIR": str(ring)}
    for k in ("PODHEALTH_TOKEN", "PODHEALTH_AGENT_TOKEN", "PODHEALTH_CONFIG"):
        env.pop(k, None)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--listen", f"127.0.0.1:{port}"]
    with service("agent", argv, tmp_path, port=port, env=env,
                 ready=lambda: http_get(f"{url}/health")[0] == 200
                 and json.loads(http_get(f"{url}/health")[1])["status"] == "OK", ready_timeout=90):
        assert (ring / "_keys" / "dgx01.key").stat().st_mode & 0o077 == 0  # the key, private to this user
        r = subprocess.run([sys.executable, "-m", "podhealth", "check", "--url", url, "--format", "json"],
                           capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
        assert r.returncode == 0 and json.loads(r.stdout)["node"] == "dgx01", r.stderr[-2000:]
        # Without the key (another user's ring): nothing runs, and the message says where keys come from.
        other = tmp_path / "other"
        other.mkdir(mode=0o700)
        r = subprocess.run([sys.executable, "-m", "podhealth", "check", "--url", url],
                           capture_output=True, text=True, timeout=60, env={**env, "PODHEALTH_SIM_DIR": str(other)},
                           cwd=tmp_path)
        assert r.returncode == 2 and "no agent key for dgx01" in r.stderr, r.stderr
