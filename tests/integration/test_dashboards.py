"""The Grafana dashboards (dashboards/*.json) are tested like code.

(a) the committed JSON is exactly what dashboards/generate.py renders;
(b) each is a valid Grafana dashboard model (schemaVersion, uid, title, unique panel ids,
    gridPos inside 24 columns and not overlapping, every target with expr and refId, the
    datasource variable used by every panel, every `$var` defined);
(c) every panel's every query returns data from a real Prometheus scraping a simulated fleet
    (three agents with cluster/partition target labels, the aggregator's /metrics, the shipped
    recording rules), after faults that give the "failing" panels something to show:
    XID 79 on dgx01 GPU 3 (fenced through the dry-run fencer), XID 79 on dgx02 GPU 1 (opted out,
    so its fence is held) with an InfiniBand port down, HW thermal slowdown on dgx03 GPU 0;
(d) a first event shows as 1, not 0: the faults are injected after Prometheus has scraped every
    target, so the XID and fence series are born while Prometheus watches, and the XID panels,
    the XID recording rule and "Fences by check" count that single XID 79 and its fence.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import pytest

from tests.harness import stack
from tests.harness.proc import free_port, need, wait_until

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
BOARD_FILES = sorted(DASHBOARDS.glob("*.json"))
CLUSTER, PARTITION = "dash", "gpu"
NODES = ("dgx01", "dgx02", "dgx03")
# Grafana's own variables; anything else a query names must be defined in `templating`.
BUILTINS = {"__interval", "__interval_ms", "__rate_interval", "__range", "__range_s", "__range_ms",
            "__dashboard", "__from", "__to", "__name", "__org", "__user", "timeFilter", "__timeFilter"}
_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)(?::\w+)?\]\]")
_LABEL_VALUES = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$")
_METRIC = re.compile(r"(?<![\w:\"'])((?:podhealth[_:]|scrape_)[A-Za-z0-9_:]*)")
DATA_TIMEOUT = 90.0
# Grafana's interval variables, as Grafana would set them for a 3-minute range at a 5 s step.
INTERVALS = {"__interval": "5s", "__interval_ms": "5000", "__rate_interval": "1m", "__range": "3m",
             "__range_s": "180", "__range_ms": "180000"}


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("podhealth_dashboards_generate", DASHBOARDS / "generate.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load(path: Path) -> dict[str, Any]:
    return dict(json.loads(path.read_text()))


def variables_used(text: str) -> set[str]:
    return {a or b or c for a, b, c in _VAR.findall(text)}


def substitute(expr: str) -> str:
    """Every dashboard variable as its "All" value (a regex matching anything); Grafana's
    interval variables as durations."""
    return _VAR.sub(lambda m: INTERVALS.get(m.group(1) or m.group(2) or m.group(3), ".*"), expr)


def queries(board: dict[str, Any]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


# ---- (a) committed JSON == generator output ----------------------------------------------------


def test_committed_dashboards_match_generator() -> None:
    rendered = generator().render()
    committed = {p.name: p.read_text() for p in BOARD_FILES}
    assert sorted(committed) == sorted(rendered), "dashboards/*.json and generate.py's boards differ in name"
    stale = [name for name, text in rendered.items() if committed[name] != text]
    assert not stale, f"regenerate with `python dashboards/generate.py`: {stale} differ from the generator"


# ---- (b) a valid Grafana dashboard model ---------------------------------------------------------


def _overlap(a: dict[str, int], b: dict[str, int]) -> bool:
    return a["x"] < b["x"] + b["w"] and b["x"] < a["x"] + a["w"] and a["y"] < b["y"] + b["h"] and b["y"] < a["y"] + a["h"]


@pytest.mark.parametrize("path", BOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_is_a_valid_grafana_model(path: Path) -> None:
    board = load(path)
    problems: list[str] = []
    if not isinstance(board.get("schemaVersion"), int) or board["schemaVersion"] < 30:
        problems.append(f"schemaVersion {board.get('schemaVersion')!r} (want an int >= 30)")
    for key in ("uid", "title"):
        if not isinstance(board.get(key), str) or not board[key]:
            problems.append(f"missing {key}")
    if len(board.get("uid", "")) > 40:
        problems.append(f"uid longer than Grafana's 40 characters: {board['uid']}")
    panels = board.get("panels", [])
    if not panels:
        problems.append("no panels")
    ids = [p.get("id") for p in panels]
    if len(ids) != len(set(ids)) or not all(isinstance(i, int) for i in ids):
        problems.append(f"panel ids not unique integers: {ids}")

    templating = board.get("templating", {}).get("list", [])
    names = {v.get("name") for v in templating}
    ds_vars = [v for v in templating if v.get("type") == "datasource" and v.get("query") == "prometheus"]
    if len(ds_vars) != 1:
        problems.append("want exactly one datasource variable of type prometheus")
    ds_ref = "${%s}" % ds_vars[0]["name"] if ds_vars else None
    for v in templating:
        if v.get("type") == "query":
            if v.get("datasource", {}).get("uid") != ds_ref:
                problems.append(f"variable {v['name']} does not use the datasource variable")
            undefined = variables_used(json.dumps(v.get("query"))) - names - BUILTINS
            if undefined:
                problems.append(f"variable {v['name']} uses undefined {sorted(undefined)}")

    for p in panels:
        where = f"panel {p.get('id')} {p.get('title')!r}"
        g = p.get("gridPos", {})
        if not all(isinstance(g.get(k), int) for k in ("x", "y", "w", "h")):
            problems.append(f"{where}: gridPos {g}")
            continue
        if g["x"] < 0 or g["y"] < 0 or g["w"] < 1 or g["h"] < 1 or g["x"] + g["w"] > 24:
            problems.append(f"{where}: gridPos {g} outside the 24-column grid")
        if not p.get("title") or not p.get("type"):
            problems.append(f"{where}: needs a title and a type")
        if p.get("datasource", {}).get("uid") != ds_ref:
            problems.append(f"{where}: datasource {p.get('datasource')} is not {ds_ref}")
        targets = p.get("targets", [])
        if not targets:
            problems.append(f"{where}: no targets")
        refids = [t.get("refId") for t in targets]
        if len(refids) != len(set(refids)) or not all(refids):
            problems.append(f"{where}: refIds {refids}")
        for t in targets:
            if not isinstance(t.get("expr"), str) or not t["expr"].strip():
                problems.append(f"{where} [{t.get('refId')}]: no expr")
            if t.get("datasource", {}).get("uid") != ds_ref:
                problems.append(f"{where} [{t.get('refId')}]: target datasource is not {ds_ref}")
            undefined = variables_used(json.dumps(t)) - names - BUILTINS
            if undefined:
                problems.append(f"{where} [{t.get('refId')}]: undefined variables {sorted(undefined)}")
    placed = [p for p in panels if isinstance(p.get("gridPos"), dict) and len(p["gridPos"]) >= 4]
    for i, a in enumerate(placed):
        for b in placed[i + 1:]:
            if _overlap(a["gridPos"], b["gridPos"]):
                problems.append(f"panels {a['id']} and {b['id']} overlap: {a['gridPos']} {b['gridPos']}")
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_dashboard_uids_are_unique() -> None:
    uids = [load(p)["uid"] for p in BOARD_FILES]
    assert len(uids) == len(set(uids)), uids


def test_variable_substitution_covers_every_form() -> None:
    # The test's own helper: a form it missed would reach Prometheus as a syntax error, or worse,
    # as a literal that matches nothing and hides a panel's real result.
    expr = 'x{a=~"$cluster",b=~"${node}",c=~"${gpu:regex}",d=~"[[partition]]"}'
    assert variables_used(expr) == {"cluster", "node", "gpu", "partition"}
    assert substitute(expr) == 'x{a=~".*",b=~".*",c=~".*",d=~".*"}'
    assert substitute("rate(x[$__rate_interval])") == "rate(x[1m])"


# ---- (c) every query returns data from a real Prometheus -----------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Prometheus]:
    need("prometheus")
    tmp = tmp_path_factory.mktemp("dashboards")
    sim_root = tmp / "sim"
    ports = {n: free_port() for n in NODES}
    with stack.aggregator(tmp / "aggregator", {
        "decide_interval": 0.5, "pull_interval": 2.0, "unreachable_after": 3600.0, "healthy_for": 3600.0,
        # No breaker here (three of three nodes fail on purpose); dgx02 opted out so a fence is held.
        "breaker": {"min_nodes": 100}, "opt_out": ["dgx02"],
        "caps": {"max_fenced": 3, "max_percent_per_partition": 100.0},
        # Agents push, and the aggregator pulls their /health too.
        "nodes": [{"name": n, "agent_url": f"http://127.0.0.1:{ports[n]}", "partition": PARTITION} for n in NODES],
        "fencers": {"dryrun": {"enabled": True}},
        # The fail-slow board: three nodes' 24 GPUs are cohort enough here; judged every second.
        "failslow": {"interval": 1.0, "judge": {"min_cohort": 8}},
    }) as agg:
        configs = {n: stack.agent_config(publish_url=agg.url, token=agg.node_token(n), spool_dir=tmp / "spool" / n,
                                         failslow_after=15.0)
                   for n in NODES}
        with stack.agents(tmp / "agents", sim_root, configs, ports=ports) as agents, \
                stack.prometheus(tmp / "prometheus", [
                    stack.ScrapeJob("podhealth", agents.targets(), {"cluster": CLUSTER, "partition": PARTITION}),
                    stack.ScrapeJob("podhealth-aggregator", (agg.url.removeprefix("http://"),), {"cluster": CLUSTER}),
                ], rule_files=[stack.RULES]) as prom:
            # Before the agents' first fail-slow round (15 s after their start): one GPU 30% slow.
            stack.simulate_all(sim_root, [("inject", "dgx01", "fault=slow-gpu", "gpu=3", "pct=30")])
            # Faults after the first scrapes: an XID's series (and its fence's) is born with it,
            # and (d) checks that the panels count that first appearance.
            prom.wait_scraped("podhealth", len(NODES), samples=2, timeout=DATA_TIMEOUT)
            prom.wait_scraped("podhealth-aggregator", 1, samples=2, timeout=DATA_TIMEOUT)
            # ib-down is a WARN on the simulated topology (a storage port): dgx02's held fence
            # comes from its XID 79, the port down still feeds the fabric panels.
            stack.simulate_all(sim_root, [("inject", "dgx01", "xid=79", "gpu=3"),
                                          ("inject", "dgx02", "xid=79", "gpu=1"),
                                          ("inject", "dgx02", "fault=ib-down", "device=mlx5_0"),
                                          ("inject", "dgx03", "fault=thermal", "gpu=0")])
            yield prom


def evaluate(prom: stack.Prometheus, target: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """The target's series, variables as "All", instant or over the last 3 minutes like Grafana;
    only series with at least one value."""
    expr = substitute(target["expr"])
    if target.get("instant"):
        return prom.query(expr, at=now)
    return [r for r in prom.query_range(expr, now - 180, now, 5) if r.get("values")]


def has_data(prom: stack.Prometheus, target: dict[str, Any], now: float) -> bool:
    return bool(evaluate(prom, target, now))


_LEGEND_LABEL = re.compile(r"\{\{\s*(\w+)\s*\}\}")


def problems_of(prom: stack.Prometheus, now: float) -> tuple[list[str], list[str]]:
    """(targets without data, legends naming a label none of the target's series has)."""
    empty, legends = [], []
    for path in BOARD_FILES:
        for panel, target in queries(load(path)):
            where = f"{path.stem} / {panel['title']} [{target['refId']}]"
            series = evaluate(prom, target, now)
            if not series:
                empty.append(f"{where}: {substitute(target['expr'])}")
                continue
            labels = set().union(*(r["metric"] for r in series))
            missing = sorted(set(_LEGEND_LABEL.findall(target.get("legendFormat", ""))) - labels)
            if missing:
                legends.append(f"{where}: legend {target['legendFormat']!r} names {missing}; "
                               f"the series have {sorted(labels)}")
    return empty, legends


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_every_panel_query_returns_data(fleet: stack.Prometheus) -> None:
    prom = fleet
    prom.wait_scraped("podhealth", len(NODES), samples=3, timeout=DATA_TIMEOUT)
    prom.wait_scraped("podhealth-aggregator", 1, samples=3, timeout=DATA_TIMEOUT)
    # The check can fail: a query for a node that does not exist is reported, instant or range.
    for instant in (True, False):
        assert not has_data(prom, {"expr": 'podhealth_gpu_up{node=~"$node",node="nonexistent"}', "instant": instant},
                            time.time())
    # Faults take a few collections to show (and rate() two scrapes): poll until every panel has data.
    deadline = time.monotonic() + DATA_TIMEOUT
    while True:
        empty, legends = problems_of(prom, time.time())
        if not empty or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert not empty, "panels whose query returns no data:\n" + "\n".join(empty)
    assert not legends, "panels whose legend names a label their series lack:\n" + "\n".join(legends)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_every_metric_a_panel_names_exists(fleet: stack.Prometheus) -> None:
    """`count(x == 0) or vector(0)` always answers: also check that x itself is in Prometheus."""
    prom = fleet
    prom.wait_scraped("podhealth", len(NODES), samples=3, timeout=DATA_TIMEOUT)
    names: dict[str, set[str]] = {}
    for path in BOARD_FILES:
        for panel, target in queries(load(path)):
            for name in _METRIC.findall(target["expr"]):
                names.setdefault(name, set()).add(f"{path.stem} / {panel['title']}")
    missing = {n: sorted(w) for n, w in names.items() if not prom.query(f'count({{__name__="{n}"}})')}
    assert not missing, f"metrics named by panels but absent from Prometheus: {json.dumps(missing, indent=1)}"


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_every_variable_query_returns_values(fleet: stack.Prometheus) -> None:
    prom = fleet
    prom.wait_scraped("podhealth", len(NODES), samples=3, timeout=DATA_TIMEOUT)
    want = {"cluster": {CLUSTER}, "partition": {PARTITION}, "node": set(NODES)}
    problems = []
    for path in BOARD_FILES:
        for v in load(path)["templating"]["list"]:
            if v.get("type") != "query":
                continue
            m = _LABEL_VALUES.match(v["query"]["query"].strip())
            if m is None:
                problems.append(f"{path.stem} ${v['name']}: not a label_values() query: {v['query']['query']}")
                continue
            values = set(prom.label_values(m.group("label"), substitute(m.group("match") or "up")))
            if not values or not want.get(v["name"], set()) <= values:
                problems.append(f"{path.stem} ${v['name']}: {sorted(values)} (want at least {sorted(want.get(v['name'], set()))})")
    assert not problems, "\n".join(problems)


# ---- (d) the first event shows -------------------------------------------------------------------


def panel_expr(board: str, title: str) -> str:
    found = [t["expr"] for p in load(DASHBOARDS / f"{board}.json")["panels"] if p["title"] == title
             for t in p["targets"]]
    assert len(found) == 1, f"{board} / {title}: {len(found)} targets"
    return found[0]


def for_node(expr: str, node: str) -> str:
    """The panel's query as Grafana sends it with $node = `node` and every other variable "All"."""
    return substitute(expr.replace("$node", node).replace("${node}", node))


def reads(prom: stack.Prometheus, expr: str, **labels: str) -> float | None:
    """The query's value now for the one series carrying `labels` (None while there is none)."""
    got = [r for r in prom.query(expr) if all(r["metric"].get(k) == v for k, v in labels.items())]
    assert len(got) <= 1, got
    return float(got[0]["value"][1]) if got else None


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_a_single_xid_79_and_its_fence_show_as_one(fleet: stack.Prometheus) -> None:
    prom = fleet
    # Prometheus has scraped the XID (and the aggregator's fence) once its counter is there.
    wait_until(lambda: prom.query('podhealth_xid_events_total{node="dgx01",gpu="3",code="79"} == 1'),
               DATA_TIMEOUT, 0.5, "dgx01's XID 79 scraped")
    wait_until(lambda: prom.query('podhealth_aggregator_fences_total{check="xid"} == 1'),
               DATA_TIMEOUT, 0.5, "dgx01's fence scraped")
    want = {  # (what, expr, labels of the series) -> the count it must show
        ("node board XID events", for_node(panel_expr("podhealth-node", "XID events"), "dgx01"), (("gpu", "3"), ("code", "79"))): 1.0,
        ("GPU board XID events", for_node(panel_expr("podhealth-gpu", "XID events"), "dgx01"),
         (("node", "dgx01"), ("gpu", "3"), ("code", "79"))): 1.0,
        # dgx01 and dgx02 logged one XID 79 each
        ("fleet XID events by code", substitute(panel_expr("podhealth-fleet", "XID events by code (fleet)")),
         (("code", "79"),)): 2.0,
        ("recording rule", "podhealth:gpu_xid_events:increase10m", (("node", "dgx01"), ("gpu", "3"), ("code", "79"))): 1.0,
        # dgx01 fenced; dgx02 opted out, so its fence is held, not counted
        ("fleet Fences by check", substitute(panel_expr("podhealth-fleet", "Fences by check")), (("check", "xid"),)): 1.0,
    }
    got: dict[str, float | None] = {}

    def all_show() -> bool:
        for (what, expr, labels), value in want.items():
            got[what] = reads(prom, expr, **dict(labels))
        return all(got[what] == value for (what, _, _), value in want.items())

    try:
        wait_until(all_show, DATA_TIMEOUT, 1.0, "the first XID and fence counted")
    except AssertionError:
        pass
    assert got == {what: value for (what, _, _), value in want.items()}
