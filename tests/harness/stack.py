"""Real monitoring stacks for integration tests: simulated agents, an aggregator, Prometheus,
Alertmanager and a webhook sink, all on free loopback ports, all stopped by PID (also on failure).

    with stack.agents(tmp / "agents", sim_root, {"dgx01": stack.agent_config()}) as agents, \
         stack.prometheus(tmp / "prom", [stack.ScrapeJob("podhealth", targets, {"cluster": "c1"})],
                          rule_files=[rules]) as prom:
        prom.query("up")

Everything is started through tests/harness/proc.py's `service()` (own process group, SIGTERM then
SIGKILL when the `with` ends), except the webhook sink, which is a thread in the test process so
a test can read what it received directly. Config files are written under the given work
directory, never into the repo; shipped files (alert rules, Alertmanager config) are read and
rewritten for loopback (receiver URLs, durations scaled down) by the pure functions below.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import yaml

from tests.harness.proc import Service, free_port, http_get, need, service, wait_until

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "alerts" / "podhealth-rules.yml"
ALERTMANAGER_CONFIG = REPO / "alerts" / "alertmanager.yml"
LOOPBACK = "127.0.0.1"

# ---- durations ------------------------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0, "y": 31536000.0}


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus duration ("1m", "1h30m", "250ms"); ValueError when it is not one."""
    s = str(text).strip()
    pos, total = 0, 0.0
    for m in _DURATION.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise ValueError(f"not a Prometheus duration: {text!r}")
    return total


def format_duration(seconds: float) -> str:
    """A duration Prometheus and Alertmanager both parse, to the millisecond ("2s", "333ms")."""
    ms = max(0, round(seconds * 1000))
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def scale_rule_durations(rules_yaml: str, factor: float, floor: float = 1.0) -> str:
    """The rules file with every alert's `for:` multiplied by `factor` (not below `floor` s).

    Tests run the shipped rules at production-like settings scaled down in time: a `for: 1m`
    with factor 1/30 waits 2 s, so "for: durations are honoured" still means something.
    """
    doc = yaml.safe_load(rules_yaml)
    for group in doc.get("groups", []):
        for rule in group.get("rules", []):
            if "for" in rule:
                rule["for"] = format_duration(max(floor, parse_duration(rule["for"]) * factor))
    return yaml.safe_dump(doc, sort_keys=False)


