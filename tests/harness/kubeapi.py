"""An in-memory Kubernetes API server stand-in, enough for kubectl and the official Python client.

No kube-apiserver can be installed here, so tests talk to this: a threaded http.server on
127.0.0.1 (plain HTTP; a wrong bearer token gets 401, none is anonymous because kubectl sends no
token over http) serving /version, legacy discovery, Nodes (get, list,
PATCH as JSON merge / strategic merge / JSON patch, PUT with resourceVersion conflicts),
Events (core/v1 and events.k8s.io/v1) and an always-empty pod list, which is what `kubectl
cordon/uncordon/taint/drain --ignore-daemonsets/get` need. Standard library only, so scripts can
use it without pytest.

    with KubeAPI(nodes=["dgx01", "dgx02"]) as api:
        subprocess.run(["kubectl", "--kubeconfig", str(api.kubeconfig), "cordon", "dgx01"], timeout=30)
        assert api.node("dgx01")["spec"]["unschedulable"] is True

Concurrency is real optimistic locking: every write bumps the node's resourceVersion, a PUT or a
patch that carries a stale metadata.resourceVersion gets 409, and `inject_concurrent_update()`
makes "another client" write a node just before the next request's write is applied
(`inject_delete` deletes it there instead, `inject_replace` deletes and re-creates it with a new
uid, as a re-provisioned machine re-registers under its old name).

`add_node_object()` serves a whole Node as a real cluster holds it (managedFields, other
controllers' labels, taints, annotations and conditions; tests/fixtures/kubernetes/), and
`unschedulable_taint=True` plays the node lifecycle controller: right after a write that cordons
or uncordons a node it adds or removes `node.kubernetes.io/unschedulable:NoSchedule` (its own
write, with its own resourceVersion, which the writer's response does not show yet).

Strategic merge patch is implemented for what Node patches use: maps merge recursively, null
deletes, lists with a merge key (status.conditions/addresses by `type`, metadata.ownerReferences
by `uid`) merge item by item, `$patch: replace|delete|merge`, `$setElementOrder/<list>`,
`$retainKeys` and `$deleteFromPrimitiveList/<list>`; spec.taints is atomic (replaced whole, as
in the real NodeSpec) and so are other lists. That covers kubectl cordon/uncordon/taint/label/
annotate/drain and the Python client's patches (checked with `kubectl -v=8`).

Opt-in, as a real cluster has them (existing callers get plain HTTP and one all-powerful token):

- `tls=True`: HTTPS with a CA and a serving certificate for 127.0.0.1 made at start with the
  `openssl` CLI in the workdir (`api.ca_cert`), so the Python client's in-cluster config (https +
  a CA file) and kubectl (certificate-authority-data in the kubeconfig) verify the server.
- `rbac=Rbac(objects)` (tests/harness/kuberbac.py) with `users={token: "system:serviceaccount:ns:name"}`:
  each request is authenticated (the kubeconfig's own token is `kubernetes-admin` in
  `system:masters`, as kubeadm's admin.conf is; no token is `system:anonymous`), mapped to verb,
  API group, resource/subresource and namespace, and refused with the apiserver's 403 Status
  unless a bound role allows it. Every refusal is kept in `api.denied`.
"""

from __future__ import annotations

import base64
import copy
import json
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.harness.kuberbac import ANONYMOUS, MASTERS, Attributes, Rbac, User, forbidden, request_attributes

Json = dict[str, Any]

K8S_VERSION = {"major": "1", "minor": "29", "gitVersion": "v1.29.0", "gitCommit": "podhealth-stand-in",
               "gitTreeState": "clean", "buildDate": "2024-01-01T00:00:00Z", "goVersion": "go1.21.5",
               "compiler": "gc", "platform": "linux/amd64"}

# (path inside the object) -> merge key, from the Kubernetes types' patchMergeKey tags.
# spec.taints is NOT here: NodeSpec.Taints has no patch strategy, so a strategic merge patch
# replaces the whole list. That is why `kubectl taint` (checked with -v=8) always sends the
# complete new list, and why removing a taint that way works at all.
_MERGE_KEYS: dict[tuple[str, ...], str] = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
}
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"  # the node lifecycle controller's, for a cordon
# Lists of scalars with patchStrategy=merge (set union).
_PRIMITIVE_MERGE: frozenset[tuple[str, ...]] = frozenset({("metadata", "finalizers"), ("spec", "podCIDRs")})


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: Json | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> Json:
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": self.message, "reason": self.reason, "details": self.details, "code": self.code}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def new_node(name: str, labels: dict[str, str] | None = None, unschedulable: bool = False) -> Json:
    """A Node as a kubelet would register it, with every status.nodeInfo field the client requires."""
    node: Json = {
        "kind": "Node", "apiVersion": "v1",
        "metadata": {"name": name, "uid": str(uuid.uuid4()), "resourceVersion": "0",
                     "creationTimestamp": _now(),
                     "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                                "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                                "beta.kubernetes.io/arch": "amd64", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                **(labels or {})},
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
        "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": ["10.244.1.0/24"]},
        "status": {
            "capacity": {"cpu": "224", "memory": "2113407156Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "allocatable": {"cpu": "224", "memory": "2113304756Ki", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [
                {"type": t, "status": "False", "reason": r, "message": m, "lastHeartbeatTime": _now(),
                 "lastTransitionTime": _now()}
                for t, r, m in (("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory"),
                                ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                                ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID"))
            ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status",
                  "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": uuid.uuid4().hex, "systemUUID": str(uuid.uuid4()), "bootID": str(uuid.uuid4()),
                         "kernelVersion": "5.15.0-1053-nvidia", "osImage": "Ubuntu 22.04.4 LTS",
                         "containerRuntimeVersion": "containerd://1.7.12", "kubeletVersion": "v1.29.0",
                         "kubeProxyVersion": "v1.29.0", "operatingSystem": "linux", "architecture": "amd64"},
        },
    }
    if unschedulable:
        node["spec"]["unschedulable"] = True
    return node


