"""The agent's heartbeat against a real aggregator: full report, then leases, then full again
whenever a verdict changes, the full-report interval passes, or the aggregator cannot match."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from podhealth.agent.heartbeat import Heartbeat
from podhealth.agent.sequence import Sequencer
from podhealth.aggregator.state import Verdict
from podhealth.config import PublishConfig
from podhealth.vocab import Action, CheckResult, NodeReport, Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.proc import free_port

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self) -> None:
        self.t = 5000.0

    def __call__(self) -> float:
        return self.t


def healthy(t: float, temp: str = "35.0") -> NodeReport:
    results = tuple(CheckResult("temperature", Status.OK, f"gpu{g}", evidence=(("gpu_c", temp),), since=100.0)
                    for g in range(8))
    return NodeReport("dgx01", "0.1.0", "dgx-h100", results + (CheckResult("xid", Status.OK, "gpu0", since=100.0),),
                      (("nvml", 0.2),), t)


def failing(t: float) -> NodeReport:
    rep = healthy(t)
    bad = CheckResult("xid", Status.FAIL, "gpu0", evidence=(("codes", "79"),), action=Action.REBOOT, since=1050.0,
                      summary="XID 79: GPU has fallen off the bus")
    return NodeReport(rep.node, rep.agent_version, rep.profile, rep.results[:-1] + (bad,), rep.staleness, t)


def sequencer(tmp_path: Path, clock: Clock) -> Sequencer:
    boot = tmp_path / "proc" / "sys" / "kernel" / "random" / "boot_id"
    boot.parent.mkdir(parents=True)
    boot.write_text("boot-a\n")
    return Sequencer(tmp_path / "proc", clock_ns=lambda: int(clock.t * 1e9))


async def test_full_report_then_leases_then_full_again_on_change(tmp_path: Path) -> None:
    clock = Clock()
    async with running(config(tmp_path), [MemFencer()]) as (agg, url):
        hb = Heartbeat(PublishConfig(aggregator_url=url, full_report_interval=300.0), clock=clock,
                       sequencer=sequencer(tmp_path, clock))
        await hb.start()
        try:
            rec = agg.mem.nodes["dgx01"]
            assert await hb.send(healthy(1000))
            assert (hb.stats.full, hb.stats.leases) == (1, 0) and (rec.boot_id, rec.report_seq) == ("boot-a", 5000e9)
            # readings changed, verdicts did not: a lease, and the aggregator moves on in the agent's order
            assert hb.lease_for(healthy(1030, temp="36.0")) is not None
            assert await hb.send(healthy(1030, temp="36.0"))
            assert (hb.stats.full, hb.stats.leases) == (1, 1) and rec.report_seq == 5000e9 + 1
            assert rec.status is Status.OK
            # a verdict changed: the full report, and the aggregator opens the condition
            assert hb.lease_for(failing(1060)) is None
            assert await hb.send(failing(1060))
            assert (hb.stats.full, hb.stats.leases) == (2, 1)
            assert [(c.check, c.status) for c in agg.mem.conditions_of("dgx01")] == [("xid", Status.FAIL)]
            assert await hb.send(failing(1090))
            assert (hb.stats.full, hb.stats.leases) == (2, 2)
            # the full-report interval passed: full again though nothing changed
            clock.t += 300
            assert hb.lease_for(failing(1120)) is None
            assert await hb.send(failing(1120))
            assert (hb.stats.full, hb.stats.leases, hb.stats.conflicts) == (3, 2, 0)
        finally:
            await hb.stop()


async def test_a_lease_the_aggregator_cannot_match_is_followed_by_the_full_report(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    hb = Heartbeat(PublishConfig(aggregator_url="", full_report_interval=300.0), clock=Clock())
    await hb.start()
    try:
        async with running(cfg, [MemFencer()]) as (agg, url):
            hb.url = f"{url}/v1/reports"
            assert await hb.send(healthy(1000)) and await hb.send(healthy(1030))
            assert (hb.stats.full, hb.stats.leases) == (1, 1)
        async with running(cfg, [MemFencer()]) as (agg, url):  # restarted: it knows no digest
            hb.url = f"{url}/v1/reports"
            assert await hb.send(healthy(1060))
            assert (hb.stats.full, hb.stats.leases, hb.stats.conflicts) == (2, 1, 1)
            assert await hb.send(healthy(1090))
            assert (hb.stats.full, hb.stats.leases, hb.stats.conflicts) == (2, 2, 1)
            # a transition reaches the aggregator (through the spool) that the agent has since
            # taken back: the next lease is refused and the full report puts things right
            agg.mem.apply_verdict("dgx01", Verdict("xid", "gpu0", Status.FAIL, Action.REBOOT, 1095.0), 1095.0)
            assert [c.check for c in agg.mem.conditions_of("dgx01")] == ["xid"]
            assert await hb.send(healthy(1120))
            assert (hb.stats.full, hb.stats.leases, hb.stats.conflicts) == (3, 2, 2)
            assert agg.mem.conditions_of("dgx01") == []
    finally:
        await hb.stop()


async def test_an_unreachable_aggregator_is_a_failed_heartbeat_not_an_error() -> None:
    hb = Heartbeat(PublishConfig(aggregator_url=f"http://127.0.0.1:{free_port()}", timeout=2.0))
    await hb.start()
    try:
        assert not await hb.send(healthy(1000))
        assert hb.stats.failures == 1 and hb.stats.full == 0
        assert hb.lease_for(healthy(1030)) is None, "nothing was taken, so nothing can be leased"
    finally:
        await hb.stop()


async def test_an_aggregator_that_refuses_leases_gets_full_reports() -> None:
    got: list[dict[str, object]] = []

    async def reports(request: web.Request) -> web.Response:
        body = await request.json()
        got.append(body)
        if "results" not in body:
            return web.json_response({"error": "report.results: expected a list"}, status=400)
        return web.json_response({"applied": 1, "digest": "00000000000000aa"})

    app = web.Application()
    app.router.add_post("/v1/reports", reports)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    hb = Heartbeat(PublishConfig(aggregator_url=f"http://127.0.0.1:{port}"))
    await hb.start()
    try:
        assert await hb.send(healthy(1000)) and await hb.send(healthy(1030))
        assert ["results" in b for b in got] == [True, False, True]
        assert (hb.stats.full, hb.stats.leases, hb.stats.conflicts, hb.stats.failures) == (2, 0, 1, 0)
    finally:
        await hb.stop()
        await runner.cleanup()
