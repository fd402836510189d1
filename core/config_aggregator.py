"""The aggregator's section of the config file (`aggregator:`), as frozen typed models.

It lives in core, beside core/config.py which embeds it, because the schema is vocabulary every
layer may read (the fencers take their settings from it, `podhealth token` validates node names
with it) while the aggregator itself sits on top. Keep it light: no aiohttp, no sqlite, nothing
that imports podhealth.config back.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

from podhealth import credentials
from podhealth.hostnames import node_name_problem
from podhealth.config_failslow import FailslowAggConfig
from podhealth.config_federation import FederationConfig
from podhealth.config_listen import ListenConfig
from podhealth.config_tls import ServerTlsConfig
from podhealth.netaddr import is_loopback_address
from podhealth.configload import AbsPath, Ge, Gt, NonEmpty, Percent, Seconds, doc

ActionName = Literal["NONE", "RESTART_APP", "RESET_GPU", "DRAIN", "REBOOT", "REPLACE"]
Severity = Literal["info", "warning", "critical"]
Do = Literal["notify", "fence", "fence_and_reboot"]
SEVERITY_RANK: Mapping[str, int] = {"info": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class AggAuthConfig:
    cluster_secret: str = doc(
        "Secret each node's ingest token is derived from: HMAC-SHA256(secret, \"podhealth-node:\" + node),\n"
        "hex (`podhealth token derive --node NAME`). Such a token speaks only for its own node; the\n"
        "secret itself is never accepted as a token. Also from cluster_secret_file or $PODHEALTH_CLUSTER_SECRET.", "")
    cluster_secret_file: str = doc("File holding cluster_secret (keep it 0600 / 0640 root:podhealth).", "")
    node_tokens: Mapping[str, str] = doc("Per-node ingest tokens (node name -> token); such a token only speaks for its node.", factory=dict)
    cluster_token: str = doc(
        "Shared bearer token for central senders: Alertmanager's webhook (/v1/alertmanager). Agents\n"
        "cannot use it unless cluster_token_for_agents. Also from cluster_token_file or $PODHEALTH_CLUSTER_TOKEN.", "")
    cluster_token_file: str = doc("File holding cluster_token.", "")
    cluster_token_for_agents: bool = doc(
        "UNSAFE, for migration only: accept cluster_token on /v1/reports and /v1/events for any node, so\n"
        "every holder can report for (and so get fenced) every node. Nodes it teaches the aggregator\n"
        "do not count in the breaker's fleet.", False)
    admin_token: str = doc(
        "Bearer token for fence/release/breaker reset; empty = those endpoints are disabled.\n"
        "Also from admin_token_file or $PODHEALTH_ADMIN_TOKEN.", "")
    admin_token_file: str = doc("File holding admin_token.", "")
    agent_token: str = doc(
        "One bearer token the aggregator presents to every agent (/v1/handover, GPU resets, bundles;\n"
        "never with a pull of the open /health): their auth.token. UNSAFE, for migration: root on any\n"
        "node reads it and can reset GPUs on every other. Leave it empty and, with cluster_secret set,\n"
        "each agent gets its own (`podhealth token derive --agent --node NAME`).\n"
        "Also from agent_token_file or $PODHEALTH_AGENT_TOKEN.", "")
    agent_token_file: str = doc("File holding agent_token.", "")

    def validate(self) -> tuple[str, str] | None:
        for name, token in self.node_tokens.items():
            problem = node_name_problem(name)
            if problem:
                return ("node_tokens", problem)
            if not token:
                return ("node_tokens", f"empty token for node {name}")
        for what in _SECRETS:
            secret = credentials.secret_problem(getattr(self, what), getattr(self, f"{what}_file"), what)
            if secret:
                return secret
        if self.cluster_secret and len(self.cluster_secret) < credentials.MIN_SECRET_CHARS:
            return ("cluster_secret", f"expected at least {credentials.MIN_SECRET_CHARS} characters "
                                      "(a short secret can be guessed from one node's token)")
        return None

    def configured(self) -> bool:
        """Any ingest credential is set (inline, as a file, or in the environment): ingest is closed."""
        return bool(self.node_tokens) or any(
            getattr(self, what) or getattr(self, f"{what}_file") or os.environ.get(_ENV[what], "")
            for what in ("cluster_secret", "cluster_token"))

    def agent_token_for(self, node: str) -> str:
        """What the aggregator presents to `node`'s agent: the shared agent_token when one is set,
        else the token derived for that node from cluster_secret, else nothing (an agent without
        a token serves only its own host). Call on a resolved() copy."""
        if self.agent_token:
            return self.agent_token
        return credentials.derive_agent_token(self.cluster_secret, node) if self.cluster_secret else ""

    def resolved(self) -> "AggAuthConfig":
        """A copy with every secret read from its file or the environment (at start, once).
        Raises credentials.CredentialError naming the file when one cannot be read."""
        values: dict[str, Any] = {}
        for what in _SECRETS:
            values[what] = credentials.read_secret(getattr(self, what), getattr(self, f"{what}_file"), _ENV[what])
            values[f"{what}_file"] = ""
        return dataclasses.replace(self, **values)


_SECRETS = ("cluster_secret", "cluster_token", "admin_token", "agent_token")
_ENV = {"cluster_secret": "PODHEALTH_CLUSTER_SECRET", "cluster_token": "PODHEALTH_CLUSTER_TOKEN",
        "admin_token": "PODHEALTH_ADMIN_TOKEN", "agent_token": "PODHEALTH_AGENT_TOKEN"}


@dataclass(frozen=True)
class RuleConfig:
    check: Annotated[str, NonEmpty()] = doc("Check name or glob (alertname for Alertmanager observations).", "*")
    actions: tuple[ActionName, ...] = doc("Actions this rule matches (empty = any).", ())
    min_severity: Severity = doc("Least severity that matches: WARN is warning, FAIL is critical.", "critical")
    do: Do = doc(
        "notify, fence (drain + cordon), or fence_and_reboot (fences, then with ladder.enabled the ladder\n"
        "starts at REBOOT whatever the failure asks for).", "fence")
    min_duration: Annotated[float, Ge(0, "seconds")] = doc("Seconds a condition must persist before acting.", 0.0)

    def matches(self, check: str, action: str, severity: str) -> bool:
        if SEVERITY_RANK[severity] < SEVERITY_RANK[self.min_severity]:
            return False
        if self.actions and action not in self.actions:
            return False
        return self.check == check or fnmatch.fnmatchcase(check, self.check)


def _default_rules() -> tuple[RuleConfig, ...]:
    return (
        RuleConfig(check="*", actions=("RESET_GPU", "DRAIN", "REBOOT", "REPLACE"), min_severity="critical", do="fence"),
        RuleConfig(check="*", actions=(), min_severity="warning", do="notify"),
    )


@dataclass(frozen=True)
class CapsConfig:
    max_fenced: Annotated[int, Ge(0, "a count")] = doc("Most nodes podhealth keeps fenced at once.", 10)
    max_percent_per_partition: Percent = doc(
        "Most % of a partition / node pool that may be fenced (anyone's fences count; at least one node).", 10.0)


@dataclass(frozen=True)
class RateLimitConfig:
    fences_per_minute: Annotated[int, Ge(0, "a count")] = doc("Most new fences in any 60 s.", 10)


@dataclass(frozen=True)
class BreakerConfig:
    share_percent: Percent = doc("Trip when more than this % of nodes turn bad within the window.", 10.0)
    window: Seconds = doc("Seconds over which nodes turning bad are counted.", 300.0)
    min_nodes: Annotated[int, Ge(1, "a count")] = doc("Never trip for fewer bad nodes than this.", 3)


@dataclass(frozen=True)
class FlapHoldConfig:
    cycles: Annotated[int, Ge(1, "a count")] = doc(
        "Fence/release cycles of one node within `window` after which its next fence holds it for an\n"
        "operator (no automatic release; `podhealth fleet release` clears it).", 3)
    window: Seconds = doc("Seconds over which a node's fence/release cycles are counted.", 3600.0)


@dataclass(frozen=True)
class LadderConfig:
    enabled: bool = doc(
        "After podhealth fences a node whose failure asks for RESET_GPU or REBOOT, climb the remediation\n"
        "ladder: reset the GPU through its agent (POST /v1/gpu-reset), reboot through the scheduler\n"
        "(Slurm `scontrol reboot ASAP nextstate=DOWN`), then the handover suite. Off: podhealth only fences.", False)
    max_attempts: Annotated[int, Ge(1, "a count")] = doc(
        "Failed remediation attempts within `window` after which the node goes to REPAIR: fenced with\n"
        "the reason `podhealth: REPAIR ...`, held for an operator, listed by `podhealth fleet repairs`.", 2)
    window: Seconds = doc("Seconds over which a node's failed attempts are counted.", 86400.0)
    verify_within: Seconds = doc(
        "Seconds after a reset or reboot within which the node must pass the handover suite (and be\n"
        "released); past that the attempt counts as failed and the next rung is tried.", 3600.0)
    max_remediating: Annotated[int, Ge(0, "a count")] = doc(
        "Most nodes with a reset or reboot in flight or being verified at once (the cap for every rung).", 5)
    per_minute: Annotated[int, Ge(0, "a count")] = doc("Most new resets/reboots in any 60 s (the rung rate limit).", 2)
    reset_timeout: Seconds = doc("Seconds the agent's GPU reset (POST /v1/gpu-reset) may take.", 120.0)


JobMode = Literal["wait", "wait_then_force", "now"]


def _default_job_modes() -> Mapping[str, JobMode]:
    return {"RESTART_APP": "wait", "DRAIN": "wait", "REPLACE": "wait", "RESET_GPU": "wait_then_force",
            "REBOOT": "wait_then_force"}


@dataclass(frozen=True)
class JobsConfig:
    enabled: bool = doc(
        "Job-aware actions: after a fence, name the jobs (Slurm) / pods (Kubernetes) on the node and its\n"
        "GPUs in the audit log and node page, and move them off per `modes`. Off: a fence only drains/cordons.",
        False)
    modes: Mapping[str, JobMode] = doc(
        "Per action the fence asks for: wait (Slurm's drain lets jobs finish; Kubernetes pods are evicted\n"
        "through the Eviction API, which honours PodDisruptionBudgets, after evict_after), wait_then_force\n"
        "(as wait, then Slurm jobs are requeued after force_after), now (requeue / evict at once).",
        factory=_default_job_modes)
    default: JobMode = doc("Mode for an action not under `modes`.", "wait")
    fatal: tuple[str, ...] = doc(
        "Failures after which the job is already dead, acted on now whatever the action: a check name,\n"
        "or check:XID for an xid/sxid verdict of that code (GPU fallen off the bus, uncontained ECC).",
        ("gpu_lost", "xid:79", "xid:95"))
    force_after: Seconds = doc("Seconds after the fence before wait_then_force requeues the jobs.", 3600.0)
    evict_after: Seconds = doc("Seconds after the fence before Kubernetes pods are evicted (wait modes).", 1800.0)

    def validate(self) -> tuple[str, str] | None:
        for action in self.modes:
            if action not in ("NONE", "RESTART_APP", "RESET_GPU", "DRAIN", "REBOOT", "REPLACE"):
                return ("modes", f'unknown action "{action}" (RESTART_APP, RESET_GPU, DRAIN, REBOOT, REPLACE)')
        for action, mode in self.modes.items():
            if mode not in ("wait", "wait_then_force", "now"):
                return ("modes", f'{action}: expected wait, wait_then_force or now, got "{mode}"')
        return None


@dataclass(frozen=True)
class NodeEntry:
    name: Annotated[str, NonEmpty()] = doc("Node name (as agents report it).", "dgx01")
    agent_url: str = doc("Agent base URL for /health pulls and handover; empty = push only.", "")
    slurm_name: str = doc("Name in Slurm (empty = name).", "")
    k8s_name: str = doc("Name in Kubernetes (empty = name).", "")
    partition: str = doc("Slurm partition / Kubernetes node pool, for the per-partition cap.", "")

    def validate(self) -> tuple[str, str] | None:
        for key in ("name", "slurm_name", "k8s_name"):
            value = getattr(self, key)
            if (key == "name" or value) and node_name_problem(value):
                return (key, node_name_problem(value) or "")
        if self.agent_url and not self.agent_url.startswith(("http://", "https://")):
            return ("agent_url", f'expected an http(s) URL, got "{self.agent_url}"')
        return None


@dataclass(frozen=True)
class SlurmFencerConfig:
    enabled: bool = doc("Drain/resume through scontrol.", False)
    scontrol: Annotated[str, NonEmpty()] = doc("scontrol binary.", "scontrol")
    squeue: Annotated[str, NonEmpty()] = doc("squeue binary (the jobs on a node, for job-aware actions).", "squeue")
    timeout: Seconds = doc("Seconds per scontrol call.", 10.0)
    slurm_conf: str = doc("SLURM_CONF for scontrol (empty = its default).", "")


@dataclass(frozen=True)
class KubeFencerConfig:
    enabled: bool = doc("Cordon + taint through the Kubernetes API.", False)
    kubeconfig: str = doc("kubeconfig path (empty = in_cluster or the default ~/.kube/config).", "")
    in_cluster: bool = doc("Use the pod's service account ($KUBERNETES_SERVICE_HOST/PORT, token and CA from\n"
                           "service_account_dir; the token is re-read when the kubelet rotates it).", False)
    timeout: Seconds = doc("Seconds per API call.", 10.0)
    service_account_dir: str = doc("Where in_cluster finds token and ca.crt.",
                                   "/var/run/secrets/kubernetes.io/serviceaccount")

    def validate(self) -> tuple[str, str] | None:
        if not self.service_account_dir.startswith("/"):
            return ("service_account_dir", f'expected an absolute path, got "{self.service_account_dir}"')
        return None


@dataclass(frozen=True)
class DryRunFencerConfig:
    enabled: bool = doc("In-memory fencer that records what it would do (also used when no other is on).", False)


@dataclass(frozen=True)
class FileFencerConfig:
    enabled: bool = doc("TEST ONLY: a fencer whose state is a JSON file (counts every fence it makes).", False)
    path: str = doc("TEST ONLY: the state file.", "")
    gate: str = doc("TEST ONLY: while this file exists a fence call waits (to kill the aggregator mid-fence).", "")
    gate_after: bool = doc("TEST ONLY: wait on the gate after changing state instead of before.", False)

    def validate(self) -> tuple[str, str] | None:
        if self.enabled and not self.path.startswith("/"):
            return ("path", f'expected an absolute path, got "{self.path}"')
        return None


@dataclass(frozen=True)
class FencersConfig:
    slurm: SlurmFencerConfig = doc("Slurm (scontrol).", factory=SlurmFencerConfig)
    kubernetes: KubeFencerConfig = doc("Kubernetes.", factory=KubeFencerConfig)
    dryrun: DryRunFencerConfig = doc("Dry-run stand-in.", factory=DryRunFencerConfig)
    file: FileFencerConfig = doc("TEST ONLY file-backed fencer.", factory=FileFencerConfig)


@dataclass(frozen=True)
class RetryConfig:
    attempts: Annotated[int, Ge(1, "a count")] = doc("Fencer calls per action before it is left pending for later.", 3)
    backoff: Seconds = doc("Seconds before the first retry (doubles each time).", 0.5)
    max_backoff: Seconds = doc("Longest wait between retries of a pending action.", 60.0)


@dataclass(frozen=True)
class UiConfig:
    grafana_url: str = doc(
        "Base URL of the Grafana that holds podhealth's dashboards (e.g. https://grafana.example.com);\n"
        "the node page links to each dashboard with var-node=NAME. Empty = no links.", "")
    history_interval: Seconds = doc("Seconds between samples of the fleet's node counts by state (fleet chart).", 300.0)
    history_retention: Seconds = doc("Seconds fleet samples are kept.", 7 * 86400.0)

    def validate(self) -> tuple[str, str] | None:
        url = self.grafana_url
        if url and (not url.startswith(("http://", "https://")) or any(c in url for c in " \"'<>?#")):
            return ("grafana_url", f'expected an http(s):// base URL without query or fragment, got "{url}"')
        return None


@dataclass(frozen=True)
class BundlesConfig:
    enabled: bool = doc(
        "After each fence, fetch the node's evidence bundle (POST /v1/bundle on its agent_url: nvidia-smi -q,\n"
        "XID lines, IB counter history, dcgmi diag/burn-in, /health, dmesg tail, versions) and keep it\n"
        "with the fence, under bundles/ beside the database (`podhealth fleet bundle NODE`). Not in dry_run.", True)
    keep: Annotated[int, Ge(1, "a count")] = doc("Bundles kept per node; the oldest go first.", 5)
    timeout: Seconds = doc("Seconds the agent may take to build and send one (it runs nvidia-smi -q).", 120.0)
    max_bytes: Annotated[int, Gt(0, "bytes")] = doc("Largest bundle accepted; a larger one is refused.",
                                                    8 * 1024 * 1024)


@dataclass(frozen=True)
class NodeIngestConfig:
    max_event_bytes: Annotated[int, Gt(0, "bytes")] = doc(
        "Largest record (an event, a transition, a pushed report) a node may send; a larger one is\n"
        "refused with 413 and the agent keeps it aside (rejected.jsonl).", 256 * 1024)
    rate: Annotated[int, Gt(0, "bytes per second")] = doc(
        "Bytes per second one node may push, sustained, to /v1/events and (a bucket of its own, so a\n"
        "backlog never starves heartbeats) to /v1/reports; beyond it the\n"
        "answer is 429 with Retry-After (counted: podhealth_aggregator_ingest_throttled_total), except\n"
        "for that node's FAIL transitions, which are applied all the same.", 256 * 1024)
    burst: Annotated[int, Gt(0, "bytes")] = doc(
        "Bytes one node may push at once above `rate` (a spool delivered after an outage).", 16 * 1024 * 1024)
    stored_bytes: Annotated[int, Gt(0, "bytes")] = doc(
        "Bytes of events one node may hold in the store within event_retention; beyond it the node's\n"
        "pushes are answered 429 (FAIL transitions still applied) until retention frees room.",
        512 * 1024 * 1024)


# The agents keep their connection idle this much past their heartbeat interval, and never longer
# than AGENT_KEEPALIVE_MAX_S (agent/heartbeat.py keepalive_s); by default the aggregator keeps it
# IDLE_MARGIN_S past that, so the agent is the side that closes and never sends into a closing one.
AGENT_KEEPALIVE_MARGIN_S = 15.0
AGENT_KEEPALIVE_MAX_S = 300.0
IDLE_MARGIN_S = 30.0


@dataclass(frozen=True)
class ConnectionsConfig:
    idle_timeout: Annotated[float, Ge(0, "seconds")] = doc(
        "Seconds a connection may stay idle (between requests, or before its first request head: a slow\n"
        "client) before the aggregator closes it. Each agent keeps one connection from one heartbeat to\n"
        "the next, idle up to heartbeat_interval + 15 s (at most 300 s); this should outlast that, or every\n"
        "heartbeat pays a new connection (and TLS handshake) again. 0 = that + 30 s (75 s at the defaults).", 0.0)
    max: Annotated[int, Ge(0, "connections")] = doc(
        "Connections open at once; one more is answered 503 and closed (podhealth_aggregator_http_connections_\n"
        "refused_total; podhealth_aggregator_http_connections is the count open). Every node holds one, the UI\n"
        "and scrapers a few: size this, and the open-file limit above it (the unit's LimitNOFILE), to the\n"
        "fleet plus a margin. Idle connections are not closed to make room (aiohttp has no such policy), so\n"
        "nodes beyond the cap are refused at each heartbeat. 0 = 3/4 of the open-file limit.", 0)

    def idle_for(self, heartbeat_interval: float) -> float:
        """The idle timeout in force: the configured one, else past the agents' keep-alive."""
        if self.idle_timeout:
            return self.idle_timeout
        return agent_keepalive(heartbeat_interval) + IDLE_MARGIN_S