# ---- patches (pure) ---------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


def strategic_merge_patch(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Kubernetes strategic merge patch, for the Node fields listed in _MERGE_KEYS (see module doc)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    patch = dict(patch)
    directive = patch.pop("$patch", None)
    if directive == "replace":
        return strategic_merge_patch({}, patch, path)
    if directive == "delete":
        return None
    if directive not in (None, "merge"):
        raise ApiError(400, "BadRequest", f"unknown $patch directive {directive!r} at {'.'.join(path) or '<root>'}")
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    retain = patch.pop("$retainKeys", None)
    orders: dict[str, list[Any]] = {}
    for k in [k for k in patch if k.startswith("$setElementOrder/")]:
        orders[k.split("/", 1)[1]] = patch.pop(k)
    for k in [k for k in patch if k.startswith("$deleteFromPrimitiveList/")]:
        field_name = k.split("/", 1)[1]
        drop = patch.pop(k) or []
        if isinstance(out.get(field_name), list):
            out[field_name] = [x for x in out[field_name] if x not in drop]
    for k, v in patch.items():
        if k.startswith("$"):
            raise ApiError(400, "BadRequest", f"unsupported strategic merge directive {k!r}")
        sub = path + (k,)
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and sub in _MERGE_KEYS:
            out[k] = _merge_keyed_list(out.get(k) or [], v, _MERGE_KEYS[sub], sub)
        elif isinstance(v, list) and sub in _PRIMITIVE_MERGE:
            cur = list(out.get(k) or [])
            out[k] = cur + [x for x in v if x not in cur]
        elif isinstance(v, dict):
            merged = strategic_merge_patch(out.get(k), v, sub)
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
        else:
            out[k] = copy.deepcopy(v)
    for k, order in orders.items():
        if isinstance(out.get(k), list):
            out[k] = _apply_order(out[k], order, _MERGE_KEYS.get(path + (k,)))
    if retain is not None:
        out = {k: v for k, v in out.items() if k in set(retain)}
    return out


def _merge_keyed_list(current: list[Any], patch: list[Any], key: str, path: tuple[str, ...]) -> list[Any]:
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy({k: v for k, v in i.items() if k != "$patch"})
                for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    out = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise ApiError(400, "BadRequest", f"{'.'.join(path)}: every item needs the merge key {key!r}")
        idx = next((i for i, cur in enumerate(out) if isinstance(cur, dict) and cur.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if idx is not None:
                out.pop(idx)
        elif idx is None:
            out.append(copy.deepcopy(item))
        else:
            out[idx] = strategic_merge_patch(out[idx], item, path)
    return out


def _apply_order(items: list[Any], order: list[Any], key: str | None) -> list[Any]:
    def ident(x: Any) -> Any:
        return x.get(key) if key and isinstance(x, dict) else json.dumps(x, sort_keys=True)
    rank = {ident(o): i for i, o in enumerate(order)}
    return sorted(items, key=lambda x: rank.get(ident(x), len(rank)))


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test)."""
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "a JSON patch must be a list of operations")
    doc = copy.deepcopy(target)
    for n, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ApiError(400, "BadRequest", f"JSON patch operation {n} needs op and path")
        kind = op["op"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise ApiError(400, "BadRequest", f"JSON patch operation {n} ({kind}) needs a value")
        if kind == "add":
            doc = _ptr_set(doc, op["path"], copy.deepcopy(op["value"]), insert=True)
        elif kind == "remove":
            doc, _ = _ptr_remove(doc, op["path"])
        elif kind == "replace":
            _ptr_get(doc, op["path"])
            doc = _ptr_set(doc, op["path"], copy.deepcopy(op["value"]), insert=False)
        elif kind == "move":
            doc, val = _ptr_remove(doc, op["from"])
            doc = _ptr_set(doc, op["path"], val, insert=True)
        elif kind == "copy":
            doc = _ptr_set(doc, op["path"], copy.deepcopy(_ptr_get(doc, op["from"])), insert=True)
        elif kind == "test":
            if _ptr_get(doc, op["path"]) != op["value"]:
                raise ApiError(422, "Invalid", f"JSON patch test failed at {op['path']}")
        else:
            raise ApiError(400, "BadRequest", f"unknown JSON patch op {kind!r}")
    return doc


def _ptr_parts(ptr: str) -> list[str]:
    if ptr == "":
        return []
    if not ptr.startswith("/"):
        raise ApiError(400, "BadRequest", f"JSON pointer {ptr!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in ptr[1:].split("/")]


def _index(container: list[Any], part: str, ptr: str, allow_end: bool) -> int:
    if part == "-" and allow_end:
        return len(container)
    if not part.isdigit():
        raise ApiError(422, "Invalid", f"JSON pointer {ptr!r}: {part!r} is not a list index")
    i = int(part)
    if i > len(container) or (i == len(container) and not allow_end):
        raise ApiError(422, "Invalid", f"JSON pointer {ptr!r}: index {i} out of range")
    return i


def _ptr_get(doc: Any, ptr: str) -> Any:
    cur = doc
    for part in _ptr_parts(ptr):
        if isinstance(cur, dict):
            if part not in cur:
                raise ApiError(422, "Invalid", f"JSON pointer {ptr!r}: no {part!r}")
            cur = cur[part]
        elif isinstance(cur, list):
            cur = cur[_index(cur, part, ptr, False)]
        else:
            raise ApiError(422, "Invalid", f"JSON pointer {ptr!r} goes through a scalar")
    return cur


def _parent(doc: Any, ptr: str) -> tuple[Any, str]:
    parts = _ptr_parts(ptr)
    if not parts:
        raise ApiError(422, "Invalid", "cannot change the whole document with a JSON pointer ''")
    parent = _ptr_get(doc, "/" + "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts[:-1])) \
        if len(parts) > 1 else doc
    return parent, parts[-1]


def _ptr_set(doc: Any, ptr: str, value: Any, insert: bool) -> Any:
    if ptr == "":
        return value
    parent, last = _parent(doc, ptr)
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        i = _index(parent, last, ptr, insert)
        if insert:
            parent.insert(i, value)
        else:
            parent[i] = value
    else:
        raise ApiError(422, "Invalid", f"JSON pointer {ptr!r} goes through a scalar")
    return doc


def _ptr_remove(doc: Any, ptr: str) -> tuple[Any, Any]:
    parent, last = _parent(doc, ptr)
    if isinstance(parent, dict):
        if last not in parent:
            raise ApiError(422, "Invalid", f"JSON pointer {ptr!r}: nothing to remove")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(parent, last, ptr, False))
    raise ApiError(422, "Invalid", f"JSON pointer {ptr!r} goes through a scalar")


# ---- the server -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """One request as the stand-in saw it (for tests that check what a client sent)."""

    method: str
    path: str
    query: str
    content_type: str
    accept: str
    body: bytes
    token: bool = False  # an Authorization header came with it (checked against the server's token)


_CORE_RESOURCES = [
    {"name": "nodes", "singularName": "node", "namespaced": False, "kind": "Node", "shortNames": ["no"],
     "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]},
    {"name": "nodes/status", "singularName": "", "namespaced": False, "kind": "Node",
     "verbs": ["get", "patch", "update"]},
    {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "shortNames": ["po"],
     "categories": ["all"], "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update",
                                      "watch"]},
    {"name": "pods/eviction", "singularName": "", "namespaced": True, "group": "policy", "version": "v1",
     "kind": "Eviction", "verbs": ["create"]},
    {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event", "shortNames": ["ev"],
     "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]},
    {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
     "shortNames": ["ns"], "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]},
]
_EVENTS_RESOURCES = [
    {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event", "shortNames": ["ev"],
     "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]},
]


class KubeAPI:
    """The stand-in server. Start with `start()` or `with KubeAPI(...) as api:`."""

    def __init__(self, nodes: Iterable[str] = ("node-a",), token: str = "podhealth-test-token",
                 workdir: Path | str | None = None, require_token: bool = False, tls: bool = False,
                 rbac: Rbac | None = None, users: Mapping[str, str] | None = None,
                 unschedulable_taint: bool = False) -> None:
        self.token = token
        self.unschedulable_taint = unschedulable_taint
        self.require_token = require_token
        self._lock = threading.RLock()
        self.tls = tls
        self.rbac = rbac
        # bearer token -> user; the kubeconfig's token is the cluster admin (system:masters).
        self._users: dict[str, User] = {token: User("kubernetes-admin", (MASTERS, "system:authenticated"))}
        for t, name in (users or {}).items():
            self.add_token(t, name)
        self.denied: list[tuple[User, Attributes]] = []
        self.ca_cert = Path()
        self._rv = 0
        self._nodes: dict[str, Json] = {}
        self._events: list[Json] = []
        # Pods (only what podhealth reads: bound node, GPU requests, phase) and the disruptions
        # each PodDisruptionBudget still allows (namespace, matchLabels) -> count; the Eviction API
        # answers 429 for a pod a budget at 0 covers, as the real apiserver does.
        self._pods: dict[tuple[str, str], Json] = {}
        self._budgets: list[tuple[str, dict[str, str], list[int]]] = []
        self._injections: dict[str, list[Callable[[Json], None]]] = {}
        self._before_write: dict[str, list[Callable[[], None]]] = {}
        self.requests: list[Request] = []
        self.conflicts_sent = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._own_dir = workdir is None
        self._workdir = Path(workdir) if workdir is not None else None
        self.kubeconfig = Path()
        for n in nodes:
            self.add_node(n)

    # ---- lifecycle ------------------------------------------------------------------------------

    def start(self) -> "KubeAPI":
        api = self

        class Handler(_Handler):
            server_api = api

        if self._workdir is None:
            self._workdir = Path(tempfile.mkdtemp(prefix="phkube-"))
        self._workdir.mkdir(parents=True, exist_ok=True)
        if self.tls:
            self.ca_cert, cert, key = make_tls_files(self._workdir)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
            self._server = _TLSServer(("127.0.0.1", 0), Handler, ctx)
        else:
            self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubeapi", daemon=True)
        self._thread.start()
        self.kubeconfig = self.write_kubeconfig(self._workdir / "kubeconfig")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)
        self._server = self._thread = None
        if self._own_dir and self._workdir is not None:
            for p in self._workdir.iterdir():
                p.unlink()
            self._workdir.rmdir()
            self._workdir = None

    def __enter__(self) -> "KubeAPI":
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def write_kubeconfig(self, path: Path | str) -> Path:
        """A kubeconfig (JSON is valid YAML) that kubectl and the Python client both accept."""
        path = Path(path)
        cluster: Json = {"server": self.url}
        if self.tls:
            cluster["certificate-authority-data"] = base64.b64encode(self.ca_cert.read_bytes()).decode()
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "podhealth-test",
               "clusters": [{"name": "stand-in", "cluster": cluster}],
               "users": [{"name": "podhealth", "user": {"token": self.token}}],
               "contexts": [{"name": "podhealth-test", "context": {"cluster": "stand-in", "user": "podhealth"}}],
               "preferences": {}}
        path.write_text(json.dumps(cfg, indent=1))
        path.chmod(0o600)
        return path

    # ---- test helpers ---------------------------------------------------------------------------

    def add_token(self, token: str, user: str, groups: Iterable[str] = ()) -> None:
        """Accept `token` as `user` (a service account's groups come with `system:serviceaccount:*`)."""
        with self._lock:
            self._users[token] = User.of(user, groups)

    def remove_token(self, token: str) -> None:
        """Stop accepting `token` (a rotated-out service account token expires)."""
        with self._lock:
            self._users.pop(token, None)

    def authenticate(self, header: str | None) -> User | None:
        """The user an Authorization header names; ANONYMOUS without one; None = 401."""
        if header is None:
            return ANONYMOUS
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer":  # the scheme is case-insensitive (RFC 7235); the client sends "bearer"
            return None
        with self._lock:
            return self._users.get(token.strip())

    def add_node(self, name: str, labels: dict[str, str] | None = None, unschedulable: bool = False) -> None:
        with self._lock:
            node = new_node(name, labels, unschedulable)
            node["metadata"]["resourceVersion"] = self._next_rv()
            self._nodes[name] = node

    def add_node_object(self, obj: Json) -> str:
        """Serve `obj` (a Node as `kubectl get node -o json` shows it) as is, with a fresh
        resourceVersion (and a uid when it has none); returns its name."""
        with self._lock:
            node = copy.deepcopy(obj)
            meta = node.setdefault("metadata", {})
            meta.setdefault("uid", str(uuid.uuid4()))
            meta["resourceVersion"] = self._next_rv()
            node["kind"], node["apiVersion"] = "Node", "v1"
            self._nodes[meta["name"]] = node
            return str(meta["name"])

    def delete_node(self, name: str) -> None:
        """Delete a node as another client would (`kubectl delete node`)."""
        with self._lock:
            if self._nodes.pop(name, None) is not None:
                self._next_rv()

    def inject_delete(self, name: str) -> None:
        """The node is deleted just before the next write to it is applied (that write gets 404)."""
        with self._lock:
            self._before_write.setdefault(name, []).append(lambda: self.delete_node(name))

    def inject_replace(self, name: str, obj: Json | None = None) -> None:
        """Just before the next write, the node is deleted and registered again under the same name
        (a new uid and resourceVersion): `obj`, or a fresh Node."""
        def replace() -> None:
            self.delete_node(name)
            if obj is None:
                self.add_node(name)
            else:
                self.add_node_object({**obj, "metadata": {**obj["metadata"], "name": name, "uid": str(uuid.uuid4())}})
        with self._lock:
            self._before_write.setdefault(name, []).append(replace)

    def node(self, name: str) -> Json:
        with self._lock:
            return copy.deepcopy(self._nodes[name])

    def update_node(self, name: str, mutate: Callable[[Json], None]) -> Json:
        """Change a node as another client would (bumps its resourceVersion)."""
        with self._lock:
            node = self._nodes[name]
            mutate(node)
            node["metadata"]["resourceVersion"] = self._next_rv()
            return copy.deepcopy(node)

    def inject_concurrent_update(self, name: str, mutate: Callable[[Json], None], times: int = 1) -> None:
        """Before each of the next `times` writes to `name`, another client's write lands first."""
        with self._lock:
            self._injections.setdefault(name, []).extend([mutate] * times)

    def add_pod(self, namespace: str, name: str, node: str, gpus: int = 1,
                labels: dict[str, str] | None = None) -> None:
        with self._lock:
            res = {"limits": {"nvidia.com/gpu": str(gpus)}} if gpus else {}
            self._pods[(namespace, name)] = {
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()),
                             "resourceVersion": self._next_rv(), "labels": dict(labels or {}),
                             "creationTimestamp": _now()},
                "spec": {"nodeName": node, "containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch",
                                                           "resources": res}]},
                "status": {"phase": "Running"}}

    def pods(self) -> list[tuple[str, str]]:
        with self._lock:
            return sorted(self._pods)

    def add_budget(self, namespace: str, match_labels: dict[str, str], allowed: int = 0) -> list[int]:
        """A PodDisruptionBudget: `allowed` evictions of the pods it selects (a one-element list the
        test may raise later, as a budget's disruptionsAllowed rises when pods become ready)."""
        left = [allowed]
        with self._lock:
            self._budgets.append((namespace, dict(match_labels), left))
        return left

    def _evict(self, namespace: str, name: str) -> Json:
        with self._lock:
            pod = self._pods.get((namespace, name))
            if pod is None:
                raise ApiError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            labels = pod["metadata"].get("labels", {})
            covering = [b for b in self._budgets
                        if b[0] == namespace and all(labels.get(k) == v for k, v in b[1].items())]
            if any(b[2][0] <= 0 for b in covering):
                raise ApiError(429, "TooManyRequests",
                               "Cannot evict pod as it would violate the pod's disruption budget.",
                               {"causes": [{"reason": "DisruptionBudget",
                                            "message": "The disruption budget needs 1 healthy pods and has 1 "
                                                       "currently"}]})
            for b in covering:
                b[2][0] -= 1
            del self._pods[(namespace, name)]
            self._next_rv()
        return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def events(self) -> list[Json]:
        with self._lock:
            return copy.deepcopy(self._events)

    def writes(self, node: str) -> list[Request]:
        """PATCH/PUT requests that targeted `node`."""
        return [r for r in list(self.requests)
                if r.method in ("PATCH", "PUT") and r.path == f"/api/v1/nodes/{node}"]

    # ---- request handling (called from the handler threads) -------------------------------------

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def handle(self, method: str, path: str, query: dict[str, list[str]], ctype: str, accept: str,
               body: bytes) -> tuple[int, Json]:
        parts = [p for p in path.split("/") if p]
        if method == "GET":
            return self._get(parts, query, accept)
        if method == "DELETE" and len(parts) == 4 and parts[:3] == ["api", "v1", "nodes"]:
            return 200, self._delete_node(parts[3])
        if method in ("PATCH", "PUT") and len(parts) in (4, 5) and parts[:3] == ["api", "v1", "nodes"]:
            if len(parts) == 5 and parts[4] != "status":
                raise ApiError(404, "NotFound", f"the server could not find the requested resource ({path})")
            return 200, self._write_node(method, parts[3], ctype, body, query, status=len(parts) == 5)
        if method == "POST" and _is_events_path(parts):
            return 201, self._create_event(parts, body)
        if method == "POST" and len(parts) == 7 and parts[2] == "namespaces" and parts[4] == "pods" \
                and parts[6] == "eviction":
            return 201, self._evict(parts[3], parts[5])
        raise ApiError(405 if _known_path(parts) else 404, "MethodNotAllowed" if _known_path(parts) else "NotFound",
                       f"{method} {path} is not served by the stand-in")

    def _get(self, parts: list[str], query: dict[str, list[str]], accept: str) -> tuple[int, Json]:
        if parts == ["version"]:
            return 200, dict(K8S_VERSION)
        if parts == ["api"]:
            return 200, {"kind": "APIVersions", "versions": ["v1"],
                         "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0",
                                                         "serverAddress": f"127.0.0.1:{self.port}"}]}
        if parts == ["apis"]:
            grp = {"name": "events.k8s.io", "versions": [{"groupVersion": "events.k8s.io/v1", "version": "v1"}],
                   "preferredVersion": {"groupVersion": "events.k8s.io/v1", "version": "v1"}}
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [grp]}
        if parts == ["api", "v1"]:
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1",
                         "resources": _CORE_RESOURCES}
        if parts == ["apis", "events.k8s.io", "v1"]:
            return 200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "events.k8s.io/v1",
                         "resources": _EVENTS_RESOURCES}
        if parts == ["api", "v1", "nodes"]:
            with self._lock:
                items = [copy.deepcopy(n) for _, n in sorted(self._nodes.items())]
                rv = str(self._rv)
            sel = query.get("labelSelector", [""])[0]
            items = [n for n in items if _labels_match(n["metadata"].get("labels", {}), sel)]
            fsel = query.get("fieldSelector", [""])[0]
            if fsel.startswith("metadata.name="):
                items = [n for n in items if n["metadata"]["name"] == fsel.split("=", 1)[1]]
            if "as=Table" in accept:
                return 200, _node_table(items, rv)
            return 200, {"kind": "NodeList", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}
        if len(parts) in (4, 5) and parts[:3] == ["api", "v1", "nodes"] and (len(parts) == 4 or parts[4] == "status"):
            with self._lock:
                node = copy.deepcopy(self._nodes.get(parts[3]))
            if node is None:
                raise ApiError(404, "NotFound", f'nodes "{parts[3]}" not found',
                               {"name": parts[3], "kind": "nodes"})
            if "as=Table" in accept:
                return 200, _node_table([node], node["metadata"]["resourceVersion"])
            return 200, node
        if parts in (["api", "v1", "pods"],) or (len(parts) == 5 and parts[2] == "namespaces" and parts[4] == "pods"):
            fsel = query.get("fieldSelector", [""])[0]
            on = fsel.split("=", 1)[1] if fsel.startswith("spec.nodeName=") else None
            with self._lock:
                items = [copy.deepcopy(p) for (ns, _), p in sorted(self._pods.items())
                         if (len(parts) == 3 or ns == parts[3]) and (on is None or p["spec"]["nodeName"] == on)]
            return 200, {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": str(self._rv)},
                         "items": items}
        if _is_events_path(parts) or parts in (["api", "v1", "events"], ["apis", "events.k8s.io", "v1", "events"]):
            # one namespace's events, or (`kubectl get events -A`) every namespace's
            api_version = "v1" if parts[0] == "api" else "events.k8s.io/v1"
            with self._lock:
                items = [copy.deepcopy(e) for e in self._events if e["apiVersion"] == api_version
                         and (len(parts) < 5 or e["metadata"]["namespace"] == parts[-2])]
            return 200, {"kind": "EventList", "apiVersion": api_version, "metadata": {"resourceVersion": str(self._rv)},
                         "items": items}
        raise ApiError(404, "NotFound", f"the server could not find the requested resource (/{'/'.join(parts)})")

    def _write_node(self, method: str, name: str, ctype: str, body: bytes, query: dict[str, list[str]],
                    status: bool = False) -> Json:
        try:
            doc = json.loads(body or b"null")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"body is not JSON: {e}") from None
        ctype = ctype.split(";")[0].strip().lower()
        with self._lock:
            actions = self._before_write.get(name)
            if actions:
                action = actions.pop(0)
                if not actions:
                    del self._before_write[name]
                action()
            queue = self._injections.get(name)
            if queue:
                mutate = queue.pop(0)
                if not queue:
                    del self._injections[name]
                self.update_node(name, mutate)
            current = self._nodes.get(name)
            if current is None:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            if method == "PUT":
                if ctype not in ("application/json", ""):
                    raise ApiError(415, "UnsupportedMediaType", f"PUT does not take {ctype}")
                new = doc
                if not isinstance(new, dict):
                    raise ApiError(400, "BadRequest", "PUT body must be a Node object")
            elif ctype == "application/merge-patch+json":
                new = merge_patch(current, doc)
            elif ctype == "application/strategic-merge-patch+json":
                new = strategic_merge_patch(current, doc)
            elif ctype == "application/json-patch+json":
                new = json_patch(current, doc)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                               f"accepted media types include: application/json-patch+json, "
                               f"application/merge-patch+json, application/strategic-merge-patch+json ({ctype})")
            if not isinstance(new, dict) or not isinstance(new.get("metadata"), dict):
                raise ApiError(422, "Invalid", "the result is not a Node object")
            if new["metadata"].get("name", name) != name:
                raise ApiError(422, "Invalid", f'Node "{name}" is invalid: metadata.name: field is immutable')
            want_rv = new["metadata"].get("resourceVersion")
            if method == "PUT" or (isinstance(doc, dict) and "resourceVersion" in (doc.get("metadata") or {})) \
                    or ctype == "application/json-patch+json":
                if want_rv and want_rv != current["metadata"]["resourceVersion"]:
                    self.conflicts_sent += 1
                    raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on nodes "{name}": the object '
                                   "has been modified; please apply your changes to the latest version and try again",
                                   {"name": name, "kind": "nodes"})
            if "All" in query.get("dryRun", []):
                return copy.deepcopy(new)
            # As the apiserver's node strategies do: a write to the Node ignores status, and a write
            # to nodes/status changes only status.
            if status:
                new = {**copy.deepcopy(current), "status": new.get("status", current.get("status"))}
            else:
                new["status"] = copy.deepcopy(current.get("status"))
            for k in ("uid", "creationTimestamp"):
                new["metadata"][k] = current["metadata"][k]
            new["metadata"]["name"] = name
            new["kind"], new["apiVersion"] = "Node", "v1"
            if new.get("spec", {}).get("unschedulable") is False:
                # The apiserver drops false: it is the omitempty zero value of a bool.
                del new["spec"]["unschedulable"]
            new["metadata"]["resourceVersion"] = self._next_rv()
            self._nodes[name] = new
            answer = copy.deepcopy(new)
            if self.unschedulable_taint and not status:
                self._sync_unschedulable_taint(new)
            return answer

    def _sync_unschedulable_taint(self, node: Json) -> None:
        """The node lifecycle controller's write after a cordon/uncordon (TaintNodesByCondition)."""
        spec = node.setdefault("spec", {})
        current = list(spec.get("taints") or ())
        present = any(t.get("key") == UNSCHEDULABLE_TAINT for t in current)
        cordoned = spec.get("unschedulable") is True
        if cordoned == present:
            return  # in step: the controller leaves the list (and its order) alone
        if cordoned:
            taints = current + [{"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule", "timeAdded": _now()}]
        else:
            taints = [t for t in current if t.get("key") != UNSCHEDULABLE_TAINT]
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        node["metadata"]["resourceVersion"] = self._next_rv()

    def _delete_node(self, name: str) -> Json:
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                raise ApiError(404, "NotFound", f'nodes "{name}" not found', {"name": name, "kind": "nodes"})
            self.delete_node(name)
            return copy.deepcopy(node)

    def _create_event(self, parts: list[str], body: bytes) -> Json:
        try:
            ev = json.loads(body)
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"body is not JSON: {e}") from None
        if not isinstance(ev, dict):
            raise ApiError(400, "BadRequest", "an Event must be an object")
        ns = parts[3]
        core = parts[0] == "api"
        meta = ev.setdefault("metadata", {})
        if not meta.get("name"):
            if not meta.get("generateName"):
                raise ApiError(422, "Invalid", "Event is invalid: metadata.name: Required value")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta.get("namespace", ns) != ns:
            raise ApiError(400, "BadRequest", "the namespace of the object does not match the namespace on the request")
        meta["namespace"] = ns
        if core and not (ev.get("involvedObject") or {}).get("name"):
            raise ApiError(422, "Invalid", "Event is invalid: involvedObject.name: Required value")
        if not core and not (ev.get("regarding") or {}).get("name"):
            raise ApiError(422, "Invalid", "Event is invalid: regarding.name: Required value")
        if not core and not ev.get("reportingController"):
            raise ApiError(422, "Invalid", "Event is invalid: reportingController: Required value")
        with self._lock:
            meta.update(uid=str(uuid.uuid4()), resourceVersion=self._next_rv(), creationTimestamp=_now())
            ev["kind"], ev["apiVersion"] = "Event", "v1" if core else "events.k8s.io/v1"
            self._events.append(ev)
            return copy.deepcopy(ev)


