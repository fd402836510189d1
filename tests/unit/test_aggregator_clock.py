"""The aggregator's clock is the judge: agents' records are ordered by their own (boot_id, seq),
their time claims order nothing, the breaker counts by receive time, intervals survive a wall
clock step, and a flapping node is held for an operator."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp
import pytest

from podhealth.aggregator import ingest
from podhealth.config_aggregator import AggAuthConfig, CapsConfig, FlapHoldConfig, RateLimitConfig
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.policy import Policy, decide
from podhealth.aggregator.service import Aggregator
from podhealth.aggregator.state import Memory
from podhealth.aggregator.store import Store, connect, migrate
from podhealth.vocab import Status
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)
AUTH = AggAuthConfig(node_tokens={"dgx01": "n1tok", "dgx02": "n2tok"}, admin_token="atok")


def report(node: str, t: float, status: str = "FAIL", seq: int | None = None, boot: str = "boot-1",
           since: float | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t,
        "results": [{"check": "xid", "entity": "GPU0", "status": status,
                     "action": "NONE" if status == "OK" else "RESET_GPU", "since": t - 5 if since is None else since}]}
    if seq is not None:
        doc.update(boot_id=boot, seq=seq)
    return doc


async def post(s: aiohttp.ClientSession, url: str, body: Any, token: str) -> tuple[int, Any]:
    async with s.post(url, json=body, headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json()


def status_of(agg: Aggregator, node: str = "dgx01") -> Status:
    assert agg.mem is not None
    return agg.mem.nodes[node].status


# ---- ordering by the agent's sequence -------------------------------------------------------------


def test_records_are_ordered_by_boot_and_seq_not_by_time() -> None:
    m = Memory()
    assert m.apply_report("n", (), 5000.0, "", 100.0, order=("b1", 10))[0] == "applied"
    # an older seq is stale whatever time it claims; a newer one is applied whatever time it claims
    assert m.apply_report("n", (), 9e9, "", 101.0, order=("b1", 9))[0] == "stale"
    assert m.apply_report("n", (), 1.0, "", 102.0, order=("b1", 11), fp=1)[0] == "applied"
    assert m.nodes["n"].report_time == 102.0, "the stored time is the aggregator's"
    # a transition older than the last report is stale; a newer one voids it (a transition
    # carries no time claim into the memory at all: apply_verdict takes none)
    from podhealth.aggregator.state import Verdict
    from podhealth.vocab import Action
    v = Verdict("xid", "GPU0", Status.FAIL, Action.RESET_GPU, 1.0)
    assert m.apply_verdict("n", v, 103.0, order=("b1", 10))[0] == "stale"
    assert m.apply_verdict("n", v, 104.0, order=("b1", 12))[0] == "applied"
    assert m.apply_report("n", (), 9e9, "", 105.0, order=("b1", 11), fp=2)[0] == "stale"
    # a reboot is a new epoch (seq starts low again); the old boot's late records are stale
    assert m.apply_report("n", (), 1.0, "", 106.0, order=("b2", 1), fp=3)[0] == "applied"
    assert m.apply_verdict("n", v, 107.0, order=("b1", 99))[0] == "stale"
    assert m.nodes["n"].retired == ("b1",) and m.conditions_of("n") == []
    # an agent that sends no seq is ordered by arrival: never stale
    assert m.apply_report("n", (), 0.0, "", 108.0, fp=4)[0] == "applied"
    # an operator's reset forgets the order: any boot starts afresh
    m.reset_order("n")
    assert m.apply_report("n", (), 1.0, "", 109.0, order=("b1", 1), fp=5)[0] == "applied"


def test_bad_order_fields_are_refused() -> None:
    for bad in ({"seq": 1}, {"boot_id": "b"}, {"boot_id": "", "seq": 1}, {"boot_id": "b", "seq": -1},
                {"boot_id": "b", "seq": 2**63}, {"boot_id": "b", "seq": True}, {"boot_id": "b\n", "seq": 1},
                {"boot_id": "b", "seq": 1.5}):
        with pytest.raises(ingest.BadRequest, match="boot_id|seq"):
            ingest.parse_report({**report("n", 1.0), **bad}, b"")


async def test_a_fail_from_the_future_does_not_hold_the_node(tmp_path: Path) -> None:
    """`time: now + 3600` once kept every later report stale for the hour."""
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        # an agent with seq, its clock an hour ahead (later corrected by NTP)
        assert (await post(s, f"{url}/v1/reports", report("dgx01", now + 3600, seq=10), "n1tok"))[1]["applied"] == 1
        assert status_of(agg) is Status.FAIL
        st, out = await post(s, f"{url}/v1/reports", report("dgx01", now, "OK", seq=11), "n1tok")
        assert (st, out["applied"], out["stale"]) == (200, 1, 0) and status_of(agg) is Status.OK
        # an older agent (no seq), or a forger: ordered by arrival, the claim times nothing
        assert (await post(s, f"{url}/v1/reports", report("dgx02", now + 3600), "n2tok"))[1]["applied"] == 1
        assert status_of(agg, "dgx02") is Status.FAIL
        assert (await post(s, f"{url}/v1/reports", report("dgx02", now, "OK"), "n2tok"))[1]["applied"] == 1
        assert status_of(agg, "dgx02") is Status.OK
        assert agg.mem is not None and agg.mem.nodes["dgx02"].report_time <= time.time()
        # counted, on the node and in /metrics
        async with s.get(f"{url}/api/v1/nodes/dgx01") as r:
            node = await r.json()
        assert node["clock"]["ahead"] == 1 and node["order"] == {"boot_id": "boot-1", "seq": 11, "retired_boots": []}
        async with s.get(f"{url}/metrics") as r:
            assert "podhealth_aggregator_clock_ahead_total 2.0" in await r.text()


async def test_time_1e12_does_not_make_a_failing_node_look_ok_even_across_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path, auth=AUTH)
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        assert (await post(s, f"{url}/v1/reports", report("dgx01", now, seq=100), "n1tok"))[1]["applied"] == 1
        # a forged OK with a time from the far future (and no seq)
        assert (await post(s, f"{url}/v1/reports", report("dgx01", 1e12, "OK"), "n1tok"))[1]["applied"] == 1
        assert status_of(agg) is Status.OK
        # the real agent's next report is not stale: the node is FAIL again
        assert (await post(s, f"{url}/v1/reports", report("dgx01", now + 1, seq=101), "n1tok"))[1]["applied"] == 1
        assert status_of(agg) is Status.FAIL
        await post(s, f"{url}/v1/reports", report("dgx01", 1e12, "OK"), "n1tok")
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem is not None and agg.mem.nodes["dgx01"].report_time < 1e10
        assert agg.mem.nodes["dgx01"].report_seq == 101
        st, out = await post(s, f"{url}/v1/reports", report("dgx01", time.time(), seq=102), "n1tok")
        assert out["applied"] == 1 and status_of(agg) is Status.FAIL


def test_the_migration_cuts_back_stored_claims_from_the_future(tmp_path: Path) -> None:
    db = tmp_path / "agg.db"
    conn = connect(db)
    migrate(conn, upto=3)
    conn.execute("INSERT INTO nodes (name, last_seen, report_time) VALUES ('dgx01', 100.0, 1e12)")
    conn.execute("INSERT INTO conditions VALUES ('dgx01', 'xid', 'GPU0', 'FAIL', 'REBOOT', 'critical', 50.0, 90.0, "
                 "'agent', '', '', 0)")
    conn.execute("INSERT INTO events VALUES ('e1', 'dgx01', 'event', 1e12, 95.0, '{}')")
    conn.close()
    s = Store(db)
    loaded = s.load(now=100.0, event_retention=1000.0)
    assert [(r.report_time, r.boot_id, r.report_seq) for r in loaded.nodes] == [(100.0, "", 0)]
    assert [c.opened for c in loaded.conditions] == [50.0]
    assert s.history("dgx01")[0]["time"] == 95.0
    s.close()


async def test_an_admin_resets_a_nodes_order_with_the_token_and_it_is_audited(tmp_path: Path) -> None:
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        # a runaway seq (a forger with the node's token) leaves the real agent's reports stale
        await post(s, f"{url}/v1/reports", report("dgx01", now, seq=2**62), "n1tok")
        assert (await post(s, f"{url}/v1/reports", report("dgx01", now, "OK", seq=500), "n1tok"))[1]["stale"] == 1
        reset = f"{url}/api/v1/nodes/dgx01/reset-order"
        assert (await post(s, reset, {"reason": "forged seq"}, "n1tok"))[0] == 401
        assert (await post(s, reset, {}, "atok"))[0] == 400, "a reason is required"
        st, out = await post(s, reset, {"reason": "forged seq", "who": "alice"}, "atok")
        assert st == 200 and out["was"]["seq"] == 2**62
        assert (await post(s, f"{url}/v1/reports", report("dgx01", now, "OK", seq=501), "n1tok"))[1]["applied"] == 1
        assert status_of(agg) is Status.OK
        async with s.get(f"{url}/api/v1/nodes/dgx01/history") as r:
            items = (await r.json())["items"]
        assert any(i["type"] == "audit" and i["what"] == "order reset" and i["who"] == "operator:alice"
                   for i in items)


# ---- the breaker counts by the aggregator's clock -----------------------------------------------


def test_200_failing_nodes_with_clocks_an_hour_behind_trip_the_breaker() -> None:
    policy = Policy(rules=config(Path("/tmp")).rules, max_fenced=10, max_percent_per_partition=100.0,
                    fences_per_minute=1000, breaker_share_percent=10.0, breaker_window=300.0)
    m = Memory()
    now = 1_800_000_000.0
    for i in range(200):
        m.configure_node(f"n{i:03d}", "", "", "", "batch", now)
    tripped_at = None
    for i in range(200):
        lag = now - 3600.0  # the agent's clock
        rep = ingest.read_report(json.dumps(report(f"n{i:03d}", lag, since=lag - 5)).encode())
        ingest.apply_report(m, rep, now + i)
        d = decide(m.open_conditions(), m.fleet(), now + i, policy)
        for a in d.of_kind("fence"):
            m.set_node(a.node, fence=FenceMode.FENCED)
        m.set_breaker(d.breaker)
        if d.breaker.tripped and tripped_at is None:
            tripped_at = i
        assert sum(1 for r in m.nodes.values() if r.fence.ours) <= 10
    assert tripped_at == 20, "trips once more than 10% of 200 turned bad within the window"
    assert sum(1 for r in m.nodes.values() if r.fence.ours) == 10


def test_a_node_whose_clock_lags_does_not_skip_min_duration() -> None:
    """The agent's `since` is a claim on its own clock: an hour behind, a FAIL it saw 5 s ago
    is 5 s old here, not an hour (so a rule's min_duration still waits), and one it saw 10
    minutes ago is 10 minutes old."""
    rules = [dataclasses.replace(r, min_duration=60.0) for r in config(Path("/tmp")).rules]
    policy = Policy(rules=rules, max_fenced=10, max_percent_per_partition=100.0, fences_per_minute=1000,
                    breaker_share_percent=100.0, breaker_window=300.0)
    now = 1_800_000_000.0
    for node, seen_ago, fenced in (("late", 5.0, False), ("long", 600.0, True)):
        m = Memory()
        m.configure_node(node, "", "", "", "batch", now)
        lag = now - 3600.0  # the agent's clock
        ingest.apply_report(m, ingest.read_report(json.dumps(report(node, lag, since=lag - seen_ago)).encode()), now)
        [c] = m.conditions_of(node)
        assert c.since == pytest.approx(now - seen_ago)
        d = decide(m.open_conditions(), m.fleet(), now, policy)
        assert bool(d.of_kind("fence")) is fenced, d
    # a claim from the future is our receive time, offset or not
    m = Memory()
    ingest.apply_report(m, ingest.read_report(json.dumps(report("n", now, since=now + 999)).encode()), now)
    assert m.conditions_of("n")[0].since == now


# ---- intervals on a monotonic clock -------------------------------------------------------------


class Clocks:
    def __init__(self) -> None:
        self.wall = 1_800_000_000.0
        self.mono = 5_000.0

    def step(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds


@contextlib.asynccontextmanager
async def started(tmp_path: Path, fencer: MemFencer, clocks: Clocks, **kw: Any) -> AsyncIterator[Aggregator]:
    agg = await Aggregator.open(config(tmp_path, **kw), fencers=[fencer], clock=lambda: clocks.wall,
                                mono=lambda: clocks.mono)
    agg.housekeeping_interval = 3600.0
    try:
        await agg.start()
        yield agg
    finally:
        await agg.stop()


async def apply(agg: Aggregator, doc: dict[str, Any]) -> None:
    assert agg.mem is not None
    _, ops = ingest.apply_report(agg.mem, ingest.read_report(json.dumps(doc).encode()), agg.clock())
    await agg.commit(ops)


async def settle(agg: Aggregator) -> None:
    while agg._action_tasks:
        await asyncio.gather(*list(agg._action_tasks))


async def test_the_rate_limit_holds_when_the_wall_clock_steps_back(tmp_path: Path) -> None:
    clocks, fencer = Clocks(), MemFencer()
    async with started(tmp_path, fencer, clocks, rate_limit=RateLimitConfig(fences_per_minute=1),
                       caps=CapsConfig(max_percent_per_partition=100.0), decide_interval=3600.0) as agg:
        await apply(agg, report("dgx01", clocks.wall))
        agg.run_decide()
        await settle(agg)
        assert fencer.count("fence", "dgx01") == 1
        clocks.wall -= 3600.0  # NTP steps the wall clock back an hour; 5 s pass
        clocks.mono += 5.0
        await apply(agg, report("dgx02", clocks.wall))
        d = agg.run_decide()
        await settle(agg)
        assert [n.node for n in d.notes_of("rate_limited")] == ["dgx02"] and fencer.count("fence", "dgx02") == 0
        assert agg.fleet_json()["rate_limit"]["used"] == 1
        clocks.mono += 60.0  # a minute later (by the monotonic clock) it may go
        assert [a.node for a in agg.run_decide().of_kind("fence")] == ["dgx02"]
        await settle(agg)


async def test_the_decide_loop_keeps_its_interval_when_the_wall_clock_steps_back(tmp_path: Path) -> None:
    clocks, fencer = Clocks(), MemFencer()
    async with started(tmp_path, fencer, clocks, decide_interval=0.02) as agg:
        runs = agg.metrics.decisions
        deadline = asyncio.get_running_loop().time() + 10
        while runs._value.get() < 1:  # type: ignore[attr-defined]
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.01)
        clocks.wall -= 3600.0
        before = runs._value.get()  # type: ignore[attr-defined]
        clocks.mono += 1.0  # an interval passes; nothing changed in the fleet
        while runs._value.get() <= before:  # type: ignore[attr-defined]
            assert asyncio.get_running_loop().time() < deadline, "the loop stopped running on its interval"
            await asyncio.sleep(0.01)


# ---- the flap hold ------------------------------------------------------------------------------


async def test_a_flapping_node_is_held_fenced_for_an_operator(tmp_path: Path) -> None:
    clocks, fencer = Clocks(), MemFencer()
    async with started(tmp_path, fencer, clocks, healthy_for=0.0, decide_interval=3600.0,
                       flap_hold=FlapHoldConfig(cycles=3, window=3600.0),
                       rate_limit=RateLimitConfig(fences_per_minute=100)) as agg:
        mem = agg.mem
        assert mem is not None
        rec = mem.nodes["dgx01"]
        for cycle in range(3):
            await apply(agg, report("dgx01", clocks.wall))
            agg.run_decide()
            await settle(agg)
            assert rec.fence is FenceMode.FENCED and not rec.hold
            await apply(agg, report("dgx01", clocks.wall, "OK"))
            # the handover passed (what _do_handover does next): podhealth releases it
            await agg.actions.release_after_handover("dgx01", clocks.wall)
            await settle(agg)
            assert rec.fence is FenceMode.NONE
            clocks.step(60.0)
        await apply(agg, report("dgx01", clocks.wall))
        agg.run_decide()
        await settle(agg)
        why = "flapping: fenced/released 3 times in 1h; release by operator"
        assert rec.fence is FenceMode.FENCED and rec.hold and rec.hold_reason == why
        node = agg.node_json("dgx01")
        assert node is not None and node["hold"] and node["hold_reason"] == why
        # healthy again, yet no automatic return: it waits for an operator, and says why
        await apply(agg, report("dgx01", clocks.wall, "OK"))
        d = agg.run_decide()
        assert not d.of_kind("handover") and not d.of_kind("release")
        assert [n.detail for n in d.notes_of("operator_hold")] == [why + ": waits for `podhealth fleet release`"]
        assert agg.store is not None
        assert any(a.get("what") == "hold" and a.get("why") == why for a in agg.store.history("dgx01"))
        # the operator releases it: hold and count cleared
        out = await agg.operator_release("dgx01", "looked at it", "alice")
        assert out["state"] == "done" and not rec.hold and rec.hold_reason == "" and rec.cycles == []


async def test_the_flap_count_survives_a_restart(tmp_path: Path) -> None:
    clocks, fencer = Clocks(), MemFencer()
    kw: dict[str, Any] = dict(healthy_for=0.0, decide_interval=3600.0, flap_hold=FlapHoldConfig(cycles=2))
    async with started(tmp_path, fencer, clocks, **kw) as agg:
        for _ in range(2):
            await apply(agg, report("dgx01", clocks.wall))
            agg.run_decide()
            await settle(agg)
            await agg.actions.release_after_handover("dgx01", clocks.wall)
            await settle(agg)
            clocks.step(61.0)
    async with started(tmp_path, fencer, clocks, **kw) as agg:
        assert agg.mem is not None and len(agg.mem.nodes["dgx01"].cycles) == 2
        await apply(agg, report("dgx01", clocks.wall, seq=None))
        agg.run_decide()
        await settle(agg)
        assert agg.mem.nodes["dgx01"].hold and agg.mem.nodes["dgx01"].hold_reason.startswith("flapping: ")


async def test_a_node_someone_keeps_resuming_is_held_too(tmp_path: Path) -> None:
    """The cycle need not end in podhealth's own release: a script that resumes the node in Slurm
    while it still fails makes podhealth fence it again, and again."""
    clocks, fencer = Clocks(), MemFencer()
    async with started(tmp_path, fencer, clocks, decide_interval=3600.0, flap_hold=FlapHoldConfig(cycles=3)) as agg:
        assert agg.mem is not None
        rec = agg.mem.nodes["dgx01"]
        await apply(agg, report("dgx01", clocks.wall))
        for _ in range(4):
            agg.run_decide()
            await settle(agg)
            assert rec.fence is FenceMode.FENCED
            if rec.hold:
                break
            del fencer.fenced["dgx01"]  # someone resumes it
            await agg.reconcile()
            assert rec.fence is FenceMode.NONE
            clocks.step(30.0)
        assert fencer.count("fence", "dgx01") == 4 and rec.hold and rec.hold_reason.startswith("flapping: ")