def agent_keepalive(heartbeat_interval: float) -> float:
    """How long agents at this heartbeat interval keep an idle connection (agent/heartbeat.py)."""
    return min(heartbeat_interval + AGENT_KEEPALIVE_MARGIN_S, AGENT_KEEPALIVE_MAX_S)


@dataclass(frozen=True)
class StoreConfig:
    url: str = doc(
        "Where the state lives: sqlite:////abs/path (one aggregator; empty = the `db` file) or\n"
        "postgresql://user[:password]@host[:port]/dbname (replicas share it: one leader acts, all ingest;\n"
        "needs podhealth[postgresql]). Prefer $PGPASSWORD or ~/.pgpass to a password in the URL.", "")
    lease: Seconds = doc(
        "PostgreSQL only: seconds the leader's lease lasts without renewal; a follower takes over after\n"
        "it runs out. The leader renews every lease/4 and stops acting when it could not renew within lease/2.",
        8.0)

    def validate(self) -> tuple[str, str] | None:
        u = self.url
        if not u or u.startswith(("postgresql://", "postgres://")):
            return None
        if u.startswith("sqlite://") and u[len("sqlite://"):].startswith("/") and len(u) > len("sqlite:///"):
            return None
        return ("url", f'expected sqlite:////abs/path or postgresql://user@host:port/db, got "{u}"')