def alertmanager_config(shipped_yaml: str, receiver_urls: Mapping[str, str], *, factor: float = 1.0,
                        credentials_file: Path | None = None) -> str:
    """The shipped Alertmanager config pointed at loopback.

    Every webhook receiver named in `receiver_urls` gets that URL (a receiver not named there is
    an error: nothing may page a real system from a test); `credentials_file` replaces the
    bearer credentials file wherever one is configured; route timings and resolve_timeout are
    multiplied by `factor`.
    """
    doc = yaml.safe_load(shipped_yaml)
    for rcv in doc.get("receivers", []):
        hooks = rcv.get("webhook_configs", [])
        other = sorted(k for k in rcv if k not in ("name", "webhook_configs"))
        if other:
            raise ValueError(f"receiver {rcv['name']}: only webhook receivers can be pointed at loopback, got {other}")
        if hooks and rcv["name"] not in receiver_urls:
            raise ValueError(f"receiver {rcv['name']} has no loopback URL (have {sorted(receiver_urls)})")
        for hook in hooks:
            hook["url"] = receiver_urls[rcv["name"]]
            auth = hook.get("http_config", {}).get("authorization")
            if auth is not None and "credentials_file" in auth:
                if credentials_file is None:
                    raise ValueError(f"receiver {rcv['name']} needs a credentials_file")
                auth["credentials_file"] = str(credentials_file)

    def scale_route(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route:
                route[key] = format_duration(parse_duration(route[key]) * factor)
        for child in route.get("routes", []):
            scale_route(child)

    scale_route(doc.get("route", {}))
    glob = doc.get("global", {})
    if "resolve_timeout" in glob:
        glob["resolve_timeout"] = format_duration(parse_duration(glob["resolve_timeout"]) * factor)
    return yaml.safe_dump(doc, sort_keys=False)


# ---- the webhook sink -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hook:
    time: float
    path: str
    body: Any

    def alerts(self) -> list[dict[str, Any]]:
        alerts = self.body.get("alerts", []) if isinstance(self.body, dict) else []
        return [a for a in alerts if isinstance(a, dict)]


@dataclass
class WebhookSink:
    """An HTTP server in a thread that answers every POST with 200 and keeps what it got."""

    port: int = 0
    received: list[Hook] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def url(self, path: str) -> str:
        return f"http://{LOOPBACK}:{self.port}/{path.lstrip('/')}"

    def hooks(self, path: str | None = None) -> list[Hook]:
        with self._lock:
            return [h for h in self.received if path is None or h.path == path]

    def alerts(self, path: str | None = None, alertname: str | None = None,
               status: str | None = None) -> list[tuple[float, dict[str, Any]]]:
        """(time received, alert) for every alert delivered, optionally filtered."""
        out = []
        for h in self.hooks(path):
            for a in h.alerts():
                if alertname is not None and a.get("labels", {}).get("alertname") != alertname:
                    continue
                if status is not None and a.get("status") != status:
                    continue
                out.append((h.time, a))
        return out

    def start(self) -> "WebhookSink":
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                with sink._lock:
                    sink.received.append(Hook(time.time(), self.path, body))
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer((LOOPBACK, self.port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="webhook-sink", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(5)

    def __enter__(self) -> "WebhookSink":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# ---- HTTP helpers -----------------------------------------------------------------------------------


def get_json(url: str, timeout: float = 5.0, headers: dict[str, str] | None = None) -> Any:
    status, body = http_get(url, timeout, headers)
    if status != 200:
        raise AssertionError(f"GET {url} -> {status}: {body[:300]!r}")
    return json.loads(body)


def post_json(url: str, body: Any, token: str = "", timeout: float = 30.0) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw or b"null")
        except ValueError:
            return e.code, raw.decode(errors="replace")


def metric_values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted label pairs: value} of one metric in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[tuple[tuple[str, str], ...], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name:
                out[tuple(sorted(s.labels.items()))] = float(s.value)
    return out


# ---- Prometheus -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScrapeJob:
    name: str
    targets: tuple[str, ...]
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Prometheus:
    svc: Service

    @property
    def url(self) -> str:
        return self.svc.url

    def _api(self, path: str, **params: Any) -> Any:
        doc = get_json(f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}", timeout=10)
        if doc.get("status") != "success":
            raise AssertionError(f"{path} {params}: {doc}")
        return doc["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self._api("query", **params)
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return list(data["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return list(self._api("query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}",
                              step=format_duration(step))["result"])

    def value(self, expr: str) -> float | None:
        r = self.query(expr)
        return float(r[0]["value"][1]) if len(r) == 1 else None

    def alerts(self, alertname: str | None = None, state: str | None = "firing") -> list[dict[str, Any]]:
        return [a for a in self._api("alerts")["alerts"]
                if (alertname is None or a["labels"].get("alertname") == alertname)
                and (state is None or a.get("state") == state)]

    def label_values(self, label: str, match: str) -> list[str]:
        return list(self._api(f"label/{label}/values", **{"match[]": match}))

    def wait_scraped(self, job: str, targets: int, samples: int = 3, timeout: float = 60.0) -> None:
        """Until each of `targets` targets of `job` has been scraped successfully `samples` times."""
        expr = f'count(count_over_time(up{{job="{job}"}}[5m]) >= {samples} and up{{job="{job}"}} == 1)'
        wait_until(lambda: (self.value(expr) or 0) >= targets, timeout, 0.5,
                   f"{targets} {job} targets scraped {samples} times")


def prometheus_config(jobs: Sequence[ScrapeJob], rule_files: Sequence[Path] = (), alertmanager: str | None = None,
                      interval: float = 1.0) -> str:
    doc: dict[str, Any] = {
        "global": {"scrape_interval": format_duration(interval), "evaluation_interval": format_duration(interval)},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": [{"job_name": j.name, "static_configs": [{"targets": list(j.targets),
                                                                    "labels": dict(j.labels)}]} for j in jobs],
    }
    if alertmanager:
        doc["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.removeprefix("http://")]}]}]}
    return yaml.safe_dump(doc, sort_keys=False)


@contextlib.contextmanager
def prometheus(workdir: Path, jobs: Sequence[ScrapeJob], rule_files: Sequence[Path] = (),
               alertmanager: str | None = None, interval: float = 1.0,
               resend_delay: float = 60.0) -> Iterator[Prometheus]:
    """A Prometheus on a free loopback port; `rule_files` are checked by promtool first.

    `resend_delay` is --rules.alert.resend-delay (default 1m): how often alerts, resolved ones
    included, are sent to Alertmanager again. A time-scaled test scales it too: a resolved alert
    that Alertmanager held back (inhibited) is only delivered at the next resend."""
    binary = need("prometheus")
    workdir.mkdir(parents=True, exist_ok=True)
    if rule_files:
        r = subprocess.run([need("promtool"), "check", "rules", *map(str, rule_files)], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"promtool check rules failed:\n{r.stdout}\n{r.stderr}"
    conf = workdir / "prometheus.yml"
    conf.write_text(prometheus_config(jobs, rule_files, alertmanager, interval))
    port = free_port()
    argv = [binary, f"--config.file={conf}", f"--storage.tsdb.path={workdir / 'tsdb'}",
            f"--web.listen-address={LOOPBACK}:{port}", "--log.level=warn",
            f"--rules.alert.resend-delay={format_duration(resend_delay)}"]
    url = f"http://{LOOPBACK}:{port}"
    with service("prometheus", argv, workdir, port=port, ready=lambda: http_get(f"{url}/-/ready")[0] == 200,
                 ready_timeout=60) as svc:
        yield Prometheus(svc)


# ---- Alertmanager -----------------------------------------------------------------------------------


@dataclass
class Alertmanager:
    svc: Service

    @property
    def url(self) -> str:
        return self.svc.url

    def alerts(self, alertname: str | None = None, **labels: str) -> list[dict[str, Any]]:
        """Alerts Alertmanager holds now (active, silenced and inhibited alike)."""
        filters = [f'{k}="{v}"' for k, v in ({"alertname": alertname} if alertname else {}).items()]
        filters += [f'{k}="{v}"' for k, v in labels.items()]
        q = urllib.parse.urlencode([("filter", f) for f in filters])
        return list(get_json(f"{self.url}/api/v2/alerts?{q}"))


@contextlib.contextmanager
def alertmanager(workdir: Path, config_text: str) -> Iterator[Alertmanager]:
    """Alertmanager (`prometheus-alertmanager`) with gossip off, after `amtool check-config`."""
    binary = need("prometheus-alertmanager")
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "alertmanager.yml"
    conf.write_text(config_text)
    r = subprocess.run([need("amtool"), "check-config", str(conf)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"amtool check-config failed:\n{r.stdout}\n{r.stderr}"
    port = free_port()
    # An empty --cluster.listen-address turns off HA gossip, which would otherwise bind 0.0.0.0:9094.
    argv = [binary, f"--config.file={conf}", f"--storage.path={workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{port}", "--cluster.listen-address=", "--log.level=warn"]
    url = f"http://{LOOPBACK}:{port}"
    with service("alertmanager", argv, workdir, port=port, ready=lambda: http_get(f"{url}/-/ready")[0] == 200,
                 ready_timeout=60) as svc:
        yield Alertmanager(svc)


# ---- agents -----------------------------------------------------------------------------------------


def agent_config(*, interval: float = 2.0, kmsg_interval: float = 1.0, nfs_interval: float = 5.0,
                 probe_timeout: float = 5.0, rate_window: float = 300.0, mounts: Sequence[str] = ("/home",),
                 publish_url: str = "", token: str = "", spool_dir: Path | None = None,
                 failslow_after: float | None = None, job_window: float | None = None) -> str:
    """An agent config for tests: collectors every `interval` s, the kernel log every `kmsg_interval`.

    The simulator's NFS probe is a Python subprocess: on this shared 2-core machine its start-up
    alone can take 3 s, so a shorter probe timeout reports healthy mounts as hung. Hence the long
    NFS interval and probe timeout. An empty `publish_url` means the agent does not push.
    `failslow_after`: run the fail-slow probes (the simulated node's performance model) that many
    seconds after the agent starts, once (the next round is an interval later). `job_window`:
    send running jobs' GPU summaries that often.
    """
    c = {"interval": interval, "timeout": max(4.0, interval * 2)}
    doc: dict[str, Any] = {
        "log": {"level": "info", "format": "json"},
        "collectors": {
            "nvml": dict(c), "nvlink": dict(c), "infiniband": dict(c), "host": dict(c),
            "kmsg": {"interval": kmsg_interval, "timeout": 4.0},
            "dcgm": {"enabled": False},
            "nfs": {"interval": nfs_interval, "timeout": probe_timeout + 3.0,
                    "mounts": [{"path": m, "timeout": probe_timeout} for m in mounts]},
        },
        "checks": {"rate_window": rate_window},
    }
    if failslow_after is not None:
        doc["failslow"] = {"enabled": True, "idle_for": failslow_after, "jitter": 0.0, "interval": 3600.0}
    if job_window is not None:  # running jobs' GPU summaries to the aggregator this often (stragglers)
        doc.setdefault("failslow", {})["job_window"] = job_window
    if publish_url:
        if spool_dir is None:
            raise ValueError("an agent that publishes needs a spool_dir")
        doc["publish"] = {"aggregator_url": publish_url, "token": token, "spool_dir": str(spool_dir)}
    text = yaml.safe_dump(doc, sort_keys=False)
    from podhealth import config
    config.loads(text, "<stack.agent_config>")  # a schema change fails here, with file:line:key
    return text


DEFAULT_CLUSTER_SECRET = "test-cluster-secret-0123456789"  # aggregator()'s, unless a test names another


def with_agent_key(text: str, node: str, cluster_secret: str = DEFAULT_CLUSTER_SECRET) -> str:
    """`text` with the node's agent key derived from `cluster_secret` (auth.token), as a site
    provisions it (`podhealth token derive --agent`), unless the config sets auth itself: the
    aggregator's pulls, handovers, resets and bundle fetches need the agent to prove itself."""
    from podhealth.credentials import derive_agent_token

    doc = yaml.safe_load(text) or {}
    if "auth" in doc:
        return text
    doc["auth"] = {"token": derive_agent_token(cluster_secret, node)}
    return yaml.safe_dump(doc, sort_keys=False)


@dataclass
class Agents:
    services: dict[str, Service]
    sim_root: Path

    def url(self, node: str) -> str:
        return self.services[node].url

    def targets(self) -> tuple[str, ...]:
        return tuple(f"{LOOPBACK}:{s.port}" for s in self.services.values())


@contextlib.contextmanager
def agents(workdir: Path, sim_root: Path, configs: Mapping[str, str], profile: str = "dgx-h100",
           ports: Mapping[str, int] | None = None, ready_timeout: float = 120.0) -> Iterator[Agents]:
    """`podhealth agent --simulate` for each node in `configs` (node -> config text), started
    together (they import and initialise in parallel) and ready when each answers /metrics.
    `ports` fixes some nodes' ports (an aggregator configured with their URLs before they start)."""
    workdir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        services: dict[str, Service] = {}
        for node, text in configs.items():
            conf = workdir / f"{node}.yml"
            conf.write_text(with_agent_key(text, node))
            port = (ports or {}).get(node) or free_port()
            argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", profile, "--node", node,
                    "--sim-root", str(sim_root), "--listen", f"{LOOPBACK}:{port}", "--config", str(conf)]
            services[node] = stack.enter_context(service(f"agent-{node}", argv, workdir, port=port))

        def all_ready() -> bool:
            for node, svc in services.items():
                if svc.proc.poll() is not None:
                    raise AssertionError(f"agent {node} exited with {svc.proc.returncode}:\n{svc.log_tail()}")
            return all(http_get(f"{s.url}/metrics", timeout=2)[0] == 200 for s in services.values())

        wait_until(all_ready, ready_timeout, 0.2, f"{len(services)} agents to serve /metrics")
        yield Agents(services, sim_root)


def simulate(sim_root: Path, *argv: str, timeout: float = 60.0) -> str:
    """Run `podhealth simulate ARGV... --root SIM_ROOT`; fail the test on a non-zero exit."""
    cmd = [sys.executable, "-m", "podhealth", "simulate", *argv, "--root", str(sim_root)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{' '.join(argv)} -> rc {r.returncode}: {r.stderr.strip()}"
    return r.stdout


def simulate_all(sim_root: Path, commands: Sequence[Sequence[str]], timeout: float = 60.0) -> None:
    """Several `podhealth simulate` commands at once (a fleet-wide fault lands on every node together)."""
    procs = [subprocess.Popen([sys.executable, "-m", "podhealth", "simulate", *argv, "--root", str(sim_root)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
             for argv in commands]
    errors = []
    try:
        for argv, p in zip(commands, procs):
            _, err = p.communicate(timeout=timeout)
            if p.returncode != 0:
                errors.append(f"{' '.join(argv)} -> rc {p.returncode}: {err.strip()}")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    assert not errors, "\n".join(errors)


def kernel_line_written(sim_root: Path, node: str) -> float:
    """When the simulated kernel last logged a line on `node` (an injected XID writes one).

    This, not the fault's `injected_at`, is when an agent can first see an XID: `simulate inject`
    records the fault, then waits for the node's lock (held while the agent's refresher rewrites
    its trees) before it writes the line, which takes seconds on a loaded machine.
    """
    from podhealth.sim.node import SimNode

    return SimNode.open(sim_root, node).kmsg_path.stat().st_mtime


# ---- the aggregator ---------------------------------------------------------------------------------


@dataclass
class AggregatorProc:
    svc: Service
    config: Path
    cluster_token: str
    admin_token: str
    cluster_secret: str = ""

    @property
    def url(self) -> str:
        return self.svc.url

    def node_token(self, node: str) -> str:
        """What `podhealth token derive --node NODE` prints for this aggregator's cluster secret."""
        from podhealth.credentials import derive_node_token
        return derive_node_token(self.cluster_secret, node)

    def node(self, name: str) -> dict[str, Any]:
        return dict(get_json(f"{self.url}/api/v1/nodes/{name}"))

    def fleet(self) -> dict[str, Any]:
        return dict(get_json(f"{self.url}/api/v1/fleet"))

    def history(self, name: str, limit: int = 1000) -> list[dict[str, Any]]:
        return list(get_json(f"{self.url}/api/v1/nodes/{name}/history?limit={limit}")["items"])

    def metrics(self) -> str:
        status, body = http_get(f"{self.url}/metrics")
        assert status == 200, body[:300]
        return body.decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of `name` over the series whose labels include `labels` (0 when there is none)."""
        want = set(labels.items())
        return sum(v for k, v in metric_values(self.metrics(), name).items() if want <= set(k))

    def release(self, node: str, reason: str = "test: repaired") -> Any:
        status, body = post_json(f"{self.url}/api/v1/nodes/{node}/release", {"reason": reason, "who": "test"},
                                 self.admin_token)
        assert status == 200, f"release {node} -> {status}: {body}"
        return body


@contextlib.contextmanager
def aggregator(workdir: Path, section: Mapping[str, Any], cluster_token: str = "cluster-token",
               admin_token: str = "admin-token",
               cluster_secret: str = DEFAULT_CLUSTER_SECRET) -> Iterator[AggregatorProc]:
    """`podhealth aggregator --config FILE` with `section` as its `aggregator:` section; listen,
    db and auth are filled in (loopback port, a database under `workdir`, the cluster secret that
    node tokens derive from (`AggregatorProc.node_token`), the cluster token for Alertmanager and
    the admin token)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    agg = {"listen": {"address": LOOPBACK, "port": port}, "db": str(workdir / "aggregator.db"),
           "auth": {"cluster_secret": cluster_secret, "cluster_token": cluster_token, "admin_token": admin_token},
           **section}
    text = yaml.safe_dump({"log": {"level": "info", "format": "json"}, "aggregator": agg}, sort_keys=False)
    conf = workdir / "aggregator.yml"
    conf.write_text(text)
    from podhealth import config
    config.loads(text, str(conf))
    url = f"http://{LOOPBACK}:{port}"
    argv = [sys.executable, "-m", "podhealth", "aggregator", "--config", str(conf)]
    with service("aggregator", argv, workdir, port=port, ready=lambda: http_get(f"{url}/healthz")[0] == 200,
                 ready_timeout=60) as svc:
        yield AggregatorProc(svc, conf, cluster_token, admin_token, cluster_secret)


def describe(agg: AggregatorProc | None = None, prom: Prometheus | None = None, slurm: Any = None,
             services: Sequence[Service] = ()) -> str:
    """What the stack looks like now, for a failing test's message (each part best effort)."""
    parts: list[str] = []

    def add(title: str, fn: Any) -> None:
        try:
            parts.append(f"--- {title} ---\n{fn()}")
        except Exception as e:  # noqa: BLE001 - a diagnostic must not hide the failure
            parts.append(f"--- {title} --- (unavailable: {type(e).__name__}: {e})")

    if agg is not None:
        add("aggregator nodes", lambda: "\n".join(json.dumps(n) for n in get_json(f"{agg.url}/api/v1/nodes")["nodes"]))
        add("aggregator log", lambda: agg.svc.log_tail(15))
    if prom is not None:
        add("failing checks in Prometheus", lambda: "\n".join(
            f"{r['metric'].get('node')} {r['metric'].get('check')} {r['metric'].get('entity')} "
            f"{r['metric'].get('action')} = {r['value'][1]}" for r in prom.query("podhealth_check_status > 0")))
        add("alerts in Prometheus", lambda: "\n".join(
            f"{a['labels'].get('alertname')} {a['labels'].get('node', '')} {a['state']}" for a in prom.alerts(state=None)))
    if slurm is not None:
        add("sinfo", lambda: slurm.run("sinfo", "-N", "-h", "-o", "%N %T %E", check=False).stdout)
    for svc in services:
        add(f"{svc.name} log", lambda svc=svc: svc.log_tail(10))
    return "\n".join(parts)
