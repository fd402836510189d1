"""Shared pieces of the aggregator benchmarks (bench/aggregator_scale.py, storm.py, fault_to_fence.py).

- `Aggregator`: a real `podhealth aggregator` subprocess on a loopback port with a config built
  from a dict (checked by the real loader first), stopped by process group.
- `ProcStats`: CPU seconds (utime + stime from /proc/<pid>/stat) and RSS of a process;
  `tree_cpu_s()`: the same for a process and its children (PostgreSQL's postmaster and backends).
- `ReportFactory`: lightweight stand-ins for agents: the NodeReport JSON a DGX H100 agent sends
  (8 GPUs, 8 HCAs, 2 NFS mounts, host checks), rendered once per node as bytes around a time.
- `percentile()`, `verdict()`: figures and target lines for the printout.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from podhealth.sim.slurmcluster import free_ports  # noqa: F401 - re-exported for the benches

CLK_TCK = os.sysconf("SC_CLK_TCK")
REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class ProcSample:
    cpu_s: float
    rss_mib: float
    peak_rss_mib: float


class ProcStats:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def sample(self) -> ProcSample:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        # after the comm: state(0) ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime(11) stime(12)
        cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK
        rss = peak = 0.0
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
                elif line.startswith("VmHWM:"):
                    peak = int(line.split()[1]) / 1024
        return ProcSample(cpu, rss, peak)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of `pid`, of its children it has reaped and of its live children (PostgreSQL:
    the postmaster, the backends that exited and the ones still running)."""
    def fields(p: int) -> list[str]:
        with open(f"/proc/{p}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    # after the comm: ... utime(11) stime(12) cutime(13) cstime(14); ppid(1)
    own = fields(pid)
    total = sum(int(x) for x in own[11:15])
    for d in os.listdir("/proc"):
        if d.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                f = fields(int(d))
                if int(f[1]) == pid:
                    total += int(f[11]) + int(f[12])
    return total / CLK_TCK


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(q / 100 * (len(s) - 1)))))
    return s[k]


def verdict(ok: bool) -> str:
    return "meets target" if ok else "MISSES target"


