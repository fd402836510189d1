"""RBAC for the stand-in API server: request attributes and the RBAC authorizer, as kube-apiserver has them.

Pure (no I/O): `request_attributes()` turns a method + path + query into what the apiserver's
RequestInfoFactory makes of it (verb, API group, resource, subresource, namespace, name), and
`Rbac.allows()` answers as the RBAC authorizer does from ClusterRoles, Roles and their bindings
(plain dicts, e.g. `kubectl kustomize deploy/kubernetes/base` output). `forbidden()` builds the
403 Status the apiserver sends, word for word, so a client's error handling meets the real text.

Users: `system:masters` is the superuser group (the apiserver lets it through before RBAC is
asked); every authenticated user is in `system:authenticated`, which the default
`system:discovery` and `system:public-info-viewer` ClusterRoles let read discovery and /version.
Aggregated ClusterRoles (aggregationRule) are not expanded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Json = dict[str, Any]

SA_PREFIX = "system:serviceaccount:"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"

# The verbs a method maps to (k8s.io/apiserver/pkg/endpoints/request/requestinfo.go).
_VERB = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete", "GET": "get", "HEAD": "get"}

# What the default bootstrap ClusterRoles give without any binding in the bundle:
# system:discovery (authenticated) and system:public-info-viewer (everyone).
_DISCOVERY_URLS = ("/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version", "/version/",
                   "/healthz", "/livez", "/readyz")
_PUBLIC_URLS = ("/version", "/version/", "/healthz", "/livez", "/readyz")


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()

    @classmethod
    def service_account(cls, namespace: str, name: str) -> "User":
        return cls(f"{SA_PREFIX}{namespace}:{name}",
                   ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", AUTHENTICATED))

    @classmethod
    def of(cls, name: str, groups: Iterable[str] = ()) -> "User":
        """A user by name; `system:serviceaccount:<ns>:<name>` gets a service account's groups."""
        if name.startswith(SA_PREFIX) and name.count(":") == 3:
            ns, sa = name[len(SA_PREFIX):].split(":")
            base = cls.service_account(ns, sa)
            return cls(base.name, tuple(dict.fromkeys(base.groups + tuple(groups))))
        return cls(name, tuple(dict.fromkeys((*groups, AUTHENTICATED))))


ANONYMOUS = User("system:anonymous", ("system:unauthenticated",))


@dataclass(frozen=True)
class Attributes:
    """One request as the authorizer sees it."""

    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    api_version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def combined_resource(self) -> str:
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


def request_attributes(method: str, path: str, query: Mapping[str, list[str]] | None = None) -> Attributes:
    """What kube-apiserver's RequestInfoFactory makes of a request (for the paths a client sends)."""
    query = query or {}
    parts = [p for p in path.split("/") if p]
    verb = _VERB.get(method.upper(), method.lower())
    if len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return Attributes(verb=method.lower(), path=path, resource_request=False)
    if not rest:  # /api/v1, /apis/<group>/<version>: discovery, a non-resource URL
        return Attributes(verb=method.lower(), path=path, resource_request=False)
    if rest[0] == "watch":  # the deprecated /api/v1/watch/... form
        verb, rest = "watch", rest[1:]
    namespace = ""
    if rest and rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        # /namespaces/<ns>[/status|/finalize] is the Namespace object itself; anything else after
        # the name is a resource inside that namespace.
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    if verb == "get" and not name:
        verb = "watch" if query.get("watch", [""])[0].lower() in ("1", "true") else "list"
        # A list with fieldSelector metadata.name=X is authorized as a request for X, so
        # resourceNames rules can allow `kubectl get node X -w`.
        for term in query.get("fieldSelector", [""])[0].split(","):
            key, _, value = term.partition("=")
            value = value.removeprefix("=").strip()
            if key.strip() == "metadata.name" and value and "/" not in value:
                name = value
    elif verb == "delete" and not name:
        verb = "deletecollection"
    return Attributes(verb=verb, path=path, resource_request=True, api_group=group, api_version=version,
                      resource=resource, subresource=subresource, namespace=namespace, name=name)


# ---- rules (rbac/v1 helpers, pkg/apis/rbac/v1/evaluation_helpers.go) ----------------------------

def _verb_matches(rule: Json, verb: str) -> bool:
    verbs = rule.get("verbs") or []
    return "*" in verbs or verb in verbs


def _group_matches(rule: Json, group: str) -> bool:
    groups = rule.get("apiGroups") or []
    return "*" in groups or group in groups


