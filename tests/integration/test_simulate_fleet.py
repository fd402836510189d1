"""`podhealth simulate fleet` end to end: a 3-node simulated pod as a subprocess, on its own root.

One pod serves the whole module (starting agents is the slow part on a small machine); the last
test stops it with SIGTERM and checks that every process it started is gone. The fixture's
teardown stops it by process group too, so a failing test leaks nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import yaml

from tests.harness.proc import http_get, need, wait_until
from tests.harness.slurm import missing_binaries

pytestmark = pytest.mark.integration

NODES = 3
READY_LINE = "Ctrl-C (or SIGTERM) stops the whole pod."
URL = re.compile(r"http://127\.0\.0\.1:\d+(?:/[\w/.-]*)?")


@dataclass
class Pod:
    proc: subprocess.Popen[bytes]
    root: Path
    out: Path

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def info(self) -> dict:  # type: ignore[type-arg]
        return json.loads((self.root / "_fleet" / "fleet.json").read_text())


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _pids_naming(marker: str) -> set[int]:
    """Live processes whose command line mentions `marker` (our root, our Slurm directory)."""
    out = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if marker in cmd and _alive(int(entry.name)):
                out.add(int(entry.name))
    return out


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    root = tmp_path_factory.mktemp("fleet")
    out = root.parent / f"{root.name}-stdout.log"
    fh = open(out, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "podhealth", "simulate", "fleet", "--nodes", str(NODES),
                             "--root", str(root)], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    p = Pod(proc, root, out)
    try:
        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"fleet exited with {proc.returncode}:\n{p.text()}")
            return READY_LINE in p.text()
        try:
            wait_until(ready, timeout=150, interval=0.2, what="the fleet to print its banner")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- fleet output ---\n{p.text()}") from None
        yield p
    finally:
        pids: list[int] = []
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = p.info()
            pids = [info["aggregator"]["pid"], *(a["pid"] for a in info["agents"]), *info["slurm_pids"]]
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        for pid in pids:  # last resort, only if the fleet failed to stop its own children
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        fh.close()


def _scrape_config(text: str) -> str:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Prometheus scrape config")) + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("Ctrl-C"))
    return "\n".join(line[2:] if line.startswith("  ") else line for line in lines[start:end])


def test_printed_urls_answer(pod: Pod) -> None:
    text = pod.text()
    info = pod.info()
    urls = sorted(set(URL.findall(text)))
    agg = info["aggregator"]["url"]
    agents = [a["url"] for a in info["agents"]]
    assert [a["node"] for a in info["agents"]] == ["dgx01", "dgx02", "dgx03"]
    for a in agents:
        assert f"{a}/metrics" in urls
    for u in (f"{agg}/api/v1/nodes", f"{agg}/metrics", f"{agg}/ui"):
        assert u in urls
    no_ui = "(this build has no UI yet)" in text
    for u in urls:
        if no_ui and u.endswith("/ui"):
            assert http_get(u)[0] == 404, "the banner says there is no UI, but /ui answers"
            continue
        status, body = http_get(u)
        assert status == 200, f"{u} answered {status}: {body[:200]!r}"
    # each agent speaks for its own node
    for a in info["agents"]:
        status, body = http_get(a["metrics"])
        assert status == 200 and f'node="{a["node"]}"' in body.decode()
    status, body = http_get(f"{agg}/api/v1/nodes")
    assert {n["name"] for n in json.loads(body)["nodes"]} >= {"dgx01", "dgx02", "dgx03"}


def test_scrape_config_is_valid_for_prometheus(pod: Pod, tmp_path: Path) -> None:
    promtool = need("promtool")
    printed = _scrape_config(pod.text())
    doc = yaml.safe_load(printed)
    jobs = {j["job_name"]: j for j in doc["scrape_configs"]}
    info = pod.info()
    agents = jobs["podhealth"]["static_configs"]
    targets = [t for sc in agents for t in sc["targets"]]
    assert targets == [a["url"].removeprefix("http://") for a in info["agents"]]
    assert all(sc["labels"]["cluster"] and sc["labels"]["partition"] == "gpu" for sc in agents)
    agg_targets = [t for sc in jobs["podhealth-aggregator"]["static_configs"] for t in sc["targets"]]
    assert agg_targets == [info["aggregator"]["url"].removeprefix("http://")]
    # the printed text is itself a prometheus.yml; a minimal one wrapping only its jobs must pass too
    full = tmp_path / "printed.yml"
    full.write_text(printed)
    minimal = tmp_path / "prometheus.yml"
    minimal.write_text(yaml.safe_dump({"global": {"scrape_interval": "5s"}, "scrape_configs": doc["scrape_configs"]}))
    for path in (full, minimal):
        r = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, f"promtool check config {path}:\n{r.stdout}\n{r.stderr}"


def test_check_node_works_as_the_banner_prints_it(pod: Pod) -> None:
    # `podhealth check --node` finds the agent through the aggregator, not DNS (dgx03 has none).
    line = next(x.strip() for x in pod.text().splitlines() if "podhealth check --node" in x)
    words = shlex.split(line.split("#")[0])
    env_kv, argv = words[0], words[words.index("check"):]
    # The pod runs as `python -m podhealth`: the banner calls that, not a `podhealth` from PATH.
    assert words[1:words.index("check")] == [sys.executable, "-m", "podhealth"], line
    key, _, token = env_kv.partition("=")
    assert key == "PODHEALTH_TOKEN" and token
    r = subprocess.run([sys.executable, "-m", "podhealth", *argv, "--format", "json"], capture_output=True, text=True,
                       timeout=300, env={**os.environ, "PODHEALTH_TOKEN": token})
    assert r.returncode == 0, f"{line}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    node = argv[argv.index("--node") + 1]
    assert json.loads(r.stdout)["node"] == node
    # On the aggregator's host no token needs passing: check derives the node's agent token from
    # the aggregator config's cluster_secret, as the aggregator does.
    env = {k: v for k, v in os.environ.items() if k not in ("PODHEALTH_TOKEN", "PODHEALTH_AGENT_TOKEN")}
    cfg = str(pod.root / "_fleet" / "aggregator.yml")
    r = subprocess.run([sys.executable, "-m", "podhealth", *argv, "--config", cfg, "--format", "json"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["node"] == node, f"{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    # Another node's agent token is refused, and the error says where the right one comes from.
    other = next(a["node"] for a in pod.info()["agents"] if a["node"] != node)
    from podhealth.credentials import derive_agent_token
    secret = yaml.safe_load((pod.root / "_fleet" / "aggregator.yml").read_text())["aggregator"]["auth"]["cluster_secret"]
    r = subprocess.run([sys.executable, "-m", "podhealth", *argv, "--format", "json"], capture_output=True, text=True,
                       timeout=300, env={**env, "PODHEALTH_TOKEN": derive_agent_token(secret, other)})
    assert r.returncode == 2 and "401" in r.stderr and "token derive --agent" in r.stderr, r.stderr
    dns = subprocess.run([sys.executable, "-m", "podhealth", "check", "--node", "dgx03"], capture_output=True,
                         text=True, timeout=60)
    assert dns.returncode == 2 and "--url" in dns.stderr and "checks.agents" in dns.stderr, dns.stderr


def test_xid79_drains_the_node(pod: Pod) -> None:
    info = pod.info()
    r = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "dgx02", "xid=79", "gpu=3",
                        "--root", str(pod.root)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    agg = info["aggregator"]["url"]
    if info["slurm_conf"]:
        env = {**os.environ, "SLURM_CONF": info["slurm_conf"]}

        def drained() -> str | None:
            out = subprocess.run(["scontrol", "show", "node", "-o", "dgx02"], env=env, capture_output=True,
                                 text=True, timeout=10).stdout
            return out if "DRAIN" in out and "Reason=podhealth:" in out else None
        try:
            line = wait_until(drained, timeout=60, interval=0.3, what="dgx02 drained in the fleet's Slurm")
        except AssertionError as e:
            raise AssertionError(f"{e}\naggregator view: {http_get(f'{agg}/api/v1/nodes/dgx02')[1][:1500]!r}") from None
        assert "xid" in str(line).lower() or "gpu" in str(line).lower()
        others = subprocess.run(["sinfo", "-N", "-h", "-o", "%N %T"], env=env, capture_output=True, text=True,
                                timeout=10).stdout
        states = dict(line.split() for line in others.splitlines())
        assert states["dgx01"] == "idle" and states["dgx03"] == "idle", states
    else:
        assert missing_binaries() or os.geteuid() != 0, "Slurm is usable here but the fleet did not start it"
        assert "dry-run fencer" in pod.text()

        def fenced() -> bool:
            status, body = http_get(f"{agg}/api/v1/nodes/dgx02")
            return status == 200 and json.loads(body)["fence"] in ("fencing", "fenced")
        wait_until(fenced, timeout=60, interval=0.3, what="dgx02 fenced by the dry-run fencer")
        assert json.loads(http_get(f"{agg}/api/v1/fleet")[1])["fencers"] == ["dryrun"]


def test_token_files_are_private_and_each_agent_holds_only_its_own_token(pod: Pod) -> None:
    from podhealth.credentials import derive_agent_token, derive_node_token

    home = pod.root / "_fleet"
    agg = yaml.safe_load((home / "aggregator.yml").read_text())["aggregator"]
    secret = agg["auth"]["cluster_secret"]
    # No shared agent_token: the aggregator derives each agent's token from the secret.
    assert len(secret) >= 32 and "cluster_token" not in agg["auth"] and "agent_token" not in agg["auth"]
    files = [home / "aggregator.yml", home / "fleet.json", *sorted((home / "agents").glob("*.yml"))]
    assert len(files) == 2 + NODES
    for f in files:
        assert f.stat().st_mode & 0o777 == 0o600, f"{f} is {oct(f.stat().st_mode & 0o777)}"
    for a in pod.info()["agents"]:
        text = (home / "agents" / f"{a['node']}.yml").read_text()
        doc = yaml.safe_load(text)
        assert doc["publish"]["token"] == derive_node_token(secret, a["node"])
        assert doc["auth"]["token"] == derive_agent_token(secret, a["node"]) != doc["publish"]["token"]
        assert secret not in text
    # Root on one node holds that node's agent token: another node's agent API refuses it.
    first, second = pod.info()["agents"][:2]
    mine = derive_agent_token(secret, first["node"])
    req = urllib.request.Request(second["url"] + "/v1/handover", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {mine}", "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=10)
    assert refused.value.code == 401, refused.value.read()[:300]


def test_sigterm_stops_every_process(pod: Pod) -> None:
    info = pod.info()
    pids = {info["aggregator"]["pid"], *(a["pid"] for a in info["agents"]), *info["slurm_pids"]}
    assert all(_alive(p) for p in pids), "a child died before the stop"
    assert len(pids) >= 1 + NODES + (2 + NODES if info["slurm_conf"] else 0)
    named = _pids_naming(str(pod.root)) - {pod.proc.pid}
    assert named and named <= pids | _pids_naming(str(pod.root))
    slurm_dir = str(Path(info["slurm_conf"]).parent) if info["slurm_conf"] else None
    os.kill(pod.proc.pid, signal.SIGTERM)
    assert pod.proc.wait(60) == 0, pod.text()[-2000:]
    wait_until(lambda: not any(_alive(p) for p in pids), timeout=10, what="every child to exit")
    assert not _pids_naming(str(pod.root)), "processes naming the fleet root survived"
    if slurm_dir:
        assert not _pids_naming(slurm_dir), "Slurm daemons survived"
    assert not list((pod.root / "_fleet" / "run").glob("*.pid"))
    assert "podhealth: stopped" in pod.text()
