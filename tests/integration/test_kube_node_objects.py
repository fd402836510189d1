"""KubeFencer on Node objects as real clusters hold them, checked with real kubectl.

The Nodes come from tests/fixtures/kubernetes/ (GPU Operator labels and taints, NFD, node-problem-
detector conditions, managedFields, an admin's cordon); the stand-in API server plays the node
lifecycle controller (`node.kubernetes.io/unschedulable` follows a cordon). podhealth's release
must leave every mark it did not make exactly as it was, and a Node that is deleted or replaced
while podhealth fences it must give a clear answer, never a crash or a fence on the wrong object.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from podhealth.fencing.fence import FenceReason, Refused
from podhealth.fencing.kube import ANNOTATION, CONDITION_TYPE, REBOOT_ANNOTATION, TAINT_KEY, KubeFencer, NodeView
from tests.harness.kubeapi import UNSCHEDULABLE_TAINT, KubeAPI, Kubectl, kubectl_for

pytestmark = pytest.mark.integration

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubernetes"
CORDONED = json.loads((FIX / "node_h100_cordoned_by_admin_gpu_operator_npd.json").read_text())
NPD = json.loads((FIX / "node_h100_npd_kerneldeadlock_operands_off.json").read_text())
XID = FenceReason(check="xid", entity="GPU3", action="DRAIN", id="ev-0042")
OURS = (ANNOTATION, REBOOT_ANNOTATION)


def named(obj: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["name"] = name
    out["metadata"]["labels"]["kubernetes.io/hostname"] = name
    return out


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with KubeAPI(nodes=[], unschedulable_taint=True) as server:
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


def others(node: dict[str, Any]) -> dict[str, Any]:
    """Everything on a Node that is not podhealth's: what release must leave as it found it."""
    meta, spec, status = node["metadata"], node.get("spec", {}), node.get("status", {})
    return {"labels": meta.get("labels"),
            "annotations": {k: v for k, v in (meta.get("annotations") or {}).items() if k not in OURS},
            "managedFields": meta.get("managedFields"),
            "taints": [t for t in spec.get("taints") or () if t.get("key") != TAINT_KEY],
            "unschedulable": spec.get("unschedulable", False),
            "conditions": [c for c in status.get("conditions") or () if c.get("type") != CONDITION_TYPE],
            "nodeInfo": status.get("nodeInfo"), "capacity": status.get("capacity")}


def test_fixture_nodes_read_as_real_clusters_hold_them() -> None:
    """Pure: an admin's cordon, other tools' taints, NPD conditions and the GPU Operator's labels are
    no podhealth fence and no opt-out."""
    c, n = NodeView.of(CORDONED), NodeView.of(NPD)
    assert c.unschedulable and not c.ours and not c.opted_out and c.record is None
    st = c.state()
    assert not st.fenced and not st.ours and not st.opted_out and st.reason == "cordoned, not by podhealth"
    assert not n.unschedulable and not n.ours and not n.opted_out and n.state().reason == ""
    assert [t["key"] for t in n.taints] == ["nvidia.com/gpu", "example.com/hw-check"]
    assert n.condition == ""  # NPD's conditions are not podhealth's


async def test_admin_cordon_stays_and_every_other_mark_survives(api: KubeAPI, kubectl: Any,
                                                                fencer: KubeFencer) -> None:
    name = api.add_node_object(named(CORDONED, "dgx-h100-07"))
    before = others(kget(kubectl, name))
    o = await fencer.fence(name, XID)
    assert o.changed and "already cordoned by someone else" in o.output, o
    node = kget(kubectl, name)
    assert json.loads(node["metadata"]["annotations"][ANNOTATION])["cordoned_before"] is True
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", UNSCHEDULABLE_TAINT, TAINT_KEY]
    assert others(node) == before  # the fence itself touched nothing of theirs
    r = await fencer.release(name)
    assert r.changed and "cordon kept" in r.output, r
    node = kget(kubectl, name)
    assert others(node) == before
    assert ANNOTATION not in node["metadata"]["annotations"] and node["spec"]["unschedulable"] is True
    assert {c["type"]: c["status"] for c in node["status"]["conditions"]}[CONDITION_TYPE] == "False"
    table = kubectl("get", "node", name)
    assert "SchedulingDisabled" in table  # kubectl still shows the admin's cordon