def _is_events_path(parts: list[str]) -> bool:
    core = len(parts) == 5 and parts[:3] == ["api", "v1", "namespaces"] and parts[4] == "events"
    grp = len(parts) == 6 and parts[:4] == ["apis", "events.k8s.io", "v1", "namespaces"] and parts[5] == "events"
    return core or grp


def _known_path(parts: list[str]) -> bool:
    return parts[:3] == ["api", "v1", "nodes"] or _is_events_path(parts) or parts in (["version"], ["api"], ["apis"])


def _labels_match(labels: dict[str, str], selector: str) -> bool:
    """Equality-based label selectors (`a=b,c!=d,e`), which is all kubectl -l sends for our tests."""
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _node_table(nodes: Sequence[Json], rv: str) -> Json:
    """meta.k8s.io/v1 Table, as `kubectl get nodes` asks for (server-side printing)."""
    cols = [{"name": "Name", "type": "string", "format": "name", "description": "Name", "priority": 0},
            {"name": "Status", "type": "string", "format": "", "description": "Node status", "priority": 0},
            {"name": "Roles", "type": "string", "format": "", "description": "Roles", "priority": 0},
            {"name": "Age", "type": "string", "format": "", "description": "Age", "priority": 0},
            {"name": "Version", "type": "string", "format": "", "description": "Kubelet version", "priority": 0}]
    rows = []
    for n in nodes:
        ready = next((c["status"] for c in n["status"]["conditions"] if c["type"] == "Ready"), "Unknown")
        status = "Ready" if ready == "True" else "NotReady"
        if n.get("spec", {}).get("unschedulable"):
            status += ",SchedulingDisabled"
        version = n["status"]["nodeInfo"]["kubeletVersion"]
        rows.append({"cells": [n["metadata"]["name"], status, "<none>", "1d", version],
                     "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                "metadata": n["metadata"]}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": rv},
            "columnDefinitions": cols, "rows": rows}


