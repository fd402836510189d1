"""The kubelet's PodResources API (v1): which pod and container hold which devices on this node.

The kubelet serves gRPC on a unix socket (/var/lib/kubelet/pod-resources/kubelet.sock, root only).
`List` answers every pod with its containers and their device-plugin devices; for NVIDIA's device
plugin the resource is `nvidia.com/gpu` and the device ids are GPU UUIDs ("GPU-…", or "MIG-…"
for MIG slices), or indices when the plugin runs with `--device-id-strategy=index`.

Dynamic Resource Allocation (DRA, the way the GPU Operator is moving: a ResourceClaim instead of
a device-plugin count) shows in the same answer since Kubernetes 1.27 (on by default from 1.34):
a container's `dynamic_resources` name the claim and, per allocated device, the DRA driver
(`gpu.nvidia.com`), its device name (`gpu-3`, MIG `gpu-3-mig-...`) and its CDI devices.

grpcio is an optional extra (`podhealth[podresources]`, grpcio alone: no Kubernetes client on a GPU
node): without it this source is skipped with a reason, never an error. The messages are decoded
here with a small protobuf wire reader rather than generated stubs (no protoc, no protobuf
runtime): only the fields below are read, and unknown fields are skipped as the wire format
allows, so newer kubelets still parse.

    ListPodResourcesResponse { repeated PodResources pod_resources = 1; }
    PodResources             { string name = 1; string namespace = 2; repeated ContainerResources containers = 3; }
    ContainerResources       { string name = 1; repeated ContainerDevices devices = 2; ...;
                               repeated DynamicResource dynamic_resources = 5; }
    ContainerDevices         { string resource_name = 1; repeated string device_ids = 2; ... }
    DynamicResource          { string claim_name = 2; string claim_namespace = 3; repeated ClaimResource claim_resources = 4; }
    ClaimResource            { repeated CDIDevice cdi_devices = 1; string driver_name = 2; string pool_name = 3;
                               string device_name = 4; }
    CDIDevice                { string name = 1; }
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

LIST_METHOD = "/v1.PodResourcesLister/List"
GPU_RESOURCES = ("nvidia.com/gpu",)
# DRA drivers whose devices are GPUs (NVIDIA's k8s-dra-driver-gpu); reported as resource "dra:DRIVER".
GPU_DRA_DRIVERS = ("gpu.nvidia.com",)
MAX_RESPONSE_BYTES = 16 * 1024 * 1024  # the kubelet's own default limit for this API


class GrpcMissing(Exception):
    """grpcio is not installed (pip install 'podhealth[podresources]')."""


@dataclass(frozen=True, slots=True)
class PodDevices:
    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]
    claim: str = ""  # DRA: "namespace/claim" the devices were allocated to ("" for a device plugin's)


# ---- protobuf wire format (proto3): just enough to read length-delimited and varint fields ----

def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = value = 0
    while True:
        if i >= len(buf) or shift > 63:
            raise ValueError("truncated or overlong varint")
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """(field number, wire type, value) for each field: bytes for length-delimited, int for
    varints; fixed32/64 are skipped over (returned as int). ValueError on a malformed message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wt = key >> 3, key & 7
        if num == 0:
            raise ValueError("field number 0")
        if wt == 0:
            v, i = _varint(buf, i)
            yield num, wt, v
        elif wt == 2:
            n, i = _varint(buf, i)
            if i + n > len(buf):
                raise ValueError("truncated length-delimited field")
            yield num, wt, buf[i:i + n]
            i += n
        elif wt in (1, 5):
            width = 8 if wt == 1 else 4
            if i + width > len(buf):
                raise ValueError("truncated fixed field")
            yield num, wt, int.from_bytes(buf[i:i + width], "little")
            i += width
        else:
            raise ValueError(f"unsupported wire type {wt}")


def _text(v: bytes | int) -> str:
    if not isinstance(v, bytes):
        raise ValueError("expected a string field")
    return v.decode("utf-8", "replace")