def http_json(url: str, data: Any = None, token: str = "", timeout: float = 10.0) -> Any:
    body = json.dumps(data).encode() if data is not None else None
    req = urllib.request.Request(url, data=body, method="POST" if body is not None else "GET")
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_healthy(proc: subprocess.Popen[bytes], url: str, timeout: float, what: str,
                 log_tail: Callable[[], str]) -> None:
    """Until GET url answers 200; RuntimeError (with the log tail) if proc exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log_tail()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout:g}s:\n{log_tail()}")
        time.sleep(0.05)


@dataclass
class Aggregator:
    """`podhealth aggregator` in its own process group, on 127.0.0.1:<free port>."""

    workdir: Path
    settings: dict[str, Any]
    log_level: str = "info"
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _log: Any = None
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def db(self) -> Path:
        return self.workdir / "aggregator.db"

    def db_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.workdir.glob("aggregator.db*") if p.is_file())

    def start(self, timeout: float = 60.0) -> "Aggregator":
        from podhealth import config

        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_ports(1)[0]
        agg = {"listen": {"address": "127.0.0.1", "port": self.port}, "db": str(self.db), **self.settings}
        text = yaml.safe_dump({"log": {"level": self.log_level, "format": "json"}, "aggregator": agg}, sort_keys=False)
        path = self.workdir / "aggregator.yml"
        config.loads(text, str(path))  # a schema change fails here with file:line:key
        path.write_text(text)
        self._log = open(self.workdir / "aggregator.log", "wb")
        # PODHEALTH_BENCH_PROFILE=FILE runs the aggregator under cProfile (written when it stops).
        prof = os.environ.get("PODHEALTH_BENCH_PROFILE")
        pre = ["-m", "cProfile", "-o", prof] if prof else []
        self.proc = subprocess.Popen([sys.executable, *pre, "-m", "podhealth", "aggregator", "--config", str(path)],
                                     stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env={**os.environ, **self.extra_env}, cwd=REPO)
        wait_healthy(self.proc, f"{self.url}/healthz", timeout, "aggregator", self.log_tail)
        return self

    def stats(self) -> ProcStats:
        assert self.proc is not None
        return ProcStats(self.proc.pid)

    def log_tail(self, n: int = 20) -> str:
        try:
            return "\n".join((self.workdir / "aggregator.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> "Aggregator":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class FloorServer:
    """bench/aiohttp_floor.py (aiohttp doing nothing on the same loop) in its own process group."""

    port: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stats(self) -> ProcStats:
        assert self.proc is not None
        return ProcStats(self.proc.pid)

    def __enter__(self) -> "FloorServer":
        self.port = self.port or free_ports(1)[0]
        self.proc = subprocess.Popen([sys.executable, str(REPO / "bench" / "aiohttp_floor.py"), str(self.port)],
                                     stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        try:
            wait_healthy(self.proc, f"{self.url}/healthz", 30.0, "aiohttp_floor.py", lambda: "")
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


# ---- lightweight report generators ------------------------------------------------------------

GPUS = 8
HCAS = 10  # a DGX H100: 8 compute ports and 2 storage ports
MOUNTS = ("/cm/shared", "/home")
SINCE = 1796010487.036734


def _result(check: str, entity: str, status: str = "OK", action: str = "NONE", summary: str = "",
            evidence: dict[str, str] | None = None, since: float = SINCE) -> dict[str, Any]:
    return {"check": check, "status": status, "entity": entity, "evidence": evidence or {}, "action": action,
            "since": since, "summary": summary}


def _uuid(g: int) -> str:
    return f"GPU-{g:08x}-e3dc-19d1-7764-b3ad92015ff8"


def healthy_results() -> list[dict[str, Any]]:
    """What a healthy DGX H100 agent reports: the simulated agent's 106 results (check, entity,
    evidence and summary as it sends them; captured from `/health`), ~16 KB of JSON."""
    out = [_result("gpu_count", "node", evidence={"visible": "8", "expected": "8"})]
    per_gpu: list[tuple[str, dict[str, str], str]] = [
        ("gpu_lost", {}, ""), ("xid", {"uuid": ""}, "no XID in the window"), ("ecc", {"uncorrected_volatile": "0"}, ""),
        ("row_remap", {"uncorrectable_remaps": "0", "uuid": ""}, ""),
        ("pcie", {"gen": "5", "width": "16", "expected": "gen5 x16"}, ""), ("clocks", {"reasons": "gpu_idle"}, ""),
        ("temperature", {"gpu_c": "36.0", "memory_c": "41.0"}, ""), ("fabric", {"state": "completed"}, ""),
        ("persistence", {}, "")]
    for check, ev, summary in per_gpu:
        for g in range(GPUS):
            out.append(_result(check, f"gpu{g}", summary=summary,
                               evidence={k: (_uuid(g) if k == "uuid" else v) for k, v in ev.items()}))
    out.append(_result("driver", "node", evidence={"driver": "565.57.01", "minimum": "535.104.05"}))
    out += [_result("nvlink", f"gpu{g}", evidence={"links_up": "18", "expected": "18"}) for g in range(GPUS)]
    out += [_result("ib_port", f"mlx5_{h}/1", evidence={"state": "ACTIVE", "phys_state": "LinkUp"}) for h in range(HCAS)]
    out += [_result("ib_errors", f"mlx5_{h}/1") for h in range(HCAS)]
    for m in MOUNTS:
        out.append(_result("nfs_mount", m, evidence={"probe_seconds": "0.0011"}))
        out.append(_result("nfs_latency", m, evidence={"avg_rtt_ms": "0.56", "retrans_per_min": "0.0",
                                                         "requests": "1412"}))
    return out


# Evidence that is a reading taken at evaluation time (a real agent's changes in every report).
LIVE_READINGS = {"temperature": ("gpu_c", "memory_c"), "nfs_mount": ("probe_seconds",),
                 "nfs_latency": ("avg_rtt_ms", "requests")}


class Template:
    """A JSON document with some string values left open: render() fills them, one join."""

    def __init__(self, doc: Any, marker: str = "\u0000slot\u0000") -> None:
        text = json.dumps(doc, separators=(",", ":"))
        quoted = json.dumps(marker)
        self.parts = [p.encode() for p in text.split(quoted)]
        self.slots = len(self.parts) - 1

    def render(self, values: list[str]) -> bytes:
        assert len(values) == self.slots, (len(values), self.slots)
        out = [self.parts[0]]
        for v, part in zip(values, self.parts[1:]):
            out.append(v.encode())
            out.append(part)
        return b"".join(out)


class ReportFactory:
    """Per node, the report JSON split around its time, so a send costs one join, not a dumps."""

    def __init__(self, profile: str = "dgx-h100", version: str = "0.1.0") -> None:
        self.profile = profile
        self.version = version
        self.healthy = healthy_results()

    def _doc(self, node: str, results: list[dict[str, Any]], status: str, action: str, t: Any) -> dict[str, Any]:
        return {"node": node, "agent_version": self.version, "profile": self.profile, "status": status,
                "action": action, "time": t, "staleness": {"host": 9.311, "infiniband": 9.268, "kmsg": 0.333,
                                                           "nfs": 9.328, "nvlink": 9.219, "nvml": 9.279},
                "results": results}

    def _split(self, node: str, results: list[dict[str, Any]], status: str, action: str) -> tuple[bytes, bytes]:
        marker = 1234567890.123456
        text = json.dumps(self._doc(node, results, status, action, marker), separators=(",", ":"))
        head, tail = text.split(repr(marker), 1)
        return head.encode(), tail.encode()

    def healthy_parts(self, node: str) -> tuple[bytes, bytes]:
        return self._split(node, self.healthy, "OK", "NONE")

    def failing_parts(self, node: str, since: float, gpu: int = 3) -> tuple[bytes, bytes]:
        """XID 79 on one GPU: the check the catalog maps to REBOOT (GPU fell off the bus)."""
        results = [dict(r) for r in self.healthy]
        for r in results:
            if r["check"] == "xid" and r["entity"] == f"gpu{gpu}":
                r.update(status="FAIL", action="REBOOT", since=since,
                         summary="XID 79: GPU has fallen off the bus", evidence={"codes": "79", "count": "1"})
        return self._split(node, results, "FAIL", "REBOOT")

    @staticmethod
    def body(parts: tuple[bytes, bytes], t: float) -> bytes:
        return parts[0] + repr(t).encode() + parts[1]

    SLOT = "\u0000slot\u0000"

    def live_template(self, node: str = SLOT) -> Template:
        """A healthy node's full report with its time and live readings (LIVE_READINGS) open
        (and its name, by default): as a real agent's, its results text is never the same twice."""
        slot = self.SLOT
        results = [dict(r) for r in self.healthy]
        for r in results:
            keys = LIVE_READINGS.get(r["check"], ())
            if keys:
                r["evidence"] = {k: (slot if k in keys else v) for k, v in r["evidence"].items()}
        doc = self._doc(node, results, "OK", "NONE", slot)
        return Template(doc, slot)

    @staticmethod
    def live_values(t: float, rng: random.Random) -> list[str]:
        """The time, then readings in document order: temperatures, probe seconds, RTTs, counts."""
        vals = [repr(t)]
        readings: list[str] = []
        for _ in range(GPUS):
            readings += [f'"{rng.uniform(30, 45):.1f}"', f'"{rng.uniform(35, 50):.1f}"']
        for _ in MOUNTS:
            readings += [f'"{rng.uniform(0.0008, 0.004):.4f}"', f'"{rng.uniform(0.4, 0.9):.2f}"',
                         f'"{rng.randrange(1000, 10**7)}"']
        return vals + readings

    @staticmethod
    def lease(node: str, t: float, digest: str) -> bytes:
        """What agent/heartbeat.py sends while the node's verdicts are those of its last full report."""
        return json.dumps({"node": node, "time": t, "digest": digest, "agent_version": "0.1.0",
                           "profile": "dgx-h100", "status": "OK", "action": "NONE",
                           "staleness": {"host": 9.311, "infiniband": 9.268, "kmsg": 0.333, "nfs": 9.328,
                                         "nvlink": 9.219, "nvml": 9.279}}, separators=(",", ":")).encode()


def event_batch(node: str, seq: int, count: int, t: float) -> bytes:
    """A burst of XID 13 events (warning-level application faults): ids unique per node and seq."""
    events = [{"id": f"{node}-{seq}-{i}", "type": "event", "time": t,
               "event": {"kind": "xid", "code": 13, "gpu": i % GPUS, "message": "Graphics SM Warp Exception",
                         "time": t}} for i in range(count)]
    return json.dumps({"node": node, "events": events}, separators=(",", ":")).encode()


def node_names(n: int, prefix: str = "dgx") -> list[str]:
    width = max(2, len(str(n)))
    return [f"{prefix}{i:0{width}d}" for i in range(1, n + 1)]


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    import shutil
    import tempfile

    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield d
    finally:
        if os.environ.get("PODHEALTH_BENCH_KEEP"):
            print(f"(kept {d})")
        else:
            shutil.rmtree(d, ignore_errors=True)
