"""A frozen leader must not act after it is deposed: SIGSTOP/SIGCONT at each point of a fence and
of a release, with two aggregator processes on one private PostgreSQL and a loopback Slurm.

The leader (A) runs scontrol through a wrapper that records every call and can hold one of them
at a gate: the Nth call whose arguments contain a pattern. At that point the test freezes A
(SIGSTOP). A read is then let through while A is frozen (it returns into a stopped process); an
update (the drain or the resume itself) is held. The other replica (B) takes over and finishes
A's journaled action, an operator then undoes it through B (releases the fenced node, or fences
the released one again), the held update is let go (it must have been killed at A's lease
deadline: it would land after B's move), and A is woken (SIGCONT). What must hold at every
point: A starts no scontrol update after it wakes, and Slurm keeps what B and the operator did.

Before, A's fence went on from wherever it stood: the drain after the read ran on wake-up and
drained the released node again; a held update landed late; and B's reconcile adopted that
drain as podhealth's own. Every process is stopped by PID, also on failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness.pg import PgServer, pg_fixture
from tests.harness.proc import Service, free_port, http_get, service, wait_until
from tests.harness.slurm import SlurmCluster, slurm_fixture

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]

NODES = 8
LEASE = 2.0
REPO = Path(__file__).resolve().parents[2]
ADMIN = "frozen-admin-token-" + "y" * 16
pg = pg_fixture(scope="module")
slurm = slurm_fixture(scope="module", nodes=NODES, daemons=2)


def _token(node: str) -> str:
    return f"frozen-node-token-{node}-" + "x" * 16


WRAPPER = """\
#!{python}
# scontrol as the frozen leader runs it (tests/integration/test_frozen_leader.py): every call is
# logged; the Nth call matching the gate's pattern waits for `go`, then this process becomes scontrol.
import os, sys, time
work, real = {work!r}, {real!r}
line = " ".join(sys.argv[1:])
def log(what):
    with open(os.path.join(work, "calls.log"), "a") as f:
        f.write("%.6f %d %s %s\\n" % (time.time(), os.getpid(), what, line))
