"""Which job holds each GPU: job records (prolog/epilog), cgroup v1 fallback, the kubelet's
PodResources API over real gRPC on a unix socket, the agent's evidence and dcgm-exporter files."""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent import futures
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.agent import jobmap
from podhealth.checks.cli import slurm_hooks
from podhealth.collectors import REGISTRY, factory, job_records, podresources
from podhealth.collectors.job_records import JobRecord
from podhealth.collectors.jobs import (
    JobsCollector, nvml_gpu_pids, parse_devices_list, parse_proc_cgroup, parse_status_uid, records_from_samples,
)
from podhealth.collectors.nvml_session import NvmlSession
from podhealth.sim.node import SimNode
from podhealth.config import Config, loads
from podhealth.vocab import CheckResult, Event, Status, evidence_of
from tests.conftest import REPO
from tests.harness.nvmlsim import inject, node, session  # noqa: F401 - fixtures


def _collector(tmp: Path, socket: Path | None = None, uuids: dict[str, int] | None = None,
               timeout: float = 2.0) -> JobsCollector:
    return JobsCollector(tmp / "jobs", tmp / "sys" / "fs" / "cgroup" / "devices", socket or tmp / "no.sock",
                         timeout, uuid_map=(lambda: uuids or {}))


def _info(c: JobsCollector) -> tuple[set[tuple[str, ...]], dict[str, float]]:
    col = c.collect()
    info: set[tuple[str, ...]] = {(s.label("gpu"), s.label("job_id"), s.label("scheduler"), s.label("user"), s.label("namespace"),
             s.label("pod")) for s in col.samples if s.name == "gpu_job_info"}
    up: dict[str, float] = {s.label("source"): s.value for s in col.samples if s.name == "job_source_up"}
    return info, up


# ---- records -------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw,want", [("0,1", (0, 1)), ("4-6", (4, 5, 6)), ("7,0-1", (0, 1, 7)), ("", ()),
                                      (" 3 ", (3,))])
def test_gpu_list(raw: str, want: tuple[int, ...]) -> None:
    assert job_records.parse_gpu_list(raw) == want


@pytest.mark.parametrize("raw", ["GPU-1234", "NoDevFiles", "3-1", "0-99", "1,a"])
def test_gpu_list_rejects(raw: str) -> None:
    with pytest.raises(ValueError):
        job_records.parse_gpu_list(raw)


