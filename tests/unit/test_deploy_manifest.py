"""The DaemonSet manifest: well-formed, its embedded config valid, and the host mounts the agent needs."""

from __future__ import annotations

import yaml

from podhealth import config
from tests.conftest import REPO

MANIFEST = REPO / "deploy" / "kubernetes" / "podhealth-agent.yaml"


def _docs() -> dict[str, dict]:  # type: ignore[type-arg]
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text())}


def test_embedded_config_is_valid() -> None:
    cm = _docs()["ConfigMap"]
    cfg = config.loads(cm["data"]["podhealth.yaml"], "configmap:podhealth.yaml")
    assert str(cfg.paths.sysfs_root) == "/host/sys" and str(cfg.paths.procfs_root) == "/host/proc"


def test_daemonset_mounts_what_the_collectors_read() -> None:
    ds = _docs()["DaemonSet"]
    spec = ds["spec"]["template"]["spec"]
    assert spec["hostPID"] is True
    c = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/host/sys", "/host/proc", "/dev/kmsg", "/etc/podhealth"):
        assert mounts[path].get("readOnly") is True, path
    assert mounts["/host/home"]["mountPropagation"] == "HostToContainer"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert {"operator": "Exists"} in spec["tolerations"]
