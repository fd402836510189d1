"""An operator's own drain in a real loopback Slurm cluster: the aggregator records it as an
`operator_drain` event, and nothing podhealth does resumes it (not the policy when the node
reports OK, not mark-healthy, not release); a podhealth fence on another node is released by
mark-healthy through scontrol."""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import pytest

from podhealth.config_aggregator import AggAuthConfig
from podhealth.aggregator.model import FenceMode
from podhealth.fencing.slurm import SlurmFencer
from tests.harness.agg import config, running
from tests.harness.slurm import SlurmCluster, slurm_fixture
from tests.integration.test_slurm_fencer import sinfo
from tests.unit.test_aggregator_service import fail_report, until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

slurm = slurm_fixture(nodes=4)
ADMIN = "admin-token-0123456789"
H = {"Authorization": f"Bearer {ADMIN}"}


async def test_an_operators_drain_is_an_event_and_podhealth_never_resumes_it(slurm: SlurmCluster,
                                                                             tmp_path: Path) -> None:
    slurm.run("scontrol", "update", "NodeName=dgx02", "State=DRAIN", "Reason=ops: PSU swap tonight")
    fencer = SlurmFencer(slurm_conf=slurm.conf, env=slurm.env, timeout=5.0)
    # 20 configured (4 in Slurm): one drained by hand must not use up the partition cap of 10%
    cfg = config(tmp_path, auth=AggAuthConfig(admin_token=ADMIN), healthy_for=0.1, nodes=20)
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        assert agg.mem.nodes["dgx02"].fence is FenceMode.EXTERNAL
        h = await (await s.get(f"{url}/api/v1/nodes/dgx02/history")).json()
        [ev] = [i for i in h["items"] if i["type"] == "event" and i["kind"] == "operator_drain"]
        assert "ops: PSU swap tonight" in ev["event"]["event"]["text"] and ev["event"]["event"]["device"] == "slurm"
        await s.post(f"{url}/v1/reports", json=fail_report("dgx02", time.time(), "OK"))
        r = await s.post(f"{url}/api/v1/nodes/dgx02/mark-healthy", headers=H, json={"reason": "looks fine"})
        assert r.status == 409
        r = await s.post(f"{url}/api/v1/nodes/dgx02/release", headers=H, json={"reason": "looks fine"})
        assert r.status == 409
        # podhealth's own fence on dgx01, then mark-healthy: resumed through scontrol
        await s.post(f"{url}/v1/reports", json=fail_report("dgx01", time.time()))
        await until(lambda: agg.mem.nodes["dgx01"].fence is FenceMode.FENCED)
        assert sinfo(slurm, "dgx01")[0] in ("drained", "draining")
        r = await s.post(f"{url}/api/v1/nodes/dgx01/mark-healthy", headers=H, json={"reason": "reseated the GPU"})
        assert r.status == 200 and (await r.json())["state"] == "done"
        assert sinfo(slurm, "dgx01")[0].rstrip("*") == "idle"  # `*`: the loopback slurmd may be slow to answer
        await agg.reconcile()
        assert sinfo(slurm, "dgx02") == ("drained", "ops: PSU swap tonight")
        assert agg.mem.nodes["dgx02"].fence is FenceMode.EXTERNAL
    slurm.run("scontrol", "update", "NodeName=dgx02", "State=RESUME")
