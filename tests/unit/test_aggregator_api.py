"""The aggregator's HTTP API against a real aiohttp server on a loopback port."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.config_aggregator import AggAuthConfig
from podhealth.aggregator.model import FenceMode
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)

# ctok speaks for any node (the unsafe migration switch) so these API tests need one token;
# test_aggregator_auth covers per-node credentials and that ctok alone does not speak for nodes.
AUTH = AggAuthConfig(cluster_token="ctok", cluster_token_for_agents=True, node_tokens={"dgx01": "n1tok"},
                     admin_token="atok")


def report(node: str = "dgx01", t: float = 1000.0, status: str = "FAIL", action: str = "RESET_GPU",
           check: str = "xid", entity: str = "GPU0") -> dict[str, Any]:
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t, **order(t),
            "results": [{"check": check, "entity": entity, "status": status, "action": action, "since": t - 5,
                         "evidence": {"xid": "79"}, "summary": "fell off the bus"},
                        {"check": "nfs", "entity": "/home", "status": "OK", "action": "NONE"}]}


def order(t: float) -> dict[str, Any]:
    """The agent's place for a record made at `t` (agent/sequence.py): these tests' agent never reboots."""
    return {"boot_id": "boot-1", "seq": int(t * 1000)}


def event(eid: str, code: int = 79, t: float = 1000.0) -> dict[str, Any]:
    return {"id": eid, "type": "event", "time": t,
            "event": {"kind": "xid", "code": code, "time": t, "text": f"NVRM: Xid {code}", "id": eid}}


def transition(eid: str, status: str = "FAIL", t: float = 1000.0, check: str = "xid") -> dict[str, Any]:
    return {"id": eid, "type": "transition", "time": t, **order(t), "old": None,
            "new": {"check": check, "entity": "GPU1", "status": status, "action": "RESET_GPU", "since": t}}


async def call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None, token: str | None = None,
               data: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    kw: dict[str, Any] = {"headers": h}
    if data is not None:
        kw["data"] = data
    elif body is not None:
        kw["json"] = body
    async with session.request(method, url, **kw) as r:
        text = await r.text()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text


def snapshot(agg: Any) -> Any:
    m = agg.mem
    return (dict(m.conditions), {n: (r.status, r.fence, r.report_time) for n, r in m.nodes.items()},
            set(m.seen_ids), agg.store.counts(), m.breaker)


async def test_bad_requests_are_refused_and_change_nothing(tmp_path: Path) -> None:
    fencer = MemFencer()
    cfg = config(tmp_path, auth=AUTH, max_body_bytes=4096, learn_nodes=False)
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        ok = await call(s, "POST", f"{url}/v1/events", {"node": "dgx02", "events": [event("first")]}, "ctok")
        assert ok == (200, {"applied": 1, "duplicate": 0, "stale": 0, "unchanged": 0})
        before = snapshot(agg)
        good_then_bad = {"node": "dgx02", "events": [transition("t1"), {"id": "t2", "type": "transition",
                                                                       "time": 1, "new": {"check": "x", "status": "MEH"}}]}
        cases: list[tuple[str, Any, str | None, bytes | None, int, str]] = [
            ("/v1/reports", report(), None, None, 401, "missing bearer token"),
            ("/v1/reports", report(), "nope", None, 401, "invalid token"),
            ("/v1/reports", report("dgx02"), "n1tok", None, 401, "this token speaks for dgx01, not dgx02"),
            ("/v1/events", {"node": "dgx02", "events": [event("x")]}, "atok", None, 401, "invalid token"),
            ("/v1/reports", None, "ctok", b'{"node": "dgx01", "results": [', 400, "body is not JSON"),
            ("/v1/reports", None, "ctok", b"\xff\xfe", 400, "body is not JSON"),
            ("/v1/reports", {"results": []}, "ctok", None, 400, "report.node: expected a non-empty string"),
            ("/v1/reports", {"node": "dgx01", "time": 1, "results": {}}, "ctok", None, 400,
             "report.results: expected a list"),
            ("/v1/reports", {"node": "dgx01;rm", "time": 1, "results": []}, "ctok", None, 400, "report.node:"),
            ("/v1/reports", report(status="BROKEN"), "ctok", None, 400,
             "report.results[0].status: expected one of OK, WARN, FAIL, UNKNOWN"),
            ("/v1/reports", {**report(), "time": "soon"}, "ctok", None, 400, "report.time: expected a number"),
            ("/v1/events", good_then_bad, "ctok", None, 400, "events[1].new.status"),
            ("/v1/events", {"node": "dgx02", "events": [{"id": "", "type": "event", "time": 1}]}, "ctok", None, 400,
             "events[0].id: expected a non-empty string"),
            ("/v1/events", {"node": "dgx02", "events": [{"id": "z", "type": "gossip", "time": 1}]}, "ctok", None,
             400, "events[0].type: expected one of event, transition, report, summary"),
            ("/v1/events", {"node": "dgx02", "events": "lots"}, "ctok", None, 400, "body.events: expected a list"),
            ("/v1/reports", report("dgx77"), "ctok", None, 403, "unknown node dgx77"),
            ("/v1/reports", None, "ctok", b"{" + b" " * 5000 + b"}", 413, "exceeds 4096"),
            ("/v1/alertmanager", {"alerts": [{"status": "maybe", "labels": {"node": "dgx01", "alertname": "A"}}]},
             "ctok", None, 400, "alerts[0].status: expected firing or resolved"),
            ("/v1/alertmanager", {"alerts": []}, "n1tok", None, 401, "node token cannot post alerts"),
            ("/v1/reports", {"node": "dgx01", "time": 1, "digest": "DEADBEEF"}, "ctok", None, 400,
             "lease.digest: expected the 16 hex digits"),
            ("/v1/reports", {"node": "dgx01", "digest": "0123456789abcdef"}, "ctok", None, 400,
             "lease.time: expected a number"),
            ("/v1/reports", {"node": "dgx01", "time": 1, "digest": "0123456789abcdef"}, "ctok", None, 409,
             "no full report of dgx01 with digest 0123456789abcdef"),
            ("/v1/reports", {"node": "dgx01", "time": 1, "digest": "0123456789abcdef"}, "n1tok", None, 409,
             "send the full report"),
            ("/v1/reports", {"node": "dgx02", "time": 1, "digest": "0123456789abcdef"}, "n1tok", None, 401,
             "this token speaks for dgx01"),
            ("/v1/reports", {"node": "dgx77", "time": 1, "digest": "0123456789abcdef"}, "ctok", None, 403,
             "unknown node dgx77"),
        ]
        for path, body, token, data, want, msg in cases:
            status, out = await call(s, "POST", url + path, body, token, data)
            assert status == want, (path, body, out)
            assert msg in out["error"], (msg, out)
        # a chunked body (no Content-Length) over the limit is refused too
        async def chunks() -> Any:
            for _ in range(10):
                yield b" " * 1000
        async with s.post(f"{url}/v1/reports", data=chunks(), headers={"Authorization": "Bearer ctok"}) as r:
            assert r.status == 413
        await asyncio.sleep(0.2)  # give the decide loop a chance to act on anything (it must not)
        assert snapshot(agg) == before
        assert fencer.count("fence") == 0
        metrics = await (await s.get(f"{url}/metrics")).text()
        assert 'podhealth_aggregator_ingest_requests_total{endpoint="reports",result="unauthorized"} 4.0' in metrics
        assert 'podhealth_aggregator_ingest_requests_total{endpoint="reports",result="too_large"} 2.0' in metrics
        assert 'podhealth_aggregator_ingest_requests_total{endpoint="reports",result="conflict"} 2.0' in metrics


async def test_admin_endpoints_need_the_admin_token_and_a_reason(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        before = snapshot(agg)
        for token, body, want in [(None, {"reason": "x"}, 401), ("ctok", {"reason": "x"}, 401),
                                  ("atok", {}, 400), ("atok", {"reason": "   "}, 400),
                                  ("atok", {"reason": 5}, 400), ("atok", {"reason": "x" * 501}, 400)]:
            status, out = await call(s, "POST", f"{url}/api/v1/nodes/dgx01/fence", body, token)
            assert status == want, (token, body, out)
        assert (await call(s, "POST", f"{url}/api/v1/nodes/dgx99/fence", {"reason": "x"}, "atok"))[0] == 404
        assert (await call(s, "POST", f"{url}/api/v1/nodes/bad%20name/fence", {"reason": "x"}, "atok"))[0] == 400
        assert (await call(s, "POST", f"{url}/api/v1/breaker/reset", {}, "ctok"))[0] == 401
        assert snapshot(agg) == before and fencer.calls == [("list", "")]

        status, out = await call(s, "POST", f"{url}/api/v1/nodes/dgx01/fence",
                                 {"reason": "bad DIMM, RMA 1234", "who": "alice"}, "atok")
        assert status == 200 and out["state"] == "done", out
        assert fencer.fenced["dgx01"].startswith("podhealth: operator node DRAIN [alice]")
        node = (await call(s, "GET", f"{url}/api/v1/nodes/dgx01"))[1]
        assert node["state"] == "fenced" and node["hold"] is True
        status, out = await call(s, "POST", f"{url}/api/v1/nodes/dgx01/release", {"reason": "fixed"}, "atok")
        assert status == 200 and out["state"] == "done" and "dgx01" not in fencer.fenced
        hist = (await call(s, "GET", f"{url}/api/v1/nodes/dgx01/history"))[1]["items"]
        audit = [(h["what"], h["who"], h["why"]) for h in hist if h["type"] == "audit"]
        assert ("fence done", "operator:alice", "bad DIMM, RMA 1234") in audit
        assert ("release done", "operator:api", "fixed") in audit


async def test_admin_endpoints_are_off_without_an_admin_token(tmp_path: Path) -> None:
    async with running(config(tmp_path), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        status, out = await call(s, "POST", f"{url}/api/v1/nodes/dgx01/fence", {"reason": "x"}, "anything")
        assert status == 403 and "no admin token" in out["error"]


async def test_events_are_applied_once_per_id(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        batch = {"node": "dgx01", "events": [event("e1"), transition("t1"), event("e1"), event("e2", code=48)]}
        st, out = await call(s, "POST", f"{url}/v1/events", batch, "n1tok")
        assert (st, out) == (200, {"applied": 3, "duplicate": 1, "stale": 0, "unchanged": 0})
        def ingested() -> tuple[int, int, int]:
            c = agg.store.counts()
            return c["events"], c["verdicts"], c["conditions"]
        counts = ingested()
        st, out = await call(s, "POST", f"{url}/v1/events", batch, "n1tok")
        assert (st, out) == (200, {"applied": 0, "duplicate": 4, "stale": 0, "unchanged": 0})
        assert ingested() == counts == (3, 1, 1)
        # the transition opened a condition that fences (once)
        await _wait(lambda: fencer.count("fence", "dgx01") == 1)
        await asyncio.sleep(0.2)
        assert fencer.count("fence") == 1


async def test_reports_drive_conditions_and_stale_reports_are_ignored(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1000), "ctok"))[1]["applied"] == 1
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1000), "ctok"))[1]["stale"] == 1
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1001), "ctok"))[1]["unchanged"] == 1
        await _wait(lambda: "dgx01" in fencer.fenced)
        nodes = (await call(s, "GET", f"{url}/api/v1/nodes?state=fenced"))[1]
        assert [n["name"] for n in nodes["nodes"]] == ["dgx01"] and nodes["nodes"][0]["checks"] == ["xid"]
        assert (await call(s, "GET", f"{url}/api/v1/nodes?check=nfs"))[1]["count"] == 0
        node = (await call(s, "GET", f"{url}/api/v1/nodes/dgx01"))[1]
        assert node["report"]["results"][0]["evidence"] == {"xid": "79"}
        assert [c["check"] for c in node["conditions"]] == ["xid"]
        fleet = (await call(s, "GET", f"{url}/api/v1/fleet"))[1]
        assert fleet["fence_budget"] == {"used": 1, "limit": 10} and fleet["counts"]["fenced"] == 1
        assert fleet["partitions"]["batch"] == {"nodes": 4, "fenced": 1, "limit": 1}
        assert (await call(s, "GET", f"{url}/api/v1/nodes/dgx42"))[0] == 404
        assert (await call(s, "GET", f"{url}/api/v1/nodes/dgx01/history?limit=x"))[0] == 400
        for before in ("nan", "inf", "-inf", "1e400"):  # NaN answered an empty page as if nothing had happened
            assert (await call(s, "GET", f"{url}/api/v1/nodes/dgx01/history?before={before}"))[0] == 400, before
        assert (await call(s, "GET", f"{url}/healthz"))[0] == 200


def lease(digest: str, t: float, node: str = "dgx01") -> dict[str, Any]:
    return {"node": node, "time": t, **order(t), "digest": digest, "agent_version": "0.1.0", "status": "FAIL",
            "staleness": {"nvml": 0.2}}


async def test_a_lease_stands_for_the_full_report_it_names(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        st, first = await call(s, "POST", f"{url}/v1/reports", report(t=1000), "n1tok")
        assert st == 200 and first["applied"] == 1 and len(first["digest"]) == 16
        digest = first["digest"]
        # the FAIL starts a fence; let it finish (memory, fencer and store) so the snapshots
        # compared below differ only by what the requests themselves did
        await _wait(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED and not agg.pending
                    and "dgx01" in fencer.fenced)
        # the same verdicts in a full report: the same digest
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1001), "n1tok"))[1] == {
            "applied": 0, "duplicate": 0, "stale": 0, "unchanged": 1, "digest": digest}
        rec = agg.mem.nodes["dgx01"]
        seen = rec.last_seen
        st, out = await call(s, "POST", f"{url}/v1/reports", lease(digest, 1010), "n1tok")
        assert (st, out) == (200, {"applied": 0, "duplicate": 0, "stale": 0, "unchanged": 1, "digest": digest})
        assert rec.report_seq == 1010_000 and rec.last_seen >= seen
        assert [c.check for c in agg.mem.conditions_of("dgx01")] == ["xid"]
        # older than what was applied: stale, and nothing moves back
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1005), "n1tok"))[1]["stale"] == 1
        assert rec.report_seq == 1010_000
        # a digest this aggregator did not give: 409, nothing changes
        before = snapshot(agg)
        other = "0" * 16 if digest != "0" * 16 else "1" * 16
        st, out = await call(s, "POST", f"{url}/v1/reports", lease(other, 1020), "n1tok")
        assert st == 409 and "send the full report" in out["error"]
        assert snapshot(agg) == before
        # a different report: a different digest, and the old one stops working
        st, out = await call(s, "POST", f"{url}/v1/reports", report(t=1030, status="WARN", action="NONE"), "n1tok")
        assert out["applied"] == 1 and out["digest"] != digest
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1040), "n1tok"))[0] == 409
        assert (await call(s, "POST", f"{url}/v1/reports", lease(out["digest"], 1040), "n1tok"))[1]["unchanged"] == 1


async def test_a_transition_voids_the_last_report_and_older_reports_are_stale(tmp_path: Path) -> None:
    """Transitions come through the agent's spool and heartbeats do not, so they may cross."""
    async with running(config(tmp_path, auth=AUTH), [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        digest = (await call(s, "POST", f"{url}/v1/reports", report(t=1000), "n1tok"))[1]["digest"]
        assert [c.check for c in agg.mem.conditions_of("dgx01")] == ["xid"]
        # the xid check recovers (its transition), then a heartbeat from before that arrives late
        ok = {"id": "r1", "type": "transition", "time": 1005.0, **order(1005), "old": None,
              "new": {"check": "xid", "entity": "GPU0", "status": "OK", "action": "NONE", "since": 1005.0}}
        assert (await call(s, "POST", f"{url}/v1/events", {"node": "dgx01", "events": [ok]}, "n1tok"))[1]["applied"] == 1
        assert agg.mem.conditions_of("dgx01") == []
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1004), "n1tok"))[1]["stale"] == 1
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1004), "n1tok"))[0] == 409
        assert agg.mem.conditions_of("dgx01") == [], "nothing older than the transition reopens the condition"
        # a lease naming the report from before the transition no longer matches, however new
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1006), "n1tok"))[0] == 409
        # the same verdicts as that report, sent in full after the transition, are applied, not
        # taken as "unchanged": the transition changed what the aggregator believes
        st, out = await call(s, "POST", f"{url}/v1/reports", report(t=1007), "n1tok")
        assert out["applied"] == 1 and [c.check for c in agg.mem.conditions_of("dgx01")] == ["xid"]