@pytest.mark.parametrize("text,why", [
    ("{", "not JSON"), ("[]", "object"), ('{"scheduler": "pbs", "job_id": "1", "gpus": []}', "scheduler"),
    ('{"scheduler": "slurm", "job_id": "../x", "gpus": []}', "job_id"),
    ('{"scheduler": "slurm", "job_id": "1", "gpus": [0, 99]}', "gpus"),
    ('{"scheduler": "slurm", "job_id": "1", "gpus": [true]}', "gpus"),
    ('{"scheduler": "slurm", "job_id": "1", "gpus": [0], "user": "a b"}', "user"),
])
def test_record_rejects(text: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        job_records.parse_record(text)


def test_records_round_trip_atomically(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    job_records.write_record(d, JobRecord("slurm", "1234", (1, 0), "alice"))
    job_records.write_record(d, JobRecord("kubernetes", "ml.train-0", (3,), namespace="ml", pod="train-0"))
    (d / "broken.json").write_text("{")
    assert sorted(os.listdir(d)) == ["broken.json", "kubernetes-ml.train-0.json", "slurm-1234.json"]  # no temporaries
    recs, errors = job_records.read_records(d)
    assert [(r.job_id, r.gpus, r.user) for r in recs] == [("ml.train-0", (3,), ""), ("1234", (0, 1), "alice")]
    assert recs[1].since > 0
    assert len(errors) == 1 and "broken.json" in errors[0]
    assert job_records.remove_record(d, "slurm", "1234") is True
    assert job_records.remove_record(d, "slurm", "1234") is False
    assert job_records.read_records(tmp_path / "absent") == ([], [])


def test_collector_reads_records_and_says_unknown_when_it_cannot(tmp_path: Path) -> None:
    job_records.write_record(tmp_path / "jobs", JobRecord("slurm", "42", (0, 1), "alice"))
    info, up = _info(_collector(tmp_path))
    assert info == {("0", "42", "slurm", "alice", "", ""), ("1", "42", "slurm", "alice", "", "")}
    assert up == {"records": 1.0}  # no cgroup v1 hierarchy, no kubelet: those sources are not here
    assert _info(_collector(tmp_path / "elsewhere")) == (set(), {})  # no prolog has run: no source at all
    # The state directory cannot be listed (a file where the directory should be): unknown, not "no job".
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "jobs").write_text("")
    col = _collector(bad).collect()
    assert [(s.label("source"), s.value) for s in col.samples if s.name == "job_source_up"] == [("records", 0.0)]
    assert not [s for s in col.samples if s.name == "gpu_job_info"]
    assert col.errors


# ---- cgroup v1 -----------------------------------------------------------------------------------

def test_devices_list() -> None:
    assert parse_devices_list("c 195:255 rwm\nc 195:0 rwm\nc 195:3 rw\nc 1:3 rwm\nc 195:254 rwm\n") == (0, 3)
    assert parse_devices_list("a *:* rwm\n") is None
    assert parse_devices_list("") == ()


def test_cgroup_fallback_for_jobs_without_record(tmp_path: Path) -> None:
    base = tmp_path / "sys" / "fs" / "cgroup" / "devices" / "slurm" / "uid_0"
    for job, devices in (("job_7", "c 195:255 rwm\nc 195:5 rwm\n"), ("job_8", "c 195:6 rwm\n"),
                         ("job_9", "a *:* rwm\n")):
        (base / job).mkdir(parents=True)
        (base / job / "devices.list").write_text(devices)
    job_records.write_record(tmp_path / "jobs", JobRecord("slurm", "8", (6,), "bob"))  # the record wins
    info, up = _info(_collector(tmp_path))
    assert info == {("5", "7", "slurm", "root", "", ""), ("6", "8", "slurm", "bob", "", "")}
    assert up == {"records": 1.0, "cgroup": 1.0}


# ---- cgroup v2: the GPU's processes (NVML) placed in their jobs through /proc/<pid>/cgroup ----------

def test_proc_cgroup_and_status() -> None:
    assert parse_proc_cgroup("0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0\n") == "1234"
    assert parse_proc_cgroup("12:pids:/\n4:devices:/slurm/uid_1000/job_77/step_batch/task_0\n") == "77"
    assert parse_proc_cgroup("0::/user.slice/user-1000.slice/session-3.scope\n") is None
    assert parse_proc_cgroup("0::/system.slice/slurmstepd.scope/job_12x/step_0\n") is None
    assert parse_status_uid("Name:\tpython3\nUid:\t1001\t1001\t1001\t1001\n") == 1001
    assert parse_status_uid("Name:\tx\n") is None


def _v2_node(tmp: Path, procs: dict[int, tuple[str, int]], pids: dict[int, list[int]]) -> JobsCollector:
    (tmp / "sys" / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope").mkdir(parents=True)
    for pid, (cgroup, uid) in procs.items():
        (tmp / "proc" / str(pid)).mkdir(parents=True)
        (tmp / "proc" / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
        (tmp / "proc" / str(pid) / "status").write_text(f"Name:\tpython3\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return JobsCollector(tmp / "jobs", tmp / "sys" / "fs" / "cgroup" / "devices", tmp / "no.sock", 2.0,
                         slurm_v2_scope=tmp / "sys" / "fs" / "cgroup" / "system.slice" / "slurmstepd.scope",
                         procfs_root=tmp / "proc", gpu_pids=lambda: pids)


def test_cgroup_v2_processes_for_gpus_without_record(tmp_path: Path) -> None:
    # pid 102 on GPU 2 has ended (no /proc entry); pid 103 on GPU 3 is ignored: a record names GPU 3.
    c = _v2_node(tmp_path, {100: ("/system.slice/slurmstepd.scope/job_55/step_0/user/task_0", 0),
                            101: ("/user.slice/user-0.slice/session-1.scope", 0),  # someone's nvidia-smi
                            103: ("/system.slice/slurmstepd.scope/job_99/step_0/user/task_0", 0)},
                 {0: [100], 1: [101], 2: [102], 3: [103], 4: [100]})
    job_records.write_record(tmp_path / "jobs", JobRecord("slurm", "56", (3,), "bob"))  # GPU 3: the record says
    info, up = _info(c)
    assert info == {("0", "55", "slurm", "root", "", ""), ("4", "55", "slurm", "root", "", ""),
                    ("3", "56", "slurm", "bob", "", "")}
    assert up == {"records": 1.0, "processes": 1.0}


def test_processes_unknown_when_nvml_fails(tmp_path: Path) -> None:
    c = _v2_node(tmp_path, {}, {})

    def broken() -> dict[int, list[int]]:
        raise RuntimeError("NVML: driver not loaded")
    c.gpu_pids = broken
    job_records.write_record(tmp_path / "jobs", JobRecord("slurm", "56", (3,), "bob"))
    info, up = _info(c)
    assert info == {("3", "56", "slurm", "bob", "", "")}  # the records still count
    assert up == {"records": 1.0, "processes": 0.0}


def test_nvml_gpu_pids_through_real_pynvml(node: SimNode, session: NvmlSession) -> None:
    read = nvml_gpu_pids("", session)
    assert all(v == [] for v in read().values())
    inject(node, "fault=gpu-busy", "gpu=2")
    got = read()
    assert got[2] == [4242] and all(v == [] for g, v in got.items() if g != 2)


# ---- the kubelet's PodResources API, real gRPC on a unix socket -------------------------------------

def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes | str) -> bytes:
    data = payload.encode() if isinstance(payload, str) else payload
    return _varint(num << 3 | 2) + _varint(len(data)) + data


def _list_response(pods: list[tuple[str, str, list[tuple[str, str, list[str]]]]]) -> bytes:
    out = b""
    for ns, name, containers in pods:
        body = _field(1, name) + _field(2, ns)
        for cname, resource, ids in containers:
            dev = _field(1, resource) + b"".join(_field(2, i) for i in ids) + _field(3, _field(1, _varint(8) + _varint(1)))
            # cpu_ids (packed int64, field 3) and an unknown future field (9, varint) must be skipped
            body += _field(3, _field(1, cname) + _field(2, dev) + _field(3, _varint(4) + _varint(5)) + _varint(9 << 3) + _varint(1))
        out += _field(1, body)
    return out


@pytest.fixture()
def kubelet(tmp_path: Path) -> Iterator[tuple[Path, dict[str, object]]]:
    grpc = pytest.importorskip("grpc", reason="grpcio is the [kubernetes] extra")
    state: dict[str, object] = {"answer": b"", "release": threading.Event()}

    def list_(request: bytes, context: object) -> bytes:
        if state.get("hang"):
            state["release"].wait(30)  # type: ignore[attr-defined]
        return state["answer"]  # type: ignore[return-value]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(list_, request_deserializer=lambda b: b,
                                                    response_serializer=lambda b: b)}),))
    sock = tmp_path / "kubelet.sock"
    server.add_insecure_port(f"unix:{sock}")
    server.start()
    try:
        yield sock, state
    finally:
        state["release"].set()  # type: ignore[attr-defined]
        server.stop(0).wait(10)