class _Handler(BaseHTTPRequestHandler):
    server_api: KubeAPI
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        return

    def _serve(self) -> None:
        api = self.server_api
        u = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        if length > 4 * 1024 * 1024:
            self._reply(413, ApiError(413, "RequestEntityTooLarge", "request body too large").status())
            return
        body = self.rfile.read(length) if length else b""
        ctype = self.headers.get("Content-Type", "")
        accept = self.headers.get("Accept", "")
        api.requests.append(Request(self.command, u.path, u.query, ctype, accept, body,
                                    self.headers.get("Authorization") is not None))
        auth = self.headers.get("Authorization")
        # kubectl (client-go) never sends a bearer token over plain http, so a request without
        # one is served as anonymous (like --anonymous-auth with a permissive RBAC); a wrong
        # token is still refused, so the Python client's token is really checked.
        user = api.authenticate(auth)
        if user is None or (auth is None and api.require_token):
            self._reply(401, ApiError(401, "Unauthorized", "Unauthorized").status())
            return
        if api.rbac is not None:
            attrs = request_attributes(self.command, u.path, parse_qs(u.query))
            if not api.rbac.allows(user, attrs):
                api.denied.append((user, attrs))
                self._reply(403, forbidden(user, attrs))
                return
        try:
            code, payload = api.handle(self.command, u.path, parse_qs(u.query), ctype, accept, body)
        except ApiError as e:
            code, payload = e.code, e.status()
        except Exception as e:  # noqa: BLE001 - a stand-in bug must answer 500, not hang the client
            code, payload = 500, ApiError(500, "InternalError", f"{type(e).__name__}: {e}").status()
        self._reply(code, payload)

    def _reply(self, code: int, payload: Json) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve


