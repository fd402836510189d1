"""A fence is one read and one `scontrol update` (issue 32 §4), against the loopback Slurm.

The action runner reads the node (to plan: unknown, someone else's fence, opted out) and the
Slurm fencer drains from that read (SeenFencer) without reading it again, before or after:
`scontrol update` exits 0 only once slurmctld applied it. Every scontrol run goes through a
wrapper that logs its argv, so the test counts invocations per fence. The safety stays: a node a
human drained is never drained over, and a fence of a node already drained by podhealth sends
nothing.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import aiohttp
import pytest

from podhealth.aggregator.model import FenceMode
from podhealth.config_aggregator import CapsConfig
from podhealth.fencing.fence import FenceReason, SeenFencer
from podhealth.fencing.slurm import SlurmFencer
from tests.harness.agg import config, running
from tests.harness.slurm import SlurmCluster, slurm_fixture
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
slurm = slurm_fixture(nodes=4)
XID = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-0001")


def counting_scontrol(tmp_path: Path) -> tuple[Path, Path]:
    """A scontrol that appends its argv (one line per run) to a log, then runs the real one."""
    real = shutil.which("scontrol")
    assert real is not None
    log = tmp_path / "scontrol.log"
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script, log


def runs_naming(log: Path, node: str) -> list[str]:
    if not log.exists():
        return []
    return [ln for ln in log.read_text().splitlines() if node in ln.split() or f"NodeName={node}" in ln]


def state(c: SlurmCluster, node: str) -> tuple[str, str]:
    st, reason = c.run("sinfo", "-N", "-h", "-n", node, "-o", "%T|%E").stdout.strip().split("|", 1)
    return st, reason


async def test_a_fence_is_one_read_and_one_update_and_never_over_a_human_drain(
        tmp_path: Path, slurm: SlurmCluster) -> None:
    script, log = counting_scontrol(tmp_path)
    fencer = SlurmFencer(scontrol=str(script), slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)
    assert isinstance(fencer, SeenFencer)
    try:
        cfg = config(tmp_path, nodes=4, caps=CapsConfig(max_percent_per_partition=100.0))
        async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as http:
            await until(lambda: agg.last_decision_at > 0)
            # a human drains dgx03 after podhealth's start (its reconcile did not see it)
            slurm.run("scontrol", "update", "NodeName=dgx03", "State=DRAIN", "Reason=admin: bad PSU")
            for node in ("dgx02", "dgx03"):
                async with http.post(f"{url}/v1/reports", json=fail_report(node, 10)) as r:
                    assert r.status == 200
            try:
                await until(lambda: agg.mem.nodes["dgx02"].fence is FenceMode.FENCED
                            and agg.mem.nodes["dgx03"].fence is FenceMode.EXTERNAL and not agg.pending, timeout=30)
            except AssertionError:
                raise AssertionError(f"{[(n, agg.mem.nodes[n].fence) for n in ('dgx02', 'dgx03')]}, "
                                     f"{log.read_text() if log.exists() else ''}") from None
            fenced = runs_naming(log, "dgx02")
            assert [ln.split()[:2] for ln in fenced] == [["show", "node"], ["update", "NodeName=dgx02"]], fenced
            st, reason = state(slurm, "dgx02")
            assert st in ("drained", "draining") and reason.startswith("podhealth:"), (st, reason)
            # the human's drain: read once, left alone, its reason kept
            human = runs_naming(log, "dgx03")
            assert [ln.split()[:2] for ln in human] == [["show", "node"]], human
            assert state(slurm, "dgx03")[1] == "admin: bad PSU"
        # idempotent: a node podhealth drained already is read and nothing is sent
        before = len(runs_naming(log, "dgx02"))
        seen = await fencer.read("dgx02")
        again = await fencer.fence_seen("dgx02", XID, seen)
        assert not again.changed and "podhealth" in again.output
        assert len(runs_naming(log, "dgx02")) == before + 1  # the read above, no update
        # fence() on its own reads once and updates once too: no read-back
        mark = len(runs_naming(log, "dgx04"))
        o = await fencer.fence("dgx04", XID)
        assert o.changed, o
        assert [ln.split()[:2] for ln in runs_naming(log, "dgx04")[mark:]] == [["show", "node"],
                                                                                ["update", "NodeName=dgx04"]]
        assert state(slurm, "dgx04")[1].startswith("podhealth:")
    finally:
        for node in ("dgx02", "dgx03", "dgx04"):
            slurm.run("scontrol", "update", f"NodeName={node}", "State=RESUME", check=False)
    assert os.path.exists(log)
