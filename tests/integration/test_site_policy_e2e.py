"""A site check and a site XID override each drive a fence end to end (issue 28 §2, §3):

    dgx01: `podhealth agent --simulate`, checks.site.peermem = examples/checks/nvidia-peermem,
           action DRAIN, pointed at a sysfs fixture without nvidia_peermem
    dgx02: the same agent with checks.policy.xid.31 {fence: now, action: DRAIN}; XID 31 injected
           (the catalog alone: RESTART_APP, a WARN that never fences)
      └─ push ─► aggregator (shipped rules) ─► scontrol ─► loopback Slurm: both DRAINED,
                 each reason naming the check that asked

and each is refused with file:line when malformed (the agent exits 2 and starts nothing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.harness import stack
from tests.harness.proc import http_get, wait_until
from tests.harness.slurm import SlurmCluster, slurm_fixture
from tests.integration.test_slurm_fencer import sinfo

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "checks"
TIMEOUT = 90.0
slurm = slurm_fixture(scope="module", nodes=2)


def agent_config(agg: stack.AggregatorProc, node: str, spool: Path, checks: dict[str, Any]) -> str:
    doc = yaml.safe_load(stack.agent_config(interval=1.0, publish_url=agg.url, token=agg.node_token(node),
                                            spool_dir=spool))
    doc["checks"].update({"grace": 0, **checks})
    text = yaml.safe_dump(doc, sort_keys=False)
    from podhealth import config
    config.loads(text, f"<{node}>")
    return text


def health(url: str) -> dict[str, Any]:
    code, body = http_get(f"{url}/health")
    assert code in (200, 503), code
    return json.loads(body)  # type: ignore[no-any-return]


def result(url: str, check: str, entity: str) -> dict[str, Any] | None:
    return next((r for r in health(url)["results"] if r["check"] == check and r["entity"] == entity), None)


def drained(cluster: SlurmCluster, node: str) -> tuple[str, str] | None:
    state, reason = sinfo(cluster, node)
    return (state, reason) if state.rstrip("*") in ("drained", "draining") else None


@pytest.fixture
def sysfs_without_peermem() -> Iterator[Path]:
    """A sysfs fixture with the driver's module and no nvidia_peermem, somewhere the check's
    unprivileged user can read (pytest's own temporary directories are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="podhealth-site-sysfs-"))
    try:
        root.chmod(0o755)
        (root / "module" / "nvidia").mkdir(parents=True)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_site_check_and_xid_override_each_fence_through_slurm(tmp_path: Path, slurm: SlurmCluster,
                                                              sysfs_without_peermem: Path) -> None:
    sysfs = sysfs_without_peermem
    section = {"decide_interval": 0.2, "caps": {"max_fenced": 2, "max_percent_per_partition": 100.0},
               "nodes": [{"name": n, "partition": "gpu"} for n in ("dgx01", "dgx02")],
               "fencers": {"slurm": {"enabled": True, "slurm_conf": str(slurm.conf), "timeout": 10.0}}}
    site = {"site": {"peermem": {"argv": [str(EXAMPLES / "nvidia-peermem")], "interval": 1, "timeout": 1,
                                 "action": "DRAIN", "env": {"PODHEALTH_SYSFS_ROOT": str(sysfs)}}}}
    policy = {"policy": {"xid": {31: {"fence": "now", "action": "DRAIN"}}}}
    with stack.aggregator(tmp_path / "aggregator", section) as agg:
        configs = {"dgx01": agent_config(agg, "dgx01", tmp_path / "spool1", site),
                   "dgx02": agent_config(agg, "dgx02", tmp_path / "spool2", policy)}
        with stack.agents(tmp_path / "agents", tmp_path / "sim", configs) as agents:
            # dgx02 healthy first: the override changes nothing until its code appears
            wait_until(lambda: (r := result(agents.url("dgx02"), "xid", "gpu2")) and r["status"] == "OK",
                       TIMEOUT, 0.3, "dgx02 xid OK")
            assert drained(slurm, "dgx02") is None
            stack.simulate(tmp_path / "sim", "inject", "dgx02", "xid=31", "gpu=2")

            try:
                got1 = wait_until(lambda: drained(slurm, "dgx01"), TIMEOUT, 0.3, "dgx01 drained by its site check")
            except AssertionError:
                raise AssertionError(f"{result(agents.url('dgx01'), 'site_peermem', 'node')}\n"
                                     f"{agg.node('dgx01')}") from None
            got2 = wait_until(lambda: drained(slurm, "dgx02"), TIMEOUT, 0.3, "dgx02 drained by the XID 31 override")
            assert got1[1].startswith("podhealth:") and "site_peermem" in got1[1] and "DRAIN" in got1[1], got1
            assert got2[1].startswith("podhealth:") and "xid" in got2[1] and "DRAIN" in got2[1], got2

            peer = result(agents.url("dgx01"), "site_peermem", "node")
            assert peer is not None and (peer["status"], peer["action"]) == ("FAIL", "DRAIN")
            assert peer["summary"] == "nvidia_peermem is not loaded: GPUDirect RDMA is off"
            assert peer["evidence"]["state"] == "absent" and peer["evidence"]["ran_as"] == "nobody"
            x = result(agents.url("dgx02"), "xid", "gpu2")
            assert x is not None and (x["status"], x["action"]) == ("FAIL", "DRAIN")
            assert x["evidence"]["policy"].startswith("checks.policy.xid.31: fence now, action DRAIN")
            assert x["evidence"]["without_policy"] == "WARN RESTART_APP"
            # the aggregator's node view (the UI's API) holds it like any condition
            conds = {(c["check"], c["status"], c["action"]) for c in agg.node("dgx01")["conditions"]}
            assert ("site_peermem", "FAIL", "DRAIN") in conds, conds
            # the site check is on /metrics like every check
            code, body = http_get(f"{agents.url('dgx01')}/metrics")
            text = body.decode()
            assert 'podhealth_check_status{action="DRAIN",check="site_peermem",entity="node",node="dgx01"} 2' in text
            assert 'collector="site_peermem"' in text
    for node in ("dgx01", "dgx02"):
        slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME")


@pytest.mark.parametrize("checks, where", [
    ("  site:\n    peermem:\n      argv: [nvidia-peermem]\n", "agent.yaml:5: checks.site.peermem.argv: expected an absolute path"),
    ("  policy:\n    xid:\n      31: {fence: now, action: FENCE}\n", "agent.yaml:5: checks.policy.xid.31.action: expected one of"),
    ("  policy:\n    xid:\n      9999: {fence: never}\n", "agent.yaml:5: checks.policy.xid.9999: XID 9999 is not in the shipped catalog"),
])
def test_a_malformed_site_check_or_override_is_refused(tmp_path: Path, checks: str, where: str) -> None:
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("checks:\n  grace: 0\n" + checks)
    for argv in (["config", "check", str(cfg)],
                 ["agent", "--config", str(cfg), "--simulate", "dgx-h100", "--sim-root", str(tmp_path / "sim"),
                  "--listen", "127.0.0.1:0"]):
        r = subprocess.run([sys.executable, "-m", "podhealth", *argv], capture_output=True, text=True, timeout=90)
        assert r.returncode == 2, (argv, r.stdout, r.stderr)
        assert where in r.stderr, r.stderr