async def test_release_of_our_cordon_keeps_npd_gpu_operator_and_other_taints(api: KubeAPI, kubectl: Any,
                                                                            fencer: KubeFencer) -> None:
    name = api.add_node_object(named(NPD, "dgx-h100-08"))
    before = others(kget(kubectl, name))
    o = await fencer.fence(name, XID)
    assert o.changed and "already cordoned" not in o.output, o
    node = kget(kubectl, name)
    # The controller's taint came after our write, behind ours: nothing of the other tools moved.
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", "example.com/hw-check", TAINT_KEY,
                                                          UNSCHEDULABLE_TAINT]
    assert node["spec"]["taints"][1]["timeAdded"] == "2024-12-01T09:40:00Z"
    # fence() is idempotent on this node too: the controller's later write is no reason to patch again.
    again = await fencer.fence(name, XID)
    assert not again.changed, again
    r = await fencer.release(name)
    assert r.changed and "cordon kept" not in r.output, r
    node = kget(kubectl, name)
    assert "unschedulable" not in node["spec"]
    assert others(node) == before  # the controller removed its taint again; NPD's KernelDeadlock=True stays
    conds = {c["type"]: c for c in node["status"]["conditions"]}
    assert conds["KernelDeadlock"]["status"] == "True" and conds["GpuXid"]["reason"] == "Xid79"
    assert node["metadata"]["labels"]["nvidia.com/gpu.deploy.operands"] == "false"


