"""The stand-in API server's RBAC (tests/harness/kuberbac.py): request attributes, rule matching and the
403 text, checked against what kube-apiserver does (requestinfo.go, rbac/v1 evaluation helpers,
responsewriters.Forbidden)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.harness.kuberbac import ANONYMOUS, Attributes, Rbac, User, forbidden, request_attributes, rule_allows

SA = User.of("system:serviceaccount:podhealth:podhealth-aggregator")


@pytest.mark.parametrize("method,path,query,want", [
    ("GET", "/api/v1/nodes/dgx01", {}, ("get", "", "nodes", "", "", "dgx01")),
    ("GET", "/api/v1/nodes", {}, ("list", "", "nodes", "", "", "")),
    ("GET", "/api/v1/nodes", {"watch": ["true"]}, ("watch", "", "nodes", "", "", "")),
    ("GET", "/api/v1/nodes", {"fieldSelector": ["metadata.name=dgx02"]}, ("list", "", "nodes", "", "", "dgx02")),
    ("GET", "/api/v1/watch/nodes", {}, ("watch", "", "nodes", "", "", "")),
    ("PATCH", "/api/v1/nodes/dgx01", {}, ("patch", "", "nodes", "", "", "dgx01")),
    ("PATCH", "/api/v1/nodes/dgx01/status", {}, ("patch", "", "nodes", "status", "", "dgx01")),
    ("PUT", "/api/v1/nodes/dgx01", {}, ("update", "", "nodes", "", "", "dgx01")),
    ("DELETE", "/api/v1/nodes/dgx01", {}, ("delete", "", "nodes", "", "", "dgx01")),
    ("DELETE", "/api/v1/nodes", {}, ("deletecollection", "", "nodes", "", "", "")),
    ("POST", "/api/v1/namespaces/default/events", {}, ("create", "", "events", "", "default", "")),
    ("POST", "/apis/events.k8s.io/v1/namespaces/kube-system/events", {},
     ("create", "events.k8s.io", "events", "", "kube-system", "")),
    ("POST", "/api/v1/namespaces/ns1/pods/p1/eviction", {}, ("create", "", "pods", "eviction", "ns1", "p1")),
    ("GET", "/api/v1/namespaces/ns1", {}, ("get", "", "namespaces", "", "ns1", "ns1")),
    ("PUT", "/api/v1/namespaces/ns1/finalize", {}, ("update", "", "namespaces", "finalize", "ns1", "ns1")),
    ("GET", "/api/v1/events", {}, ("list", "", "events", "", "", "")),
])
def test_request_attributes_as_the_apiserver_makes_them(method: str, path: str, query: dict[str, list[str]],
                                                         want: tuple[str, ...]) -> None:
    a = request_attributes(method, path, query)
    assert a.resource_request
    assert (a.verb, a.api_group, a.resource, a.subresource, a.namespace, a.name) == want


@pytest.mark.parametrize("path", ["/api", "/apis", "/api/v1", "/apis/events.k8s.io/v1", "/version"])
def test_discovery_is_a_non_resource_request(path: str) -> None:
    a = request_attributes("GET", path)
    assert not a.resource_request and a.verb == "get" and a.path == path


def _attrs(verb: str, resource: str, sub: str = "", name: str = "dgx01", group: str = "", ns: str = "") -> Attributes:
    return Attributes(verb=verb, path="/", resource_request=True, api_group=group, api_version="v1",
                      resource=resource, subresource=sub, namespace=ns, name=name)


@pytest.mark.parametrize("rule,attrs,allowed", [
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}, _attrs("patch", "nodes"), True),
    # a subresource is its own resource: nodes does not cover nodes/status, nor the other way round
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}, _attrs("patch", "nodes", "status"), False),
    ({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}, _attrs("patch", "nodes", "status"), True),
    ({"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]}, _attrs("patch", "nodes"), False),
    ({"apiGroups": [""], "resources": ["*/status"], "verbs": ["patch"]}, _attrs("patch", "nodes", "status"), True),
    ({"apiGroups": [""], "resources": ["*"], "verbs": ["patch"]}, _attrs("patch", "nodes", "status"), True),
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["*"]}, _attrs("delete", "nodes"), True),
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}, _attrs("watch", "nodes"), False),
    # the API group must match: core "" is not events.k8s.io
    ({"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
     _attrs("create", "events", name="", group="events.k8s.io", ns="default"), False),
    ({"apiGroups": ["*"], "resources": ["events"], "verbs": ["create"]},
     _attrs("create", "events", name="", group="events.k8s.io", ns="default"), True),
    # resourceNames limit to named requests; a create or an unnamed list never matches them
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"], "resourceNames": ["dgx01"]},
     _attrs("get", "nodes"), True),
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"], "resourceNames": ["dgx02"]},
     _attrs("get", "nodes"), False),
    ({"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"], "resourceNames": ["dgx01"]},
     _attrs("list", "nodes", name=""), False),
    # a nonResourceURLs rule says nothing about resources
    ({"nonResourceURLs": ["*"], "verbs": ["*"]}, _attrs("get", "nodes"), False),
])
def test_rule_matching(rule: dict[str, Any], attrs: Attributes, allowed: bool) -> None:
    assert rule_allows(rule, attrs) is allowed


def test_non_resource_urls() -> None:
    rule = {"nonResourceURLs": ["/metrics", "/logs/*"], "verbs": ["get"]}
    assert rule_allows(rule, request_attributes("GET", "/metrics"))
    assert rule_allows(rule, request_attributes("GET", "/logs/kube-apiserver.log"))
    assert not rule_allows(rule, request_attributes("GET", "/metricsx"))
    assert not rule_allows(rule, request_attributes("POST", "/metrics"))


ROLE = {"kind": "ClusterRole", "metadata": {"name": "fencer"},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]}
NS_ROLE = {"kind": "Role", "metadata": {"name": "ev", "namespace": "podhealth"},
           "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]}


def _crb(subject: dict[str, Any], role: str = "fencer") -> dict[str, Any]:
    return {"kind": "ClusterRoleBinding", "metadata": {"name": f"b-{role}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [subject]}


def test_bindings_grant_to_their_subjects_only() -> None:
    get = request_attributes("GET", "/api/v1/nodes/dgx01")
    sa_bound = Rbac([ROLE, _crb({"kind": "ServiceAccount", "name": "podhealth-aggregator", "namespace": "podhealth"})])
    assert sa_bound.allows(SA, get)
    assert not sa_bound.allows(User.of("system:serviceaccount:other:podhealth-aggregator"), get)
    assert not sa_bound.allows(User.of("alice"), get)
    assert Rbac([ROLE, _crb({"kind": "User", "name": "alice"})]).allows(User.of("alice"), get)
    assert Rbac([ROLE, _crb({"kind": "Group", "name": "system:serviceaccounts:podhealth"})]).allows(SA, get)
    # a binding to a role that does not exist grants nothing
    assert not Rbac([_crb({"kind": "User", "name": "alice"}, role="nosuch")]).allows(User.of("alice"), get)
    # superusers get past RBAC without any binding, as the apiserver lets system:masters through
    assert Rbac([]).allows(User("admin", ("system:masters",)), request_attributes("DELETE", "/api/v1/nodes/x"))


def test_a_role_binding_grants_only_in_its_namespace() -> None:
    rb = {"kind": "RoleBinding", "metadata": {"name": "ev", "namespace": "podhealth"},
          "roleRef": {"kind": "Role", "name": "ev"}, "subjects": [{"kind": "ServiceAccount",
                                                                   "name": "podhealth-aggregator"}]}
    rbac = Rbac([NS_ROLE, rb])
    assert rbac.allows(SA, request_attributes("POST", "/api/v1/namespaces/podhealth/events"))
    assert not rbac.allows(SA, request_attributes("POST", "/api/v1/namespaces/default/events"))


def test_discovery_is_open_to_authenticated_users_and_version_to_everyone() -> None:
    rbac = Rbac([])
    for path in ("/api", "/apis", "/api/v1", "/apis/events.k8s.io/v1", "/version"):
        assert rbac.allows(SA, request_attributes("GET", path)), path
    assert rbac.allows(ANONYMOUS, request_attributes("GET", "/version"))
    assert not rbac.allows(ANONYMOUS, request_attributes("GET", "/api"))
    assert not rbac.allows(SA, request_attributes("GET", "/api/v1/nodes"))


def test_forbidden_is_the_apiservers_text() -> None:
    status = forbidden(SA, request_attributes("PATCH", "/api/v1/nodes/dgx01/status"))
    assert status == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "reason": "Forbidden", "code": 403,
        "message": 'nodes "dgx01" is forbidden: User "system:serviceaccount:podhealth:podhealth-aggregator" cannot '
                   'patch resource "nodes/status" in API group "" at the cluster scope',
        "details": {"name": "dgx01", "kind": "nodes"}}
    ev = forbidden(SA, request_attributes("POST", "/apis/events.k8s.io/v1/namespaces/default/events"))
    assert ev["message"] == ('events.events.k8s.io is forbidden: User "system:serviceaccount:podhealth:'
                             'podhealth-aggregator" cannot create resource "events" in API group "events.k8s.io" '
                             'in the namespace "default"')
    assert ev["details"] == {"group": "events.k8s.io", "kind": "events"}
    anon = forbidden(ANONYMOUS, request_attributes("GET", "/api"))
    assert anon["message"] == 'forbidden: User "system:anonymous" cannot get path "/api"'
