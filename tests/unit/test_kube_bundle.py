"""The Kubernetes bundle (deploy/kubernetes): kustomize renders it, every object validates against
the Kubernetes OpenAPI schemas (kubernetes-validate) and the monitoring CRDs' schemas, the embedded
configs are valid podhealth configs, the PrometheusRule is generated from alerts/, checkov finds
nothing that is not justified, and the node-problem-detector plugin speaks NPD's protocol."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from podhealth import config
from podhealth.fencing.kube import CONDITION_TYPE  # noqa: F401 - the fencer's own condition exists
from podhealth.vocab import Action, CheckResult, NodeReport, Status
from tests.conftest import REPO

BUNDLE = REPO / "deploy" / "kubernetes"
K8S_VERSION = "1.30"
SHARED_CRDS = REPO.parent / "shared" / "fixtures" / "kubernetes"


def _kubectl() -> str:
    k = shutil.which("kubectl")
    if not k:
        pytest.skip("kubectl is not installed (bash scripts/setup.sh --test installs it)")
    return k


def render(path: Path) -> list[dict[str, Any]]:
    r = subprocess.run([_kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    return render(BUNDLE)


def _by(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name))


def test_renders_every_part(objects: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in objects)
    for k in ("DaemonSet", "Deployment", "Service", "PersistentVolumeClaim", "ServiceAccount", "ClusterRole",
              "ClusterRoleBinding", "PodMonitor", "ServiceMonitor", "PrometheusRule", "Namespace"):
        assert k in kinds, k
    assert all(o["metadata"].get("namespace") == "podhealth" for o in objects
               if o["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"))
    assert render(BUNDLE / "base") and render(BUNDLE / "npd")


def _secrets_used(objects: list[dict[str, Any]]) -> set[str]:
    """The Secrets the pods mount or read keys from."""
    names: set[str] = set()
    for o in objects:
        pod = o.get("spec", {}).get("template", {}).get("spec", {})
        names |= {v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}
        for c in pod.get("containers", []):
            names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                      if "secretKeyRef" in e.get("valueFrom", {})}
    return names


@pytest.mark.parametrize("variant", [".", "base", "replicas", "examples/with-jobs"])
def test_the_bundle_ships_no_secret_that_would_clear_the_operators(variant: str) -> None:
    """The operator fills the Secrets with `kubectl ... -o yaml | kubectl apply -f -` (README):
    an empty Secret of the same name in the bundle, applied after it, makes kubectl clear every
    key it applied before (a field in the last-applied configuration and not in the new one is
    deleted), so the aggregator would start without its cluster secret. The bundle names the
    Secrets its pods use and the install steps create each one."""
    objs = render(BUNDLE / variant)
    assert not [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"]
    used = _secrets_used(objs)
    assert "podhealth-aggregator" in used
    steps = (BUNDLE / "README.md").read_text()
    for name in used:
        assert f"create secret generic {name}" in steps or f"create secret generic {name}" in \
            (BUNDLE / variant / "kustomization.yaml").read_text(), name


def test_core_objects_validate_against_the_kubernetes_schemas(objects: list[dict[str, Any]]) -> None:
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extras)")
    checked = 0
    for o in objects:
        if o["apiVersion"].startswith("monitoring.coreos.com"):
            continue
        kv.validate(o, K8S_VERSION, strict=True)  # raises ValidationError naming the field
        checked += 1
    assert checked >= 12


def test_monitoring_objects_validate_against_the_operator_crds(objects: list[dict[str, Any]]) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    crds = sorted(SHARED_CRDS.glob("prometheus-operator_*_crd_monitoring.coreos.com_*.yaml"))
    if not crds:
        pytest.skip(f"the Prometheus Operator CRDs are read from {SHARED_CRDS} (not in this checkout)")
    schemas = {}
    for path in crds:
        crd = yaml.safe_load(path.read_text())
        for v in crd["spec"]["versions"]:
            schemas[(crd["spec"]["names"]["kind"], f"{crd['spec']['group']}/{v['name']}")] = v["schema"]["openAPIV3Schema"]
    mon = [o for o in objects if o["apiVersion"].startswith("monitoring.coreos.com")]
    assert {o["kind"] for o in mon} == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    for o in mon:
        # No check_schema(): the CRDs hold Go regexes ("(?i)...") that Python's re cannot compile;
        # none of them applies to a field we set.
        errors = list(jsonschema.Draft202012Validator(schemas[(o["kind"], o["apiVersion"])]).iter_errors(o))
        assert not errors, f"{o['kind']}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors)


def test_embedded_configs_are_valid(objects: list[dict[str, Any]]) -> None:
    agent = config.loads(_by(objects, "ConfigMap", "podhealth-agent")["data"]["podhealth.yaml"], "configmap:agent")
    assert str(agent.paths.sysfs_root) == "/host/sys" and agent.publish.token_file.startswith("/host/etc/podhealth")
    agg = config.loads(_by(objects, "ConfigMap", "podhealth-aggregator")["data"]["aggregator.yaml"],
                       "configmap:aggregator").aggregator
    assert agg.fencers.kubernetes.enabled and agg.fencers.kubernetes.in_cluster
    assert agg.auth.cluster_secret_file and agg.exposure_problem() is None


def test_agent_daemonset_is_what_the_collectors_need(objects: list[dict[str, Any]]) -> None:
    spec = _by(objects, "DaemonSet")["spec"]["template"]["spec"]
    assert spec["hostPID"] and spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "podhealth.io/unhealthy", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    c = spec["containers"][0]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYSLOG"]}
    assert c["livenessProbe"]["httpGet"]["path"] == c["readinessProbe"]["httpGet"]["path"] == "/healthz"
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/host/sys", "/host/proc", "/dev/kmsg", "/etc/podhealth"):
        assert mounts[path].get("readOnly") is True, path
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert spec["automountServiceAccountToken"] is False


def test_aggregator_is_one_recreated_replica_with_exactly_the_fencers_rbac(objects: list[dict[str, Any]]) -> None:
    dep = _by(objects, "Deployment")["spec"]
    assert dep["replicas"] == 1 and dep["strategy"] == {"type": "Recreate"}
    rules = {(r, v) for rule in _by(objects, "ClusterRole")["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert rules == {("nodes", "get"), ("nodes", "list"), ("nodes", "patch"), ("nodes/status", "patch"),
                     ("events", "create")}
    sub = _by(objects, "ClusterRoleBinding")["subjects"][0]
    assert (sub["name"], sub["namespace"]) == ("podhealth-aggregator", "podhealth")


def test_the_replicas_variant_runs_two_aggregators_on_postgresql() -> None:
    objects = render(BUNDLE / "replicas")
    dep = _by(objects, "Deployment", "podhealth-aggregator")["spec"]
    assert dep["replicas"] == 2 and dep["strategy"]["type"] == "RollingUpdate"
    pod = dep["template"]["spec"]
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["PGPASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": "podhealth-postgresql", "key": "password"}
    state = next(v for v in pod["volumes"] if v["name"] == "state")
    assert "emptyDir" in state and "persistentVolumeClaim" not in state
    assert not [o for o in objects if o["kind"] == "PersistentVolumeClaim"]
    assert _by(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    agg = config.loads(_by(objects, "ConfigMap", "podhealth-aggregator")["data"]["aggregator.yaml"],
                       "configmap:aggregator").aggregator
    assert agg.store.url.startswith("postgresql://") and ":" not in agg.store.url.split("@")[0][len("postgresql://"):]
    assert agg.fencers.kubernetes.enabled and agg.exposure_problem() is None
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (test extras)")
    for o in objects:
        kv.validate(o, K8S_VERSION, strict=True)


def test_prometheusrule_is_generated_from_the_alert_rules() -> None:
    sys.path.insert(0, str(BUNDLE / "monitoring"))
    try:
        import generate  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    want = generate.render((REPO / "alerts" / "podhealth-rules.yml").read_text())
    assert (BUNDLE / "monitoring" / "prometheusrule.yaml").read_text() == want, \
        "run python deploy/kubernetes/monitoring/generate.py"


def test_checkov_finds_nothing_unjustified(objects: list[dict[str, Any]], tmp_path: Path) -> None:
    checkov = REPO / ".venv-checkov" / "bin" / "checkov"
    if not checkov.exists():
        pytest.skip("checkov lives in its own virtualenv: bash scripts/setup.sh --test creates .venv-checkov")
    rendered = tmp_path / "bundle.yaml"
    rendered.write_text(yaml.safe_dump_all(objects))
    r = subprocess.run([str(checkov), "-f", str(rendered), "--framework", "kubernetes", "--output", "json",
                        "--quiet", "--compact"], capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout or "{}")
    reports = report if isinstance(report, list) else [report]
    failed = [f"{c['check_id']} {c['resource']}: {c['check_name']}" for rep in reports
              for c in rep.get("results", {}).get("failed_checks", [])]
    assert not failed, "checkov findings without a justification (checkov.io/skipN annotation):\n" + "\n".join(failed)
    skipped = [c for rep in reports for c in rep.get("results", {}).get("skipped_checks", [])]
    assert all(c.get("suppress_comment", "").strip() for c in skipped)


# ---- node-problem-detector plugin ----------------------------------------------------------------


def _report(status: Status) -> bytes:
    results = [CheckResult(check="xid", status=status, entity="gpu3", action=Action.REBOOT if status is Status.FAIL
                           else Action.NONE, summary="x"),
               CheckResult(check="ecc", status=Status.OK, entity="gpu0", action=Action.NONE)]
    return json.dumps(NodeReport("dgx01", "0.1.0", "dgx-h100", tuple(results)).to_json()).encode()


NPD_KEY = "9f" * 32  # the node's agent key, as `token derive --agent` prints one


@pytest.fixture()
def fake_agent() -> Iterator[tuple[int, dict[str, bytes]]]:
    state = {"body": b"", "key": NPD_KEY.encode()}  # key b"": an impostor, which proves nothing

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            import time as _time

            from podhealth import nodeproof

            body = state["body"]
            code = 200 if self.path == "/health" else 404
            self.send_response(code)
            nonce = nodeproof.nonce_of(self.headers)  # type: ignore[arg-type]
            if state["key"] and nonce and self.headers.get("X-Podhealth-Node") == "dgx01":
                for k, v in nodeproof.prove(state["key"].decode(), "dgx01", "GET", self.path, nonce, code, body,
                                            _time.time()).items():
                    self.send_header(k, v)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv.server_address[1], state
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def _plugin(port: int, key: str = NPD_KEY) -> subprocess.CompletedProcess[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".key") as f:
        f.write(key + "\n")
        f.flush()
        return subprocess.run(["bash", str(BUNDLE / "npd" / "podhealth-plugin.sh")], capture_output=True, text=True,
                              timeout=20, env={"PATH": "/usr/bin:/bin", "HOST_IP": "127.0.0.1", "PODHEALTH_PORT": str(port),
                                               "NODE_NAME": "dgx01", "PODHEALTH_KEY_FILE": f.name})


@pytest.mark.parametrize("status,code", [(Status.OK, 0), (Status.WARN, 0), (Status.FAIL, 1), (Status.UNKNOWN, 2)])
def test_npd_plugin_exit_codes_follow_the_verdict(fake_agent: tuple[int, dict[str, bytes]], status: Status,
                                                   code: int) -> None:
    port, state = fake_agent
    state["body"] = _report(status)
    r = _plugin(port)
    assert r.returncode == code, (r.stdout, r.stderr)
    line = r.stdout.strip().splitlines()[0]
    assert len(line) <= 80 and status.value in line
    if status is Status.FAIL:
        assert "REBOOT" in line


@pytest.mark.parametrize("status", [Status.OK, Status.FAIL])
def test_npd_plugin_believes_only_an_answer_proven_by_the_nodes_key(fake_agent: tuple[int, dict[str, bytes]],
                                                                     status: Status) -> None:
    """An impostor on the agent's port (or an agent with another node's key) set the condition."""
    port, state = fake_agent
    state["body"] = _report(status)
    r = _plugin(port)
    assert r.returncode == (0 if status is Status.OK else 1), (r.stdout, r.stderr)
    state["key"] = b""  # whatever took the port while the agent was down
    r = _plugin(port)
    assert r.returncode == 2 and "no proof" in r.stdout, (r.stdout, r.stderr)
    state["key"] = ("ab" * 32).encode()  # another node's key
    r = _plugin(port)
    assert r.returncode == 2 and "not proven" in r.stdout, (r.stdout, r.stderr)
    state["key"] = NPD_KEY.encode()
    assert _plugin(port, key="").returncode == 2  # no key here: cannot tell, never OK or NonOK
    long_key = "k" * 80  # over HMAC's 64-byte block (a shared agent_token): hashed first, RFC 2104
    state["key"] = long_key.encode()
    assert _plugin(port, key=long_key).returncode == (0 if status is Status.OK else 1)


def test_npd_plugin_is_unknown_when_the_agent_is_away() -> None:
    from podhealth.sim.slurmcluster import free_port

    r = _plugin(free_port())
    assert r.returncode == 2 and "not reachable" in r.stdout


def test_npd_monitor_config_points_at_the_plugin() -> None:
    cm = render(BUNDLE / "npd")[0]
    monitor = json.loads(cm["data"]["podhealth-monitor.json"])
    assert monitor["plugin"] == "custom" and monitor["rules"][0]["type"] == "permanent"
    assert monitor["rules"][0]["path"].endswith("/podhealth-plugin.sh")
    assert cm["data"]["podhealth-plugin.sh"] == (BUNDLE / "npd" / "podhealth-plugin.sh").read_text()


def test_the_jobs_overlay_adds_exactly_the_pod_verbs_and_turns_jobs_on() -> None:
    objs = render(BUNDLE / "examples" / "with-jobs")
    rules = {(r, v) for rule in _by(objs, "ClusterRole")["rules"] for r in rule["resources"] for v in rule["verbs"]}
    base = {(r, v) for rule in _by(render(BUNDLE / "base"), "ClusterRole")["rules"]
            for r in rule["resources"] for v in rule["verbs"]}
    assert rules - base == {("pods", "list"), ("pods/eviction", "create")}
    agg = config.loads(_by(objs, "ConfigMap", "podhealth-aggregator")["data"]["aggregator.yaml"], "overlay").aggregator
    assert agg.jobs.enabled and agg.fencers.kubernetes.in_cluster
