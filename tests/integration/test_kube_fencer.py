"""KubeFencer (official Python client) against the in-memory API server, checked with real kubectl."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podhealth.fencing.fence import BatchFencer, FenceOutcome, FenceReason, Fencer, Refused, Transient
from podhealth.fencing.kube import ANNOTATION, TAINT_KEY, FenceRecord, KubeFencer, KubeUnavailable
from tests.harness.kubeapi import KubeAPI, Kubectl, kubectl_for

pytestmark = pytest.mark.integration

NODES = [f"dgx{i:02d}" for i in range(1, 14)]  # dgx10..dgx12: the batch test's own; dgx13 the lease test's
XID = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-0001")
OUR_TAINT = {"key": TAINT_KEY, "value": "xid", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with KubeAPI(nodes=NODES) as server:
        yield server


@pytest.fixture(scope="module")
def kubectl(api: KubeAPI, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return kubectl_for(api, tmp_path_factory.mktemp("kubectl-cache"))


@pytest.fixture
def fencer(api: KubeAPI) -> KubeFencer:
    return KubeFencer(kubeconfig=str(api.kubeconfig), timeout=5.0)


def kget(kubectl: Any, node: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(kubectl("get", "node", node, "-o", "json"))
    return doc


def test_is_a_fencer(fencer: KubeFencer) -> None:
    assert isinstance(fencer, Fencer)


async def test_cordon_matches_kubectl_and_release_restores(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    original = {n: api.node(n) for n in ("dgx01", "dgx02")}
    o = await fencer.fence("dgx01", XID)
    assert o.changed, o
    kubectl("cordon", "dgx02")

    # What real kubectl sent (checked with -v=8): a strategic merge patch of spec.unschedulable.
    sent = [(r.content_type, json.loads(r.body)) for r in api.writes("dgx02")]
    assert sent == [("application/strategic-merge-patch+json", {"spec": {"unschedulable": True}})]
    ours, theirs = kget(kubectl, "dgx01"), kget(kubectl, "dgx02")
    assert ours["spec"]["unschedulable"] is True
    assert theirs["spec"]["unschedulable"] is True
    # The same Node spec as `kubectl cordon`, plus only our taint.
    assert {k: v for k, v in ours["spec"].items() if k != "taints"} == theirs["spec"]
    assert ours["spec"]["taints"] == [OUR_TAINT]
    rec = FenceRecord.parse(ours["metadata"]["annotations"][ANNOTATION])
    assert rec is not None and rec.why == "podhealth: xid GPU3 DRAIN [ev-0001]" and rec.id == "ev-0001"
    assert not rec.cordoned_before and rec.when.endswith("Z")
    table = kubectl("get", "nodes", "dgx01", "dgx02")
    assert table.count("SchedulingDisabled") == 2

    st = await fencer.read("dgx01")
    assert st.fenced and st.ours and not st.opted_out and st.reason == rec.why
    assert set(await fencer.list_fenced()) >= {"dgx01"} and "dgx02" not in await fencer.list_fenced()

    events = [e for e in api.events() if e["involvedObject"]["name"] == "dgx01"]
    assert [e["reason"] for e in events] == ["PodhealthFenced"]
    assert events[0]["type"] == "Warning" and events[0]["involvedObject"]["kind"] == "Node"
    assert events[0]["involvedObject"]["uid"] == original["dgx01"]["metadata"]["uid"]
    assert events[0]["message"] == rec.why

    again = await fencer.fence("dgx01", FenceReason("nvlink", "GPU0", "REPLACE", "ev-2"))
    assert not again.changed
    assert kget(kubectl, "dgx01")["metadata"]["annotations"][ANNOTATION] == ours["metadata"]["annotations"][ANNOTATION]

    r = await fencer.release("dgx01")
    assert r.changed, r
    kubectl("uncordon", "dgx02")
    for n in ("dgx01", "dgx02"):
        now = kget(kubectl, n)
        assert now["spec"] == original[n]["spec"], n
        assert now["metadata"]["annotations"] == original[n]["metadata"]["annotations"], n
    assert [e["reason"] for e in api.events() if e["involvedObject"]["name"] == "dgx01"] == \
        ["PodhealthFenced", "PodhealthReleased"]
    assert not (await fencer.read("dgx01")).fenced
    again_r = await fencer.release("dgx01")
    assert not again_r.changed


async def test_hand_cordoned_node_stays_cordoned(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    kubectl("drain", "dgx03", "--ignore-daemonsets")  # a human drains it (cordon + evict nothing)
    st = await fencer.read("dgx03")
    assert not st.fenced and not st.ours and st.reason == "cordoned, not by podhealth"
    o = await fencer.fence("dgx03", XID)
    assert o.changed and "already cordoned" in o.output
    node = kget(kubectl, "dgx03")
    rec = FenceRecord.parse(node["metadata"]["annotations"][ANNOTATION])
    assert rec is not None and rec.cordoned_before

    r = await fencer.release("dgx03")
    assert r.changed and "cordon kept" in r.output
    node = kget(kubectl, "dgx03")
    assert node["spec"]["unschedulable"] is True
    assert "taints" not in node["spec"] and ANNOTATION not in node["metadata"]["annotations"]


async def test_release_keeps_taints_others_added(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    await fencer.fence("dgx04", XID)
    kubectl("taint", "nodes", "dgx04", "nvidia.com/gpu-maintenance=true:NoExecute")
    r = await fencer.release("dgx04")
    assert r.changed
    node = kget(kubectl, "dgx04")
    assert node["spec"]["taints"] == [{"effect": "NoExecute", "key": "nvidia.com/gpu-maintenance", "value": "true"}]
    assert "unschedulable" not in node["spec"]
    kubectl("taint", "nodes", "dgx04", "nvidia.com/gpu-maintenance:NoExecute-")  # atomic list: this must work
    assert "taints" not in kget(kubectl, "dgx04")["spec"] or kget(kubectl, "dgx04")["spec"]["taints"] == []


async def test_conflict_is_re_read_and_retried(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    def other_writer(node: dict[str, Any]) -> None:
        node["spec"].setdefault("taints", []).append({"key": "other.io/x", "value": "1", "effect": "NoExecute"})
        node["metadata"]["labels"]["touched-by"] = "someone"

    api.inject_concurrent_update("dgx05", other_writer)
    before = api.conflicts_sent
    o = await fencer.fence("dgx05", XID)
    assert o.changed, o
    assert api.conflicts_sent == before + 1
    assert len(api.writes("dgx05")) == 2
    node = kget(kubectl, "dgx05")
    # Neither write was lost: the other client's taint and label, and our whole fence.
    assert node["spec"]["taints"] == [{"effect": "NoExecute", "key": "other.io/x", "value": "1"}, OUR_TAINT]
    assert node["metadata"]["labels"]["touched-by"] == "someone"
    assert node["spec"]["unschedulable"] is True and ANNOTATION in node["metadata"]["annotations"]

    api.inject_concurrent_update("dgx05", lambda n: n["metadata"]["labels"].update(again="yes"))
    r = await fencer.release("dgx05")
    assert r.changed
    node = kget(kubectl, "dgx05")
    assert node["spec"]["taints"] == [{"effect": "NoExecute", "key": "other.io/x", "value": "1"}]
    assert node["metadata"]["labels"]["again"] == "yes"


async def test_endless_conflicts_give_up_without_fencing(api: KubeAPI, fencer: KubeFencer) -> None:
    api.inject_concurrent_update("dgx06", lambda n: None, times=fencer.attempts)
    with pytest.raises(Transient, match="409"):
        await fencer.fence("dgx06", XID)
    node = api.node("dgx06")
    assert "unschedulable" not in node["spec"] and ANNOTATION not in node["metadata"]["annotations"]


async def test_opted_out_node_is_left_alone(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    kubectl("label", "node", "dgx07", "podhealth.io/managed=false")
    st = await fencer.read("dgx07")
    assert st.opted_out and not st.fenced
    rv = api.node("dgx07")["metadata"]["resourceVersion"]
    with pytest.raises(Refused, match="opted out"):
        await fencer.fence("dgx07", XID)
    assert api.node("dgx07")["metadata"]["resourceVersion"] == rv


async def test_batch_calls_answer_per_node_like_the_single_calls(api: KubeAPI, kubectl: Any,
                                                                  fencer: KubeFencer) -> None:
    assert isinstance(fencer, BatchFencer)
    assert (await fencer.fence("dgx12", XID)).changed
    nodes = ["dgx10", "dgx11", "dgx12", "nosuch", "DGX01"]
    read = await fencer.read_many(nodes)
    assert sorted(read) == ["dgx10", "dgx11", "dgx12", "nosuch"]  # a bad name is left for read() to refuse
    assert not read["nosuch"].exists and read["dgx12"].ours and not read["dgx10"].fenced
    out = await fencer.fence_many([(n, FenceReason("xid", "GPU1", "REBOOT", f"ev-{n}")) for n in nodes])
    done = {n: o.changed for n, o in out.items() if isinstance(o, FenceOutcome)}
    assert done == {"dgx10": True, "dgx11": True, "dgx12": False}, out
    nosuch, upper = out["nosuch"], out["DGX01"]
    assert isinstance(nosuch, Refused) and "not found" in nosuch.error and isinstance(upper, Refused)
    doc = kget(kubectl, "dgx11")
    assert doc["spec"]["unschedulable"] is True and "ev-dgx11" in doc["metadata"]["annotations"][ANNOTATION]
    for n in ("dgx10", "dgx11", "dgx12"):
        await fencer.release(n)


async def test_bad_and_unknown_nodes(api: KubeAPI, fencer: KubeFencer) -> None:
    n = len(api.requests)
    for bad in ("DGX01", "dgx_01", "dgx01/status", "", "a" * 254):
        with pytest.raises(Refused) as e:
            await fencer.fence(bad, XID)
        assert "not a valid Kubernetes node name" in e.value.error or "empty" in e.value.error, bad
        with pytest.raises(Refused):
            await fencer.release(bad)
    assert len(api.requests) == n, "an invalid name reached the API server"
    st = await fencer.read("nosuch")
    assert not st.exists
    with pytest.raises(Refused, match="not found"):
        await fencer.fence("nosuch", XID)


async def test_wrong_token_is_refused_not_retried(api: KubeAPI, tmp_path: Path) -> None:
    bad = json.loads(api.kubeconfig.read_text())
    bad["users"][0]["user"]["token"] = "wrong"
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(bad))
    f = KubeFencer(kubeconfig=str(path), timeout=5.0)
    n = len(api.requests)
    with pytest.raises(KubeUnavailable, match="401"):
        await f.read("dgx08")
    assert len(api.requests) == n + 1
    with pytest.raises(Transient, match="401"):
        await f.fence("dgx08", XID)


async def test_api_server_gone(tmp_path: Path) -> None:
    server = KubeAPI(nodes=["dgx01"], workdir=tmp_path).start()
    kubeconfig = str(server.kubeconfig)
    server.stop()
    f = KubeFencer(kubeconfig=kubeconfig, timeout=1.0)
    t0 = time.monotonic()
    with pytest.raises(Transient, match="Kubernetes API"):
        await f.fence("dgx01", XID)
    assert time.monotonic() - t0 < f.budget + 2.0
    with pytest.raises(KubeUnavailable):
        await f.list_fenced()


def test_missing_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot load the Kubernetes kubeconfig"):
        KubeFencer(kubeconfig=str(tmp_path / "nope"))


# ---- the stand-in itself: what the fencer does not exercise -------------------------------------

def _raw(api: KubeAPI, method: str, path: str, body: Any = None, ctype: str = "application/json") -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(api.url + path, data=data, method=method,
                                 headers={"Authorization": f"Bearer {api.token}", "Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_stand_in_put_conflict_and_patch_flavours(api: KubeAPI) -> None:
    code, node = _raw(api, "GET", "/api/v1/nodes/dgx09")
    assert code == 200
    stale = json.loads(json.dumps(node))
    node["metadata"]["labels"]["a"] = "1"
    code, put = _raw(api, "PUT", "/api/v1/nodes/dgx09", node)
    assert code == 200 and put["metadata"]["resourceVersion"] != node["metadata"]["resourceVersion"]
    stale["metadata"]["labels"]["b"] = "2"
    code, status = _raw(api, "PUT", "/api/v1/nodes/dgx09", stale)
    assert code == 409 and status["reason"] == "Conflict" and "b" not in api.node("dgx09")["metadata"]["labels"]

    code, _ = _raw(api, "PATCH", "/api/v1/nodes/dgx09", [
        {"op": "add", "path": "/spec/taints", "value": [{"key": "k", "effect": "NoSchedule"}]},
        {"op": "add", "path": "/metadata/labels/x~1y", "value": "z"},
        {"op": "test", "path": "/spec/taints/0/key", "value": "k"}], "application/json-patch+json")
    assert code == 200 and api.node("dgx09")["metadata"]["labels"]["x/y"] == "z"
    code, _ = _raw(api, "PATCH", "/api/v1/nodes/dgx09", [{"op": "test", "path": "/spec/taints/0/key", "value": "no"},
                                                         {"op": "remove", "path": "/spec/taints"}],
                   "application/json-patch+json")
    assert code == 422 and api.node("dgx09")["spec"]["taints"] == [{"key": "k", "effect": "NoSchedule"}]

    # Strategic merge: conditions merge by type, a $patch: delete item, $setElementOrder.
    code, out = _raw(api, "PATCH", "/api/v1/nodes/dgx09/status", {"status": {
        "$setElementOrder/conditions": [{"type": "Ready"}, {"type": "MemoryPressure"}, {"type": "DiskPressure"}],
        "conditions": [{"type": "Ready", "status": "False"}, {"type": "PIDPressure", "$patch": "delete"}]}},
        "application/strategic-merge-patch+json")
    assert code == 200
    conds = out["status"]["conditions"]
    assert [c["type"] for c in conds] == ["Ready", "MemoryPressure", "DiskPressure"]
    assert conds[0]["status"] == "False" and conds[0]["reason"] == "KubeletReady"
    code, _ = _raw(api, "PATCH", "/api/v1/nodes/dgx09", {"spec": {"x": 1}}, "text/plain")
    assert code == 415
    code, _ = _raw(api, "PATCH", "/api/v1/nodes/dgx09", {"metadata": {"name": "other"}},
                   "application/merge-patch+json")
    assert code == 422 and api.node("dgx09")["metadata"]["name"] == "dgx09"


async def test_fence_sets_a_node_condition_that_kubectl_describe_shows(api: KubeAPI, kubectl: Any,
                                                                      fencer: KubeFencer) -> None:
    node = "dgx06"
    before = {c["type"]: c for c in kget(kubectl, node)["status"]["conditions"]}
    out = await fencer.fence(node, FenceReason(check="ib_port", entity="mlx5_0/1", action="DRAIN", id="ev-cond"))
    assert "not recorded" not in out.output, out
    conds = {c["type"]: c for c in kget(kubectl, node)["status"]["conditions"]}
    ours = conds["PodhealthFenced"]
    assert (ours["status"], ours["reason"]) == ("True", "IbPort") and "mlx5_0/1" in ours["message"]
    assert ours["lastTransitionTime"]
    assert {t: c for t, c in conds.items() if t != "PodhealthFenced"} == before  # the kubelet's stay as they were
    described = kubectl("describe", "node", node)
    assert "PodhealthFenced" in described and "IbPort" in described
    out = await fencer.release(node)
    assert "not recorded" not in out.output, out
    ours = {c["type"]: c for c in kget(kubectl, node)["status"]["conditions"]}["PodhealthFenced"]
    assert (ours["status"], ours["reason"]) == ("False", "PodhealthReleased")
    # A second fence of a node whose condition someone removed puts it back.
    await fencer.fence(node, FenceReason(check="xid", entity="gpu1", action="REBOOT", id="ev-cond2"))
    api.update_node(node, lambda n: n["status"].update(
        conditions=[c for c in n["status"]["conditions"] if c["type"] != "PodhealthFenced"]))
    again = await fencer.fence(node, FenceReason(check="xid", entity="gpu1", action="REBOOT", id="ev-cond2"))
    assert not again.changed
    ours = {c["type"]: c for c in kget(kubectl, node)["status"]["conditions"]}["PodhealthFenced"]
    assert (ours["status"], ours["reason"]) == ("True", "Xid")
    await fencer.release(node)


async def test_no_api_call_after_the_lease_deadline_and_the_epoch_is_in_the_marks(api: KubeAPI) -> None:
    """The aggregator's lease (fencing/fence.py Guard): once it has run out the fencer makes no
    call at all; a mark made under it carries the leader's epoch (annotation reason, taint value)."""
    from podhealth.fencing.fence import LeaseExpired
    f = KubeFencer(kubeconfig=str(api.kubeconfig), timeout=5.0)
    f.guard = lambda: 0.0
    before = len(api.writes("dgx13"))
    with pytest.raises(LeaseExpired):
        await f.fence("dgx13", XID)
    assert len(api.writes("dgx13")) == before and not api.node("dgx13")["spec"].get("unschedulable")
    f.guard = lambda: 30.0
    o = await f.fence("dgx13", FenceReason("xid", "GPU3", "DRAIN", "ev-0009", epoch=12))
    assert o.changed, o
    node = api.node("dgx13")
    assert {"key": TAINT_KEY, "value": "xid.e12", "effect": "NoSchedule"} in node["spec"]["taints"]
    st = await f.read("dgx13")
    assert st.ours and st.epoch == 12 and st.reason.endswith("[ev-0009] e12")
    await f.release("dgx13")
