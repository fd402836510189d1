"""jobs: which Slurm job or Kubernetes pod holds each GPU on this node.

Sources, each optional; one that is absent or unreadable makes its jobs "unknown", never an
error verdict (`job_source_up` says which could be read):
- `records`: the files `podhealth-slurm-prolog` writes into collectors.jobs.state_dir (see
  job_records.py; the epilog removes them). slurmd gives the prolog SLURM_JOB_GPUS / the host's
  CUDA_VISIBLE_DEVICES, so the GPU indices are the host's.
- `cgroup`: for a Slurm job without a record (the prolog hook is not installed), cgroup v1's
  `<sysfs_root>/fs/cgroup/devices/slurm*/uid_<uid>/job_<id>/devices.list`, where Slurm's
  task/cgroup plugin allows the job's own /dev/nvidiaN (char major 195, minor N). cgroup v2
  enforces devices with eBPF and has no readable list: there the records are the source.
- `processes`: on a cgroup v2 Slurm node (`<sysfs_root>/fs/cgroup/system.slice/slurmstepd.scope`),
  for GPUs no record names: the GPU's processes from NVML, each placed in its job by the
  `job_<id>` in `<procfs_root>/<pid>/cgroup` (its user from the pid's status Uid). A job whose
  GPUs run no process yet is not seen this way; the prolog's record is the exact source.
- `kubelet`: the kubelet's PodResources API (podresources.py, grpcio optional): pods holding
  `nvidia.com/gpu`, whose device ids (GPU UUIDs) are turned into indices through NVML.

Series: `gpu_job_info{gpu, job_id, scheduler, user | namespace, pod}` 1 per (GPU, job), and
`job_source_up{source}`. The agent adds the job to /health evidence, events, and optionally
dcgm-exporter's job-mapping files (agent/jobmap.py).
"""

from __future__ import annotations

import os
import pwd
import re
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Mapping

from podhealth.collectors import job_records, podresources
from podhealth.collectors.base import Collection, specs
from podhealth.collectors.job_records import JobRecord
from podhealth.config import Config
from podhealth.vocab import MetricSpec, Sample

if TYPE_CHECKING:
    from podhealth.collectors.nvml_session import NvmlSession

METRICS: Mapping[str, MetricSpec] = specs(
    MetricSpec("gpu_job_info", "gauge",
               "1 per GPU and the job using it (labels job_id, scheduler slurm|kubernetes, user, namespace, pod)."),
    MetricSpec("job_source_up", "gauge",
               "Whether a job source could be read (source records|cgroup|processes|kubelet): 0 = its jobs are unknown."),
)

NVIDIA_MAJOR = 195  # /dev/nvidiaN is char 195:N; 195:255 is nvidiactl, 195:254 nvidia-modeset
_DEVICE_LINE = re.compile(r"^([abc])\s+(\*|\d+):(\*|\d+)\s+[rwm]+$")
_JOB_DIR = re.compile(r"^job_([0-9]{1,20})$")
_UID_DIR = re.compile(r"^uid_([0-9]{1,10})$")
_CGROUP_JOB = re.compile(r"/job_([0-9]{1,20})(?:/|$)")
_STATUS_UID = re.compile(r"^Uid:\s+([0-9]+)", re.M)
UuidMap = Callable[[], Mapping[str, int]]
GpuPids = Callable[[], Mapping[int, list[int]]]


def parse_devices_list(text: str) -> tuple[int, ...] | None:
    """cgroup v1 devices.list -> the NVIDIA GPU minors it allows; None when it allows every
    device ("a *:* rwm": no device confinement, so the GPUs are unknown)."""
    gpus: set[int] = set()
    for line in text.splitlines():
        m = _DEVICE_LINE.match(line.strip())
        if not m:
            continue
        kind, major, minor = m.groups()
        if kind == "a" or (major == "*" and minor == "*"):
            return None
        if kind == "c" and major == str(NVIDIA_MAJOR) and minor.isdigit() and int(minor) < 254:
            gpus.add(int(minor))
    return tuple(sorted(gpus))