log("start")
gate = os.path.join(work, "gate")
if os.path.exists(gate):
    pattern, nth = open(gate).read().split("\\n")[:2]
    if pattern in line:
        fd = os.open(os.path.join(work, "count"), os.O_RDWR | os.O_CREAT)
        import fcntl
        fcntl.flock(fd, fcntl.LOCK_EX)
        n = int(os.read(fd, 32) or b"0") + 1
        os.lseek(fd, 0, 0)
        os.ftruncate(fd, 0)
        os.write(fd, str(n).encode())
        os.close(fd)
        if n == int(nth):
            with open(os.path.join(work, "hit.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.rename(os.path.join(work, "hit.tmp"), os.path.join(work, "hit"))
            while not os.path.exists(os.path.join(work, "go")):
                time.sleep(0.01)
log("exec")
os.execv(real, [real] + sys.argv[1:])
"""


def _config(tmp: Path, name: str, port: int, url: str, cluster: SlurmCluster, scontrol: str) -> Path:
    p = tmp / f"{name}.yaml"
    nodes = ", ".join(f"{{name: dgx{i:02d}, partition: gpu}}" for i in range(1, NODES + 1))
    tokens = ", ".join(f"dgx{i:02d}: {_token(f'dgx{i:02d}')}" for i in range(1, NODES + 1))
    p.write_text(f"""\
aggregator:
  listen: {{address: 127.0.0.1, port: {port}}}
  store: {{url: "{url}", lease: {LEASE}}}
  auth: {{node_tokens: {{{tokens}}}, admin_token: {ADMIN}}}
  learn_nodes: false
  healthy_for: 3600.0
  unreachable_after: 3600.0
  decide_interval: 0.2
  caps: {{max_fenced: {NODES}, max_percent_per_partition: 100.0}}
  rate_limit: {{fences_per_minute: 1000}}
  breaker: {{share_percent: 100.0, window: 300.0, min_nodes: 1000}}
  retries: {{attempts: 2, backoff: 0.2, max_backoff: 1.0}}
  bundles: {{enabled: false}}
  fencers:
    slurm: {{enabled: true, slurm_conf: {cluster.conf}, timeout: 10.0, scontrol: {scontrol}}}
  nodes: [{nodes}]
""")
    return p


def _post(url: str, body: Any, token: str, timeout: float = 40.0) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _q(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    import psycopg
    with psycopg.connect(url, connect_timeout=5) as c:
        return [tuple(r) for r in c.execute(sql, args).fetchall()]  # type: ignore[arg-type]


class Pair:
    """Replicas A (scontrol through the gate wrapper) and B (scontrol itself)."""

    def __init__(self, tmp: Path, url: str, cluster: SlurmCluster) -> None:
        self.tmp, self.url, self.cluster = tmp, url, cluster
        self.work = tmp / "wrap"
        self.work.mkdir()
        real = shutil.which("scontrol")
        assert real is not None
        wrapper = tmp / "scontrol-a"
        wrapper.write_text(WRAPPER.format(python=sys.executable, work=str(self.work), real=real))
        wrapper.chmod(0o755)
        self.ports = {"a": free_port(), "b": free_port()}
        self.scontrol = {"a": str(wrapper), "b": real}
        self.svcs: dict[str, Service] = {}
        self.stack = contextlib.ExitStack()

    def base(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def start(self, name: str) -> None:
        cfg = _config(self.tmp, name, self.ports[name], self.url, self.cluster, self.scontrol[name])
        base = self.base(name)
        self.svcs[name] = self.stack.enter_context(service(
            f"agg-{name}", [sys.executable, "-m", "podhealth", "aggregator", "--config", str(cfg)], self.tmp / "logs",
            ready=lambda: http_get(f"{base}/healthz", timeout=1)[0] == 200, ready_timeout=30.0, cwd=REPO))

    def replica(self, name: str) -> dict[str, Any]:
        try:
            status, body = http_get(f"{self.base(name)}/api/v1/fleet", timeout=2)
        except OSError:
            return {}
        return json.loads(body)["replica"] if status == 200 else {}  # type: ignore[no-any-return]

    def leads(self, name: str) -> int | None:
        r = self.replica(name)
        return int(r["epoch"]) if r.get("role") == "leader" else None

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.svcs[name].proc.pid, sig)

    def close(self) -> None:
        for name, svc in self.svcs.items():  # a stopped process cannot stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(svc.proc.pid, signal.SIGCONT)
        hit = self.work / "hit"
        if hit.exists():  # a held wrapper runs in a session of its own: not in the service's group
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(hit.read_text()), signal.SIGKILL)
        self.stack.close()

    def calls(self) -> list[tuple[float, str, str]]:
        p = self.work / "calls.log"
        out = []
        for ln in (p.read_text().splitlines() if p.exists() else []):
            t, _, what, *line = ln.split(" ")
            out.append((float(t), what, " ".join(line)))
        return out


@contextlib.contextmanager
def pair(tmp: Path, url: str, cluster: SlurmCluster) -> Iterator[Pair]:
    p = Pair(tmp, url, cluster)
    try:
        yield p
    finally:
        p.close()


def _slurm(cluster: SlurmCluster, node: str) -> tuple[bool, str]:
    """(drained, reason) as sinfo shows the node."""
    r = cluster.run("sinfo", "-N", "-h", "-n", node, "-o", "%T|%E", check=False, timeout=10)
    state, _, reason = r.stdout.strip().partition("|")
    return ("drain" in state.lower(), reason.strip())


def _journal(url: str, node: str, kind: str) -> list[tuple[Any, ...]]:
    return _q(url, "SELECT state, epoch FROM actions WHERE node = %s AND kind = %s ORDER BY id", node, kind)


# (what A is doing, the pattern of the scontrol call to freeze it in, which such call): every
# point of Slurm's fence (read by the runner, which the fencer drains from; the drain: no read
# back) and of its release (read by the runner, read by the fencer, the resume, the read back).
POINTS = [
    ("fence", "show node -o", 1), ("fence", "State=DRAIN", 1),
    ("release", "show node -o", 1), ("release", "show node -o", 2), ("release", "State=RESUME", 1),
    ("release", "show node -o", 3),
]


@pytest.mark.parametrize("doing, pattern, nth", POINTS)
def test_a_leader_frozen_inside_a_fence_or_release_does_nothing_when_it_wakes(
        tmp_path: Path, pg: PgServer, slurm: SlurmCluster, doing: str, pattern: str, nth: int) -> None:
    node = f"dgx{POINTS.index((doing, pattern, nth)) + 1:02d}"
    url = pg.new_database()
    with pair(tmp_path, url, slurm) as p:
        p.start("a")
        epoch_a = wait_until(lambda: p.leads("a"), timeout=6 * LEASE, what="A to lead")
        p.start("b")
        assert p.leads("b") is None
        if doing == "release":  # A fenced the node (an operator asked); it is A's to release
            assert _post(f"{p.base('a')}/api/v1/nodes/{node}/fence", {"reason": "bad fan", "who": "alice"},
                         ADMIN)[0] == 200
            wait_until(lambda: _slurm(slurm, node)[0], timeout=30, what=f"{node} drained by A")
        (p.work / "gate").write_text(f"{pattern} {node}\n{nth}\n" if "show" in pattern else f"{pattern}\n{nth}\n")
        if doing == "fence":
            report = {"node": node, "time": time.time(), "results": [
                {"check": "xid", "entity": "GPU0", "status": "FAIL", "action": "RESET_GPU"}]}
            assert _post(f"{p.base('a')}/v1/reports", report, _token(node))[0] == 200
        else:
            def release() -> None:  # A answers late or never (it is frozen, then deposed)
                with contextlib.suppress(OSError):
                    _post(f"{p.base('a')}/api/v1/nodes/{node}/release", {"reason": "repaired", "who": "alice"},
                          ADMIN, timeout=60)
            threading.Thread(target=release, daemon=True).start()
        wait_until(lambda: (p.work / "hit").exists(), timeout=15, what=f"A at the gate ({pattern} #{nth})")
        p.signal("a", signal.SIGSTOP)
        frozen = time.time()
        held = int((p.work / "hit").read_text())
        update = pattern.startswith("State=")
        if not update:
            (p.work / "go").touch()  # a read finishes into the frozen process
        epoch_b = wait_until(lambda: (lambda e: e if e and e > epoch_a else None)(p.leads("b")),
                             timeout=max(6 * LEASE, 30), what="B to take over")
        # B finishes A's journaled action; then an operator undoes it through B
        if doing == "fence":
            wait_until(lambda: ("done", epoch_b) in _journal(url, node, "fence"), timeout=20, what="B's fence")
            assert _slurm(slurm, node)[0]
            # 503 until B's takeover (recovery, reconcile) is done
            wait_until(lambda: _post(f"{p.base('b')}/api/v1/nodes/{node}/release",
                                     {"reason": "false alarm", "who": "bob"}, ADMIN)[0] == 200,
                       timeout=20, interval=0.2, what="the operator's release through B")
            wait_until(lambda: not _slurm(slurm, node)[0], timeout=30, what=f"{node} released by the operator")
            want = False
        else:
            wait_until(lambda: ("done", epoch_b) in _journal(url, node, "release"), timeout=20, what="B's release")
            assert not _slurm(slurm, node)[0]
            wait_until(lambda: _post(f"{p.base('b')}/api/v1/nodes/{node}/fence",
                                     {"reason": "failing again", "who": "bob"}, ADMIN)[0] == 200,
                       timeout=20, interval=0.2, what="the operator's fence through B")
            wait_until(lambda: _slurm(slurm, node)[0], timeout=30, what=f"{node} fenced again through B")
            want = True
        if update:
            # The held drain/resume, started before A froze, was killed at A's lease deadline
            # (`timeout` runs it: A itself cannot kill anything while it is stopped).
            (p.work / "go").touch()
            wait_until(lambda: not Path(f"/proc/{held}").exists() or _zombie(held), timeout=30,
                       what="the held scontrol to end")
        p.signal("a", signal.SIGCONT)
        wait_until(lambda: p.replica("a").get("role") == "follower", timeout=6 * LEASE, what="A to know it is deposed")
        late = [(t, what, line) for t, what, line in p.calls() if what == "exec" and "update" in line and t >= frozen]
        assert not late, f"A ran scontrol updates after it was deposed: {late}\n{p.calls()}"
        drained, reason = _slurm(slurm, node)
        assert drained is want, (drained, reason, p.calls())
        if want:  # B's mark, with B's epoch
            assert reason.startswith("podhealth: operator node DRAIN [bob] e" + str(epoch_b)), reason
        # the journal agrees with Slurm: the operator's action through B is the last word
        wait_until(lambda: _q(url, "SELECT kind, state FROM actions WHERE node = %s ORDER BY id DESC LIMIT 1", node)[0]
                   == (("fence", "done") if want else ("release", "done")), timeout=30, what="the journal to agree")


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    return True
