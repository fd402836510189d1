"""The agent's publisher: disk spool, bound with summaries, ordered delivery, resume after restart."""

from __future__ import annotations

import asyncio
import errno
import io
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import structlog
from aiohttp import web

from podhealth import log as plog
from podhealth.agent.publisher import Publisher
from podhealth.agent.spool import Spool, summarise
from podhealth.config import PublishConfig
from podhealth.vocab import Action, CheckResult, Event, NodeReport, Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)


def xid(i: int, code: int = 79) -> Event:
    return Event(kind="xid", code=code, time=1000.0 + i, text=f"NVRM: Xid (PCI:0000:18:00): {code}", id=f"ev{i:05d}")


async def until(pred: Any, timeout: float = 15.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


class Sink:
    """A stand-in aggregator that records batches and can be told to answer with an error."""

    def __init__(self) -> None:
        self.batches: list[dict[str, Any]] = []
        self.status = 200
        self.reject_ids: set[str] = set()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.status != 200:
            return web.json_response({"error": "down"}, status=self.status)
        if any(e["id"] in self.reject_ids for e in body["events"]):
            return web.json_response({"error": "bad record"}, status=400)
        self.batches.append(body)
        return web.json_response({"applied": len(body["events"])})

    @property
    def ids(self) -> list[str]:
        return [e["id"] for b in self.batches for e in b["events"]]


async def sink_server(sink: Sink) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_post("/v1/events", sink.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def pcfg(tmp_path: Path, url: str, max_bytes: int = 1 << 20, token: str = "") -> PublishConfig:
    return PublishConfig(aggregator_url=url, token=token, spool_dir=tmp_path / "spool", spool_max_bytes=max_bytes,
                         timeout=2.0)


async def test_delivers_in_order_and_deletes_delivered_segments(tmp_path: Path) -> None:
    sink = Sink()
    runner, url = await sink_server(sink)
    pub = Publisher(pcfg(tmp_path, url, max_bytes=1 << 20), "dgx01")  # 128 KiB segments
    await pub.start()
    try:
        for i in range(600):
            pub.publish_event(xid(i))
        pub.publish_transition(None, CheckResult("xid", Status.FAIL, "GPU0", action=Action.RESET_GPU))
        pub.publish_report(NodeReport("dgx01", "0.1", "dgx-h100", (CheckResult("nfs", Status.OK, "/home"),)))
        await until(lambda: len(sink.ids) == 602)
        assert sink.ids[:600] == [f"ev{i:05d}" for i in range(600)]
        types = [e["type"] for b in sink.batches for e in b["events"]][600:]
        assert types == ["transition", "report"] and all(b["node"] == "dgx01" for b in sink.batches)
        await until(lambda: pub.stats.spool_bytes == 0)
        segs = [p for p in (tmp_path / "spool").iterdir() if p.name.startswith("seg-")]
        assert len(segs) <= 1  # only the segment being written is left
    finally:
        await pub.stop()
        await runner.cleanup()


async def test_spools_while_away_and_resumes_after_a_restart(tmp_path: Path) -> None:
    sink = Sink()
    sink.status = 503
    runner, url = await sink_server(sink)
    pub = Publisher(pcfg(tmp_path, url), "dgx01", max_backoff=0.2)
    await pub.start()
    for i in range(100):
        pub.publish_event(xid(i))
    await until(lambda: pub.stats.send_failures >= 2)
    await pub.stop(drain=0)
    assert sink.ids == []
    # a new process finds the spool and delivers it once the aggregator answers
    sink.status = 200
    pub2 = Publisher(pcfg(tmp_path, url), "dgx01")
    await pub2.start()
    try:
        await until(lambda: len(sink.ids) == 100)
        assert sink.ids == [f"ev{i:05d}" for i in range(100)]
    finally:
        await pub2.stop()
    # and a third one resends nothing: the cursor moved past what was delivered
    pub3 = Publisher(pcfg(tmp_path, url), "dgx01")
    await pub3.start()
    pub3.publish_event(xid(100))
    try:
        await until(lambda: len(sink.ids) == 101)
        await asyncio.sleep(0.2)
        assert len(sink.ids) == 101
    finally:
        await pub3.stop()
        await runner.cleanup()


async def test_a_full_spool_summarises_the_oldest_never_drops(tmp_path: Path) -> None:
    sink = Sink()
    sink.status = 503
    runner, url = await sink_server(sink)
    bound = 32 * 1024
    pub = Publisher(pcfg(tmp_path, url, max_bytes=bound), "dgx01", max_backoff=0.1)
    await pub.start()
    try:
        for i in range(2000):
            pub.publish_event(xid(i, code=79 if i % 4 else 48))
            if i % 200 == 0:
                await asyncio.sleep(0.06)  # let the flusher run between bursts, as real time would
        await until(lambda: pub.stats.published == 2000 and pub.in_memory == 0)
        await asyncio.sleep(0.1)
        assert pub.stats.spool_bytes <= bound and pub.stats.summarised > 0
        sink.status = 200
        await until(lambda: pub.stats.spool_bytes == 0 and sink.batches)
        events = [e for b in sink.batches for e in b["events"]]
        summaries = [e for e in events if e["type"] == "summary"]
        plain = [e for e in events if e["type"] == "event"]
        assert summaries and events[0]["type"] == "summary"  # the oldest went first, as a summary
        total = {"event:xid:79": 0, "event:xid:48": 0}
        for sm in summaries:
            for k, v in sm["counts"].items():
                total[k] += v
        for e in plain:
            total[f"event:xid:{e['event']['code']}"] += 1
        assert total == {"event:xid:79": 1500, "event:xid:48": 500}
        assert sum(sm["count"] for sm in summaries) + len(plain) == 2000
        assert [e["id"] for e in plain] == sorted(e["id"] for e in plain)  # still in order
    finally:
        await pub.stop()
        await runner.cleanup()


async def test_a_record_the_aggregator_rejects_is_kept_aside_not_lost(tmp_path: Path) -> None:
    sink = Sink()
    sink.reject_ids = {"ev00002"}
    runner, url = await sink_server(sink)
    pub = Publisher(pcfg(tmp_path, url), "dgx01")
    await pub.start()
    try:
        for i in range(5):
            pub.publish_event(xid(i))
        await until(lambda: len(sink.ids) == 4)
        assert sink.ids == ["ev00000", "ev00001", "ev00003", "ev00004"] and pub.stats.rejected == 1
        [line] = (tmp_path / "spool" / "rejected.jsonl").read_text().splitlines()
        assert json.loads(line)["record"]["id"] == "ev00002"
    finally:
        await pub.stop()
        await runner.cleanup()


def test_spool_cuts_back_a_line_cut_short_by_a_crash(tmp_path: Path) -> None:
    sp = Spool(tmp_path, 1 << 20)
    sp.append([json.dumps({"id": "a", "type": "event", "time": 1}).encode() + b"\n"])
    sp.close()
    with open(sp.path(sp.write_seq), "ab") as f:
        f.write(b'{"id": "b", "type": "ev')  # the crash
    (tmp_path / "seg-000000000001.jsonl.tmp").write_bytes(b'{"id": "summ')  # a summary cut short
    sp2 = Spool(tmp_path, 1 << 20)
    assert sp2.repaired == 2 and not list(tmp_path.glob("*.tmp"))
    assert sp2.path(1).read_bytes().endswith(b"\n")  # the torn line holds no space
    sp2.append([json.dumps({"id": "c", "type": "event", "time": 2}).encode() + b"\n"])
    recs, pos = sp2.read_batch(100, 1 << 20)
    assert [r["id"] for r in recs] == ["a", "c"] and sp2.stats_corrupt == 0
    sp2.ack(pos)
    assert sp2.read_batch(100, 1 << 20)[0] == []


def test_summaries_merge_counts() -> None:
    recs = [{"id": "1", "type": "event", "time": 5, "event": {"kind": "xid", "code": 79}},
            {"id": "2", "type": "transition", "time": 6, "new": {"check": "xid", "status": "FAIL"}},
            {"id": "3", "type": "summary", "time": 4, "first": 1, "last": 4, "count": 7, "counts": {"event:xid:79": 7}}]
    s = summarise(recs)
    assert s["counts"] == {"event:xid:79": 8, "transition:xid:FAIL": 1} and s["count"] == 9
    assert (s["first"], s["last"]) == (1, 6)


async def test_publisher_to_the_real_aggregator_applies_summaries_too(tmp_path: Path) -> None:
    async with running(config(tmp_path), [MemFencer()]) as (agg, url):
        pub = Publisher(pcfg(tmp_path, url), "dgx01")
        await pub.start()
        try:
            for i in range(20):
                pub.publish_event(xid(i))
            await until(lambda: agg.store.counts()["events"] == 20)
        finally:
            await pub.stop()
    db = sqlite3.connect(tmp_path / "agg.db")
    assert [r[0] for r in db.execute("SELECT id FROM events ORDER BY rowid")] == [f"ev{i:05d}" for i in range(20)]


def test_disabled_without_an_aggregator_url(tmp_path: Path) -> None:
    pub = Publisher(PublishConfig(aggregator_url="", spool_dir=tmp_path / "s"), "dgx01")
    pub.publish_event(xid(1))
    assert not pub.enabled and pub.stats.published == 0 and not (tmp_path / "s").exists()


class _FullDisk:
    """The spool's opener seam: real files whose writes fail with ENOSPC while `full` is set."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0

    def open(self, path: Path, mode: str) -> Any:
        return _Writes(open(path, mode), self)


class _Writes:
    def __init__(self, f: Any, disk: _FullDisk) -> None:
        self.f, self.disk = f, disk

    def write(self, b: bytes) -> int:
        if self.disk.full:
            self.disk.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return int(self.f.write(b))

    def tell(self) -> int:
        return int(self.f.tell())

    def flush(self) -> None:
        self.f.flush()

    def fileno(self) -> int:
        return int(self.f.fileno())

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> "_Writes":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def test_a_full_spool_disk_keeps_publishing_bounded_and_says_so(tmp_path: Path) -> None:
    sink = Sink()
    runner, url = await sink_server(sink)
    disk = _FullDisk()
    bound = 64 * 1024
    pub = Publisher(pcfg(tmp_path, url, max_bytes=bound), "dgx01", max_backoff=0.2, spool_opener=disk.open)
    await pub.start()
    try:
        for i in range(5):
            pub.publish_event(xid(i))
        await until(lambda: len(sink.ids) == 5 and pub.connected)
        disk.full = True
        for i in range(5, 3005):  # ~600 KB of records: ten times what memory may hold
            pub.publish_event(xid(i, code=79 if i % 2 else 48))
            if i % 500 == 0:
                await asyncio.sleep(0.06)
        await until(lambda: pub.stats.spool_failing.startswith("ENOSPC") and disk.refused >= 2)
        assert not pub.connected  # publish_connected tells the truth: nothing new gets through
        assert pub.stats.spool_errors["ENOSPC"] >= 2  # every failed write counted (retried on a backoff)
        assert pub.stats.memory_bytes <= bound + 1024 and pub.stats.summarised > 0  # bounded memory
        assert all(not t.done() for t in pub._tasks)  # both tasks alive
        disk.full = False

        def accounted() -> int:
            """Distinct events delivered plus those summarised (a resend of one is harmless: same id)."""
            events = [e for b in sink.batches for e in b["events"]]
            return len({e["id"] for e in events if e["type"] == "event"}) + \
                sum(e["count"] for e in events if e["type"] == "summary")
        await until(lambda: accounted() >= 3005, timeout=20)  # none lost: sent from memory, the disk still full
        pub.publish_event(xid(3005))  # the next write finds room again: the spool says so
        await until(lambda: accounted() >= 3006 and pub.connected and pub.stats.spool_failing == "")
    finally:
        await pub.stop()
        await runner.cleanup()


async def test_a_corrupt_spool_record_is_logged_and_counted_once(tmp_path: Path) -> None:
    buf = io.StringIO()
    plog.setup("info", "json", stream=buf)
    try:
        sp = Spool(tmp_path / "spool", 1 << 20)
        good = [json.dumps({"id": f"r{i}", "type": "event", "time": i, "event": {"kind": "xid", "code": 79}})
                for i in range(3)]
        bad = good[1].replace('"code": 79', '"code": 7\x009').encode()[:-3]  # bit rot inside an XID 79 record
        sp.append([good[0].encode() + b"\n", bad + b"\n", good[2].encode() + b"\n"])
        sp.close()
        sink = Sink()
        sink.status = 503
        runner, url = await sink_server(sink)
        pub = Publisher(pcfg(tmp_path, url), "dgx01", max_backoff=0.05)
        await pub.start()
        try:
            await until(lambda: pub.stats.send_failures >= 3)  # the same batch read again and again
            sink.status = 200
            await until(lambda: len(sink.ids) == 2)
            assert sink.ids == ["r0", "r2"]
            assert pub.stats.spool_errors == {"corrupt": 1} and pub.stats.corrupt == 1
        finally:
            await pub.stop()
            await runner.cleanup()
        lines = [json.loads(x) for x in buf.getvalue().splitlines() if "corrupt" in x]
        assert len(lines) == 1 and lines[0]["segment"].startswith("seg-") and '"r1"' in lines[0]["start"]
    finally:
        structlog.reset_defaults()


async def test_on_a_full_spool_routine_records_never_push_out_fatal_ones(tmp_path: Path) -> None:
    """The oldest records are the XID 79s: a bound that folded the oldest first would summarise
    them. The routine lane is bounded by what the priority lane leaves, so they arrive whole, first."""
    sink = Sink()
    sink.status = 503
    runner, url = await sink_server(sink)
    bound = 32 * 1024
    pub = Publisher(pcfg(tmp_path, url, max_bytes=bound), "dgx01", max_backoff=0.1)
    await pub.start()
    try:
        for i in range(50):
            pub.publish_event(xid(i, code=79))
        for i in range(50, 2050):
            pub.publish_event(xid(i, code=13))
            if i % 200 == 0:
                await asyncio.sleep(0.06)  # let the flusher run between bursts, as real time would
        await until(lambda: pub.stats.published == 2050 and pub.in_memory == 0 and pub.stats.summarised > 0)
        assert pub.stats.spool_bytes <= bound + 4096
        sink.status = 200
        await until(lambda: pub.stats.spool_bytes == 0 and sink.batches)
        events = [e for b in sink.batches for e in b["events"]]
        fatal = [e["id"] for e in events if e["type"] == "event" and e["event"]["code"] == 79]
        assert fatal == [f"ev{i:05d}" for i in range(50)] and events[:50] == [e for e in events if e["id"] in fatal]
        summaries = [e for e in events if e["type"] == "summary"]
        assert summaries and all(set(s["counts"]) == {"event:xid:13"} for s in summaries)
        routine = sum(s["count"] for s in summaries) + sum(1 for e in events if e["type"] == "event") - 50
        assert routine == 2000
    finally:
        await pub.stop()
        await runner.cleanup()