def parse_proc_cgroup(text: str) -> str | None:
    """<procfs_root>/<pid>/cgroup -> the Slurm job id the process runs in, or None.
    v2: `0::/system.slice/slurmstepd.scope/job_1234/step_0/user/task_0`;
    v1: `4:devices:/slurm/uid_1000/job_1234/step_0/task_0`."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        m = _CGROUP_JOB.search(path)
        if m:
            return m.group(1)
    return None


def parse_status_uid(text: str) -> int | None:
    m = _STATUS_UID.search(text)
    return int(m.group(1)) if m else None


def user_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return str(uid)


class JobsCollector:
    name: ClassVar[str] = "jobs"
    metrics: ClassVar[Mapping[str, MetricSpec]] = METRICS

    def __init__(self, state_dir: Path, cgroup_devices: Path, pod_socket: Path, timeout: float,
                 uuid_map: UuidMap | None = None, *, slurm_v2_scope: Path | None = None,
                 procfs_root: Path = Path("/proc"), gpu_pids: GpuPids | None = None) -> None:
        self.state_dir = state_dir
        self.cgroup_devices = cgroup_devices
        self.slurm_v2_scope = slurm_v2_scope
        self.procfs_root = procfs_root
        self.gpu_pids = gpu_pids
        self.pod_socket = pod_socket
        self.timeout = timeout
        self.uuid_map = uuid_map

    # ---- sources: each returns its records, or raises for "unknown" -----------------------------

    def _records(self, errors: list[str]) -> list[JobRecord]:
        recs, errs = job_records.read_records(self.state_dir)
        errors.extend(errs)
        return recs

    def _cgroup(self, errors: list[str]) -> list[JobRecord] | None:
        """Slurm jobs under cgroup v1; None when there is no such hierarchy (not an error)."""
        try:
            tops = sorted(n for n in os.listdir(self.cgroup_devices) if n == "slurm" or n.startswith("slurm_"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not tops:
            return None
        out: list[JobRecord] = []
        for top in tops:
            for uid_dir in sorted(os.listdir(self.cgroup_devices / top)):
                um = _UID_DIR.match(uid_dir)
                if not um:
                    continue
                for job_dir in sorted(os.listdir(self.cgroup_devices / top / uid_dir)):
                    jm = _JOB_DIR.match(job_dir)
                    if not jm:
                        continue
                    path = self.cgroup_devices / top / uid_dir / job_dir / "devices.list"
                    try:
                        gpus = parse_devices_list(path.read_text(errors="replace"))
                    except FileNotFoundError:
                        continue  # the job ended while we walked
                    if gpus is None:
                        errors.append(f"{path}: every device allowed (GPUs of job {jm.group(1)} unknown)")
                        continue
                    if gpus:
                        out.append(JobRecord("slurm", jm.group(1), gpus, user_of(int(um.group(1)))))
        return out

    def _processes(self, known: set[int]) -> list[JobRecord] | None:
        """Slurm jobs of the processes on GPUs that no record names (cgroup v2 nodes); None when
        this is not a cgroup v2 Slurm node. Raises when NVML cannot list the processes."""
        if self.gpu_pids is None or self.slurm_v2_scope is None or not self.slurm_v2_scope.is_dir():
            return None
        jobs: dict[str, tuple[set[int], str]] = {}
        for gpu, pids in sorted(self.gpu_pids().items()):
            if gpu in known:
                continue
            for pid in pids:
                try:
                    job = parse_proc_cgroup((self.procfs_root / str(pid) / "cgroup").read_text(errors="replace"))
                    uid = parse_status_uid((self.procfs_root / str(pid) / "status").read_text(errors="replace"))
                except (FileNotFoundError, ProcessLookupError):
                    continue  # the process ended
                if job is None:
                    continue  # not a Slurm job's process (an operator's nvidia-smi, a daemon)
                gpus, user = jobs.setdefault(job, (set(), user_of(uid) if uid is not None else ""))
                gpus.add(gpu)
        return [JobRecord("slurm", j, tuple(sorted(g)), u) for j, (g, u) in sorted(jobs.items())]

    def _kubelet(self) -> list[JobRecord] | None:
        """GPU pods from the kubelet; None when there is no kubelet socket (not a Kubernetes node)."""
        if not self.pod_socket.exists():
            return None
        pods = podresources.list_gpu_pods(self.pod_socket, self.timeout)
        if not pods:
            return []
        index = self.uuid_map() if self.uuid_map is not None else {}
        out: list[JobRecord] = []
        for p in pods:
            gpus: set[int] = set()
            for dev in p.device_ids:
                gpu = gpu_of_device(dev, index)
                if gpu is not None:
                    gpus.add(gpu)
            if gpus:
                out.append(JobRecord("kubernetes", _pod_id(p.namespace, p.pod),
                                     tuple(sorted(gpus)), namespace=p.namespace, pod=p.pod))
        return out

    # ---- collect ---------------------------------------------------------------------------------

    def collect(self) -> Collection:
        errors: list[str] = []
        samples: list[Sample] = []
        jobs: list[JobRecord] = []
        up: dict[str, bool] = {}

        try:
            recs = self._records(errors)
            if recs or self.state_dir.exists():  # no directory: no prolog records jobs on this node
                up["records"] = True
            jobs.extend(recs)
        except OSError as e:
            up["records"] = False
            errors.append(f"{self.state_dir}: {e.strerror or e}")

        try:
            cg = self._cgroup(errors)
            if cg is not None:
                up["cgroup"] = True
                known = {(r.scheduler, r.job_id) for r in jobs}
                jobs.extend(r for r in cg if (r.scheduler, r.job_id) not in known)
        except OSError as e:
            up["cgroup"] = False
            errors.append(f"{self.cgroup_devices}: {e.strerror or e}")

        try:
            procs = self._processes({g for r in jobs for g in r.gpus})
            if procs is not None:
                up["processes"] = True
                known_ids = {(r.scheduler, r.job_id) for r in jobs}
                jobs.extend(r for r in procs if (r.scheduler, r.job_id) not in known_ids)
        except Exception as e:  # noqa: BLE001 - NVML errors come in many types; any of them is "unknown"
            up["processes"] = False
            errors.append(f"GPU processes: {type(e).__name__}: {e}")

        try:
            kube = self._kubelet()
            if kube is not None:
                up["kubelet"] = True
                jobs.extend(kube)
        except podresources.GrpcMissing as e:
            up["kubelet"] = False
            errors.append(str(e))
        except (OSError, ValueError) as e:  # TimeoutError is an OSError
            up["kubelet"] = False
            errors.append(f"{self.pod_socket}: {e or type(e).__name__}")

        for source, ok in sorted(up.items()):
            samples.append(Sample.of("job_source_up", 1.0 if ok else 0.0, source=source))
        seen: set[tuple[int, str, str]] = set()
        for r in jobs:
            for g in r.gpus:
                if (g, r.scheduler, r.job_id) in seen:
                    continue
                seen.add((g, r.scheduler, r.job_id))
                samples.append(Sample.of("gpu_job_info", 1.0, gpu=g, job_id=r.job_id, scheduler=r.scheduler,
                                         user=r.user or None, namespace=r.namespace or None, pod=r.pod or None))
        return Collection(tuple(samples), errors=tuple(errors[:32]))

    def close(self) -> None:
        pass


def _pod_id(namespace: str, pod: str) -> str:
    """A pod's job id: namespace/name when it fits a label and a file name, else the name alone."""
    joined = f"{namespace}.{pod}"
    return joined if job_records.valid_job_id(joined) else (pod if job_records.valid_job_id(pod) else "pod")


