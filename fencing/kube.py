"""The Kubernetes fencer: cordon + taint + annotation + Event, with the official Python client.

A podhealth fence on a Node is three marks, made in one JSON merge patch that carries the
resourceVersion we read (so a concurrent writer gets us a 409, and we re-read and retry instead
of overwriting their change to the taint list):

- `spec.unschedulable: true` (what `kubectl cordon` sets),
- the taint `podhealth.io/unhealthy=<check>:NoSchedule`,
- the annotation `podhealth.io/fenced`: JSON with why, when, the event id, and whether the node
  was already cordoned by someone else before podhealth came.

Release removes only those marks, and leaves the cordon in place when the annotation says it was
there before us. A node whose only mark is a hand cordon is not "fenced" for podhealth's
purposes (a cordon says nothing about health): podhealth can still fence it, recording the prior
cordon so it never uncordons it. The label `podhealth.io/managed=false` opts a node out: podhealth
neither fences nor releases it.

Beside those marks the fencer keeps a NodeCondition `PodhealthFenced` in the Node's status (as
node-problem-detector keeps its own): True with the check as reason and the why as message while
fenced, False after release, so `kubectl describe node` shows it and controllers that read
conditions (draino, cluster-autoscaler) see it. It is written through the nodes/status
subresource with a strategic merge patch keyed by type, so the kubelet's own conditions are
untouched; like the Event it is best effort and never fails or undoes the fence.

The client is blocking, so every call runs in a worker thread with the client's own
`_request_timeout` plus an asyncio deadline; no call can hold the event loop.

Nodes are read and patched as the API server's own JSON (`_preload_content=False`), never through
the client's models: a model round trip drops fields the client does not know and rewrites the
ones it does (a taint's `timeAdded: "...Z"` came back as `"...+00:00"`), and since a merge patch
replaces spec.taints whole, that would rewrite other controllers' taints; a field the client
validates strictly would make a real Node unreadable, so unfenceable.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import math
import re
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from podhealth.fencing.fence import (
    FenceError, FenceOutcome, FenceReason, FenceState, Guard, Job, LeaseExpired, NodeNames, Refused, Transient,
    mark_epoch, refuse_bad_name, render_reason, time_left,
)
from podhealth.fencing.kubeauth import DEFAULT_SA_DIR, InClusterError, in_cluster_configuration
from podhealth.hostnames import node_name_problem
from podhealth.worker import offload

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from podhealth.config_aggregator import KubeFencerConfig

TAINT_KEY = "podhealth.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
ANNOTATION = "podhealth.io/fenced"
MANAGED_LABEL = "podhealth.io/managed"
CONDITION_TYPE = "PodhealthFenced"
# The remediation ladder's reboot request. kured (the common reboot operator) reboots a node when
# its sentinel file exists, or when --reboot-sentinel-command exits 0; it acts on no annotation.
# podhealth records the request here and documents the sentinel command that reads it (README,
# "Remediation ladder"); the node stays cordoned and tainted by podhealth across the reboot.
REBOOT_ANNOTATION = "podhealth.io/reboot-requested"
MAX_WHY_CHARS = 512
# Every write names its field manager, so the Node's managedFields (`kubectl get node
# --show-managed-fields`) say "podhealth" owns the cordon, taint and annotation it set, not the
# client library's user agent.
FIELD_MANAGER = "podhealth"
BATCH_CONCURRENCY = 8  # API calls in flight for one batch (each runs in a worker thread)

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*")
_LABEL_VALUE_BAD = re.compile(r"[^A-Za-z0-9_.-]+")
Json = dict[str, Any]
T = TypeVar("T")


def validate_kube_node_name(name: str) -> str:
    """podhealth's one node-name rule (podhealth.hostnames, what ingest and config enforce), and on
    top Kubernetes' own: node names are DNS-1123 subdomains (lower case, digits, '-', '.')."""
    if not isinstance(name, str) or not name:
        raise ValueError("Kubernetes node name is empty")
    problem = node_name_problem(name)
    if problem:
        raise ValueError(f"{name[:80]!r} is not a valid Kubernetes node name: {problem}")
    if len(name) > 253 or not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValueError(f"{name[:80]!r} is not a valid Kubernetes node name (DNS-1123 subdomain: lower-case "
                         "letters, digits, '-' and '.', at most 253 characters)")
    return name


