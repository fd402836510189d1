"""The UI's history pieces: fleet samples (store, sampling, pruning, /ui/api/fleet-history),
Grafana links (aggregator/grafana.py, /ui/api/links, aggregator.ui.grafana_url), and the
fenced tile's contrast computed from podhealth.css."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pytest

from podhealth.aggregator import grafana, ui
from podhealth.config_aggregator import AggAuthConfig, UiConfig
from podhealth.aggregator.store import Store
from podhealth.config import loads
from podhealth.configload import ConfigError
from tests.harness.agg import MemFencer, config, running
from tests.harness.pg import pg_fixture

pytestmark = pytest.mark.timeout(60)

CSS = (Path(ui.__file__).parent / "static" / "podhealth.css").read_text()
REPO = Path(__file__).resolve().parents[2]
pg = pg_fixture()  # the store's part runs on both backends, as tests/unit/test_aggregator_store.py


def cfg(tmp_path: Path, **ui_kw: Any) -> Any:
    return config(tmp_path, nodes=3, auth=AggAuthConfig(admin_token="admin"), ui=UiConfig(**ui_kw))


async def until(what: str, ok: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait for `ok()` (the asserted state), failing with `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


# ---- fleet samples ----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite", "postgresql"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    if request.param == "sqlite":
        return tmp_path / "a.db"
    return str(request.getfixturevalue("pg").new_database())


def test_store_keeps_samples_in_time_order_and_prunes(where: Path | str) -> None:
    s = Store(where)
    s.apply([Store.op_fleet_sample(300.0, {"OK": 3, "FAIL": 1}), Store.op_fleet_sample(100.0, {"OK": 4}),
             Store.op_fleet_sample(200.0, {"OK": 2, "fenced": 2})])
    assert s.fleet_history(0) == [(100.0, {"OK": 4}), (200.0, {"OK": 2, "fenced": 2}), (300.0, {"FAIL": 1, "OK": 3})]
    assert [t for t, _ in s.fleet_history(150)] == [200.0, 300.0]
    s.apply([Store.op_prune_fleet_samples(250.0)])
    assert [t for t, _ in s.fleet_history(0)] == [300.0]
    s.close()


async def test_housekeeping_samples_counts_and_prunes_old_rows(tmp_path: Path) -> None:
    c = cfg(tmp_path, history_interval=0.2, history_retention=3600.0)
    old = Store(c.db)
    old.apply([Store.op_fleet_sample(time.time() - 7200, {"OK": 9})])  # past the retention
    old.close()
    async with running(c, [MemFencer()]) as (agg, url):
        assert agg.store is not None
        store = agg.store
        # One sample at start, then one per history_interval; the two-hour-old row is pruned.
        await until("three fresh samples and the old one gone",
                    lambda: len(rows := store.fleet_history(0)) >= 3 and all(t > time.time() - 60 for t, _ in rows))
        rows = store.fleet_history(0)
        assert all(counts["UNKNOWN"] == 3 and counts["OK"] == 0 for _, counts in rows), rows  # nothing reported yet
        gaps = [b - a for (a, _), (b, _) in zip(rows, rows[1:])]
        assert min(gaps) >= 0.15, gaps  # bounded: about one row per history_interval, not one per pass


async def test_fleet_history_api(tmp_path: Path) -> None:
    async with running(cfg(tmp_path, history_interval=3600.0), [MemFencer()]) as (agg, url), \
            aiohttp.ClientSession() as s:
        assert agg.store is not None
        now = time.time()
        await agg.commit([Store.op_fleet_sample(now - 26 * 3600, {"OK": 1}),  # older than 24 h: left out
                          Store.op_fleet_sample(now - 3600, {"OK": 2, "FAIL": 1})])
        async with s.get(url + "/ui/api/fleet-history") as r:
            assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
            body = await r.json()
        assert body["hours"] == 24 and body["interval"] == 3600.0
        times = [x["time"] for x in body["samples"]]
        # the sample an hour ago, the one taken at start, and now (the 26 h old one is outside)
        assert len(times) == 3 and times == sorted(times) and all(t >= now - 24 * 3600 for t in times)
        assert {"time": pytest.approx(now - 3600), "counts": {"OK": 2, "FAIL": 1}} in body["samples"]
        assert body["samples"][-1]["time"] == body["now"]  # the chart reaches the present
        assert body["samples"][-1]["counts"]["UNKNOWN"] == 3
        async with s.get(url + "/ui/api/fleet-history?hours=30") as r:
            assert len((await r.json())["samples"]) == 4
        for bad in ("0", "-1", "169", "x", "nan"):
            async with s.get(url + f"/ui/api/fleet-history?hours={bad}") as r:
                assert r.status == 400, bad


# ---- Grafana links ------------------------------------------------------------------------------


def test_shipped_node_dashboards() -> None:
    boards = grafana.node_dashboards()
    uids = [b.uid for b in boards]
    assert uids[0] == "podhealth-node"
    shipped = {json.loads(p.read_text())["uid"] for p in (REPO / "dashboards").glob("*.json")}
    assert {"podhealth-node", "podhealth-gpu", "podhealth-fabric", "podhealth-storage"} <= set(uids) <= shipped


def test_dashboards_without_a_node_variable_or_unreadable_get_no_link(tmp_path: Path) -> None:
    def board(name: str, uid: str, variables: list[str]) -> Path:
        p = tmp_path / name
        p.write_text(json.dumps({"uid": uid, "title": uid.title(), "templating": {"list": [{"name": v} for v in variables]}}))
        return p
    files = [board("a.json", "zeta", ["node"]), board("b.json", "fleet-only", ["cluster"]),
             board("c.json", "podhealth-node", ["datasource", "node"]), tmp_path / "missing.json"]
    (tmp_path / "d.json").write_text("{not json")
    files.append(tmp_path / "d.json")
    assert [b.uid for b in grafana.node_dashboards(files)] == ["podhealth-node", "zeta"]


def test_node_links() -> None:
    boards = (grafana.Dashboard("podhealth-node", "Node"), grafana.Dashboard("podhealth-gpu", "GPU"))
    assert grafana.node_links("", "dgx01", boards) == []
    links = grafana.node_links("https://grafana.example.com/g/", "dgx01.a_b", boards)
    assert links == [
        {"uid": "podhealth-node", "title": "Node", "url": "https://grafana.example.com/g/d/podhealth-node?var-node=dgx01.a_b"},
        {"uid": "podhealth-gpu", "title": "GPU", "url": "https://grafana.example.com/g/d/podhealth-gpu?var-node=dgx01.a_b"},
    ]


async def test_links_api(tmp_path: Path) -> None:
    async with running(cfg(tmp_path / "a", grafana_url="https://grafana.example.com"), [MemFencer()]) as (_, url), \
            aiohttp.ClientSession() as s:
        async with s.get(url + "/ui/api/links?node=dgx02") as r:
            body = await r.json()
        assert body["node"] == "dgx02"
        assert body["grafana"][0]["url"] == "https://grafana.example.com/d/podhealth-node?var-node=dgx02"
        for bad in ("", "?node=", "?node=../x", "?node=a%20b"):
            async with s.get(url + "/ui/api/links" + bad) as r:
                assert r.status == 400, bad
    async with running(cfg(tmp_path / "b"), [MemFencer()]) as (_, url), aiohttp.ClientSession() as s:
        async with s.get(url + "/ui/api/links?node=dgx02") as r:
            assert (await r.json())["grafana"] == []  # no grafana_url: no links


@pytest.mark.parametrize("value", ["grafana.example.com", "ftp://g", "https://g/?orgId=1", "https://g/#x",
                                   'https://g/"><script>'])
def test_grafana_url_must_be_a_plain_http_base(value: str) -> None:
    text = f"aggregator:\n  ui:\n    grafana_url: '{value}'\n"
    with pytest.raises(ConfigError) as e:
        loads(text, "site.yaml")
    assert "site.yaml:3" in str(e.value) and "aggregator.ui.grafana_url" in str(e.value)


def test_ui_config_defaults() -> None:
    c = loads("aggregator:\n  ui:\n    grafana_url: https://grafana.example.com/\n", "site.yaml").aggregator.ui
    assert (c.grafana_url, c.history_interval, c.history_retention) == ("https://grafana.example.com/", 300.0, 7 * 86400.0)


# ---- contrast (WCAG 2.x) from the stylesheet ----------------------------------------------------------


def _hex(value: str) -> tuple[int, int, int]:
    h = value.strip().lstrip("#")
    if len(h) == 3:
        h = "".join(c * 2 for c in h)
    assert re.fullmatch(r"[0-9a-fA-F]{6}", h), value
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _luminance(rgb: tuple[int, int, int]) -> float:
    def lin(v: int) -> float:
        c = v / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (lin(v) for v in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: str, b: str) -> float:
    la, lb = _luminance(_hex(a)), _luminance(_hex(b))
    return (max(la, lb) + 0.05) / (min(la, lb) + 0.05)


def test_contrast_formula() -> None:
    assert contrast("#000", "#fff") == pytest.approx(21.0)
    assert contrast("#767676", "#ffffff") == pytest.approx(4.54, abs=0.01)  # the well-known AA grey


def _resolve(value: str, variables: dict[str, str]) -> str:
    m = re.fullmatch(r"var\((--[\w-]+)\)", value.strip())
    return variables[m.group(1)] if m else value.strip()


def _rule(selector: str) -> dict[str, str]:
    m = re.search(r"(?:^|\n|\})\s*" + re.escape(selector) + r"\s*\{([^}]*)\}", CSS)
    assert m, f"no rule for {selector} in podhealth.css"
    return {k.strip(): v.strip() for k, v in re.findall(r"([\w-]+)\s*:\s*([^;]+);", m.group(1))}


def tile_states() -> list[str]:
    """Every state a tile can show: STATES in common.js (a new state is checked without editing this)."""
    js = (Path(ui.__file__).parent / "static" / "common.js").read_text()
    m = re.search(r"export const STATES = \[([^\]]*)\]", js)
    assert m, "STATES not found in common.js"
    return re.findall(r'"([^"]+)"', m.group(1))


def test_every_tile_label_reads_on_its_background() -> None:
    """WCAG AA (4.5:1) for each state's tile: the label colour a.tile.st-X ends up with, against
    its background, and for the hatched states against every stripe colour."""
    variables = dict(re.findall(r"(--[\w-]+)\s*:\s*(#[0-9a-fA-F]{3,6})\b", CSS))
    default_label = _rule("a.tile")["color"]
    states = tile_states()
    assert {"OK", "WARN", "FAIL", "UNKNOWN", "fenced", "drained"} <= set(states)
    for state in states:
        try:
            label = _resolve(_rule(f"a.tile.st-{state}")["color"], variables)
        except AssertionError:
            label = default_label  # no override: a.tile's own colour applies
        background = _rule(f".st-{state}")["background"]
        # a hatched tile: the label must read on each of the gradient's colours
        stripes = (re.findall(r"var\(--[\w-]+\)|#[0-9a-fA-F]{3,6}\b", background) if "gradient" in background
                   else [background])
        assert stripes, background
        for bg in stripes:
            colour = _resolve(bg, variables)
            ratio = contrast(label, colour)
            assert ratio >= 4.5, f"{state}: label {label} on {bg} ({colour}) is {ratio:.2f}:1, below WCAG AA 4.5:1"


async def test_a_change_of_counts_is_sampled_at_once(tmp_path: Path) -> None:
    # the period is an hour: only the start's sample would exist, showing every node UNKNOWN
    fencer = MemFencer()
    async with running(cfg(tmp_path, history_interval=3600.0), [fencer]) as (agg, url), \
            aiohttp.ClientSession() as s:
        assert agg.store is not None
        store = agg.store
        assert [c["UNKNOWN"] for _, c in store.fleet_history(0)] == [3]
        for node in ("dgx01", "dgx02", "dgx03"):
            async with s.post(f"{url}/v1/reports", json={"node": node, "time": time.time(), "results": [
                    {"check": "xid", "entity": "gpu3", "status": "FAIL" if node == "dgx02" else "OK",
                     "action": "DRAIN"}]}) as r:
                assert r.status == 200
        await until("dgx02 fenced", lambda: "dgx02" in fencer.fenced)
        await until("a sample with the fence", lambda: any(c.get("fenced") == 1 and c.get("OK") == 2
                                                           for _, c in store.fleet_history(0)))
        runs = len(store.fleet_history(0))
        await asyncio.sleep(3 * agg.housekeeping_interval)
        assert len(store.fleet_history(0)) == runs  # nothing changed: no new rows