_DRA_GPU = re.compile(r"gpu-(\d{1,3})(?:-mig-.*)?$")


def gpu_of_device(dev: str, index: dict[str, int]) -> int | None:
    """The GPU index a kubelet device id names: an index (the device plugin's
    --device-id-strategy=index), a UUID (GPU-..., the default), a MIG UUID the map knows, or NVIDIA's
    DRA driver's device name (gpu-3, gpu-3-mig-1g.10gb-...: the GPU's index, a MIG slice's parent)."""
    if dev.isdigit():
        return int(dev)
    if dev in index:
        return index[dev]
    m = _DRA_GPU.match(dev)
    return int(m.group(1)) if m else None


def nvml_uuid_map(library_path: str) -> UuidMap:
    """UUID -> index from the agent's shared NVML session (the kubelet names GPUs by UUID)."""
    def read() -> Mapping[str, int]:
        from podhealth.collectors.nvml_session import shared

        session = shared(library_path)
        session.acquire()
        try:
            _, devices = session.devices()
            return {d.identity.uuid: d.index for d in devices if d.identity.uuid}
        finally:
            session.release()
    return read


def nvml_gpu_pids(library_path: str, session: "NvmlSession | None" = None) -> GpuPids:
    """GPU index -> PIDs of its compute and graphics processes, from the agent's NVML session."""
    def read() -> Mapping[int, list[int]]:
        import pynvml

        from podhealth.collectors.nvml_session import shared

        s = session if session is not None else shared(library_path)
        s.acquire()
        try:
            out: dict[int, list[int]] = {}
            _, devices = s.devices()
            for d in devices:
                if d.handle is None:
                    continue
                procs = list(pynvml.nvmlDeviceGetComputeRunningProcesses(d.handle))
                procs += pynvml.nvmlDeviceGetGraphicsRunningProcesses(d.handle)
                out[d.index] = sorted({int(p.pid) for p in procs})
            return out
        finally:
            s.release()
    return read


def create(cfg: Config, *, uuid_map: UuidMap | None = None, gpu_pids: GpuPids | None = None,
           **_seams: object) -> JobsCollector:
    jc = cfg.collectors.jobs
    cgroup = cfg.paths.sysfs_root / "fs" / "cgroup"
    return JobsCollector(jc.state_dir, cgroup / "devices", jc.pod_resources_socket,
                         timeout=max(0.5, jc.timeout - 0.5),
                         uuid_map=uuid_map if uuid_map is not None else nvml_uuid_map(cfg.paths.nvml_library),
                         slurm_v2_scope=cgroup / "system.slice" / "slurmstepd.scope",
                         procfs_root=cfg.paths.procfs_root,
                         gpu_pids=gpu_pids if gpu_pids is not None else nvml_gpu_pids(cfg.paths.nvml_library))


def records_from_samples(samples: "list[Sample] | tuple[Sample, ...]") -> dict[int, list[JobRecord]]:
    """The collector's gpu_job_info samples back into GPU -> jobs (for the agent's evidence)."""
    out: dict[int, list[JobRecord]] = {}
    for s in samples:
        if s.name != "gpu_job_info":
            continue
        try:
            g = int(s.label("gpu"))
        except ValueError:
            continue
        sched = s.label("scheduler")
        if sched not in job_records.SCHEDULERS:
            continue
        out.setdefault(g, []).append(JobRecord(sched, s.label("job_id"), (g,), s.label("user"),  # type: ignore[arg-type]
                                               s.label("namespace"), s.label("pod")))
    return out
