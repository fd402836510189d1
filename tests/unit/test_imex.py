"""IMEX on a GB200 NVL72 tray: nvidia-imex-ctl's answers parsed, collected from the simulated tray,
and judged (this node's daemon fails it; the rack's domain only warns here).

The JSON follows `nvidia-imex-ctl -N -j` as NVIDIA's IMEX user guide documents it and as scripts
in the public code index read it (top-level "status" UP/DEGRADED/DOWN, "nodes" by index with
"status", "host", "version", "connections"); the `-q` words are those DCGM's dcgm_fields.h lists
for DCGM_FI_IMEX_DAEMON_STATUS. No complete real `-N` table is in ../shared/fixtures/imex (its
excerpt holds the legend only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive import imex as imex_check
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors import imex_parse
from podhealth.collectors.imex import ImexCollector, dir_source
from podhealth.sim import faults
from podhealth.sim.node import SimNode
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, Status

DOMAIN = {
    "nodes": {
        "0": {"status": "READY", "host": "10.0.0.1", "hostName": "gb-tray-01", "version": "580.95.05",
              "connections": {"0": {"host": "10.0.0.1", "status": "CONNECTED", "changed": True},
                              "1": {"host": "10.0.0.2", "status": "CONNECTED", "changed": True}}, "changed": True},
        "1": {"status": "UNAVAILABLE", "host": "10.0.0.2", "version": "580.95.05",
              "connections": {"0": {"host": "10.0.0.1", "status": "DISCONNECTED", "changed": True}}},
    },
    "timestamp": "9/4/2026 00:37:39.905",
    "status": "DEGRADED",
}


def test_parse_domain_and_daemon() -> None:
    d = imex_parse.parse_domain(json.dumps(DOMAIN))
    assert d.status == "DEGRADED"
    assert [(n.index, n.status, n.unreachable) for n in d.nodes] == [("0", "READY", ()), ("1", "UNAVAILABLE", ("0",))]
    assert imex_parse.parse_daemon("READY\n") == "READY"


@pytest.mark.parametrize("text", ["", "{}", "[1]", '{"status": 3}', "not json", '{"status": "UP", "nodes": [1]}'])
def test_parse_domain_refuses_what_is_not_its_json(text: str) -> None:
    with pytest.raises(ValueError):
        imex_parse.parse_domain(text)


@pytest.mark.parametrize("text", ["", "ready", "Connection refused: is IMEX running?", "READY NOW"])
def test_parse_daemon_refuses_what_is_not_a_state(text: str) -> None:
    with pytest.raises(ValueError):
        imex_parse.parse_daemon(text)


def _judge(node: SimNode, profile: str = "gb200-nvl72") -> dict[tuple[str, str], object]:
    node.refresh()
    c = ImexCollector(dir_source(node.dir / "imex")).collect()
    now = time.time()
    st = CollectorState("imex", samples=c.samples, errors=c.errors, stale=False, last_success=now, last_attempt=now)
    ctx = Context(snapshot=Snapshot(now, {"imex": st}), profile=profiles.load(profile), now=now, rates=RateTracker(60))
    return {(r.check, r.entity): r for r in imex_check.imex(ctx)}


def test_a_healthy_tray_and_its_daemon_going_down(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "gb01", "gb200-nvl72")
    res = _judge(node)
    assert {k: r.status for k, r in res.items()} == {("imex", "node"): Status.OK, ("imex", "domain"): Status.OK}  # type: ignore[attr-defined]
    node.inject(faults.parse(["fault=imex-down"], time.time()))
    res = _judge(node)
    mine, dom = res[("imex", "node")], res[("imex", "domain")]
    assert mine.status is Status.FAIL and mine.action is Action.DRAIN and "UNAVAILABLE" in mine.summary  # type: ignore[attr-defined]
    assert dom.status is Status.WARN  # type: ignore[attr-defined]


def test_a_node_without_a_domain_is_not_judged(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "gb01", "gb200-nvl72")
    assert _judge(node, "dgx-h100") == {}
    with pytest.raises(ValueError, match="runs no IMEX service"):
        SimNode.create(tmp_path, "dgx01", "dgx-h100").inject(faults.parse(["fault=imex-down"], time.time()))


def test_an_unreadable_state_is_unknown_never_fail(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "gb01", "gb200-nvl72")
    node.refresh()
    (node.dir / "imex" / "q.txt").write_text("Connection refused\n")
    res = _judge_no_refresh(node)
    assert res[("imex", "node")].status is Status.UNKNOWN  # type: ignore[attr-defined]


def _judge_no_refresh(node: SimNode) -> dict[tuple[str, str], object]:
    c = ImexCollector(dir_source(node.dir / "imex")).collect()
    assert c.errors
    now = time.time()
    st = CollectorState("imex", samples=c.samples, errors=c.errors, stale=False, last_success=now, last_attempt=now)
    ctx = Context(snapshot=Snapshot(now, {"imex": st}), profile=profiles.load("gb200-nvl72"), now=now,
                  rates=RateTracker(60))
    return {(r.check, r.entity): r for r in imex_check.imex(ctx)}


def test_the_gb200_profile_requires_the_imex_unit(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "gb01", "gb200-nvl72")
    assert node.state.units["nvidia-imex.service"] == "active"
    assert "nvidia-fabricmanager.service" not in node.state.units  # the rack's switch trays run it
    assert profiles.load("gb200-nvl72").units == ("nvidia-imex.service",)
