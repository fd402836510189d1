"""One node-name rule, refused alike at every door (issue 15). podhealth.hostnames.node_name_problem
is the only validator; this table sends the same names through every entry point that takes one:
the config file (each key that holds a node name), the aggregator's HTTP API (ingest, Alertmanager,
operator), `podhealth token derive`, the Slurm and Kubernetes fencers, the NCCL pair tests,
`podhealth check --node` and the simulator. Before, `dgx-`, `all` and `default` passed ingest and
config and were then refused by the Slurm fencer: a node that reports, fails, and is never fenced."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from typing import Any, Callable

import aiohttp
import pytest

from podhealth import config
from podhealth.checks.active.nccl_slurm import PairJob, srun_argv
from podhealth.checks.cli.cmd_check import CheckError, agent_url
from podhealth.cli import main
from podhealth.config_aggregator import AggAuthConfig
from podhealth.configload import ConfigError
from podhealth.fencing.fence import FenceReason, Refused
from podhealth.fencing.kube import validate_kube_node_name
from podhealth.fencing.slurm import SlurmFencer
from podhealth.hostnames import is_valid_node_name, node_name_problem, validate_node_name
from podhealth.sim.node import check_name
from tests.harness.agg import MemFencer, config as agg_config, running

pytestmark = pytest.mark.timeout(60)

REFUSED = [
    "dgx-", "-dgx01", "dgx01.", "dgx_", "all", "ALL", "default", "Default",
    "dgx[01-02]", "dgx01,dgx02", "dgx 01", "dgx01 State=RESUME", "dgx01=x", 'dgx"01', "dgx01\n", "dgx;rm",
    "../x", "dgx\u00e901", "x" * 64, "",
]
ACCEPTED = ["dgx01", "gpu-7", "rack1.dgx02", "9node", "x" * 63]
SECRET = "s" * 48
REASON = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-0001")


def _yaml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a YAML flow scalar: quotes, spaces and '\n' survive


# Config keys that hold a node name: (yaml with {n} for the name, the key the error must name).
CONFIG_DOORS = [
    ("aggregator:\n  nodes:\n    - name: {n}\n", "aggregator.nodes[0].name"),
    ("aggregator:\n  nodes:\n    - name: dgx01\n      slurm_name: {n}\n", "aggregator.nodes[0].slurm_name"),
    ("aggregator:\n  opt_out: [{n}]\n", "aggregator.opt_out"),
    ("aggregator:\n  auth:\n    node_tokens: {{{n}: tok}}\n", "aggregator.auth.node_tokens"),
    ("node:\n  name: {n}\n", "node.name"),
    ("checks:\n  agents: {{{n}: 'http://x:9410'}}\n", "checks.agents"),
]


def test_the_rule_itself() -> None:
    for name in REFUSED:
        problem = node_name_problem(name)
        assert problem and "node" in problem, name
        assert not is_valid_node_name(name)
        with pytest.raises(ValueError):
            validate_node_name(name)
    for name in ACCEPTED:
        assert node_name_problem(name) is None and validate_node_name(name) == name


@pytest.mark.parametrize(("text", "key"), CONFIG_DOORS)
def test_every_config_key_refuses_the_same_names(text: str, key: str) -> None:
    for name in REFUSED:
        if name == "" and key in ("node.name", "aggregator.nodes[0].slurm_name"):
            continue  # empty there means "the host's name" / "same as name", by design
        with pytest.raises(ConfigError) as e:
            config.loads(text.format(n=_yaml(name)), "p.yaml")
        msg = str(e.value)
        assert msg.startswith("p.yaml:") and f": {key}: " in msg, (name, msg)  # file, line and key
        if name:  # (an empty one may be caught first by the key's own "non-empty" annotation)
            assert str(node_name_problem(name)) in msg, (name, msg)            # and the one rule's why
    for name in ACCEPTED:
        config.loads(text.format(n=_yaml(name)), "p.yaml")


def _refusals(check: Callable[[str], Any], exc: type[BaseException] = ValueError) -> list[str]:
    """The REFUSED names `check` lets through (should be none)."""
    passed = []
    for name in REFUSED:
        try:
            check(name)
        except exc:
            continue
        passed.append(name)
    return passed


def test_the_fencers_nccl_check_and_sim_refuse_the_same_names() -> None:
    assert _refusals(validate_kube_node_name) == []
    assert _refusals(lambda n: srun_argv(PairJob(), n, "dgx02")) == []
    assert _refusals(lambda n: srun_argv(PairJob(), "dgx02", n)) == []
    assert _refusals(lambda n: agent_url(config.Config(), n), CheckError) == []
    assert _refusals(check_name) == []
    for name in ACCEPTED:
        if name.islower() or not name.isalpha():
            validate_kube_node_name(name)
        srun_argv(PairJob(), name, "dgx02")
        check_name(name)


async def test_the_slurm_fencer_refuses_them_before_running_scontrol(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    scontrol = tmp_path / "scontrol"
    scontrol.write_text(f"#!/bin/sh\ntouch {marker}\n")
    scontrol.chmod(0o755)
    fencer = SlurmFencer(scontrol=str(scontrol), timeout=5.0)
    for name in REFUSED:
        with pytest.raises(Refused, match="node"):
            await fencer.fence(name, REASON)
    assert not marker.exists(), "a refused name reached scontrol"


def test_token_derive_refuses_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PODHEALTH_CLUSTER_SECRET", raising=False)
    secret = tmp_path / "secret"
    secret.write_text(SECRET)
    for name in [n for n in REFUSED if n]:
        assert main(["token", "derive", f"--node={name}", "--secret-file", str(secret)]) == 64, name
        assert node_name_problem(name) in capsys.readouterr().err
    assert main(["token", "derive", "--node", "dgx01", "--secret-file", str(secret)]) == 0


async def test_the_aggregator_api_answers_400_for_them(tmp_path: Path) -> None:
    auth = AggAuthConfig(admin_token="atok")
    async with running(agg_config(tmp_path, auth=auth), [MemFencer()]) as (agg, url):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as s:
            for name in REFUSED:
                report = {"node": name, "time": 1.0, "results": []}
                async with s.post(f"{url}/v1/reports", json=report) as r:
                    assert r.status == 400, (name, r.status)
                    error = (await r.json())["error"]
                    assert error.startswith("report.node: "), (name, error)
                    if name and len(name) <= 63:  # (empty and over-long: the field's own checks answer first)
                        assert str(node_name_problem(name)) in error, (name, error)
                alert = {"alerts": [{"status": "firing", "labels": {"node": name, "alertname": "X"},
                                     "startsAt": "2026-01-01T00:00:00Z"}]}
                async with s.post(f"{url}/v1/alertmanager", json=alert) as r:
                    assert r.status == 400, (name, r.status)
                if name and "/" not in name:  # a path segment cannot be empty or hold '/'
                    path = f"/api/v1/nodes/{urllib.parse.quote(name, safe='')}/fence"
                    async with s.post(url + path, json={"reason": "t"},
                                      headers={"Authorization": "Bearer atok"}) as r:
                        assert r.status == 400, (name, r.status)
            async with s.post(f"{url}/v1/reports", json={"node": "dgx-ok1", "time": 1.0, "results": []}) as r:
                assert r.status == 200
