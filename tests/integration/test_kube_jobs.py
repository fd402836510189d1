"""Job-aware actions on Kubernetes against the stand-in API server (pods, the Eviction API and
PodDisruptionBudgets), checked with the real kubectl: GPU pods on a node, eviction refused by a
budget (429) and retried, never before evict_after."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from podhealth.config_aggregator import CapsConfig, JobsConfig, RetryConfig
from podhealth.fencing.fence import Transient
from podhealth.fencing.kube import KubeFencer
from tests.harness.agg import config, running
from tests.harness.kubeapi import KubeAPI, Kubectl, kubectl_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with KubeAPI(nodes=["dgx01", "dgx02", "dgx03", "dgx04"]) as server:
        yield server


@pytest.fixture(scope="module")
def kubectl(api: KubeAPI, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return kubectl_for(api, tmp_path_factory.mktemp("kubectl-cache"))


def pods_on(kubectl: Any, node: str) -> list[str]:
    doc = json.loads(kubectl("get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "json"))
    return sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in doc["items"])


async def until(pred: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


async def test_gpu_pods_and_eviction_under_a_disruption_budget(api: KubeAPI, kubectl: Any) -> None:
    api.add_pod("ml", "train-0", "dgx01", gpus=8, labels={"app": "train"})
    api.add_pod("ml", "infer-0", "dgx01", gpus=1)
    api.add_pod("kube-system", "dcgm-exporter-x", "dgx01", gpus=0)
    api.add_pod("ml", "elsewhere", "dgx02", gpus=1)
    budget = api.add_budget("ml", {"app": "train"}, allowed=0)
    f = KubeFencer(kubeconfig=str(api.kubeconfig), timeout=5.0)
    jobs = await f.jobs("dgx01")
    assert [(j.id, j.owner, j.state) for j in jobs] == [("ml/infer-0", "ml", "Running"), ("ml/train-0", "ml", "Running")]
    assert pods_on(kubectl, "dgx01") == ["kube-system/dcgm-exporter-x", "ml/infer-0", "ml/train-0"]

    with pytest.raises(Transient) as e:  # force: still the Eviction API, never past a budget
        await f.evacuate("dgx01", jobs, force=True)
    assert "429" in e.value.error and "disruption budget" in e.value.error and "ml/infer-0" in e.value.output, e.value
    assert pods_on(kubectl, "dgx01") == ["kube-system/dcgm-exporter-x", "ml/train-0"]
    budget[0] = 1  # the budget allows one disruption now
    o = await f.evacuate("dgx01", await f.jobs("dgx01"), force=False)
    assert o.changed and "ml/train-0" in o.output, o
    assert pods_on(kubectl, "dgx01") == ["kube-system/dcgm-exporter-x"]  # a pod without GPUs is not ours to move
    assert pods_on(kubectl, "dgx02") == ["ml/elsewhere"]


async def test_a_fenced_nodes_pods_are_evicted_only_after_evict_after(api: KubeAPI, kubectl: Any,
                                                                       tmp_path: Path) -> None:
    api.add_pod("team", "job-7", "dgx03", gpus=4, labels={"app": "job7"})
    budget = api.add_budget("team", {"app": "job7"}, allowed=0)
    fencer = KubeFencer(kubeconfig=str(api.kubeconfig), timeout=5.0)
    cfg = config(tmp_path, caps=CapsConfig(max_percent_per_partition=100.0),
                 retries=RetryConfig(attempts=1, backoff=0.1, max_backoff=0.2),
                 jobs=JobsConfig(enabled=True, evict_after=2.0))
    body = {"node": "dgx03", "time": 5.0, "results": [
        {"check": "xid", "entity": "gpu2", "status": "FAIL", "action": "DRAIN", "summary": "XID 13: Graphics"}]}
    async with running(cfg, [fencer]) as (agg, url), aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/reports", json=body) as r:
            assert r.status == 200
        await until(lambda: agg.mem.nodes["dgx03"].fence.value == "fenced", 20, "the cordon")
        fenced = asyncio.get_running_loop().time()
        node = json.loads(kubectl("get", "node", "dgx03", "-o", "json"))
        assert node["spec"]["unschedulable"] is True
        await until(lambda: any(a["what"] == "jobs at the fence" for a in agg.store.audit_tail()), 20, "jobs noted")
        assert pods_on(kubectl, "dgx03") == ["team/job-7"]
        events = json.loads(kubectl("get", "events", "-n", "default", "--field-selector",
                                    "involvedObject.name=dgx03", "-o", "json"))["items"]
        affected = [e["message"] for e in events if e["reason"] == "PodhealthJobsAffected"]
        assert affected == ["podhealth: xid gpu2 DRAIN [" + affected[0].split("[", 1)[1].split("]")[0]
                            + "]: on the node: team/job-7 (team)"]
        # Past evict_after the eviction is tried; the budget refuses it (429): pending, retried.
        await until(lambda: any(p.kind == "evacuate" and p.attempts >= 2 for p in agg.pending.values()), 30,
                    "the refused eviction to be retried")
        assert asyncio.get_running_loop().time() - fenced >= 1.5
        assert pods_on(kubectl, "dgx03") == ["team/job-7"] and agg.mem.nodes["dgx03"].evacuated == ""
        budget[0] = 1
        await until(lambda: agg.mem.nodes["dgx03"].evacuated == "polite", 30, "the eviction")
        assert pods_on(kubectl, "dgx03") == []
        refused = [a for a in agg.store.audit_tail(300) if a["what"] == "evacuate via kubernetes" and not a["ok"]]
        assert refused and "429" in refused[-1]["output"]
