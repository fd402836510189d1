"""The agent's (boot_id, seq) stamp: read from procfs, strictly increasing across restarts within
a boot, on every spooled record and heartbeat, and honoured by the aggregator end to end."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.publisher import Publisher
from podhealth.agent.sequence import Sequencer, read_boot_id
from podhealth.config import PublishConfig
from podhealth.sim.node import SimNode
from podhealth.vocab import Action, CheckResult, NodeReport, Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)


def procfs(tmp_path: Path, boot: str | None) -> Path:
    root = tmp_path / "proc"
    path = root / "sys" / "kernel" / "random" / "boot_id"
    path.parent.mkdir(parents=True, exist_ok=True)
    if boot is not None:
        path.write_text(boot)
    return root


def test_the_boot_id_comes_from_procfs_and_a_missing_one_gives_a_per_process_epoch(tmp_path: Path) -> None:
    assert read_boot_id(procfs(tmp_path / "a", "3f1c2b9e-0d4e-4f55-9a51-2f0e7a1b6c3d\n")) == \
        "3f1c2b9e-0d4e-4f55-9a51-2f0e7a1b6c3d"
    assert read_boot_id(procfs(tmp_path / "b", None)) is None
    assert read_boot_id(procfs(tmp_path / "c", "x" * 65)) is None
    assert read_boot_id(procfs(tmp_path / "d", "\x00\x01")) is None
    one, two = Sequencer(procfs(tmp_path / "b", None)), Sequencer(procfs(tmp_path / "b", None))
    assert one.boot_id.startswith("proc-") and one.boot_id != two.boot_id, "each process its own epoch"


def test_seq_strictly_increases_and_an_agent_restart_continues_above(tmp_path: Path) -> None:
    root = procfs(tmp_path, "boot-a")
    clock = [1_000]
    seq = Sequencer(root, clock_ns=lambda: clock[0])
    got = [seq.next() for _ in range(3)]
    assert got == [1_000, 1_001, 1_002], "a stalled clock still gives distinct, increasing values"
    clock[0] = 500  # a clock that went back (it cannot, for CLOCK_MONOTONIC; the seq still holds)
    assert seq.next() == 1_003
    clock[0] = 9_000  # the agent restarts later in the same boot: CLOCK_MONOTONIC kept counting
    again = Sequencer(root, clock_ns=lambda: clock[0])
    assert again.boot_id == "boot-a" and again.next() > got[-1]
    assert again.stamp({"x": 1}) == {"x": 1, "boot_id": "boot-a", "seq": 9_001}


def test_a_simulated_node_has_one_boot_id_per_boot(tmp_path: Path) -> None:
    a = SimNode.create(tmp_path, "dgx01")
    first = read_boot_id(a.proc_root)
    assert first is not None and len(first) == 36
    a.refresh()
    assert read_boot_id(a.proc_root) == first, "the same boot keeps its id"
    b = SimNode.create(tmp_path, "dgx02")
    assert read_boot_id(b.proc_root) not in (None, first)


def healthy() -> NodeReport:
    return NodeReport("dgx01", "0.1.0", "dgx-h100", (CheckResult("xid", Status.OK, "GPU0"),), (), time.time())


async def until(pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_a_spooled_transition_older_than_a_heartbeat_is_stale_whatever_its_time(tmp_path: Path) -> None:
    """The agent's clock jumps an hour ahead between a FAIL transition (spooled while the
    aggregator is away) and its recovery; the late FAIL must not reopen the condition."""
    seq = Sequencer(procfs(tmp_path, "boot-a"))
    spool = tmp_path / "spool"
    away = PublishConfig(aggregator_url=f"http://127.0.0.1:{free_port()}", spool_dir=spool, timeout=1.0)
    pub = Publisher(away, "dgx01", sequencer=seq, max_backoff=0.1)
    await pub.start()
    bad = CheckResult("xid", Status.FAIL, "GPU0", action=Action.RESET_GPU, since=time.time() + 3600)
    pub.publish_transition(None, bad, at=time.time() + 3600)
    await until(lambda: pub.stats.send_failures >= 1)
    await pub.stop(drain=0)
    lines = [json.loads(line) for p in sorted(spool.rglob("seg-*")) for line in p.read_text().splitlines()]
    assert [(r["type"], r["boot_id"]) for r in lines] == [("transition", "boot-a")]
    async with running(config(tmp_path), [MemFencer()]) as (agg, url):
        hb = Heartbeat(PublishConfig(aggregator_url=url), sequencer=seq)
        await hb.start()
        try:
            assert await hb.send(healthy())
        finally:
            await hb.stop()
        back = Publisher(PublishConfig(aggregator_url=url, spool_dir=spool), "dgx01", sequencer=seq)
        await back.start()
        try:
            await until(lambda: back.stats.delivered == 1)
        finally:
            await back.stop()
        assert agg.mem is not None and agg.mem.conditions_of("dgx01") == []
        assert agg.mem.nodes["dgx01"].status is Status.OK
