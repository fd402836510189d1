"""A full disk on the node never stops a fatal event (issue 27 §7), on a real filesystem that
fills up: a small tmpfs mounted by the test. The aggregator is away while 3,000 routine XIDs
and then 50 XID 79 arrive on a disk with a few KB left; when it comes back, the XID 79 arrive
first, all of them and each on its own (never summarised), and every routine record is
accounted for (delivered or counted in a summary) although the disk is still full. Nothing
half-written holds space. At stop, records that only live in memory are offered to the
aggregator before the process exits."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import io
import json
import os
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import structlog

from podhealth import log as plog
from podhealth.agent.publisher import Publisher
from podhealth.config import PublishConfig
from tests.unit.test_publisher import Sink, sink_server, until, xid

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]
DISK = 256 * 1024
ROUTINE, FATAL = 13, 79  # XID 13 asks for an application restart; XID 79 (fallen off the bus) a reboot


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    where = tmp_path / "disk"
    where.mkdir()
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK}", "tmpfs", str(where)],
                           capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"cannot mount a tmpfs to fill up ({e}): needs root and mount(2)")
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill up: {r.stderr.strip()} (needs root and mount(2))")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=10)


def fill(disk: Path, leave: int) -> Path:
    """Fill the disk, then give back `leave` bytes (whole pages: a batch larger than that is torn)."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == errno.ENOSPC
    size = filler.stat().st_size
    os.truncate(filler, max(0, size - leave))
    return filler


def on_disk(spool: Path) -> int:
    return sum(p.stat().st_size for p in spool.rglob("seg-*"))


def delivered(sink: Sink) -> list[dict[str, Any]]:
    return [e for b in sink.batches for e in b["events"]]


def accounted(sink: Sink, code: int) -> int:
    """Distinct events of one XID delivered, plus those counted in summaries."""
    recs = delivered(sink)
    return len({e["id"] for e in recs if e["type"] == "event" and e["event"]["code"] == code}) + \
        sum(e["counts"].get(f"event:xid:{code}", 0) for e in recs if e["type"] == "summary")


@contextlib.asynccontextmanager
async def aggregator() -> AsyncIterator[Sink]:
    sink = Sink()
    runner, url = await sink_server(sink)
    sink.url = url  # type: ignore[attr-defined]
    try:
        yield sink
    finally:
        await runner.cleanup()


async def test_fatal_events_first_and_none_lost_with_the_spool_disk_full(small_disk: Path) -> None:
    buf = io.StringIO()
    plog.setup("info", "json", stream=buf)
    try:
        async with aggregator() as sink:
            sink.status = 503  # away
            spool = small_disk / "spool"
            cfg = PublishConfig(aggregator_url=sink.url, spool_dir=spool,  # type: ignore[attr-defined]
                                spool_max_bytes=128 * 1024, timeout=2.0)
            pub = Publisher(cfg, "dgx01", max_backoff=0.2)
            await pub.start()
            try:
                fill(small_disk, leave=8192)
                for i in range(3000):
                    pub.publish_event(xid(i, code=ROUTINE))
                for i in range(3000, 3050):
                    pub.publish_event(xid(i, code=FATAL))
                await until(lambda: pub.stats.spool_failing.startswith("ENOSPC") and pub.stats.send_failures >= 2)

                # Nothing torn holds space: a batch cut short was cut back, and counted.
                assert pub.stats.repaired >= 1
                assert on_disk(spool) == pub.stats.spool_bytes
                assert not list(spool.rglob("*.tmp"))
                assert all(p.read_bytes().endswith(b"\n") for p in spool.rglob("seg-*") if p.stat().st_size)
                # Memory is bounded by summarising routine records only.
                assert pub.stats.summarised > 0 and pub.stats.memory_lane_bytes["priority"] > 0

                sink.status = 200  # back; the disk is still full
                await until(lambda: accounted(sink, FATAL) == 50 and accounted(sink, ROUTINE) == 3000, timeout=30)
                recs = delivered(sink)
                fatal = [n for n, e in enumerate(recs) if e["type"] == "event" and e["event"]["code"] == FATAL]
                routine = [n for n, e in enumerate(recs) if n not in set(fatal)]
                assert len(fatal) == 50 and max(fatal) < min(routine)  # the XID 79 first, each on its own
                assert [recs[n]["id"] for n in fatal] == [f"ev{i:05d}" for i in range(3000, 3050)]  # in order
                assert not any(f"event:xid:{FATAL}" in e["counts"] for e in recs if e["type"] == "summary")

                # At stop, what only lives in memory is offered to the aggregator before exit.
                sink.status = 503
                before = pub.stats.send_failures
                for i in range(3050, 3350):
                    pub.publish_event(xid(i, code=ROUTINE))
                pub.publish_event(xid(3350, code=FATAL))
                await until(lambda: pub.stats.send_failures > before)
                sink.status = 200
            finally:
                await pub.stop()
            assert accounted(sink, ROUTINE) == 3300 and accounted(sink, FATAL) == 51
        lost = [json.loads(x) for x in buf.getvalue().splitlines() if "lost at exit" in x]
        assert lost == []
    finally:
        structlog.reset_defaults()