async def test_leases_do_not_survive_a_restart(tmp_path: Path) -> None:
    cfg = config(tmp_path, auth=AUTH)
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        digest = (await call(s, "POST", f"{url}/v1/reports", report(t=1000), "n1tok"))[1]["digest"]
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1001), "n1tok"))[0] == 200
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem.nodes["dgx01"].report_seq == 1001_000  # what the lease said was kept
        assert (await call(s, "POST", f"{url}/v1/reports", lease(digest, 1002), "n1tok"))[0] == 409
        assert (await call(s, "POST", f"{url}/v1/reports", report(t=1002), "n1tok"))[1]["applied"] == 1


async def test_alertmanager_alerts_become_observations(tmp_path: Path) -> None:
    fencer = MemFencer()
    async with running(config(tmp_path, auth=AUTH), [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        firing = {"version": "4", "status": "firing", "alerts": [
            {"status": "firing", "labels": {"alertname": "PodhealthGpuFallenOffBus", "node": "dgx03",
                                            "severity": "critical", "action": "drain", "gpu": "5"},
             "annotations": {"summary": "GPU 5 is gone"}, "startsAt": "2030-01-01T00:00:00.123456789Z",
             "fingerprint": "abc123"},
            {"status": "firing", "labels": {"alertname": "SomethingElse", "instance": "x:9100"}}]}
        st, out = await call(s, "POST", f"{url}/v1/alertmanager", firing, "ctok")
        assert st == 200 and out["applied"] == 1
        [c] = agg.mem.conditions_of("dgx03")
        assert (c.check, c.entity, c.status.value, c.action.value, c.severity, c.source) == (
            "PodhealthGpuFallenOffBus", "5", "FAIL", "DRAIN", "critical", "alertmanager")
        await _wait(lambda: "dgx03" in fencer.fenced)
        assert "PodhealthGpuFallenOffBus 5 DRAIN [abc123]" in fencer.fenced["dgx03"]
        resolved = {"alerts": [{**firing["alerts"][0], "status": "resolved"}]}  # type: ignore[index, dict-item]
        st, out = await call(s, "POST", f"{url}/v1/alertmanager", resolved, "ctok")
        assert st == 200 and agg.mem.conditions_of("dgx03") == []


async def _wait(pred: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("timed out waiting")
        await asyncio.sleep(0.02)


@pytest.mark.parametrize("typed", [True, False], ids=["typed-path", "general-path"])
def test_an_unchanged_report_is_not_stored_again_until_report_refresh(typed: bool) -> None:
    """Issue 32: an unchanged full report (new time, new readings in passing checks' evidence) is
    not rewritten; a failing check's new evidence is stored at once; after report_refresh the
    readings are too. Both readers (msgspec's typed one, orjson's general one) agree."""
    from podhealth.aggregator import ingest
    from podhealth.aggregator.state import REPORT_REFRESH_S, Memory

    def read(doc: dict[str, Any]) -> ingest.ParsedReport:
        raw = json.dumps(doc).encode()
        rep = ingest.read_posted(raw) if typed else ingest.parse_report(json.loads(raw), raw)
        assert isinstance(rep, ingest.ParsedReport)
        return rep

    def stored(ops: list[Any]) -> list[bytes]:
        return [params[1] for sql, params in ops if sql.startswith("INSERT INTO reports")]

    def at(t: float, nfs: dict[str, str], xid: dict[str, str]) -> dict[str, Any]:
        doc = report(t=t)
        doc["results"][0]["since"] = 995.0  # the agent's first-seen time stays
        doc["results"][0]["evidence"] = xid
        doc["results"][1]["evidence"] = nfs
        return doc

    mem = Memory()
    res, ops = ingest.apply_report(mem, read(at(1000, {"probe_seconds": "0.0011"}, {"xid": "79"})), 5000.0)
    assert res.applied == 1 and len(stored(ops)) == 1
    res, ops = ingest.apply_report(mem, read(at(1300, {"probe_seconds": "0.0042"}, {"xid": "79"})), 5300.0)
    assert res.unchanged == 1 and stored(ops) == [], "new readings of a passing check alone are not stored"
    res, ops = ingest.apply_report(mem, read(at(1600, {"probe_seconds": "0.0042"}, {"xid": "79", "count": "3"})),
                                   5600.0)
    assert res.unchanged == 1 and len(stored(ops)) == 1, "a failing check's new evidence is stored at once"
    res, ops = ingest.apply_report(mem, read(at(1900, {"probe_seconds": "0.0007"}, {"count": "3", "xid": "79"})),
                                   5900.0)
    assert stored(ops) == [], "the same evidence in another key order is the same"
    res, ops = ingest.apply_report(mem, read(at(2000, {"probe_seconds": "0.0009"}, {"xid": "79", "count": "3"})),
                                   5600.0 + REPORT_REFRESH_S)
    assert res.unchanged == 1 and len(stored(ops)) == 1 and b'"probe_seconds": "0.0009"' in stored(ops)[0]
