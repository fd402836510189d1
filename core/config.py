"""podhealth's configuration schema: one YAML file, frozen typed models, a default for every key.

The agent reads `agent`-side sections; the aggregator reads `aggregator`; both share `log`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Mapping

from podhealth import credentials, yamldata
from podhealth.hostnames import node_name_problem
from podhealth.config_aggregator import AggregatorConfig, agent_keepalive
from podhealth.config_failslow import FailslowProbeConfig
from podhealth.config_listen import ListenConfig
from podhealth.config_policy import SITE_NAME, PolicyConfig, SiteCheckConfig
from podhealth.config_tls import AgentTlsConfig
from podhealth.configload import (
    AbsPath, ConfigError, Ge, Gt, Le, Percent, Port, Seconds, doc, load_file, load_text,
    render_default,
)

__all__ = ["Config", "ConfigError", "load", "loads", "default_yaml"]

# The hardware profiles: checks/data/profiles.yaml is the one list (checks/profiles.names() reads
# the same file); read here as data, so the schema refuses an unknown `node.profile` with file and
# line, and core imports nothing of checks.
PROFILES: tuple[str, ...] = tuple(yamldata.shipped("profiles.yaml")["profiles"])
if TYPE_CHECKING:
    Profile = str
else:
    Profile = Literal[PROFILES]


@dataclass(frozen=True)
class NodeConfig:
    name: str = doc("Node name reported to the aggregator; empty = this host's short hostname.", "")
    profile: Profile = doc("Hardware profile (SKU) the node is checked against.", "dgx-h100")

    def validate(self) -> tuple[str, str] | None:
        problem = node_name_problem(self.name) if self.name else None
        return ("name", problem) if problem else None


@dataclass(frozen=True)
class LogConfig:
    level: Literal["debug", "info", "warning", "error"] = doc("Log level.", "info")
    format: Literal["auto", "json", "console"] = doc(
        "auto: a readable console renderer on a TTY, JSON lines otherwise (journald).", "auto")


@dataclass(frozen=True)
class PathsConfig:
    sysfs_root: Annotated[Path, AbsPath()] = doc("Root of sysfs (a container mounts the host's elsewhere).", Path("/sys"))
    procfs_root: Annotated[Path, AbsPath()] = doc("Root of procfs.", Path("/proc"))
    kmsg: Annotated[Path, AbsPath()] = doc("Kernel log source: /dev/kmsg, or a file that is followed.", Path("/dev/kmsg"))
    nvml_library: str = doc("NVML shared library; empty = the system's libnvidia-ml.so.1.", "")
    dcgm_bindings: Annotated[Path, AbsPath()] = doc(
        "Where DCGM installs its Python bindings.", Path("/usr/share/datacenter-gpu-manager-4/bindings/python3"))


@dataclass(frozen=True)
class CollectorConfig:
    enabled: bool = doc("Run this collector.", True)
    interval: Seconds = doc("Seconds between collections.", 10.0)
    timeout: Seconds = doc("Seconds one collection may take before it is abandoned and marked stale.", 5.0)
    detail: Literal["basic", "full"] = doc(
        "What /metrics exports of this collector: basic thins the per-link / per-operation families\n"
        "(checks/data/export_detail.yaml says how), full exports every series. Checks see everything.", "basic")
    families: Mapping[str, Literal["basic", "full", "none"]] = doc(
        "Per-family switches over detail, by metric name without podhealth_ and _total\n"
        "(e.g. nvlink_errors: full, host_load1: none; `off` would be YAML for false).", factory=dict)

    def validate(self) -> tuple[str, str] | None:
        if self.timeout > self.interval * 10:
            return ("timeout", f"expected seconds <= 10x interval ({self.interval * 10:g}), got {self.timeout:g}")
        return None


@dataclass(frozen=True)
class InfinibandConfig(CollectorConfig):
    hw_counters: bool = doc("Also read every ports/*/hw_counters file (mlx5's extended counters: retransmits, "
                            "out-of-sequence, ICRC and timeout errors). Doubles the files read per port; "
                            "on a real HCA each read is a firmware query.", True)


@dataclass(frozen=True)
class NfsMount:
    path: Annotated[str, AbsPath()] = doc("Mount point that must be present and answer.", "/home")
    timeout: Seconds = doc("Seconds the statfs probe may take before the mount counts as hung.", 5.0)


@dataclass(frozen=True)
class NfsConfig(CollectorConfig):
    timeout: Seconds = doc("Seconds one collection may take; must exceed every mount's probe timeout.", 10.0)
    mounts: tuple[NfsMount, ...] = doc("NFS mounts this node needs.", factory=lambda: (NfsMount("/home"), NfsMount("/cm/shared")))

    def validate(self) -> tuple[str, str] | None:
        # A probe that outlives the collection would turn a hung mount (FAIL, fences) into a stale
        # collector (UNKNOWN, never fences): the hang must be reported within the collection.
        for i, m in enumerate(self.mounts):
            if m.timeout >= self.timeout:
                return ("timeout", f"expected seconds > mounts[{i}].timeout ({m.timeout:g}), got {self.timeout:g}: "
                        "a hung mount must be reported as hung, not as a stale collector")
        return super().validate()


@dataclass(frozen=True)
class HostConfig(CollectorConfig):
    units: tuple[str, ...] = doc(
        "systemd units whose state is exported (and, with checks.required_units, required).",
        factory=lambda: ("nvidia-fabricmanager.service", "nvidia-persistenced.service",
                         "nvidia-dcgm.service", "slurmd.service", "kubelet.service"))
    disk_paths: tuple[str, ...] = doc("Filesystems whose usage is exported.", factory=lambda: ("/",))


@dataclass(frozen=True)
class KmsgConfig(CollectorConfig):
    interval: Seconds = doc("Seconds between reads of new kernel log lines from a followed file, and\n"
                            "between polls of NVML's XID events.", 1.0)
    watched_interval: Seconds = doc(
        "Seconds between collections while the kernel log is watched (/dev/kmsg: each record is read\n"
        "as it arrives). NVML's XID events, which then only confirm kernel lines, wait this long.", 5.0)
    keep_events: Annotated[int, Gt(0, "a count")] = doc("Recent XID/SXid events kept in memory.", 256)
    from_start: bool = doc("Read the kernel log from its beginning (else only lines from now on).", True)


@dataclass(frozen=True)
class DcgmConfig(CollectorConfig):
    enabled: bool = doc("Use DCGM's profiling fields when its bindings and nv-hostengine are there.", True)
    hostengine: str = doc("nv-hostengine address.", "127.0.0.1:5555")


@dataclass(frozen=True)
class JobsConfig(CollectorConfig):
    interval: Seconds = doc("Seconds between reads of which job holds each GPU.", 5.0)
    state_dir: Annotated[Path, AbsPath()] = doc(
        "Where podhealth-slurm-prolog records each job's GPUs (one file per job; the epilog removes it).",
        Path("/run/podhealth/jobs"))
    pod_resources_socket: Annotated[Path, AbsPath()] = doc(
        "The kubelet's PodResources API (gRPC; needs podhealth[podresources]); skipped when the socket is absent.",
        Path("/var/lib/kubelet/pod-resources/kubelet.sock"))
    dcgm_job_mapping_dir: Annotated[Path, AbsPath()] | None = doc(
        "Write dcgm-exporter's HPC job-mapping files here (one file per GPU index naming its jobs, as\n"
        "`dcgm-exporter --hpc-job-mapping-dir` reads them); null = do not write.", None)


@dataclass(frozen=True)
class CollectorsConfig:
    nvml: CollectorConfig = doc("GPU state through NVML.", factory=CollectorConfig)
    nvlink: CollectorConfig = doc("NVLink state and error counters through NVML.", factory=CollectorConfig)
    infiniband: "InfinibandConfig" = doc("InfiniBand ports from <sysfs_root>/class/infiniband.",
                                         factory=lambda: InfinibandConfig())
    nfs: NfsConfig = doc("NFS mounts from <procfs_root>/self/mountstats and a statfs probe "
                         "(one long-lived helper process per mount).", factory=NfsConfig)
    host: HostConfig = doc("CPU, memory, disk, load, uptime and systemd units.", factory=HostConfig)
    kmsg: KmsgConfig = doc("XID/SXid lines from the kernel log, and NVML XID events.", factory=KmsgConfig)
    dcgm: DcgmConfig = doc("DCGM profiling fields (optional).", factory=DcgmConfig)
    pcie_aer: CollectorConfig = doc("PCIe AER counters from <sysfs_root>/bus/pci/devices/*/aer_*.",
                                    factory=lambda: CollectorConfig(interval=30.0))
    edac: CollectorConfig = doc("Host memory ECC counters from <sysfs_root>/devices/system/edac/mc.",
                                factory=lambda: CollectorConfig(interval=30.0))
    nvme: CollectorConfig = doc("NVMe controllers from <sysfs_root>/class/nvme and `nvme smart-log -o json`\n"
                                "when nvme-cli is installed.", factory=lambda: CollectorConfig(interval=60.0, timeout=10.0))
    jobs: JobsConfig = doc("Which Slurm job or Kubernetes pod holds each GPU (prolog records, cgroups, kubelet).",
                           factory=JobsConfig)
    imex: CollectorConfig = doc("IMEX daemon and domain state from nvidia-imex-ctl (-q, -N -j) on multi-node NVLink\n"
                                "systems (GB200 NVL72); disabled where the tool is not installed.",
                                factory=lambda: CollectorConfig(interval=30.0, timeout=10.0))


@dataclass(frozen=True)
class InfluxConfig:
    enabled: bool = doc("Push samples to an InfluxDB v2 write endpoint.", False)
    url: str = doc("InfluxDB (or VictoriaMetrics) base URL.", "http://127.0.0.1:8086")
    org: str = doc("InfluxDB organisation.", "podhealth")
    bucket: str = doc("InfluxDB bucket.", "podhealth")
    token: str = doc("InfluxDB token.", "")
    batch_size: Annotated[int, Gt(0, "a count")] = doc("Points per write.", 5000)
    flush_interval: Seconds = doc("Seconds between flushes.", 10.0)
    buffer_points: Annotated[int, Gt(0, "a count")] = doc("Points kept while the endpoint is away (oldest dropped, counted).", 200000)


@dataclass(frozen=True)
class DcgmExporterCompatConfig:
    hostname_label: Literal["Hostname", "hostname"] = doc(
        "Name of the host label on the DCGM_FI_* series: `Hostname` as the released dcgm-exporter\n"
        "(4.x) names it; `hostname` as its main branch has renamed it (set it when you upgrade).",
        "Hostname")


@dataclass(frozen=True)
class ExportersConfig:
    influxdb: InfluxConfig = doc("InfluxDB v2 export.", factory=InfluxConfig)
    compat: tuple[Literal["dcgm-exporter"], ...] = doc(
        "Also expose the GPU series on /metrics under these exporters' names and labels\n"
        "(dcgm-exporter: DCGM_FI_*; the same as `podhealth agent --compat`).", ())
    dcgm_exporter: DcgmExporterCompatConfig = doc("How the dcgm-exporter names are rendered.",
                                                  factory=DcgmExporterCompatConfig)


@dataclass(frozen=True)
class PublishConfig:
    aggregator_url: str = doc("Aggregator base URL for pushing events; empty = do not push.", "")
    aggregators: tuple[str, ...] = doc(
        "Aggregator replicas' base URLs (instead of aggregator_url). Each node starts at its own pick\n"
        "among them and fails over in its own order (a stable hash of its name with each URL), so the\n"
        "fleet's pushes are spread over the replicas; it keeps to the one that answers and moves on\n"
        "when it does not; the spool keeps everything while none answers.", ())
    token: str = doc(
        "Bearer token for the aggregator: this node's own (`podhealth token derive --node NAME`).\n"
        "Also from token_file or $PODHEALTH_NODE_TOKEN.", "")
    token_file: str = doc("File holding token (keep it 0600 / 0640 root:podhealth).", "")
    spool_dir: Annotated[Path, AbsPath()] = doc("Where events wait while the aggregator is away.", Path("/var/lib/podhealth/spool"))
    spool_max_bytes: Annotated[int, Gt(0, "bytes")] = doc(
        "Spool size bound (both lanes: transitions and fatal events in spool_dir/priority, the rest\n"
        "in spool_dir); when full, the oldest routine records are summarised first, and priority\n"
        "records only ever to make room for newer priority records.", 64 * 1024 * 1024)
    timeout: Seconds = doc("Seconds per push request.", 5.0)
    report_interval: Seconds = doc(
        "Seconds between full node reports pushed as a heartbeat (transitions are pushed at once;\n"
        "a full report also retires checks that disappeared, e.g. start-up placeholders).\n"
        "While no verdict changes, a heartbeat is a small lease naming the last full report.", 30.0)
    full_report_interval: Seconds = doc(
        "Seconds after which a heartbeat carries the full report even though no verdict changed,\n"
        "so the evidence the aggregator shows stays this fresh.", 300.0)

    def keepalive(self) -> float:
        """Seconds an idle connection to the aggregator is kept: past the next heartbeat (agent/heartbeat.py)."""
        return agent_keepalive(self.report_interval)

    def urls(self) -> tuple[str, ...]:
        """Where to push: `aggregators`, else `aggregator_url` (empty: do not push)."""
        return self.aggregators or ((self.aggregator_url,) if self.aggregator_url else ())

    def validate(self) -> tuple[str, str] | None:
        for u in self.aggregators:
            if not u.startswith(("http://", "https://")):
                return ("aggregators", f'expected http(s):// base URLs, got "{u}"')
        return credentials.secret_problem(self.token, self.token_file, "token")

    def resolved(self) -> "PublishConfig":
        """A copy with the token read from token_file or $PODHEALTH_NODE_TOKEN (once, at start)."""
        token = credentials.read_secret(self.token, self.token_file, "PODHEALTH_NODE_TOKEN")
        return dataclasses.replace(self, token=token, token_file="")


@dataclass(frozen=True)
class DampingConfig:
    fail_after: Annotated[int, Ge(1, "a count")] = doc("Consecutive failing evaluations before a check turns FAIL.", 2)
    recover_after: Annotated[int, Ge(1, "a count")] = doc("Consecutive passing evaluations before a FAIL turns OK.", 3)


@dataclass(frozen=True)
class ChecksConfig:
    damping: DampingConfig = doc("Flap damping.", factory=DampingConfig)
    required_units: tuple[str, ...] = doc("systemd units that must be active (empty = none required).", ())
    overrides: Mapping[str, Any] = doc("Per-site overrides of the hardware profile (any profile key).", factory=dict)
    profile_file: Annotated[Path, AbsPath()] | None = doc(
        "A site golden profile (YAML) that `extends` a shipped profile (`podhealth profile capture`\n"
        "writes one); when set it replaces node.profile, and overrides still apply on top.", None)
    rate_window: Seconds = doc("Seconds over which counter rates (ECC, IB errors, retransmissions) are judged.", 300.0)
    max_series: Annotated[int, Gt(0, "a count")] = doc(
        "Counter series (and InfiniBand ports) whose history the checks keep; past it the longest\n"
        "unseen is forgotten first. A series not seen for two rate windows is forgotten anyway\n"
        "(its port, mount or GPU went away). A DGX node has ~1,000.", 20000)
    grace: Annotated[float, Ge(0, "seconds")] = doc(
        "Seconds after boot (btime in <procfs_root>/stat) and after the agent sees the driver version\n"
        "change during which non-fatal FAILs show as WARN (evidence: grace, held); fatal facts\n"
        "(checks/data/rules.yaml `immediate`: XID 79, DBE, row-remap failure, lost GPU) never wait.\n"
        "0 = no grace.", 300.0)
    agents: Mapping[str, str] = doc(
        "Agent base URLs by node name for `podhealth check --node`; a node not listed is\n"
        "reached as http://<node>:<agent_port> (DNS).", factory=dict)
    agent_port: Port = doc("Agent port used when a node's URL comes from DNS.", 9410)
    handover_active: Literal["auto", "always", "never"] = doc(
        "Run the short active tests (burn-in, NCCL) in the handover suite: auto = when CUDA is usable.", "auto")
    slurm_drain: Literal["auto", "always", "never"] = doc(
        "Whether podhealth-slurm-healthcheck (HealthCheckProgram) drains a failing node and resumes\n"
        "the nodes it drained: auto = only when publish.aggregator_url/aggregators is empty (otherwise the\n"
        "aggregator owns drain and release). Prolog/epilog failures always drain (Slurm does too).", "auto")
    healthcheck_budget: Annotated[float, Gt(0, "seconds"), Le(50, "seconds")] = doc(
        "Seconds podhealth-slurm-healthcheck may take (slurmd kills it after 60).", 10.0)
    prolog_budget: Annotated[float, Gt(0, "seconds"), Le(60, "seconds")] = doc(
        "Seconds podhealth-slurm-prolog / -epilog may take (passive checks only).", 5.0)
    site: Mapping[str, SiteCheckConfig] = doc(
        "The site's own checks: programs the agent runs (exit 0 OK, 1 FAIL, 2 UNKNOWN; the first line of\n"
        "stdout is the summary), judged as check `site_<name>` (docs/site.md; examples/checks/).", factory=dict)
    policy: PolicyConfig = doc("The site's policy over the shipped XID/SXid catalogs and rule thresholds "
                               "(docs/site.md).", factory=PolicyConfig)

    def validate(self) -> tuple[str, str] | None:
        for node in self.agents:
            problem = node_name_problem(node)
            if problem:
                return ("agents", problem)
        for name in self.site:
            if not SITE_NAME.match(name):
                return (f"site.{name}", "expected a name of lower-case letters, digits and _ (at most 40, "
                        "starting with a letter)")
        return None


@dataclass(frozen=True)
class BurninConfig:
    duration: Seconds = doc("Seconds of GEMM stress (split between bf16 and fp32).", 60.0)
    size: Annotated[int, Ge(0, "a matrix size")] = doc("Matrix size n (0 = 8192 on a GPU, 160 on CPU stand-ins).", 0)
    watcher: Literal["nvml", "metrics", "none"] = doc(
        "Telemetry during the run: NVML directly, or the local agent's /metrics.", "nvml")
    metrics_url: str = doc("Agent /metrics URL for watcher: metrics.", "http://127.0.0.1:9410/metrics")


@dataclass(frozen=True)
class DcgmDiagConfig:
    dcgmi: str = doc("dcgmi binary (name on PATH or absolute path).", "dcgmi")
    level: Annotated[int, Ge(1, "a run level"), Le(4, "a run level")] = doc("Default `dcgmi diag -r` level.", 1)
    timeout_r1: Seconds = doc("Seconds `dcgmi diag -r 1` may take.", 120.0)
    timeout_r2: Seconds = doc("Seconds `dcgmi diag -r 2` may take.", 900.0)
    timeout_r3: Seconds = doc("Seconds `dcgmi diag -r 3` may take.", 3600.0)
    timeout_r4: Seconds = doc("Seconds `dcgmi diag -r 4` may take.", 7200.0)


@dataclass(frozen=True)
class NcclCheckConfig:
    all_reduce_perf: str = doc("nccl-tests all_reduce_perf binary; empty = podhealth's torch.distributed runner.", "")
    min_bytes: Annotated[int, Gt(0, "bytes")] = doc("Smallest all-reduce size.", 1 << 20)
    max_bytes: Annotated[int, Gt(0, "bytes")] = doc("Largest all-reduce size (the gate reads the top sizes).", 1 << 30)
    timeout: Seconds = doc("Seconds one all-reduce run (or one pair test) may take.", 600.0)
    fleet_median_gbps: Annotated[float, Ge(0, "GB/s")] = doc(
        "In-node bus bandwidth fleet median for the WARN rule (0 = no median).", 0.0)
    fleet_slow_pct: Percent = doc("WARN (and, for pairs, suspect) when this % below the median.", 10.0)
    pair_busbw_gbps: Annotated[float, Ge(0, "GB/s")] = doc(
        "Two-node bus bandwidth gate for pair tests and multi-node output, overriding the profile's\n"
        "thresholds.nccl_multinode_busbw_gbps (0 = the profile's; a profile without one makes a\n"
        "completed GPU run UNKNOWN, never PASS).", 0.0)
    srun: str = doc("srun binary for multi-node pair tests.", "srun")
    partition: str = doc("Slurm partition for pair tests (empty = the default).", "")
    python: str = doc("Python on the compute nodes for the runner (empty = this interpreter's path).", "")


@dataclass(frozen=True)
class ActiveConfig:
    burnin: BurninConfig = doc("GPU burn-in (`podhealth burnin`).", factory=BurninConfig)
    dcgm: DcgmDiagConfig = doc("DCGM diagnostics (`podhealth dcgm-diag`).", factory=DcgmDiagConfig)
    nccl: NcclCheckConfig = doc("NCCL all-reduce tests (`podhealth nccl`).", factory=NcclCheckConfig)


@dataclass(frozen=True)
class GpuResetConfig:
    command: tuple[str, ...] = doc(
        "argv of the GPU reset POST /v1/gpu-reset runs (the aggregator's remediation ladder asks for it);\n"
        "{gpu} becomes the GPU index. The agent first refuses while NVML lists a compute process on\n"
        "the GPU. `podhealth agent --simulate` points it at `podhealth simulate gpu-reset`.",
        ("nvidia-smi", "-r", "-i", "{gpu}"))
    timeout: Seconds = doc("Seconds the reset may take before it is killed (and answered 500).", 120.0)

    def validate(self) -> tuple[str, str] | None:
        if not self.command:
            return ("command", "expected the reset command's argv, got an empty list")
        return None


@dataclass(frozen=True)
class AuthConfig:
    token: str = doc(
        "This node's agent key (`podhealth token derive --agent --node NAME`): requests to the handover\n"
        "suite, GPU reset and evidence bundle must be signed with it, and the agent proves its answers\n"
        "with it (core/nodeproof.py; docs/security.md). Also from token_file, $PODHEALTH_AGENT_TOKEN,\n"
        "else /etc/podhealth/agent.key (what `install-units` writes). With none, those routes are closed.", "")
    token_file: str = doc("File holding token (0640 root:podhealth: root's hooks read it too).", "")

    def validate(self) -> tuple[str, str] | None:
        return credentials.secret_problem(self.token, self.token_file, "token")

    def resolved(self) -> "AuthConfig":
        """A copy with the key read from token_file or $PODHEALTH_AGENT_TOKEN, else from
        /etc/podhealth/agent.key when this user may read it (once, at start)."""
        token = credentials.read_secret(self.token, self.token_file, "PODHEALTH_AGENT_TOKEN")
        if not token:
            token = credentials.read_key_file(credentials.DEFAULT_AGENT_KEY_FILE)
        return dataclasses.replace(self, token=token, token_file="")


@dataclass(frozen=True)
class Config:
    node: NodeConfig = doc("This node.", factory=NodeConfig)
    log: LogConfig = doc("Logging.", factory=LogConfig)
    paths: PathsConfig = doc("Where the agent reads the system from.", factory=PathsConfig)
    listen: ListenConfig = doc("HTTP server (/metrics, /health, POST /v1/handover).", factory=ListenConfig)
    collectors: CollectorsConfig = doc("Collectors, each with its own interval and timeout.", factory=CollectorsConfig)
    exporters: ExportersConfig = doc("Where samples are pushed besides /metrics.", factory=ExportersConfig)
    publish: PublishConfig = doc("Pushing verdict transitions and XID events to the aggregator.", factory=PublishConfig)
    checks: ChecksConfig = doc("Health checks.", factory=ChecksConfig)
    active: ActiveConfig = doc("Active tests run on demand: burn-in, DCGM diagnostics, NCCL.", factory=ActiveConfig)
    failslow: FailslowProbeConfig = doc("Fail-slow probes on an idle node, judged by the aggregator (docs/failslow.md).",
                                        factory=FailslowProbeConfig)
    auth: AuthConfig = doc("Agent API authentication.", factory=AuthConfig)
    tls: AgentTlsConfig = doc(
        "TLS to the aggregator (https:// in publish.aggregator_url / aggregators): the CA that verifies\n"
        "it, and this node's client certificate (docs/security.md, TLS).", factory=AgentTlsConfig)
    gpu_reset: GpuResetConfig = doc("POST /v1/gpu-reset: how this node resets one GPU.", factory=GpuResetConfig)
    aggregator: AggregatorConfig = doc("The central aggregator (podhealth aggregator).", factory=AggregatorConfig)


def loads(text: str, source: str = "<config>") -> Config:
    cfg: Config = load_text(Config, text, source)
    return cfg


def load(path: Path | str) -> Config:
    cfg: Config = load_file(Config, path)
    return cfg


def default_yaml() -> str:
    head = "# podhealth configuration. Every key is optional; shown are the defaults.\n"
    return head + render_default(Config()) + "\n"