def _resource_matches(rule: Json, attrs: Attributes) -> bool:
    for r in rule.get("resources") or []:
        if r == "*" or r == attrs.combined_resource:
            return True
        # "*/status" is every resource's status subresource; "*" alone already covers subresources.
        if attrs.subresource and r == f"*/{attrs.subresource}":
            return True
    return False


def _name_matches(rule: Json, name: str) -> bool:
    names = rule.get("resourceNames") or []
    return not names or name in names


def _url_matches(rule: Json, path: str) -> bool:
    for u in rule.get("nonResourceURLs") or []:
        if u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1])):
            return True
    return False


def rule_allows(rule: Json, attrs: Attributes) -> bool:
    """One PolicyRule against one request."""
    if attrs.resource_request:
        return (_verb_matches(rule, attrs.verb) and _group_matches(rule, attrs.api_group)
                and _resource_matches(rule, attrs) and _name_matches(rule, attrs.name))
    return _verb_matches(rule, attrs.verb) and _url_matches(rule, attrs.path)


def _subject_matches(subject: Json, user: User, binding_ns: str) -> bool:
    kind = subject.get("kind")
    if kind == "ServiceAccount":
        ns = subject.get("namespace") or binding_ns
        return user.name == f"{SA_PREFIX}{ns}:{subject.get('name')}"
    if kind == "User":
        return user.name == subject.get("name")
    if kind == "Group":
        return subject.get("name") in user.groups
    return False


@dataclass
class Rbac:
    """The RBAC authorizer over a set of objects (other kinds in `objects` are ignored)."""

    objects: Iterable[Json] = ()
    cluster_roles: dict[str, Json] = field(default_factory=dict, init=False)
    roles: dict[tuple[str, str], Json] = field(default_factory=dict, init=False)
    bindings: list[Json] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        for obj in self.objects:
            kind, meta = obj.get("kind"), obj.get("metadata") or {}
            if kind == "ClusterRole":
                self.cluster_roles[meta["name"]] = obj
            elif kind == "Role":
                self.roles[(meta.get("namespace", "default"), meta["name"])] = obj
            elif kind in ("ClusterRoleBinding", "RoleBinding"):
                self.bindings.append(obj)

    def rules_for(self, user: User, namespace: str) -> list[Json]:
        """Every rule that applies to `user` for a request in `namespace` ("" = cluster scope)."""
        out: list[Json] = []
        for b in self.bindings:
            meta = b.get("metadata") or {}
            b_ns = meta.get("namespace", "default") if b["kind"] == "RoleBinding" else ""
            if b_ns and b_ns != namespace:  # a RoleBinding grants only inside its namespace
                continue
            if not any(_subject_matches(s, user, b_ns) for s in b.get("subjects") or ()):
                continue
            ref = b.get("roleRef") or {}
            role = (self.cluster_roles.get(ref.get("name", "")) if ref.get("kind") == "ClusterRole"
                    else self.roles.get((b_ns, ref.get("name", ""))))
            out += (role or {}).get("rules") or []
        return out

    def allows(self, user: User, attrs: Attributes) -> bool:
        if MASTERS in user.groups:
            return True
        if not attrs.resource_request and attrs.verb == "get":
            public = attrs.path in _PUBLIC_URLS
            discovery = AUTHENTICATED in user.groups and _url_matches({"nonResourceURLs": _DISCOVERY_URLS},
                                                                      attrs.path)
            if public or discovery:
                return True
        return any(rule_allows(r, attrs) for r in self.rules_for(user, attrs.namespace))


def forbidden(user: User, attrs: Attributes) -> Json:
    """The 403 Status kube-apiserver sends (responsewriters.Forbidden + errors.NewForbidden)."""
    if not attrs.resource_request:
        why = f'User "{user.name}" cannot {attrs.verb} path "{attrs.path}"'
        return _status(f"forbidden: {why}", {})
    where = (f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope")
    why = (f'User "{user.name}" cannot {attrs.verb} resource "{attrs.combined_resource}" '
           f'in API group "{attrs.api_group}" {where}')
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    message = f'{qualified} "{attrs.name}" is forbidden: {why}' if attrs.name else f"{qualified} is forbidden: {why}"
    details: Json = {"kind": attrs.resource}
    if attrs.api_group:
        details["group"] = attrs.api_group
    if attrs.name:
        details["name"] = attrs.name
    return _status(message, details)


def _status(message: str, details: Json) -> Json:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": "Forbidden", "details": details, "code": 403}
