"""Nothing is lost: the aggregator (a real `podhealth aggregator` process) goes away for a stretch
while an agent's Publisher keeps producing events; after it returns every event is applied
exactly once, in order within each lane (agent/spool.py), and a full resend (a crash before the cursor was saved) applies nothing."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

from podhealth.agent.publisher import Publisher
from podhealth.config import PublishConfig
from podhealth.vocab import Action, CheckResult, Event, Status
from tests.harness.proc import free_port, http_get, service

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _config(tmp: Path, port: int) -> Path:
    p = tmp / "podhealth.yaml"
    p.write_text(f"""\
aggregator:
  listen: {{address: 127.0.0.1, port: {port}}}
  db: {tmp}/agg.db
  auth: {{node_tokens: {{dgx01: node-secret}}}}
  fencers:
    file: {{enabled: true, path: {tmp}/fence.json}}
  nodes:
    - {{name: dgx01}}
""")
    return p


def _aggregator(tmp: Path, cfg: Path, port: int, name: str) -> Any:
    return service(name, [sys.executable, "-m", "podhealth", "aggregator", "--config", str(cfg)], tmp / "logs",
                   port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz", timeout=1)[0] == 200)


async def _until(pred: Any, timeout: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.05)


def _ids(db: Path) -> list[str]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("SELECT id FROM events ORDER BY rowid")]


async def test_aggregator_down_for_a_stretch_loses_nothing_and_applies_once(tmp_path: Path) -> None:
    port = free_port()
    cfg = _config(tmp_path, port)
    pcfg = PublishConfig(aggregator_url=f"http://127.0.0.1:{port}", token="node-secret",
                         spool_dir=tmp_path / "spool", spool_max_bytes=8 << 20, timeout=2.0)
    pub = Publisher(pcfg, "dgx01", max_backoff=0.5)
    published: list[str] = []

    def produce(n: int) -> None:
        for _ in range(n):
            i = len(published)
            ev = Event(kind="xid", code=(79, 48, 94)[i % 3], time=1000.0 + i, text=f"Xid {i}", id=f"x{i:06d}")
            pub.publish_event(ev)
            published.append(ev.id)

    await pub.start()
    try:
        with _aggregator(tmp_path, cfg, port, "aggregator-1") as agg:
            produce(100)
            await _until(lambda: pub.stats.delivered == 100)
            agg.stop()
        # away: the agent keeps producing, including a verdict transition
        for _ in range(5):
            produce(100)
            await asyncio.sleep(0.1)
        pub.publish_transition(None, CheckResult("xid", Status.FAIL, "GPU2", action=Action.RESET_GPU))
        await _until(lambda: pub.stats.send_failures >= 2)
        assert pub.stats.delivered == 100 and pub.stats.spool_bytes > 0
        snapshot = tmp_path / "spool-before-return"
        await asyncio.sleep(0.1)
        shutil.copytree(tmp_path / "spool", snapshot)
        with _aggregator(tmp_path, cfg, port, "aggregator-2"):
            await _until(lambda: pub.stats.delivered == 601, timeout=60)
            ids = _ids(tmp_path / "agg.db")
            assert len(ids) == 601 == len(set(ids)) and set(published) <= set(ids)  # every one, once
            fatal = {x for n, x in enumerate(published) if n % 3 != 2}  # XID 79 and 48: the priority lane
            for lane in (fatal, set(published) - fatal):  # in order within each lane (agent/spool.py)
                assert [x for x in ids if x in lane] == [x for x in published if x in lane]
            status, body = http_get(f"http://127.0.0.1:{port}/api/v1/nodes/dgx01")
            assert status == 200 and b'"xid"' in body and b"GPU2" in body  # the transition took effect

            # The agent crashed after delivering but before saving its cursor: it resends it all.
            await pub.stop()
            again = Publisher(PublishConfig(aggregator_url=pcfg.aggregator_url, token="node-secret",
                                            spool_dir=snapshot, spool_max_bytes=8 << 20, timeout=2.0), "dgx01")
            await again.start()
            await _until(lambda: again.stats.spool_bytes == 0 and again.stats.delivered >= 501, timeout=60)
            await again.stop()
            assert _ids(tmp_path / "agg.db") == ids
            _, metrics = http_get(f"http://127.0.0.1:{port}/metrics")
            assert b'podhealth_aggregator_ingest_events_total{result="duplicate"} 501.0' in metrics
    finally:
        await pub.stop()
