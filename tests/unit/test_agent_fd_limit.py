"""The agent raises its soft open-file limit (the infiniband collector keeps counter files open)."""

from __future__ import annotations

import resource
import subprocess
import sys


def _in_child(code: str) -> str:
    # A child process: setrlimit is process-wide and must not leak into the test session.
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          check=True).stdout.strip()


def test_soft_limit_is_raised_up_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = ("import resource; from podhealth.agent.cmd import raise_fd_limit; "
            "s, h = resource.getrlimit(resource.RLIMIT_NOFILE); "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (256, h)); "
            "got = raise_fd_limit(4000); print(got, *resource.getrlimit(resource.RLIMIT_NOFILE))")
    got, now_soft, now_hard = (int(x) for x in _in_child(code).split())
    want = 4000 if hard == resource.RLIM_INFINITY else min(4000, hard)
    assert got == now_soft == want and now_hard == hard


def test_never_lowered_and_never_above_hard() -> None:
    code = ("import resource; from podhealth.agent.cmd import raise_fd_limit; "
            "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 500)); "
            "a = raise_fd_limit(100); b = raise_fd_limit(100000); "
            "print(a, b, *resource.getrlimit(resource.RLIMIT_NOFILE))")
    assert _in_child(code).split() == ["300", "500", "500", "500"]
