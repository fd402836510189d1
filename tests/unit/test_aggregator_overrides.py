"""Operator overrides: a silenced check does not fence (until it is lifted or expires by the
aggregator's clock), every change is audited and survives a restart; mark-healthy skips the
ladder and releases podhealth's fence; an operator's own drain is an event, never resumed."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.config_aggregator import AggAuthConfig
from podhealth.aggregator.model import FenceMode, FleetState
from podhealth.aggregator.policy import decide
from podhealth.vocab import Action
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_policy import NOW, cond, fenced_nodes, fleet, policy
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = pytest.mark.timeout(60)
ADMIN = "admin-token-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}


def cfg(tmp_path: Path, **kw: Any) -> Any:
    return config(tmp_path, auth=AggAuthConfig(admin_token=ADMIN), **kw)


def audit(agg: Any, node: str) -> list[str]:
    return [a["what"] for a in agg.store.audit_tail(500) if a["node"] == node]


async def decide_runs(agg: Any, n: int = 5) -> None:
    runs = agg.metrics.decisions._value.get()
    await until(lambda: agg.metrics.decisions._value.get() > runs + n)


async def test_a_silenced_check_does_not_fence_until_the_silence_expires(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(cfg(tmp_path, nodes=20), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        offset = [0.0]
        agg.clock = lambda: time.time() + offset[0]
        r = await s.post(f"{url}/api/v1/nodes/dgx01/silence", headers=H,
                         json={"check": "xid", "duration": "1h", "reason": "known bad cable, RMA open", "who": "ana"})
        assert r.status == 200, await r.text()
        body = await r.json()
        assert body["check"] == "xid" and body["who"] == "ana" and body["until"] > time.time() + 3500
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", time.time()))
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", time.time()))  # not silenced: fenced
        await until(lambda: "dgx02" in fencer.fenced)
        await decide_runs(agg)
        assert "dgx01" not in fencer.fenced and agg.mem.nodes["dgx01"].fence is FenceMode.NONE
        assert any(n.kind == "silenced" and n.node == "dgx01" for n in agg.last_decision.notes)
        node = await (await s.get(f"{url}/api/v1/nodes/dgx01")).json()
        assert [x["check"] for x in node["silences"]] == ["xid"] and node["silences"][0]["reason"].startswith("known")
        assert "silence" in audit(agg, "dgx01")
        offset[0] = 3601.0  # the aggregator's clock passes the end: housekeeping drops it, the check counts
        await until(lambda: "silence expired" in audit(agg, "dgx01"))
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", time.time() + offset[0]))  # still failing
        await until(lambda: "dgx01" in fencer.fenced)
        assert "silence expired" in audit(agg, "dgx01") and not agg.silences
        assert (await (await s.get(f"{url}/api/v1/nodes/dgx01")).json())["silences"] == []


async def test_unsilence_lets_the_check_count_again_and_silences_survive_a_restart(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(cfg(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        for node in ("dgx01", "dgx02"):
            r = await s.post(f"{url}/api/v1/nodes/{node}/silence", headers=H,
                             json={"check": "xid", "duration": 7200, "reason": "vendor on site"})
            assert r.status == 200
    async with running(cfg(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert set(agg.silences) == {("dgx01", "xid"), ("dgx02", "xid")}
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", time.time()))
        await decide_runs(agg)
        assert not fencer.fenced
        r = await s.post(f"{url}/api/v1/nodes/dgx01/unsilence", headers=H, json={"check": "xid", "reason": "done"})
        assert r.status == 200 and (await r.json())["state"] == "lifted"
        await until(lambda: "dgx01" in fencer.fenced)
        assert ("dgx01", "xid") not in agg.silences and "unsilence" in audit(agg, "dgx01")
        assert (await s.post(f"{url}/api/v1/nodes/dgx01/unsilence", headers=H, json={"check": "xid"})).status == 404


@pytest.mark.parametrize("body, headers, status", [
    ({"check": "xid", "duration": "2h", "reason": "r"}, {}, 401),
    ({"check": "xid", "duration": "2h", "reason": "r"}, {"Authorization": "Bearer nope"}, 401),
    ({"check": "xid", "duration": "2h", "reason": "r"}, {**H, "Origin": "http://evil.example"}, 403),
    ({"check": "xid", "duration": "2h"}, H, 400),  # no reason
    ({"check": "xid", "duration": "forever", "reason": "r"}, H, 400),
    ({"check": "xid", "duration": "31d", "reason": "r"}, H, 400),
    ({"check": "xid", "duration": 5, "reason": "r"}, H, 400),
    ({"check": "XID; drop", "duration": "2h", "reason": "r"}, H, 400),
    ({"duration": "2h", "reason": "r"}, H, 400),
])
async def test_bad_silences_are_refused_and_change_nothing(tmp_path: Path, body: dict[str, Any],
                                                          headers: dict[str, str], status: int) -> None:
    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        r = await s.post(f"{url}/api/v1/nodes/dgx01/silence", headers=headers, json=body)
        assert r.status == status, await r.text()
        assert not agg.silences and agg.store.silences() == () and "silence" not in audit(agg, "dgx01")
        r = await s.post(f"{url}/api/v1/nodes/dgx99/silence", headers=H,
                         json={"check": "xid", "duration": "2h", "reason": "r"})
        assert r.status == 404


async def test_mark_healthy_releases_podhealths_fence_and_skips_the_ladder(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(cfg(tmp_path), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", time.time()))
        await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED)
        agg.mem.set_node("dgx01", ladder="repair", hold=True, hold_reason="REPAIR: test")  # as the ladder leaves it
        r = await s.post(f"{url}/api/v1/nodes/dgx01/mark-healthy", headers=H,
                         json={"reason": "swapped the GPU; field diag passed", "who": "ana"})
        assert r.status == 200, await r.text()
        out = await r.json()
        assert out["was"]["ladder"] == "repair" and out["state"] == "done"
        rec = agg.mem.nodes["dgx01"]
        assert rec.fence is FenceMode.NONE and "dgx01" not in fencer.fenced
        assert rec.ladder == "" and not rec.hold and rec.released_at > 0
        assert "marked healthy" in audit(agg, "dgx01")
        await decide_runs(agg)  # the XID still open: released by an operator, it does not fence again
        assert "dgx01" not in fencer.fenced and fencer.count("fence", "dgx01") == 1
        assert (await s.post(f"{url}/api/v1/nodes/dgx01/mark-healthy", json={"reason": "x"})).status == 401


async def test_an_operators_drain_is_an_event_and_never_resumed(tmp_path: Path) -> None:
    fencer = MemFencer(fenced={"dgx02": "ops: fan replaced, burn-in tonight"})
    async with running(cfg(tmp_path, healthy_for=0.1), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem.nodes["dgx02"].fence is FenceMode.EXTERNAL
        h = await (await s.get(f"{url}/api/v1/nodes/dgx02/history")).json()
        ev = [i for i in h["items"] if i["type"] == "event" and i["kind"] == "operator_drain"]
        assert len(ev) == 1 and "ops: fan replaced" in ev[0]["event"]["event"]["text"]
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", time.time(), "OK"))
        r = await s.post(f"{url}/api/v1/nodes/dgx02/mark-healthy", headers=H, json={"reason": "looks fine"})
        assert r.status == 409 and "someone else" in (await r.json())["error"]
        await decide_runs(agg)
        await agg.reconcile()  # seen again: still theirs, no second event
        assert fencer.fenced["dgx02"].startswith("ops:") and fencer.count("release") == 0
        h = await (await s.get(f"{url}/api/v1/nodes/dgx02/history")).json()
        assert sum(1 for i in h["items"] if i["type"] == "event" and i["kind"] == "operator_drain") == 1
        # a human drains a node later: the periodic reconcile records it as an event too
        fencer.fenced["dgx03"] = "maint: PSU"
        await agg.reconcile()
        h = await (await s.get(f"{url}/api/v1/nodes/dgx03/history")).json()
        assert any(i["type"] == "event" and i["kind"] == "operator_drain" for i in h["items"])


# ---- decide() with silences as an input (pure) ----------------------------------------------------


def silenced(f: FleetState, *pairs: tuple[str, str]) -> FleetState:
    return dataclasses.replace(f, silenced=frozenset(pairs))


@pytest.mark.parametrize("pairs, fenced", [
    ((), ["dgx01"]),
    ((("dgx01", "xid"),), []),
    ((("dgx01", "nvlink"),), ["dgx01"]),  # another check of the node: the XID still fences
    ((("dgx02", "xid"),), ["dgx01"]),  # the same check on another node
])
def test_a_silenced_pair_never_fences(pairs: tuple[tuple[str, str], ...], fenced: list[str]) -> None:
    d = decide([cond("dgx01", "xid")], silenced(fleet(), *pairs), NOW, policy())
    assert fenced_nodes(d) == fenced
    assert bool(d.notes_of("silenced")) == (("dgx01", "xid") in pairs)


def test_a_silenced_check_on_one_node_leaves_its_other_failures_fencing() -> None:
    obs = [cond("dgx01", "xid"), cond("dgx01", "nfs_mount", "/home", action=Action.DRAIN)]
    d = decide(obs, silenced(fleet(), ("dgx01", "xid")), NOW, policy())
    assert fenced_nodes(d) == ["dgx01"] and d.of_kind("fence")[0].reason.check == "nfs_mount"


def test_silenced_failures_do_not_trip_the_breaker() -> None:
    storm = [cond(f"dgx{i:02d}", "ib_link", "mlx5_0/1", observed=NOW - 1, since=NOW - 100) for i in range(1, 41)]
    loud = decide(storm, fleet(n=100), NOW, policy(breaker_share_percent=10.0, breaker_min_nodes=3))
    assert loud.breaker.tripped
    quiet = decide(storm, silenced(fleet(n=100), *((f"dgx{i:02d}", "ib_link") for i in range(1, 41))), NOW,
                   policy(breaker_share_percent=10.0, breaker_min_nodes=3))
    assert not quiet.breaker.tripped and not fenced_nodes(quiet) and len(quiet.notes_of("silenced")) == 40
    assert all(n.detail.startswith("ib_link mlx5_0/1 FAIL") for n in quiet.notes_of("silenced"))


async def test_the_cli_silences_unsilences_and_marks_healthy(tmp_path: Path) -> None:
    import subprocess
    import sys

    async with running(cfg(tmp_path), [MemFencer()]) as (agg, url):
        def fleet(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "podhealth", "fleet", "--url", url, "--token", ADMIN, *args],
                                  capture_output=True, text=True, timeout=60)

        p = await asyncio.to_thread(fleet, "silence", "dgx01", "ib_link", "--for", "90m", "--reason", "cable swap")
        assert p.returncode == 0, p.stderr
        assert "dgx01: ib_link silenced until" in p.stdout and "cable swap" in p.stdout
        s = agg.silences[("dgx01", "ib_link")]
        assert s.until - s.created == 5400 and s.who  # who: the local user name
        p = await asyncio.to_thread(fleet, "silence", "dgx01", "ib_link", "--for", "forever", "--reason", "x")
        assert p.returncode == 1 and "duration" in p.stderr
        p = await asyncio.to_thread(fleet, "unsilence", "dgx01", "ib_link")
        assert p.returncode == 0 and "counts again" in p.stdout and not agg.silences
        p = await asyncio.to_thread(fleet, "mark-healthy", "dgx01", "--reason", "checked by hand")
        assert p.returncode == 0 and "marked healthy" in p.stdout
        assert "marked healthy" in audit(agg, "dgx01")