def _msgs(buf: bytes, num: int) -> Iterator[bytes]:
    """Every length-delimited field `num` (an embedded message or a string), in order."""
    for n, wt, v in fields(buf):
        if n == num and wt == 2 and isinstance(v, bytes):
            yield v


def _string(buf: bytes, num: int) -> str:
    """String field `num`; protobuf's rule for a repeated scalar: the last one wins ("" if none)."""
    last = ""
    for v in _msgs(buf, num):
        last = _text(v)
    return last


def parse_list_response(buf: bytes, resources: tuple[str, ...] = GPU_RESOURCES) -> list[PodDevices]:
    """A ListPodResourcesResponse -> the containers holding any of `resources`.

    PodResources{1 name, 2 namespace, 3 containers}; ContainerResources{1 name, 2 devices,
    5 dynamic_resources}; ContainerDevices{1 resource_name, 2 device_ids} (k8s.io/kubelet
    podresources/v1). A DRA claim's GPUs come as resource "dra:DRIVER" with the device names, and
    the GPU UUIDs its CDI device names carry ("k8s.gpu.nvidia.com/gpu=GPU-..."), for the mapping."""
    out: list[PodDevices] = []
    for pod in _msgs(buf, 1):
        name, namespace = _string(pod, 1), _string(pod, 2)
        for c in _msgs(pod, 3):
            cname = _string(c, 1)
            for d in _msgs(c, 2):
                resource = _string(d, 1)
                ids = tuple(_text(v) for v in _msgs(d, 2))
                if resource in resources and ids:
                    out.append(PodDevices(namespace, name, cname, resource, ids))
            out += _dynamic(c, namespace, name, cname)
    return out


def _dynamic(container: bytes, namespace: str, pod: str, cname: str) -> list[PodDevices]:
    out: list[PodDevices] = []
    for dr in _msgs(container, 5):
        claim = f"{_string(dr, 3) or namespace}/{_string(dr, 2)}"
        by_driver: dict[str, list[str]] = {}
        for cr in _msgs(dr, 4):
            driver = _string(cr, 2)
            if driver not in GPU_DRA_DRIVERS:
                continue
            ids = by_driver.setdefault(driver, [])
            device = _string(cr, 4)
            if device:
                ids.append(device)
            for cdi in _msgs(cr, 1):
                qualified = _string(cdi, 1)  # vendor/class=NAME
                tail = qualified.rpartition("=")[2]
                if tail.startswith(("GPU-", "MIG-")):
                    ids.append(tail)
        for driver, ids in by_driver.items():
            if ids:
                out.append(PodDevices(namespace, pod, cname, f"dra:{driver}", tuple(dict.fromkeys(ids)), claim))
    return out


# ---- the call -----------------------------------------------------------------------------------

def list_gpu_pods(socket: Path, timeout: float) -> list[PodDevices]:
    """Ask the kubelet (blocking, bounded by `timeout`). Raises GrpcMissing without grpcio,
    FileNotFoundError when the socket is absent, OSError / TimeoutError when the kubelet does
    not answer, ValueError on a malformed answer."""
    try:
        import grpc
    except ImportError:
        raise GrpcMissing("the kubelet PodResources API needs grpcio: pip install 'podhealth[podresources]'") from None
    if not socket.exists():
        raise FileNotFoundError(str(socket))
    channel = grpc.insecure_channel(f"unix://{socket}", options=[
        ("grpc.max_receive_message_length", MAX_RESPONSE_BYTES),
        ("grpc.enable_retries", 0),  # one attempt: the collector's next run is the retry
    ])
    try:
        call = channel.unary_unary(LIST_METHOD, request_serializer=lambda _: b"",
                                   response_deserializer=lambda b: b)
        try:
            raw = call(None, timeout=timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(f"kubelet PodResources List: no answer within {timeout:g} s") from None
            detail = e.details() if hasattr(e, "details") else str(e)
            raise OSError(f"kubelet PodResources List: {code.name if code else 'error'}: {detail}") from None
    finally:
        channel.close()
    return parse_list_response(bytes(raw))