@dataclass(frozen=True)
class AggregatorConfig:
    listen: ListenConfig = doc(
        "HTTP server (ingest, API, /metrics). An address but loopback needs credentials under `auth`\n"
        "(cluster_secret, node_tokens or cluster_token): without them ingest is anonymous.",
        factory=lambda: ListenConfig("127.0.0.1", 9420))
    tls: ServerTlsConfig = doc(
        "HTTPS on the listener (cert, key), and client certificates from agents (ca, client_certs);\n"
        "docs/security.md, TLS.", factory=ServerTlsConfig)
    allowed_hosts: tuple[str, ...] = doc(
        "Host names besides loopback ones that a loopback-bound aggregator answers (a reverse proxy\n"
        "on this host that passes its own name). Bound to loopback, every read (UI, API, /metrics)\n"
        "naming another Host is refused (421): a DNS-rebound web page could read them otherwise.",
        factory=tuple)
    db: Annotated[Path, AbsPath()] = doc("SQLite state file (WAL); store.url, when set, wins.",
                                         Path("/var/lib/podhealth/aggregator.db"))
    store: StoreConfig = doc("The state store (SQLite file or PostgreSQL).", factory=StoreConfig)
    auth: AggAuthConfig = doc("Tokens.", factory=AggAuthConfig)
    max_body_bytes: Annotated[int, Gt(0, "bytes")] = doc("Largest request body accepted (else 413).", 1024 * 1024)
    connections: ConnectionsConfig = doc(
        "HTTP connections: how long an idle one is kept, how many may be open (the file-descriptor budget:\n"
        "one per node; README, Faults said out loud).", factory=ConnectionsConfig)
    node_ingest: NodeIngestConfig = doc(
        "Caps on what one node may push: record size, rate, stored bytes (one node's own token must\n"
        "not fill the store).", factory=NodeIngestConfig)
    pull_interval: Seconds = doc("Seconds between pulls of each agent's /health.", 10.0)
    pull_timeout: Seconds = doc("Seconds one /health pull may take.", 5.0)
    pull_concurrency: Annotated[int, Ge(1, "a count")] = doc("Pulls in flight at once.", 64)
    unreachable_after: Seconds = doc("Seconds unreachable (or silent) before the node_unreachable condition opens.", 60.0)
    heartbeat_interval: Seconds = doc(
        "The agents' publish.report_interval: a push-only node (no agent_url) that has sent nothing\n"
        "for 2.5 of these (or unreachable_after, if shorter) is UNKNOWN; never fenced for it.", 30.0)
    decide_interval: Seconds = doc("Seconds between policy runs when nothing new arrives.", 1.0)
    dry_run: bool = doc("Decide and log, touch nothing (every fencer becomes the dry-run fencer).", False)
    rules: tuple[RuleConfig, ...] = doc("First matching rule wins; UNKNOWN never matches.", factory=_default_rules)
    caps: CapsConfig = doc("Caps on fenced nodes.", factory=CapsConfig)
    rate_limit: RateLimitConfig = doc("Rate limit on new fences.", factory=RateLimitConfig)
    breaker: BreakerConfig = doc("Circuit breaker against fleet-wide failures.", factory=BreakerConfig)
    opt_out: tuple[str, ...] = doc("Nodes podhealth never fences or releases.", ())
    manual_release: bool = doc("Never release automatically; wait for `podhealth fleet release`.", False)
    healthy_for: Seconds = doc("Seconds a fenced node must be all OK before the handover suite runs.", 600.0)
    handover_timeout: Seconds = doc("Seconds the agent's handover suite may take.", 1800.0)
    learn_nodes: bool = doc(
        "Accept nodes not listed under `nodes` when they report (with their own credential when ingest\n"
        "is authenticated). Off: a report for an unlisted node gets 403.", False)
    forget_learned_after: Annotated[float, Ge(0, "seconds")] = doc(
        "Seconds after which a learned node that has not reported since is forgotten (never while\n"
        "podhealth fences it); 0 = never.", 7 * 86400.0)
    nodes: tuple[NodeEntry, ...] = doc("Known nodes.", ())
    fencers: FencersConfig = doc("Which fencers are on.", factory=FencersConfig)
    retries: RetryConfig = doc("Fencer retries.", factory=RetryConfig)
    event_retention: Seconds = doc("Seconds events are kept (ids older than this are forgotten).", 30 * 86400.0)
    report_refresh: Seconds = doc(
        "Seconds after which a node's full report replaces the stored copy (the evidence the node page\n"
        "shows) even though nothing in it changed but the readings of passing checks (NFS probe times,\n"
        "request counts: Prometheus has them live). A change of a verdict, a since, a summary or a\n"
        "failing check's evidence is stored at once.", 3600.0)
    gc_freeze: bool = doc(
        "After start-up and after every large load (the fleet grew by 10% and 1,000 nodes), move the\n"
        "objects that exist then out of the garbage collector's full passes (gc.freeze), which otherwise\n"
        "stall ingest for 100-200 ms at 100,000 nodes. Off only to measure the difference.", True)
    max_clock_skew: Seconds = doc(
        "Seconds an agent's time claim may run ahead of the aggregator's clock before it is counted\n"
        "(podhealth_aggregator_clock_ahead_total, the node's clock.ahead). Agents' records are ordered by\n"
        "their (boot_id, seq) and timed by the aggregator's clock; a claim never orders anything.", 30.0)
    flap_hold: FlapHoldConfig = doc("Hold a flapping node fenced for an operator.", factory=FlapHoldConfig)
    jobs: JobsConfig = doc("Job-aware actions: which jobs a fence touches, and when they are moved off.",
                           factory=JobsConfig)
    ladder: LadderConfig = doc("The remediation ladder after a fence (GPU reset, reboot, REPAIR).",
                               factory=LadderConfig)
    ui: UiConfig = doc("The web UI: Grafana links, fleet history.", factory=UiConfig)
    bundles: BundlesConfig = doc("Evidence bundles fetched from a node's agent when it is fenced.",
                                 factory=BundlesConfig)
    failslow: FailslowAggConfig = doc("Fail-slow: probe results judged against their cohort, job stragglers "
                                      "(docs/failslow.md).", factory=FailslowAggConfig)
    federation: FederationConfig = doc("Other aggregator sets (SuperPODs, clusters) the UI's federated view\n"
                                       "(/ui/federation) and `podhealth fleet --federate` read.",
                                       factory=FederationConfig)

    def validate(self) -> tuple[str, str] | None:
        seen: set[str] = set()
        for n in self.nodes:
            if n.name in seen:
                return ("nodes", f"duplicate node {n.name}")
            seen.add(n.name)
        for name in self.opt_out:
            problem = node_name_problem(name)
            if problem:
                return ("opt_out", problem)
        return self.exposure_problem()

    def store_url(self) -> str:
        """The store to open: store.url, else the `db` file."""
        return self.store.url or f"sqlite://{self.db}"

    def fencing_fencers(self) -> tuple[str, ...]:
        """The enabled fencers that take real nodes out of service (not dry-run, not the test file fencer)."""
        if self.dry_run:
            return ()
        return tuple(n for n in ("slurm", "kubernetes") if getattr(self.fencers, n).enabled)

    def exposure_problem(self) -> tuple[str, str] | None:
        """(key, why) when unauthenticated input could reach this aggregator from the network or
        fence a node; checked by `config check` and again at start (after --listen)."""
        if self.auth.configured():
            return None
        fencing = self.fencing_fencers()
        if fencing:
            return (f"fencers.{fencing[0]}.enabled",
                    f"the {fencing[0]} fencer is on but ingest is unauthenticated: anyone who can reach the "
                    "aggregator could get any node fenced. Set auth.cluster_secret (or cluster_secret_file, "
                    "$PODHEALTH_CLUSTER_SECRET) and give each node its token (`podhealth token derive`), "
                    "or auth.node_tokens")
        if not is_loopback_address(self.listen.address):
            return ("listen.address",
                    f'binding "{self.listen.address}" without credentials opens anonymous ingest to the '
                    "network: bind 127.0.0.1, or set auth.cluster_secret (or node_tokens, cluster_token)")
        return None


__all__ = [
    "AggregatorConfig", "ListenConfig", "AggAuthConfig", "RuleConfig", "CapsConfig", "RateLimitConfig",
    "BreakerConfig", "FlapHoldConfig", "LadderConfig", "JobsConfig", "NodeEntry", "FencersConfig", "SlurmFencerConfig", "KubeFencerConfig",
    "DryRunFencerConfig", "FileFencerConfig", "RetryConfig", "UiConfig", "BundlesConfig", "StoreConfig", "SEVERITY_RANK",
    "ConnectionsConfig",
]
