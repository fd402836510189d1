"""agent/threadnames.py: the kernel sees each agent thread under its Python name."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

from podhealth.agent import threadnames

pytestmark = pytest.mark.timeout(30)


def _comm(tid: int) -> str:
    return Path(f"/proc/self/task/{tid}/comm").read_text().strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="names threads through /proc")
def test_threads_started_after_install_carry_their_names() -> None:
    old = threading.getprofile()
    threadnames.install()
    try:
        seen: dict[str, str] = {}
        done = threading.Event()

        def body() -> None:
            seen["comm"] = _comm(threading.get_native_id())
            seen["profile"] = repr(sys.getprofile())
            done.set()

        t = threading.Thread(target=body, name="podhealth-infiniband-with-a-long-name")
        t.start()
        assert done.wait(10)
        t.join(10)
    finally:
        threading.setprofile(old)  # type: ignore[arg-type]
    assert seen["comm"] == "infiniband-with"  # prefix dropped, cut to the kernel's 15 characters
    assert seen["profile"] == "None"  # the naming hook removed itself


def test_native_name() -> None:
    assert threadnames.native_name("podhealth-nfs") == "nfs"
    assert threadnames.native_name("asyncio_0") == "asyncio_0"
    assert threadnames.native_name("x" * 40) == "x" * 15