def test_parse_list_response_keeps_gpu_containers() -> None:
    buf = _list_response([("ml", "train-0", [("main", "nvidia.com/gpu", ["GPU-a", "GPU-b"]),
                                             ("side", "example.com/fpga", ["f0"])]),
                          ("web", "nginx", [])])
    assert podresources.parse_list_response(buf) == [
        podresources.PodDevices("ml", "train-0", "main", "nvidia.com/gpu", ("GPU-a", "GPU-b"))]
    with pytest.raises(ValueError):
        podresources.parse_list_response(buf[:-3])


def test_kubelet_pods_on_gpus(tmp_path: Path, kubelet: tuple[Path, dict[str, object]]) -> None:
    sock, state = kubelet
    state["answer"] = _list_response([("ml", "train-0", [("main", "nvidia.com/gpu", ["GPU-a", "GPU-b"])]),
                                      ("ml", "infer", [("c", "nvidia.com/gpu", ["4"])])])
    info, up = _info(_collector(tmp_path, sock, {"GPU-a": 2, "GPU-b": 3}))
    assert info == {("2", "ml.train-0", "kubernetes", "", "ml", "train-0"),
                    ("3", "ml.train-0", "kubernetes", "", "ml", "train-0"),
                    ("4", "ml.infer", "kubernetes", "", "ml", "infer")}
    assert up == {"kubelet": 1.0}