def taint_value(check: str, epoch: int = 0) -> str:
    """A check name as a valid label value (taint values follow the label-value rules), with the
    lease epoch of the aggregator that leaves it: `xid.e7` (reconcile reads it, taint_epoch)."""
    suffix = f".e{epoch}" if epoch > 0 else ""
    v = _LABEL_VALUE_BAD.sub("-", check)[:63 - len(suffix)].strip("-_.")
    return (v or "unknown") + suffix


_TAINT_EPOCH = re.compile(r"\.e([0-9]{1,18})$")


def taint_epoch(value: str) -> int:
    """The epoch in our taint's value (0 for an older mark without one)."""
    m = _TAINT_EPOCH.search(value)
    return int(m.group(1)) if m else 0


@dataclass(frozen=True)
class FenceRecord:
    """What the `podhealth.io/fenced` annotation holds."""

    why: str
    when: str
    id: str
    check: str
    cordoned_before: bool

    def to_json(self) -> str:
        return json.dumps({"why": self.why, "when": self.when, "id": self.id, "check": self.check,
                           "cordoned_before": self.cordoned_before}, sort_keys=True)

    @classmethod
    def parse(cls, text: str | None) -> "FenceRecord | None":
        """Tolerant: someone may have edited the annotation by hand; garbage gives None."""
        if not text:
            return None
        try:
            d = json.loads(text)
        except ValueError:
            return None
        if not isinstance(d, dict):
            return None
        return cls(why=str(d.get("why", "")), when=str(d.get("when", "")), id=str(d.get("id", "")),
                   check=str(d.get("check", "")), cordoned_before=d.get("cordoned_before") is True)


@dataclass(frozen=True)
class NodeView:
    """The parts of a Node that fencing looks at (pure; built from the API's JSON)."""

    name: str
    uid: str
    resource_version: str
    unschedulable: bool
    taints: tuple[Json, ...]
    record: FenceRecord | None
    has_annotation: bool
    opted_out: bool
    condition: str = ""  # status of our PodhealthFenced condition ("True"/"False"), "" when absent
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def our_taint(self) -> Json | None:
        return next((t for t in self.taints if t.get("key") == TAINT_KEY), None)

    @property
    def ours(self) -> bool:
        return self.our_taint is not None or self.has_annotation

    @property
    def complete(self) -> bool:
        return self.unschedulable and self.our_taint is not None and self.has_annotation

    @classmethod
    def of(cls, node: Json) -> "NodeView":
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        return cls(name=str(meta.get("name", "")), uid=str(meta.get("uid", "")),
                   resource_version=str(meta.get("resourceVersion", "")),
                   unschedulable=spec.get("unschedulable") is True,
                   taints=tuple(t for t in spec.get("taints") or () if isinstance(t, dict)),
                   record=FenceRecord.parse(annotations.get(ANNOTATION)), has_annotation=ANNOTATION in annotations,
                   opted_out=str(labels.get(MANAGED_LABEL, "")).lower() == "false",
                   condition=next((str(c.get("status", "")) for c in (node.get("status") or {}).get("conditions") or ()
                                   if isinstance(c, dict) and c.get("type") == CONDITION_TYPE), ""),
                   annotations={str(k): str(v) for k, v in annotations.items()
                                if k in (ANNOTATION, REBOOT_ANNOTATION)})

    def state(self) -> FenceState:
        if self.ours:
            reason = self.record.why if self.record else f"taint {TAINT_KEY}={(self.our_taint or {}).get('value', '')}"
        elif self.unschedulable:
            reason = "cordoned, not by podhealth"
        else:
            reason = ""
        raw = json.dumps({"unschedulable": self.unschedulable, "taints": list(self.taints),
                          ANNOTATION: self.record.to_json() if self.record else None, "opted_out": self.opted_out,
                          "resourceVersion": self.resource_version}, sort_keys=True)
        epoch = 0
        if self.ours:  # the annotation's reason says it; a taint alone (the annotation lost) too
            taint = str((self.our_taint or {}).get("value", ""))
            epoch = mark_epoch(self.record.why) if self.record else taint_epoch(taint)
        return FenceState(node=self.name, exists=True, fenced=self.ours, ours=self.ours, reason=reason,
                          opted_out=self.opted_out, raw=raw, epoch=epoch)