class _TLSServer(ThreadingHTTPServer):
    """HTTPS: the handshake runs in the request's own thread (finish_request), with a timeout, so
    a client that connects and says nothing cannot stall the accept loop."""

    def __init__(self, addr: tuple[str, int], handler: type[BaseHTTPRequestHandler], ctx: ssl.SSLContext) -> None:
        self.ssl_context = ctx
        super().__init__(addr, handler)

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10.0)
        try:
            tls = self.ssl_context.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):
            return  # a client that rejected our certificate or went away; nothing to serve
        super().finish_request(tls, client_address)

    def handle_error(self, request: Any, client_address: Any) -> None:
        return  # a client hanging up mid-response is not a test failure; the client sees its error


def make_tls_files(workdir: Path, timeout: float = 30.0) -> tuple[Path, Path, Path]:
    """(ca.crt, serving cert, key): a throw-away CA and a certificate it signs for 127.0.0.1 and
    localhost, made with the openssl CLI (a cluster's serving cert is CA-signed too; Go's verifier
    and Python's ssl both check the IP SAN)."""
    def openssl(*args: str) -> None:
        r = subprocess.run(["openssl", *args], capture_output=True, text=True, timeout=timeout,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"openssl {args[0]} failed: {r.stderr[-1000:]}")

    ca, ca_key = workdir / "ca.crt", workdir / "ca.key"
    cert, key, csr, ext = workdir / "apiserver.crt", workdir / "apiserver.key", workdir / "apiserver.csr", \
        workdir / "apiserver.ext"
    curve = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *curve, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
            "-subj", "/CN=podhealth-stand-in-ca")
    openssl("req", "-new", *curve, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=kube-apiserver")
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
                   "keyUsage=critical,digitalSignature,keyEncipherment\nbasicConstraints=critical,CA:FALSE\n")
    openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
            "-out", str(cert), "-days", "2", "-extfile", str(ext))
    for p in (csr, ext, workdir / "ca.srl"):
        p.unlink(missing_ok=True)
    return ca, cert, key


class Kubectl:
    """The real kubectl against a KubeAPI: its kubeconfig, a cache directory of its own (never
    ~/.kube/cache), no stdin, a timeout. `kubectl(*args)` is the stdout of a run that must
    succeed; `kubectl.run(*args, ok=False)` the whole result of one that may not."""

    def __init__(self, binary: str, kubeconfig: Path, cache: Path) -> None:
        self.argv = [binary, "--kubeconfig", str(kubeconfig), "--cache-dir", str(cache)]

    def run(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        r = subprocess.run([*self.argv, *args], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        if ok:
            assert r.returncode == 0, f"kubectl {' '.join(args)} -> {r.returncode}: {r.stderr[-2000:]}"
        return r

    def __call__(self, *args: str) -> str:
        return self.run(*args).stdout


def kubectl_for(api: KubeAPI, cache: Path) -> Kubectl:
    """kubectl for `api`; skips the test when kubectl is not installed."""
    import shutil

    import pytest

    binary = shutil.which("kubectl")
    if binary is None:
        pytest.skip("kubectl is not installed (bash scripts/setup.sh --test installs it)")
    return Kubectl(binary, api.kubeconfig, cache)