def test_kubelet_that_does_not_answer_is_unknown(tmp_path: Path, kubelet: tuple[Path, dict[str, object]]) -> None:
    sock, state = kubelet
    state["hang"] = True
    col = _collector(tmp_path, sock, timeout=0.5).collect()
    assert [(s.label("source"), s.value) for s in col.samples if s.name == "job_source_up"] == [("kubelet", 0.0)]
    assert any("within" in e for e in col.errors), col.errors


# ---- the agent: evidence, events, dcgm-exporter files --------------------------------------------

def test_annotate_and_tag() -> None:
    jobs = {3: [JobRecord("slurm", "42", (3,), "alice")]}
    results = (CheckResult("ecc", Status.FAIL, "gpu3", evidence_of(dbe=1, job="old")),
               CheckResult("ecc", Status.OK, "gpu4"), CheckResult("ib_port", Status.OK, "mlx5_0/1"))
    out = jobmap.annotate(results, jobs)
    assert dict(out[0].evidence) == {"dbe": "1", "job": "slurm job 42 (alice)"}
    assert out[1] is results[1] and out[2] is results[2]
    assert jobmap.annotate(out, {})[0].evidence == (("dbe", "1"),)  # the job ended: no stale claim
    ev = jobmap.tag_event(Event("xid", 79, 1.0, gpu=3), jobs)
    assert ev.job == "slurm job 42 (alice)" and ev.to_json()["job"] == ev.job
    assert Event.from_json(ev.to_json()).job == ev.job
    assert "job" not in jobmap.tag_event(Event("xid", 79, 1.0, gpu=5), jobs).to_json()


def test_dcgm_mapping_files(tmp_path: Path) -> None:
    d = tmp_path / "map"
    d.mkdir()
    (d / "7").write_text("old\n")       # a job that ended
    (d / "README").write_text("keep")   # not a GPU file: not ours
    jobs = {0: [JobRecord("slurm", "42", (0, 1))], 1: [JobRecord("slurm", "42", (0, 1)), JobRecord("slurm", "43", (1,))]}
    assert jobmap.write_mapping(d, jobmap.mapping_files(jobs)) == []
    assert sorted(os.listdir(d)) == ["0", "1", "README"]
    assert (d / "0").read_text() == "42\n" and (d / "1").read_text() == "42\n43\n"
    assert jobmap.write_mapping(d, {}) == []
    assert os.listdir(d) == ["README"]


def test_samples_back_to_jobs(tmp_path: Path) -> None:
    job_records.write_record(tmp_path / "jobs", JobRecord("slurm", "42", (0, 1), "alice"))
    got = records_from_samples(_collector(tmp_path).collect().samples)
    assert {g: [j.label for j in js] for g, js in got.items()} == {0: ["slurm job 42 (alice)"], 1: ["slurm job 42 (alice)"]}


# ---- the Slurm hooks ------------------------------------------------------------------------------