def condition_reason(check: str) -> str:
    """A check name as a condition reason (CamelCase, as Kubernetes reasons are): ib_port -> IbPort."""
    words = [w for w in re.split(r"[^A-Za-z0-9]+", check) if w]
    return "".join(w[:1].upper() + w[1:] for w in words)[:128] or "Unknown"


def condition_patch(fenced: bool, reason: str, message: str, now: str) -> Json:
    """Strategic merge patch for nodes/status that sets our condition (pure)."""
    return {"status": {"conditions": [{"type": CONDITION_TYPE, "status": "True" if fenced else "False",
                                       "reason": reason, "message": message[:1024],
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}}


def fence_patch(view: NodeView, record: FenceRecord, value: str) -> Json:
    """Merge patch that completes podhealth's fence on `view` (pure)."""
    taints = [dict(t) for t in view.taints]
    if view.our_taint is None:
        taints.append({"key": TAINT_KEY, "value": value, "effect": TAINT_EFFECT})
    keep = view.record if view.record is not None else record
    return {"metadata": {"resourceVersion": view.resource_version, "annotations": {ANNOTATION: keep.to_json()}},
            "spec": {"unschedulable": True, "taints": taints}}


def release_patch(view: NodeView) -> Json:
    """Merge patch that removes only podhealth's marks (pure).

    The cordon stays when the record says it predates us, and also when the record is gone or
    unreadable: without it we cannot know, and leaving a node cordoned is the safe mistake.
    """
    taints = [dict(t) for t in view.taints if t.get("key") != TAINT_KEY]
    spec: Json = {"taints": taints or None}
    if view.record is not None and not view.record.cordoned_before:
        spec["unschedulable"] = None
    return {"metadata": {"resourceVersion": view.resource_version,
                         "annotations": {ANNOTATION: None, REBOOT_ANNOTATION: None}}, "spec": spec}


class KubeUnavailable(Transient):
    """The API server could not be reached or refused the call (one attempt); the caller keeps
    the action pending and the action runner tries again later."""


class _Conflict(Exception):
    pass


class _Gone(Exception):
    """404 on a write: the Node was deleted after podhealth read it."""


class KubeFencer:
    """Cordons, taints and annotates Nodes; undoes only its own marks."""

    name = "kubernetes"

    def target(self, names: NodeNames) -> str:
        """The Node object's name (nodes[].k8s_name), else podhealth's name."""
        return names.kubernetes or names.node

    def __init__(self, api_client: "ApiClient | None" = None, kubeconfig: str | None = None,
                 in_cluster: bool = False, context: str | None = None, timeout: float = 10.0, attempts: int = 5,
                 budget: float | None = None, event_namespace: str = "default",
                 instance: str | None = None, clock: Callable[[], float] = time.time,
                 service_account_dir: str = DEFAULT_SA_DIR) -> None:
        """`timeout` bounds each API call; `budget` (default 1.5 x timeout) one public call. Each
        API call is made once (the action runner is the one retrier); `attempts` bounds only the
        re-reads after a 409 conflict, which are the merge patch's semantics, not retries.
        `in_cluster` uses the pod's service account from `service_account_dir` (fencing/kubeauth.py)."""
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        if attempts < 1 or timeout <= 0:
            raise ValueError("attempts must be >= 1 and timeout > 0")
        if api_client is None:
            try:
                if in_cluster:
                    conf = in_cluster_configuration(service_account_dir)
                else:
                    # Its own Configuration: the process-wide default is never touched.
                    conf = type.__call__(k8s.Configuration)
                    k8s_config.load_kube_config(config_file=kubeconfig or None, context=context,
                                                client_configuration=conf)
                # One attempt per call: urllib3 would otherwise repeat a refused connection 3 times
                # inside it (the client's default Retry), a hidden layer under the action runner's.
                conf.retries = 0
                api_client = k8s.ApiClient(conf)
            except (k8s_config.ConfigException, OSError, InClusterError) as e:
                where = "in-cluster service account" if in_cluster else f"kubeconfig {kubeconfig or '(default)'}"
                raise ValueError(f"cannot load the Kubernetes {where}: {e}") from None
        self.api = api_client
        self.core = k8s.CoreV1Api(api_client)
        self.timeout = timeout
        self.attempts = attempts
        self.budget = budget if budget is not None else timeout * 1.5
        self.event_namespace = event_namespace
        self.instance = instance or socket.gethostname()
        self.clock = clock
        self.guard: Guard | None = None  # set by the aggregator: its lease (fencing/fence.py)

    # ---- Fencer protocol ------------------------------------------------------------------------

    async def read(self, node: str) -> FenceState:
        """Current state; raises KubeUnavailable when the API cannot answer, ValueError for a bad name."""
        validate_kube_node_name(node)
        deadline = time.monotonic() + self.budget
        view = await self._view(node, deadline)
        if view is None:
            return FenceState(node=node, exists=False, fenced=False, ours=False)
        return view.state()

    async def fence(self, node: str, reason: FenceReason) -> FenceOutcome:
        refuse_bad_name(validate_kube_node_name, node)
        why = render_reason(reason)[:MAX_WHY_CHARS]
        value = taint_value(reason.check, reason.epoch)
        command = ("PATCH", f"/api/v1/nodes/{node}", f"cordon + taint {TAINT_KEY}={value}"
                   f":{TAINT_EFFECT} + annotation {ANNOTATION}")
        deadline = time.monotonic() + self.budget
        try:
            for _ in range(self.attempts):
                view = await self._view(node, deadline)
                if view is None:
                    raise Refused(f"node {node} not found", command=command)
                if view.opted_out:
                    raise Refused(f"node {node} is opted out ({MANAGED_LABEL}=false)", command=command)
                if view.complete:
                    note = "" if view.condition == "True" else await self._condition(
                        node, True, condition_reason(view.record.check if view.record else reason.check),
                        view.record.why if view.record else why, deadline)
                    return FenceOutcome(changed=False, command=command,
                                        output=f"already fenced by podhealth: {view.state().reason}{note}")
                record = FenceRecord(why=why, when=_iso(self.clock()), id=reason.id, check=reason.check,
                                     cordoned_before=view.unschedulable and not view.ours)
                try:
                    after = await self._patch(node, fence_patch(view, record, value), deadline)
                except _Conflict:
                    continue
                except _Gone:
                    raise _gone(node, command, "fencing") from None
                done = NodeView.of(after)
                if not done.complete:
                    raise Transient("the patch was accepted but the node does not show the fence",
                                    command=command, output=done.state().raw)
                note = await self._event(done, "PodhealthFenced", "Warning", "Fence", why, deadline)
                note += await self._condition(node, True, condition_reason(reason.check), why, deadline)
                extra = " (was already cordoned by someone else; release will leave that cordon)" \
                    if (done.record and done.record.cordoned_before) else ""
                return FenceOutcome(changed=True, command=command, output=f"fenced: {why}{extra}{note}")
            raise Transient(f"gave up after {self.attempts} conflicting updates (409)", command=command)
        except KubeUnavailable as e:
            raise KubeUnavailable(str(e), command=command) from None

    async def release(self, node: str) -> FenceOutcome:
        refuse_bad_name(validate_kube_node_name, node)
        command = ("PATCH", f"/api/v1/nodes/{node}", f"remove taint {TAINT_KEY}, annotation {ANNOTATION}, "
                   "and the cordon unless it predates podhealth")
        deadline = time.monotonic() + self.budget
        try:
            for _ in range(self.attempts):
                view = await self._view(node, deadline)
                if view is None:
                    raise Refused(f"node {node} not found", command=command)
                if not view.ours:
                    left = " (its cordon is someone else's and stays)" if view.unschedulable else ""
                    return FenceOutcome(changed=False, command=command,
                                        output=f"no podhealth fence on {node}{left}")
                if view.opted_out:
                    raise Refused(f"node {node} is opted out ({MANAGED_LABEL}=false); podhealth "
                                  "leaves its marks for an operator to remove", command=command)
                try:
                    after = await self._patch(node, release_patch(view), deadline)
                except _Conflict:
                    continue
                except _Gone:
                    raise _gone(node, command, "releasing") from None
                done = NodeView.of(after)
                if done.ours:
                    raise Transient("the patch was accepted but podhealth's marks are still there",
                                    command=command, output=done.state().raw)
                kept = done.unschedulable
                msg = f"released: {view.state().reason}" + (" (cordon kept: not podhealth's)" if kept else "")
                note = await self._event(done, "PodhealthReleased", "Normal", "Release", msg, deadline)
                note += await self._condition(node, False, "PodhealthReleased", msg, deadline)
                return FenceOutcome(changed=True, command=command, output=msg + note)
            raise Transient(f"gave up after {self.attempts} conflicting updates (409)", command=command)
        except KubeUnavailable as e:
            raise KubeUnavailable(str(e), command=command) from None

    # ---- JobSource: the GPU pods on a node, and evicting them ------------------------------------

    async def jobs(self, node: str) -> list[Job]:
        """Pods bound to `node` (fieldSelector spec.nodeName) that request nvidia.com/gpu and have
        not finished. Which GPU each holds is only known on the node (kubelet PodResources), so
        `gpus` stays empty here. Raises KubeUnavailable when the API cannot answer."""
        validate_kube_node_name(node)
        deadline = time.monotonic() + self.budget
        page = await self._call(lambda: _json_body(self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", limit=500, _preload_content=False,
            _request_timeout=self._rt(deadline))), deadline)
        out: list[Job] = []
        for pod in page.get("items") or ():
            job = gpu_pod(pod) if isinstance(pod, dict) else None
            if job is not None:
                out.append(job)
        return out

    async def evacuate(self, node: str, jobs: Sequence[Job], force: bool) -> FenceOutcome:
        """Evict each pod through the Eviction API (POST .../pods/NAME/eviction), which honours
        PodDisruptionBudgets; force changes nothing here: podhealth never deletes a pod past its
        budget. One attempt per pod: a 429 (a budget refuses) is reported, and the action runner
        tries again later."""
        from kubernetes.client import V1Eviction, V1ObjectMeta
        from kubernetes.client.exceptions import ApiException

        done: list[str] = []
        refused: list[str] = []
        failed: list[str] = []
        deadline = time.monotonic() + self.budget
        for j in jobs:
            ns, _, name = j.id.partition("/")
            body = V1Eviction(metadata=V1ObjectMeta(name=name, namespace=ns))
            try:
                await asyncio.wait_for(offload(lambda: self.core.create_namespaced_pod_eviction(
                    name, ns, body, _request_timeout=self._rt(deadline))), self._rt(deadline) + 1.0)
                done.append(j.id)
            except ApiException as e:
                if e.status == 404:
                    done.append(f"{j.id} (already gone)")
                elif e.status == 429:
                    refused.append(f"{j.id}: {_api_message(e)}")
                else:
                    failed.append(f"{j.id}: HTTP {e.status} {_api_message(e)}")
            except Exception as e:  # noqa: BLE001 - a timeout or connection error: the runner tries again
                failed.append(f"{j.id}: {type(e).__name__}: {e}")
        command = ("POST", f"/api/v1/namespaces/*/pods/*/eviction ({len(jobs)} pod(s) on {node})")
        text = f"evicted: {', '.join(done) or 'none'}"
        if refused or failed:
            why = "; ".join(refused + failed)
            code = "429 (a PodDisruptionBudget refuses; later)" if refused and not failed else "failed"
            error = f"eviction {code}: {why}"
            # A budget that refuses (429) may allow it later; any other failure is final here.
            later = "429" in error or "disruption budget" in error.lower()
            raise (Transient if later else Refused)(error, command=command, output=text)
        return FenceOutcome(changed=bool(done), command=command, output=text)

    async def announce_jobs(self, node: str, message: str) -> str:
        """An Event `PodhealthJobsAffected` on the Node naming the GPU pods a fence hurts (best
        effort, like every Event here: '' when recorded, else why not)."""
        deadline = time.monotonic() + self.budget
        try:
            view = await self._view(node, deadline)
        except KubeUnavailable as e:
            return f"event not recorded: {e}"
        if view is None:
            return f"event not recorded: node {node} not found"
        return (await self._event(view, "PodhealthJobsAffected", "Warning", "Fence", message, deadline)).lstrip("; ")

    # ---- Remediator: the ladder's reboot request and the REPAIR reason --------------------------

    async def reboot(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Annotate the node `podhealth.io/reboot-requested` (JSON: id, why, when) for the reboot
        operator, with an Event. Only on a node podhealth fenced; the same request (same id)
        already there is ok, changed=False, so a restart never asks twice."""
        why = render_reason(reason)[:MAX_WHY_CHARS]
        value = json.dumps({"id": reason.id, "why": why, "when": _iso(self.clock())}, sort_keys=True)
        return await self._annotate(node, "reboot", REBOOT_ANNOTATION, value,
                                    lambda old: _request_id(old) == reason.id, why, "PodhealthRebootRequested")

    async def remark(self, node: str, reason: FenceReason) -> FenceOutcome:
        """Put the REPAIR reason into podhealth's `podhealth.io/fenced` record (and an Event)."""
        why = render_reason(reason)[:MAX_WHY_CHARS]
        return await self._annotate(node, "remark", ANNOTATION, None, lambda old: False, why, "PodhealthRepair")

    async def _annotate(self, node: str, verb: str, key: str, value: str | None, same: Callable[[str], bool],
                        why: str, event: str) -> FenceOutcome:
        refuse_bad_name(validate_kube_node_name, node)
        command = ("PATCH", f"/api/v1/nodes/{node}", f"annotation {key}")
        deadline = time.monotonic() + self.budget
        try:
            for _ in range(self.attempts):
                view = await self._view(node, deadline)
                if view is None:
                    raise Refused(f"node {node} not found", command=command)
                if not view.complete or view.opted_out:
                    raise Refused(f"{node} is not fenced by podhealth (or opted out): not touched", command=command)
                old = view.annotations.get(key, "")
                if old and same(old):
                    return FenceOutcome(changed=False, command=command, output=f"already {verb}: {old}")
                text = value
                if text is None and view.record is not None:  # remark: the record with the new why
                    text = dataclasses.replace(view.record, why=why).to_json()
                body = {"metadata": {"resourceVersion": view.resource_version, "annotations": {key: text}}}
                try:
                    after = await self._patch(node, body, deadline)
                except _Conflict:
                    continue
                except _Gone:
                    raise _gone(node, command, "annotating") from None
                note = await self._event(NodeView.of(after), event, "Warning", verb.capitalize(), why, deadline)
                return FenceOutcome(changed=True, command=command, output=f"{key}: {text}{note}")
            raise Transient(f"gave up after {self.attempts} conflicting updates (409)", command=command)
        except KubeUnavailable as e:
            raise KubeUnavailable(str(e), command=command) from None

    # ---- BatchFencer: the API has no multi-node patch, so a batch is single calls side by side --

    async def read_many(self, nodes: Sequence[str]) -> dict[str, FenceState]:
        """read() for many nodes, BATCH_CONCURRENCY at a time; a node whose read fails is left out
        (the caller's read() then says why)."""
        sem = asyncio.Semaphore(BATCH_CONCURRENCY)

        async def one(n: str) -> FenceState | None:
            async with sem:
                try:
                    return await self.read(n)
                except (ValueError, KubeUnavailable):
                    return None

        states = await asyncio.gather(*(one(n) for n in dict.fromkeys(nodes)))
        return {st.node: st for st in states if st is not None}

    async def fence_many(self, items: Sequence[tuple[str, FenceReason]]) -> dict[str, FenceOutcome | FenceError]:
        """fence() for many nodes, BATCH_CONCURRENCY at a time: per node its outcome or its error."""
        sem = asyncio.Semaphore(BATCH_CONCURRENCY)

        async def one(n: str, r: FenceReason) -> tuple[str, FenceOutcome | FenceError]:
            async with sem:
                try:
                    return n, await self.fence(n, r)
                except FenceError as e:
                    return n, e

        return dict(await asyncio.gather(*(one(n, r) for n, r in dict(items).items())))

    async def list_fenced(self) -> dict[str, FenceState]:
        """Nodes that carry podhealth's marks; raises KubeUnavailable when the API cannot answer."""
        deadline = time.monotonic() + self.budget
        out: dict[str, FenceState] = {}
        token: str | None = None
        while True:
            page = await self._call(lambda t=token: _json_body(self.core.list_node(  # type: ignore[misc]
                limit=500, _continue=t, _preload_content=False, _request_timeout=self._rt(deadline))), deadline)
            for item in page.get("items") or ():
                if not isinstance(item, dict):
                    continue
                view = NodeView.of(item)
                if view.ours:
                    out[view.name] = view.state()
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return out

    # ---- internals ------------------------------------------------------------------------------

    def _rt(self, deadline: float) -> float:
        """A call's _request_timeout: its own, what is left of the public call, of the lease."""
        return max(0.1, min(self.timeout, deadline - time.monotonic(), self._lease_left()))

    def _lease_left(self) -> float:
        return self.guard() if self.guard is not None else math.inf

    async def _view(self, node: str, deadline: float) -> NodeView | None:
        from kubernetes.client.exceptions import ApiException

        try:
            obj = await self._call(lambda: _json_body(self.core.read_node(
                node, _preload_content=False, _request_timeout=self._rt(deadline))), deadline)
        except ApiException as e:  # only 404/409 get here: _call turns the rest into KubeUnavailable
            if e.status == 404:
                return None
            raise KubeUnavailable(f"GET node {node}: HTTP {e.status} {_api_message(e)}") from None
        return NodeView.of(obj)

    async def _patch(self, node: str, body: Json, deadline: float) -> Json:
        from kubernetes.client.exceptions import ApiException

        try:
            return await self._call(lambda: _json_body(self.core.patch_node(
                node, body, field_manager=FIELD_MANAGER, _content_type="application/merge-patch+json",
                _preload_content=False,
                _request_timeout=self._rt(deadline))), deadline)
        except ApiException as e:
            if e.status == 409:
                raise _Conflict() from None
            if e.status == 404:
                raise _Gone() from None
            raise KubeUnavailable(f"PATCH node {node}: HTTP {e.status} {_api_message(e)}") from None

    async def _event(self, view: NodeView, reason: str, kind: str, action: str, message: str,
                     deadline: float) -> str:
        """Best effort: an Event that cannot be written must not undo or fail the fence itself."""
        from kubernetes.client import CoreV1Event

        now = _iso(self.clock())
        body = CoreV1Event.from_dict({
            "metadata": {"generateName": f"{view.name}.podhealth-", "namespace": self.event_namespace},
            "involvedObject": {"kind": "Node", "name": view.name, "uid": view.uid, "apiVersion": "v1"},
            "reason": reason, "message": message[:1024], "type": kind, "action": action,
            "source": {"component": "podhealth", "host": self.instance},
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            "reportingComponent": "podhealth", "reportingInstance": self.instance[:128]})
        assert body is not None  # from_dict only returns None for a None input
        try:
            await self._call(lambda: self.core.create_namespaced_event(
                self.event_namespace, body, field_manager=FIELD_MANAGER, _request_timeout=self._rt(deadline)), deadline)
        except Exception as e:  # noqa: BLE001 - see the docstring
            return f"; event not recorded: {e}"
        return ""

    async def _condition(self, node: str, fenced: bool, reason: str, message: str, deadline: float) -> str:
        """Best effort, like the Event: a condition that cannot be written never fails the fence."""
        body = condition_patch(fenced, reason, message, _iso(self.clock()))
        try:
            await self._call(lambda: _json_body(self.core.patch_node_status(
                node, body, field_manager=FIELD_MANAGER, _content_type="application/strategic-merge-patch+json",
                _preload_content=False,
                _request_timeout=self._rt(deadline))), deadline)
        except Exception as e:  # noqa: BLE001 - see the docstring
            return f"; condition {CONDITION_TYPE} not recorded: {e}"
        return ""

    async def _call(self, fn: Callable[[], T], deadline: float) -> T:
        """Run one blocking client call in a thread, once, within what is left of `deadline`.

        404 and 409 are returned to the caller as ApiException (they are answers, not failures);
        anything else (401/403/422, 5xx, 429, connection errors, a timeout) is KubeUnavailable,
        a Transient: the action runner decides whether and when to try again.
        """
        from kubernetes.client.exceptions import ApiException

        # The lease, on the monotonic clock, immediately before the call (fencing/fence.py Guard).
        lease = time_left(self.guard, "Kubernetes API call")
        left = deadline - time.monotonic()
        if left <= 0:
            raise KubeUnavailable("Kubernetes API: no time left")
        left = min(left, lease)
        try:
            # The client's own _request_timeout ends the thread's socket wait; this deadline
            # only guards against a call that ignores it.
            return await asyncio.wait_for(offload(fn), left + 1.0)
        except ApiException as e:
            if e.status in (404, 409):
                raise
            last = f"HTTP {e.status} {_api_message(e)}"
        except asyncio.TimeoutError:
            if left >= lease:
                raise LeaseExpired("Kubernetes API call: abandoned at this aggregator's lease deadline") from None
            last = f"timed out after {left:.1f}s"
        except Exception as e:  # noqa: BLE001 - urllib3 connection errors, bad responses
            last = f"{type(e).__name__}: {e}"
        raise KubeUnavailable(f"Kubernetes API: {last[:500]}")


def gpu_pod(pod: Json) -> Job | None:
    """A pod that requests nvidia.com/gpu and is not finished, as a Job (pure); else None."""
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return None
    spec = pod.get("spec") or {}
    wanted = 0
    for c in list(spec.get("containers") or ()) + list(spec.get("initContainers") or ()):
        res = (c or {}).get("resources") or {}
        n = (res.get("limits") or {}).get("nvidia.com/gpu") or (res.get("requests") or {}).get("nvidia.com/gpu")
        try:
            wanted += int(str(n)) if n is not None else 0
        except ValueError:
            continue
    if not wanted:
        return None
    meta = pod.get("metadata") or {}
    ns, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
    return Job(id=f"{ns}/{name}", owner=ns, name=name, state=str((pod.get("status") or {}).get("phase", "")))


def _json_body(resp: Any) -> Json:
    """The JSON object of a raw (`_preload_content=False`) response; the connection goes back to
    the pool either way. Runs in the worker thread: reading the body blocks."""
    try:
        data = resp.data
    finally:
        with contextlib.suppress(Exception):
            resp.release_conn()
    doc = json.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"the API server answered {type(doc).__name__}, not an object")
    return doc


def _gone(node: str, command: tuple[str, ...], doing: str) -> Refused:
    """The Node was deleted between podhealth's read and its write (404): nothing was changed, and
    nothing is worth retrying until the node registers again (a read then says exists=False)."""
    return Refused(f"node {node} not found: deleted while podhealth was {doing} it", command=command)


def _request_id(text: str) -> str:
    try:
        d = json.loads(text)
    except ValueError:
        return ""
    return str(d.get("id", "")) if isinstance(d, dict) else ""


def _api_message(e: Exception) -> str:
    body = getattr(e, "body", None)
    if body:
        try:
            msg = json.loads(body).get("message")
            if msg:
                return str(msg)[:300]
        except (ValueError, AttributeError):
            pass
    return str(getattr(e, "reason", "") or e)[:300]


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def from_config(cfg: "KubeFencerConfig") -> KubeFencer:
    return KubeFencer(kubeconfig=cfg.kubeconfig or None, in_cluster=cfg.in_cluster, timeout=cfg.timeout,
                      service_account_dir=cfg.service_account_dir)
