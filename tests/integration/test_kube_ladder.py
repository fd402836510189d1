"""KubeFencer's Remediator calls (the ladder's reboot request and REPAIR reason) against the
stand-in API server, checked with the real kubectl."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from podhealth.fencing.fence import FenceReason, Refused, Remediator, repair_reason
from podhealth.fencing.kube import ANNOTATION, REBOOT_ANNOTATION, FenceRecord, KubeFencer
from tests.harness.kubeapi import KubeAPI, Kubectl, kubectl_for

pytestmark = pytest.mark.integration
R = FenceReason(check="xid", entity="gpu3", action="REBOOT", id="ev-0009")


@pytest.fixture(scope="module")
def api() -> Iterator[KubeAPI]:
    with KubeAPI(nodes=["dgx01", "dgx02", "dgx03"]) as server:
        yield server


@pytest.fixture(scope="module")
def kubectl(api: KubeAPI, tmp_path_factory: pytest.TempPathFactory) -> Kubectl:
    return kubectl_for(api, tmp_path_factory.mktemp("kubectl-cache"))


def node_annotations(kubectl: Any, node: str) -> dict[str, str]:
    doc = json.loads(kubectl("get", "node", node, "-o", "json"))
    return dict(doc["metadata"].get("annotations") or {})


async def test_reboot_request_repair_reason_and_release(api: KubeAPI, kubectl: Any) -> None:
    f = KubeFencer(kubeconfig=str(api.kubeconfig), timeout=5.0)
    assert isinstance(f, Remediator)
    with pytest.raises(Refused):  # not fenced by podhealth: no request
        await f.reboot("dgx01", R)
    assert REBOOT_ANNOTATION not in node_annotations(kubectl, "dgx01")

    await f.fence("dgx01", R)
    o = await f.reboot("dgx01", R)
    assert o.changed, o
    req = json.loads(node_annotations(kubectl, "dgx01")[REBOOT_ANNOTATION])
    assert req["id"] == "ev-0009" and req["why"] == "podhealth: xid gpu3 REBOOT [ev-0009]" and req["when"].endswith("Z")
    # What a kured --reboot-sentinel-command reads (README): the annotation through kubectl's jsonpath.
    path = "{.metadata.annotations.podhealth\\.io/reboot-requested}"
    assert json.loads(kubectl("get", "node", "dgx01", "-o", f"jsonpath={path}"))["id"] == "ev-0009"
    again = await f.reboot("dgx01", R)
    assert not again.changed  # the same request: never asked twice
    # still cordoned and tainted by podhealth across the reboot
    st = await f.read("dgx01")
    assert st.fenced and st.ours

    o = await f.remark("dgx01", repair_reason(R))
    assert o.changed, o
    rec = FenceRecord.parse(node_annotations(kubectl, "dgx01")[ANNOTATION])
    assert rec is not None and rec.why == "podhealth: REPAIR xid/gpu3 REBOOT [ev-0009]" and rec.id == "ev-0009"
    assert (await f.read("dgx01")).reason == "podhealth: REPAIR xid/gpu3 REBOOT [ev-0009]"
    events = kubectl("get", "events", "-n", "default", "--field-selector", "involvedObject.name=dgx01", "-o", "json")
    reasons = [e["reason"] for e in json.loads(events)["items"]]
    assert "PodhealthRebootRequested" in reasons and "PodhealthRepair" in reasons

    await f.release("dgx01")
    left = node_annotations(kubectl, "dgx01")
    assert ANNOTATION not in left and REBOOT_ANNOTATION not in left