def test_prolog_records_and_epilog_removes(tmp_path: Path) -> None:
    cfg = loads(f"collectors: {{jobs: {{state_dir: {tmp_path / 'jobs'}}}}}\n")
    env = {"SLURM_JOB_ID": "1234", "SLURM_JOB_USER": "alice", "SLURM_JOB_GPUS": "2,5", "CUDA_VISIBLE_DEVICES": "2,5"}
    assert slurm_hooks.record_job(cfg, env, "prolog") == ""
    rec = json.loads((tmp_path / "jobs" / "slurm-1234.json").read_text())
    assert (rec["job_id"], rec["user"], rec["gpus"]) == ("1234", "alice", [2, 5])
    # CUDA_VISIBLE_DEVICES alone (no SLURM_JOB_GPUS): in the prolog it holds the host's indices too.
    assert slurm_hooks.record_job(cfg, {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0"}, "prolog") == ""
    assert json.loads((tmp_path / "jobs" / "slurm-7.json").read_text())["gpus"] == [0]
    assert slurm_hooks.record_job(cfg, {"SLURM_JOB_ID": "8"}, "prolog") == ""  # no GPUs: nothing to record
    assert not (tmp_path / "jobs" / "slurm-8.json").exists()
    assert slurm_hooks.forget_job(cfg, env, "epilog") == ""
    assert not (tmp_path / "jobs" / "slurm-1234.json").exists()
    assert slurm_hooks.forget_job(cfg, env, "epilog") == ""  # twice (a failed prolog, then the epilog)
    assert "SLURM_JOB_ID" in slurm_hooks.record_job(cfg, {"SLURM_JOB_ID": "../x"}, "prolog")
    (tmp_path / "file").write_text("")
    cfg2 = loads(f"collectors: {{jobs: {{state_dir: {tmp_path / 'file' / 'jobs'}}}}}\n")
    assert "not recorded" in slurm_hooks.record_job(cfg2, env, "prolog")  # a line for stderr, no exception


def test_registered_configured_documented() -> None:
    assert REGISTRY["jobs"] == "podhealth.collectors.jobs:create"
    assert factory("jobs").__module__ == "podhealth.collectors.jobs"
    assert Config().collectors.jobs.enabled and Config().collectors.jobs.dcgm_job_mapping_dir is None
    doc = (REPO / "docs" / "metrics.md").read_text(encoding="utf-8")
    section = doc.split("## jobs ", 1)[1].split("\n## ", 1)[0]
    assert set(JobsCollector.metrics) == set(re.findall(r"^\| (\w+) \|", section, re.M))


def _dra_container(cname: str, claim: str, devices: list[tuple[str, str, list[str]]]) -> bytes:
    """ContainerResources with one DynamicResource (field 5): ClaimResources (driver, device, CDI names)."""
    claims = b"".join(_field(4, b"".join(_field(1, _field(1, c)) for c in cdi) + _field(2, driver) + _field(3, "pool")
                                + _field(4, device)) for driver, device, cdi in devices)
    return _field(1, cname) + _field(5, _field(2, claim) + _field(3, "ml") + claims)


def test_dra_allocations_name_their_gpus() -> None:
    # NVIDIA's DRA driver: device names gpu-N (MIG: gpu-N-mig-...), CDI names that may carry the UUID;
    # another driver's device (a NIC) is not a GPU
    pod = _field(1, "train-1") + _field(2, "ml") + _field(3, _dra_container("main", "gpus", [
        ("gpu.nvidia.com", "gpu-5", ["k8s.gpu.nvidia.com/gpu=GPU-e"]),
        ("gpu.nvidia.com", "gpu-6-mig-1g.10gb-0", []),
        ("net.example.com", "eth1", [])]))
    got = podresources.parse_list_response(_field(1, pod))
    assert got == [podresources.PodDevices("ml", "train-1", "main", "dra:gpu.nvidia.com",
                                           ("gpu-5", "GPU-e", "gpu-6-mig-1g.10gb-0"), "ml/gpus")]
    from podhealth.collectors.jobs import gpu_of_device
    assert [gpu_of_device(d, {"GPU-e": 5}) for d in got[0].device_ids] == [5, 5, 6]
    assert gpu_of_device("eth1", {}) is None and gpu_of_device("GPU-unknown", {}) is None


def test_kubelet_dra_pods_on_gpus(tmp_path: Path, kubelet: tuple[Path, dict[str, object]]) -> None:
    sock, state = kubelet
    pod = _field(1, "train-1") + _field(2, "ml") + _field(3, _dra_container("main", "gpus", [
        ("gpu.nvidia.com", "gpu-1", [])]))
    state["answer"] = _field(1, pod)
    info, up = _info(_collector(tmp_path, sock, {}))
    assert info == {("1", "ml.train-1", "kubernetes", "", "ml", "train-1")} and up == {"kubelet": 1.0}
