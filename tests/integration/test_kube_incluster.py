"""The bundle's aggregator, in-cluster, against an API server that enforces the bundle's RBAC.

`kubectl kustomize deploy/kubernetes/base` renders the bundle; the stand-in API server
(tests/harness/kubeapi.py) serves HTTPS and authorizes every request with the rendered
ClusterRole + ClusterRoleBinding; a real `podhealth aggregator` process runs with the bundle's
ConfigMap (paths moved to temp files) and finds the API server the way a pod does:
$KUBERNETES_SERVICE_HOST/PORT plus token and ca.crt in its service account directory. A FAIL
report from a node then has to end in what real kubectl shows: cordon, taint, annotation, Event
and the PodhealthFenced condition, with not one request refused.

The second test takes each verb of the ClusterRole away in turn and shows that the aggregator
really needs it: the API server refuses that call with the apiserver's 403 text, the aggregator
reports it, and kubectl shows the mark that verb makes missing. So a verb dropped from
base/rbac.yaml fails the first test, and a verb added there that nothing uses fails the second.
"""

from __future__ import annotations

import re

import contextlib
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from podhealth.fencing.kube import ANNOTATION, CONDITION_TYPE, TAINT_KEY, FenceRecord, KubeFencer
from podhealth.credentials import derive_node_token
from tests.harness.kubeapi import KubeAPI
from tests.harness.kuberbac import Attributes, Rbac, User, forbidden
from tests.harness.proc import Service, free_port, http_get, need, service, wait_until
from tests.harness.stack import post_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "kubernetes" / "base"
NODES = ["dgx01", "dgx02", "dgx03", "dgx04"]
SICK = "dgx01"


def _rbac_source() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((BASE / "rbac.yaml").read_text()) if d]


def _granted() -> list[tuple[str, str]]:
    """(resource, verb) for every verb base/rbac.yaml grants (read at collection: no kubectl needed)."""
    role = next(d for d in _rbac_source() if d["kind"] == "ClusterRole")
    return [(res, verb) for rule in role["rules"] for res in rule["resources"] for verb in rule["verbs"]]


