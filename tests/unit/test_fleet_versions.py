"""The fleet's versions view: the pure aggregation, GET /api/v1/fleet/versions (and /v1/fleet/versions)
on a real aggregator fed agent reports, the UI section, and `podhealth fleet versions`."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.aggregator import ui, versions
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running

pytestmark = pytest.mark.timeout(60)

STATIC = Path(ui.__file__).parent / "static"
FW_OLD, FW_NEW = "28.37.1014", "28.39.1002"


def drift(field: str, observed: str, status: str = "OK") -> dict[str, Any]:
    return {"check": "drift", "entity": field, "status": status, "action": "NONE",
            "evidence": {"observed": observed}, "summary": observed}


def report(node: str, t: float, fw: str, driver: str = "550.54.15", with_drift: bool = True) -> dict[str, Any]:
    results: list[dict[str, Any]] = [{"check": "nfs_mount", "entity": "/home", "status": "OK", "action": "NONE"}]
    if with_drift:  # the site profile states FW_NEW: an older firmware is drift (WARN)
        results += [drift("driver", driver), drift("hca_fw", fw, "WARN" if fw == FW_OLD else "OK"), drift("kernel", ""),
                    drift("vbios", "96.00.89.00.01"), drift("ofed", "")]
    return {"node": node, "agent_version": "0.1.0", "profile": "dgx-h100", "time": t,
            "boot_id": "boot-1", "seq": int(t * 1000), "results": results}


def test_fleet_versions_groups_nodes_by_version() -> None:
    readings = [("dgx01", "hca_fw", FW_OLD), ("dgx02", "hca_fw", f"{FW_NEW}, 32.41.1000"), ("dgx03", "hca_fw", FW_NEW),
                ("dgx01", "driver", "550.54.15"), ("dgx02", "driver", "550.54.15"), ("dgx03", "kernel", "")]
    view = versions.fleet_versions(readings, ["dgx01", "dgx02", "dgx03", "dgx04"])
    assert view["hca_fw"] == {FW_NEW: ["dgx02", "dgx03"], "32.41.1000": ["dgx02"], FW_OLD: ["dgx01"]}
    assert view["counts"]["hca_fw"] == {FW_NEW: 2, "32.41.1000": 1, FW_OLD: 1}  # most common first
    assert view["driver"] == {"550.54.15": ["dgx01", "dgx02"]}
    assert view["kernel"] == {}  # unreadable: under no version
    assert view["reporting"] == 3 and view["not_reported"] == ["dgx04"]
    assert list(view["counts"]) == list(versions.FIELDS)
    said = versions.lines(view)
    assert f"HCA firmware: 2 nodes run {FW_NEW}, 1 node runs {FW_OLD}, 1 node runs 32.41.1000" in said  # ties by name
    assert not any(line.startswith("kernel") for line in said)


async def test_api_counts_versions_from_stored_reports(tmp_path: Path) -> None:
    cfg = config(tmp_path, nodes=4, auth=AggAuthConfig(admin_token="atok"))
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        posts = [report("dgx01", now, FW_OLD), report("dgx02", now, FW_NEW), report("dgx03", now, FW_NEW),
                 report("dgx04", now, FW_NEW, with_drift=False)]  # an older agent: no drift results
        for body in posts:
            async with s.post(url + "/v1/reports", json=body) as r:
                assert r.status == 200, await r.text()
        for path in ("/api/v1/fleet/versions", "/v1/fleet/versions"):
            async with s.get(url + path) as r:
                assert r.status == 200
                view = await r.json()
            assert view["hca_fw"] == {FW_NEW: ["dgx02", "dgx03"], FW_OLD: ["dgx01"]}
            assert view["counts"]["driver"] == {"550.54.15": 3}
            assert view["not_reported"] == ["dgx04"]
        # an upgrade (its drift WARN clears: a new verdict) shows in the report the aggregator keeps
        async with s.post(url + "/v1/reports", json=report("dgx01", now + 1, FW_NEW)) as r:
            assert r.status == 200
        async with s.get(url + "/api/v1/fleet/versions") as r:
            assert (await r.json())["counts"]["hca_fw"] == {FW_NEW: 3}


def test_store_skips_a_report_that_is_not_json(tmp_path: Path) -> None:
    from podhealth.aggregator.store import Store

    store = Store(tmp_path / "agg.db")
    try:
        store.apply([Store.op_report("dgx01", json.dumps(report("dgx01", 1.0, FW_OLD))),
                     Store.op_report("dgx02", "{truncated")])
        assert sorted(store.drift_readings()) == sorted([
            ("dgx01", "driver", "550.54.15"), ("dgx01", "hca_fw", FW_OLD), ("dgx01", "kernel", ""),
            ("dgx01", "vbios", "96.00.89.00.01"), ("dgx01", "ofed", "")])
    finally:
        store.close()


def test_ui_has_a_versions_section_served_as_an_asset() -> None:
    html = (STATIC / "fleet.html").read_text()
    js = (STATIC / "versions.js").read_text()
    assert 'id="versions"' in html and "/ui/static/versions.js" in html
    assert "versions.js" in ui.load_assets()
    assert 'getJSON("/api/v1/fleet/versions")' in js
    assert "innerHTML" not in js  # data reaches the page as text only (common.js el())


async def test_cli_prints_one_line_per_field(tmp_path: Path) -> None:
    cfg = config(tmp_path, nodes=4, auth=AggAuthConfig(admin_token="atok"))
    async with running(cfg, [MemFencer()]) as (agg, url), aiohttp.ClientSession() as s:
        now = time.time()
        for node, fw in (("dgx01", FW_OLD), ("dgx02", FW_NEW), ("dgx03", FW_NEW)):
            async with s.post(url + "/v1/reports", json=report(node, now, fw)) as r:
                assert r.status == 200
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "podhealth", "fleet", "--url", url, "versions",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        assert proc.returncode == 0, err.decode()
        text = out.decode()
        assert f"HCA firmware: 2 nodes run {FW_NEW}, 1 node runs {FW_OLD}" in text
        assert "dgx01" in text  # the odd one out is named
        assert "driver: 3 nodes run 550.54.15" in text


def test_readings_reread_only_reports_stored_since() -> None:
    asked: list[list[str]] = []
    stored = {"dgx01": FW_OLD, "dgx02": FW_NEW, "dgx03": FW_NEW}

    def read(nodes: Any) -> list[tuple[str, str, str]]:
        asked.append(sorted(nodes))
        return [(n, "hca_fw", stored[n]) for n in nodes]

    cache = versions.Readings()
    stamps = {"dgx01": 100.0, "dgx02": 100.0, "dgx03": 100.0}
    assert cache.view(stamps, read, now=200.0)["counts"]["hca_fw"] == {FW_NEW: 2, FW_OLD: 1}
    assert asked == [["dgx01", "dgx02", "dgx03"]]
    assert cache.view(stamps, read, now=201.0)["counts"]["hca_fw"] == {FW_NEW: 2, FW_OLD: 1}
    assert asked[1:] == []  # nothing stored since: nothing read
    stored["dgx01"] = FW_NEW
    stamps["dgx01"] = 199.0  # just stored: maybe not committed yet, so read again next time too
    assert cache.view(stamps, read, now=200.0)["counts"]["hca_fw"] == {FW_NEW: 3}
    assert cache.view(stamps, read, now=206.0)["counts"]["hca_fw"] == {FW_NEW: 3}
    assert cache.view(stamps, read, now=207.0)["counts"]["hca_fw"] == {FW_NEW: 3}
    assert asked[1:] == [["dgx01"], ["dgx01"]]
    del stamps["dgx03"]  # a node the aggregator no longer knows
    assert cache.view(stamps, read, now=208.0)["hca_fw"] == {FW_NEW: ["dgx01", "dgx02"]}


def test_hca_firmware_is_grouped_by_board() -> None:
    # 16 nodes, each with compute HCAs (board A) and storage HCAs (board B): "16 nodes run X,
    # 16 nodes run Y" read like 32 nodes; per board it reads as what it is
    compute, storage = "MT_0000000838", "MT_0000000970"
    readings = [(f"dgx{i:02}", "hca_fw", f"{compute}=28.41.1000, {storage}=32.38.3056") for i in range(1, 16)]
    readings.append(("dgx16", "hca_fw", f"{compute}=28.39.1002, {storage}=32.38.3056"))
    view = versions.fleet_versions(readings, [f"dgx{i:02}" for i in range(1, 17)])
    assert view["counts"]["hca_fw"] == {"32.38.3056": 16, "28.41.1000": 15, "28.39.1002": 1}  # the API keeps its shape
    said = versions.lines(view, name_few=2)
    assert f"HCA firmware (board {compute}): 15 nodes run 28.41.1000, 1 node runs 28.39.1002 (dgx16)" in said
    assert f"HCA firmware (board {storage}): 16 nodes run 32.38.3056" in said
    assert not any(line.startswith("HCA firmware:") for line in said)


def test_the_drift_check_reports_hca_firmware_per_board() -> None:
    from podhealth.checks.passive import drift as drift_check

    seen = (drift_check.Seen("mlx5_0", "28.41.1000", "MT_0000000838"),
            drift_check.Seen("mlx5_bond_0", "32.38.3056", "MT_0000000970"))
    from unittest import mock
    with mock.patch.object(drift_check, "observe", lambda snap, samples=None: {
            f: (seen if f == "hca_fw" else None) for f in drift_check.FIELDS}):
        ctx = mock.Mock(profile=mock.Mock(versions={}, drift={}))
        res = {r.entity: r for r in drift_check.drift(ctx)}
    ev = dict(res["hca_fw"].evidence)
    assert ev["boards"] == "MT_0000000838=28.41.1000, MT_0000000970=32.38.3056"