async def test_conflicts_from_other_controllers_are_re_read(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    """409 on the write -> read the fresh object and write again: the GPU Operator's label, NPD's
    condition and another tool's taint that landed in between are all kept."""
    name = api.add_node_object(named(NPD, "dgx-h100-09"))

    def gpu_operator(n: dict[str, Any]) -> None:
        n["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = "upgrade-done"

    def other_tool(n: dict[str, Any]) -> None:
        n["spec"]["taints"].append({"key": "example.com/late", "effect": "NoSchedule"})

    api.inject_concurrent_update(name, gpu_operator)
    api.inject_concurrent_update(name, other_tool)
    sent = api.conflicts_sent
    o = await fencer.fence(name, XID)
    assert o.changed, o
    assert api.conflicts_sent == sent + 2
    node = kget(kubectl, name)
    assert node["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-done"
    assert [t["key"] for t in node["spec"]["taints"]] == ["nvidia.com/gpu", "example.com/hw-check",
                                                          "example.com/late", TAINT_KEY, UNSCHEDULABLE_TAINT]
    api.inject_concurrent_update(name, lambda n: n["spec"]["taints"].append(
        {"key": "example.com/during-release", "effect": "NoSchedule"}))
    r = await fencer.release(name)
    assert r.changed, r
    keys = [t["key"] for t in kget(kubectl, name)["spec"]["taints"]]
    assert keys == ["nvidia.com/gpu", "example.com/hw-check", "example.com/late", "example.com/during-release"]


async def test_node_deleted_while_fencing(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    """Read, then the Node is deleted before podhealth's write lands (404): a clear error, no crash,
    nothing recreated; the next read says the node does not exist."""
    name = api.add_node_object(named(NPD, "dgx-h100-10"))
    api.inject_delete(name)
    with pytest.raises(Refused) as e:
        await fencer.fence(name, XID)
    assert e.value.error == f"node {name} not found: deleted while podhealth was fencing it"
    assert kubectl.run("get", "node", name, ok=False).returncode != 0
    st = await fencer.read(name)
    assert not st.exists and not st.fenced
    with pytest.raises(Refused) as e:
        await fencer.fence(name, XID)
    assert e.value.error == f"node {name} not found"


async def test_node_deleted_while_releasing_or_annotating(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    for verb in ("release", "reboot", "remark"):
        name = api.add_node_object(named(NPD, f"dgx-h100-1{len(verb)}"))
        await fencer.fence(name, XID)
        api.inject_delete(name)
        with pytest.raises(Refused) as e:
            await (fencer.release(name) if verb == "release" else getattr(fencer, verb)(name, XID))
        assert "deleted while podhealth was" in e.value.error, (verb, e.value)
        assert (await fencer.read(name)).exists is False


async def test_node_replaced_under_the_same_name(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    """The machine is re-provisioned and registers again between our read and our write: the write
    carries the old resourceVersion, gets 409, and the fence is made on the new object (whose
    admin cordon is recorded as the new object's own)."""
    name = api.add_node_object(named(NPD, "dgx-h100-20"))
    old_uid = kget(kubectl, name)["metadata"]["uid"]
    api.inject_replace(name, named(CORDONED, name))
    o = await fencer.fence(name, XID)
    assert o.changed and "already cordoned by someone else" in o.output, o
    node = kget(kubectl, name)
    assert node["metadata"]["uid"] != old_uid
    assert json.loads(node["metadata"]["annotations"][ANNOTATION])["cordoned_before"] is True
    await fencer.release(name)
    assert kget(kubectl, name)["spec"]["unschedulable"] is True  # the new admin cordon stays


async def test_kubectl_delete_node_then_reconcile(api: KubeAPI, kubectl: Any, fencer: KubeFencer) -> None:
    name = api.add_node_object(named(NPD, "dgx-h100-21"))
    await fencer.fence(name, XID)
    assert name in await fencer.list_fenced()
    kubectl("delete", "node", name)
    assert name not in await fencer.list_fenced()
    with pytest.raises(Refused) as e:
        await fencer.release(name)
    assert e.value.error == f"node {name} not found"


async def test_every_write_names_podhealth_as_field_manager(api: KubeAPI, fencer: KubeFencer) -> None:
    """So a real API server's managedFields attribute the cordon, taint and annotation to podhealth."""
    name = api.add_node_object(named(NPD, "dgx-h100-22"))
    await fencer.fence(name, XID)
    await fencer.release(name)
    writes = [r for r in api.requests if r.method in ("PATCH", "POST") and name in r.path + r.body.decode()]
    assert {r.path for r in writes} >= {f"/api/v1/nodes/{name}", f"/api/v1/nodes/{name}/status",
                                        "/api/v1/namespaces/default/events"}
    assert all("fieldManager=podhealth" in r.query.split("&") for r in writes), [(r.path, r.query) for r in writes]


async def test_real_gpu_operator_labels_and_taint(shared_fixtures: Path, api: KubeAPI, kubectl: Any,
                                                  fencer: KubeFencer) -> None:
    """The real label set of a GPU Operator + GFD + NFD node and the real `nvidia.com/gpu=present`
    taint fragment (../shared/fixtures/kubernetes) on a Node: no podhealth mark, no opt-out, and a
    fence and release give them back unchanged."""
    k8s = shared_fixtures / "kubernetes"
    labels = json.loads((k8s / "node_metadata_labels_jq_a30_gpu_operator_gfd_nfd.json").read_text())
    taints = yaml.safe_load((k8s / "node_spec_taints_fragment_nvidia_gpu_present_noschedule.yaml").read_text())["taints"]
    assert labels and taints
    obj = named(NPD, "dgx-a30-01")
    obj["metadata"]["labels"] = dict(labels, **{"kubernetes.io/hostname": "dgx-a30-01"})
    obj["spec"]["taints"] = taints
    view = NodeView.of(obj)
    assert not view.ours and not view.opted_out and not view.state().fenced
    name = api.add_node_object(obj)
    before = others(kget(kubectl, name))
    assert (await fencer.fence(name, XID)).changed
    assert (await fencer.release(name)).changed
    assert others(kget(kubectl, name)) == before