@pytest.fixture(scope="module")
def bundle() -> list[dict[str, Any]]:
    kubectl = need("kubectl")
    r = subprocess.run([kubectl, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60,
                       stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr[-2000:]
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"the bundle has {len(found)} {kind} {name}"
    return found[0]


def _service_account(docs: list[dict[str, Any]]) -> User:
    """The aggregator Deployment's service account, as the API server names it."""
    dep = _one(docs, "Deployment", "podhealth-aggregator")
    name = dep["spec"]["template"]["spec"]["serviceAccountName"]
    ns = dep["metadata"]["namespace"]
    _one(docs, "ServiceAccount", name)  # the bundle makes the account the Deployment names
    return User.of(f"system:serviceaccount:{ns}:{name}")


def _rbac_objects(docs: list[dict[str, Any]], drop: tuple[str, str] | None = None) -> list[dict[str, Any]]:
    """The bundle's ClusterRoles and bindings, with one (resource, verb) taken away if asked."""
    objs = [copy.deepcopy(d) for d in docs if d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role",
                                                            "RoleBinding")]
    if drop is not None:
        res, verb = drop
        role = _one(objs, "ClusterRole", "podhealth-aggregator")
        rules = []
        for rule in role["rules"]:
            if res not in rule["resources"] or verb not in rule["verbs"]:
                rules.append(rule)
                continue
            # Split the rule so only this (resource, verb) pair goes.
            others = [r for r in rule["resources"] if r != res]
            if others:
                rules.append({**rule, "resources": others})
            verbs = [v for v in rule["verbs"] if v != verb]
            if verbs:
                rules.append({**rule, "resources": [res], "verbs": verbs})
        role["rules"] = rules
    return objs


@dataclass
class Cluster:
    api: KubeAPI
    agg: Service
    url: str
    admin_token: str
    secret: str  # the cluster secret node tokens derive from
    sa: User
    cache: Path

    def kubectl(self, *args: str) -> str:
        r = subprocess.run([need("kubectl"), "--kubeconfig", str(self.api.kubeconfig), "--cache-dir",
                            str(self.cache), *args], capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        assert r.returncode == 0, f"kubectl {' '.join(args)} -> {r.returncode}: {r.stderr[-2000:]}"
        return r.stdout

    def node(self, name: str = SICK) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(self.kubectl("get", "node", name, "-o", "json"))
        return doc

    def events(self, name: str = SICK) -> list[dict[str, Any]]:
        doc = json.loads(self.kubectl("get", "events", "--all-namespaces", "-o", "json"))
        return [e for e in doc["items"] if e["involvedObject"]["name"] == name]

    def agg_node(self, name: str = SICK) -> dict[str, Any]:
        status, body = http_get(f"{self.url}/api/v1/nodes/{name}")
        assert status == 200, body[:300]
        doc: dict[str, Any] = json.loads(body)
        return doc

    def fenced(self) -> bool:
        n = self.agg_node()
        return n["fence"] == "fenced" and not n["pending_actions"]

    def reported(self, message: str) -> bool:
        """The aggregator told its operator `message`: in its log or in the node's history."""
        lines = self.agg.log.read_text(errors="replace").splitlines()
        logged = [json.loads(ln) if ln.startswith("{") else ln for ln in lines]
        status, body = http_get(f"{self.url}/api/v1/nodes/{SICK}/history?limit=1000")
        history = json.loads(body) if status == 200 else {}
        return any(message in s for s in _strings([logged, history]))

    def denied(self) -> list[Attributes]:
        return [a for u, a in list(self.api.denied) if u == self.sa]


def _strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def _sa_dir(where: Path, api: KubeAPI, token: str, namespace: str) -> Path:
    """What the kubelet mounts at /var/run/secrets/kubernetes.io/serviceaccount."""
    where.mkdir(mode=0o755)
    (where / "token").write_text(token)  # no newline, as the kubelet writes it
    (where / "ca.crt").write_bytes(api.ca_cert.read_bytes())
    (where / "namespace").write_text(namespace)
    for p in where.iterdir():
        p.chmod(0o600)
    return where


def _aggregator_config(docs: list[dict[str, Any]], tmp: Path, port: int, sa_dir: Path) -> tuple[Path, str, str]:
    """The bundle's aggregator.yaml with its paths moved under `tmp`; returns (file, cluster secret, admin token)."""
    cm = _one(docs, "ConfigMap", "podhealth-aggregator")
    doc = yaml.safe_load(cm["data"]["aggregator.yaml"])
    agg = doc["aggregator"]
    assert agg["fencers"]["kubernetes"] == {"enabled": True, "in_cluster": True}, "the bundle changed: update me"
    agg["listen"] = {"address": "127.0.0.1", "port": port}
    agg["db"] = str(tmp / "aggregator.db")
    secrets = tmp / "secrets"
    secrets.mkdir()
    values = {"cluster_secret_file": "cluster-secret-" + os.urandom(16).hex(),
              "admin_token_file": "admin-" + os.urandom(12).hex(), "agent_token_file": "agent-" + os.urandom(12).hex()}
    for key, path in list(agg["auth"].items()):
        assert key in values, f"the bundle's auth.{key} is new to this test"
        f = secrets / Path(path).name
        f.write_text(values[key] + "\n")
        f.chmod(0o400)
        agg["auth"][key] = str(f)
    agg["fencers"]["kubernetes"]["service_account_dir"] = str(sa_dir)
    agg["nodes"] = [{"name": n} for n in NODES]
    doc["log"] = {"level": "info", "format": "json"}
    conf = tmp / "aggregator.yaml"
    conf.write_text(yaml.safe_dump(doc, sort_keys=False))
    return conf, values["cluster_secret_file"], values["admin_token_file"]


@contextlib.contextmanager
def cluster(docs: list[dict[str, Any]], tmp: Path, drop: tuple[str, str] | None = None) -> Iterator[Cluster]:
    """The stand-in API server (TLS + the bundle's RBAC) and a real aggregator in-cluster; both
    stopped afterwards (the aggregator by its process group, also when the test fails)."""
    sa = _service_account(docs)
    sa_token = os.urandom(24).hex()
    with KubeAPI(nodes=NODES, tls=True, rbac=Rbac(_rbac_objects(docs, drop)), users={sa_token: sa.name},
                 workdir=tmp / "kubeapi", require_token=True) as api:
        ns = sa.name.split(":")[2]
        sa_dir = _sa_dir(tmp / "serviceaccount", api, sa_token, ns)
        port = free_port()
        conf, secret, admin = _aggregator_config(docs, tmp, port, sa_dir)
        url = f"http://127.0.0.1:{port}"
        env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(api.port),
               "KUBECONFIG": str(tmp / "no-kubeconfig")}  # in-cluster must not fall back to a kubeconfig
        argv = [sys.executable, "-m", "podhealth", "aggregator", "--config", str(conf)]
        with service("aggregator", argv, tmp / "logs", port, env=env, ready_timeout=60,
                     ready=lambda: http_get(f"{url}/healthz", timeout=2)[0] == 200) as agg:
            yield Cluster(api, agg, url, admin, secret, sa, tmp / "kubectl-cache")


def _report_fail(c: Cluster) -> None:
    now = time.time()
    report = {"node": SICK, "time": now, "results": [
        {"check": "xid", "entity": "GPU4", "status": "FAIL", "action": "RESET_GPU", "since": now - 5}]}
    status, body = post_json(f"{c.url}/v1/reports", report, derive_node_token(c.secret, SICK))
    assert status == 200, body


def _condition(node: dict[str, Any]) -> dict[str, Any] | None:
    return next((x for x in node["status"].get("conditions", ()) if x["type"] == CONDITION_TYPE), None)


@pytest.mark.skipif(sys.platform != "linux", reason="process groups")
def test_in_cluster_aggregator_fences_with_exactly_the_bundles_rbac(bundle: list[dict[str, Any]],
                                                                     tmp_path: Path) -> None:
    with cluster(bundle, tmp_path) as c:
        _report_fail(c)
        # Done when fenced, or as soon as the API server refused a call (then say which).
        wait_until(lambda: c.fenced() or c.denied(), timeout=60, what=f"the aggregator to fence {SICK}")
        assert c.denied() == [], [forbidden(c.sa, a)["message"] for a in c.denied()]
        node = c.node()
        assert node["spec"]["unschedulable"] is True
        # the value carries the fencing leader's epoch (check.eN), so a frozen old leader's mark is told apart
        assert any(t["key"] == TAINT_KEY and t["effect"] == "NoSchedule" and re.fullmatch(r"xid\.e\d+", t["value"])
                   for t in node["spec"]["taints"]), node["spec"]["taints"]
        rec = FenceRecord.parse(node["metadata"]["annotations"][ANNOTATION])
        assert rec is not None and rec.check == "xid" and rec.why.startswith("podhealth: xid GPU4 RESET_GPU")
        cond = _condition(node)
        assert cond is not None and cond["status"] == "True" and cond["reason"] == "Xid", cond
        assert "PodhealthFenced" in c.kubectl("describe", "node", SICK)
        assert [e["reason"] for e in c.events()] == ["PodhealthFenced"]
        for other in NODES[1:]:
            assert "unschedulable" not in c.node(other)["spec"]

        # The release undoes it with the same grants.
        status, body = post_json(f"{c.url}/api/v1/nodes/{SICK}/release", {"reason": "test: repaired", "who": "t"},
                                 c.admin_token)
        assert status == 200, body
        wait_until(lambda: c.agg_node()["fence"] == "none" and not c.agg_node()["pending_actions"], timeout=60,
                   what=f"the aggregator to release {SICK}")
        node = c.node()
        assert "unschedulable" not in node["spec"] and ANNOTATION not in node["metadata"]["annotations"]
        cond = _condition(node)
        assert cond is not None and cond["status"] == "False", cond
        assert [e["reason"] for e in c.events()] == ["PodhealthFenced", "PodhealthReleased"]

        # Every call went through with the service account's token, and none was refused.
        assert c.denied() == [], [forbidden(c.sa, a)["message"] for a in c.denied()]
        assert any(r.token and r.method == "PATCH" for r in c.api.requests)


# What kubectl must show without each grant, once the aggregator has tried (pure predicates on the
# node, its events, and whether the aggregator counts the node fenced).
Effect = Callable[[Cluster], None]


def _not_fenced(c: Cluster) -> None:
    node = c.node()
    assert "unschedulable" not in node["spec"] and "taints" not in node["spec"], node["spec"]
    assert ANNOTATION not in node["metadata"]["annotations"] and _condition(node) is None
    assert c.agg_node()["fence"] != "fenced"


def _fenced_without_condition(c: Cluster) -> None:
    wait_until(c.fenced, timeout=60, what="the fence (the condition is best effort)")
    node = c.node()
    assert node["spec"]["unschedulable"] is True and _condition(node) is None


def _fenced_without_event(c: Cluster) -> None:
    wait_until(c.fenced, timeout=60, what="the fence (the Event is best effort)")
    assert c.node()["spec"]["unschedulable"] is True and c.events() == []


def _reconcile_skipped(c: Cluster) -> None:
    assert c.reported("cannot list fenced nodes")


EFFECTS: dict[tuple[str, str], Effect] = {
    ("nodes", "get"): _not_fenced,
    ("nodes", "patch"): _not_fenced,
    ("nodes/status", "patch"): _fenced_without_condition,
    ("events", "create"): _fenced_without_event,
    ("nodes", "list"): _reconcile_skipped,
}


@pytest.mark.skipif(sys.platform != "linux", reason="process groups")
@pytest.mark.parametrize("drop", _granted(), ids=lambda d: "-".join(d).replace("/", "_"))
def test_every_granted_verb_is_needed(bundle: list[dict[str, Any]], tmp_path: Path, drop: tuple[str, str]) -> None:
    rendered = _one(bundle, "ClusterRole", "podhealth-aggregator")["rules"]
    source = next(d for d in _rbac_source() if d["kind"] == "ClusterRole")["rules"]
    assert rendered == source  # what is parametrized here is what the bundle renders
    resource, verb = drop
    with cluster(bundle, tmp_path, drop) as c:
        _report_fail(c)

        def refused() -> str:
            hits = [a for a in c.denied() if a.combined_resource == resource and a.verb == verb]
            return forbidden(c.sa, hits[0])["message"] if hits else ""

        # A verb nothing uses is never refused: the fence completes without it, and that ends the wait.
        wait_until(lambda: refused() or c.fenced(), timeout=60, what=f"the API server to refuse {verb} {resource}")
        message = refused()
        assert message, f"{SICK} was fenced without {verb} {resource}: the ClusterRole grants more than is used"
        assert f'cannot {verb} resource "{resource}" in API group ""' in message
        assert message.startswith((f'{resource.split("/")[0]} "{SICK}" is forbidden', f"{resource} is forbidden"))
        wait_until(lambda: c.reported(message), timeout=60, what=f"the aggregator to report: {message}")
        # Nothing else was refused: the bundle grants all the rest.
        assert {(a.combined_resource, a.verb) for a in c.denied()} == {drop}
        effect = EFFECTS.get(drop)
        assert effect is not None, f"{verb} {resource} is granted and used, but this test has no expectation for it"
        effect(c)


def test_rotated_service_account_token_is_used_at_once(bundle: list[dict[str, Any]], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The kubelet swaps the token file about hourly; the next call carries the new token."""
    sa = _service_account(bundle)
    old, new = "old-" + os.urandom(8).hex(), "new-" + os.urandom(8).hex()
    with KubeAPI(nodes=NODES, tls=True, rbac=Rbac(_rbac_objects(bundle)), users={old: sa.name},
                 workdir=tmp_path / "kubeapi", require_token=True) as api:
        sa_dir = _sa_dir(tmp_path / "sa", api, old, "podhealth")
        monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        monkeypatch.setenv("KUBERNETES_SERVICE_PORT", str(api.port))
        fencer = KubeFencer(in_cluster=True, service_account_dir=str(sa_dir), timeout=5.0, attempts=1)
        assert fencer.api.configuration.host == f"https://127.0.0.1:{api.port}"
        assert fencer.core.read_node(SICK).metadata.name == SICK

        # As the kubelet's atomic writer does: the new file appears under another name and is
        # renamed over the old one; then the API server stops accepting the old token.
        tmp = sa_dir / ".token.new"
        tmp.write_text(new)
        os.replace(tmp, sa_dir / "token")
        api.add_token(new, sa.name)
        api.remove_token(old)
        assert fencer.core.read_node(SICK).metadata.name == SICK
        assert api.denied == []
