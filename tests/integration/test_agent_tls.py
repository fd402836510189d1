"""The agent's own listener over HTTPS (issue 27 §3), with a CA made at run time.

One real agent (`podhealth agent --simulate`, `tls: {serve: true, client_certs: required}`)
serves /health, /healthz and the handover with the node's certificate, which names only the
node (no 127.0.0.1, no localhost). Its callers verify it by the node name: the real aggregator
(pulls, handover, release of a fenced node), the Slurm hooks' read, `podhealth check --url
https://127.0.0.1:PORT`. A caller that trusts another CA gets nothing: the node stays fenced, the
hook's verdict is UNKNOWN, `check` exits 2. A rotated certificate is served after SIGHUP."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from podhealth import agentclient, tls
from podhealth.aggregator.model import FenceMode
from podhealth.aggregator.store import NodeRow, Store
from podhealth.checks.cli.slurm_health import agent_report, local_base, local_tls
from podhealth.config import load as load_config
from podhealth.config_aggregator import AggAuthConfig, NodeEntry
from podhealth.config_tls import ServerTlsConfig
from podhealth.credentials import derive_agent_token
from podhealth.fencing.fence import FenceReason, render_reason
from podhealth.vocab import Status
from tests.harness.agg import MemFencer, config, running
from tests.harness.proc import Service, free_port, service
from tests.harness.tlsca import CA, Issued

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
SECRET = "agent-tls-test-cluster-secret-0123456789"
KEY = derive_agent_token(SECRET, "dgx01")
R = FenceReason("xid", "gpu3", "RESET_GPU", "abc")


@dataclasses.dataclass
class Node:
    port: int
    config: Path
    live: Path  # the certificate and key the agent serves, replaced by the rotation test
    ca: CA
    rogue: CA
    aggregator: Issued  # the aggregator's certificate (server and client)
    rogue_aggregator: Issued
    svc: Service

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"


def install(it: Issued, live: Path) -> None:
    """As a rotation tool does: each file replaced whole (rename), key first."""
    for src, dst in ((it.key, live / "node.key"), (it.cert, live / "node.crt")):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        tmp.chmod(0o600)
        os.replace(tmp, dst)


def served_serial(node: Node, server_name: str = "dgx01") -> int:
    """The serial of the certificate the agent serves now, verified by the node name (with the
    node's own client certificate: the agent requires one)."""
    ctx = tls.client_context(str(node.ca.cert), str(node.live / "node.crt"), str(node.live / "node.key"))
    with socket.create_connection(("127.0.0.1", node.port), timeout=10) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as s:
        return int(s.getpeercert()["serialNumber"], 16)


def _answers(node_port: int, ca: CA, live: Path) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            ctx = tls.client_context(str(ca.cert), str(live / "node.crt"), str(live / "node.key"))
            return agentclient.ask(f"https://127.0.0.1:{node_port}/health", "dgx01", KEY, deadline_s=5,
                                   signed=False, tls=ctx).status in (200, 503)
        except agentclient.ExchangeError:
            return False
    return ready


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    root = tmp_path_factory.mktemp("agenttls")
    ca, rogue = CA(root / "site"), CA(root / "rogue", "someone else's CA")
    live = root / "live"
    live.mkdir()
    install(ca.issue("dgx01", server=True, client=True, loopback=False, stem="dgx01-first"), live)
    port = free_port()
    cfg = root / "agent.yaml"
    cfg.write_text(json.dumps({
        "listen": {"address": "127.0.0.1", "port": port},  # where the hooks find it on loopback
        "auth": {"token": KEY},  # as `podhealth token derive --agent` provisions it
        "tls": {"serve": True, "cert": str(live / "node.crt"), "key": str(live / "node.key"),
                "ca": str(ca.cert), "client_certs": "required"},
        "checks": {"damping": {"fail_after": 1, "recover_after": 1}, "grace": 0},
        "collectors": {"nfs": {"enabled": False}, "kmsg": {"interval": 0.5, "timeout": 2}},
    }))
    argv = [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
            "--sim-root", str(root / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    with service("agent", argv, root, port=port, ready=_answers(port, ca, live), ready_timeout=120, env=env) as svc:
        yield Node(port, cfg, live, ca, rogue, ca.issue("aggregator", server=True, client=True),
                   rogue.issue("aggregator", server=True, client=True), svc)


async def until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


@pytest.mark.parametrize("trusts", ["site", "rogue"])
async def test_the_aggregator_releases_a_fenced_node_only_over_https_it_verified(
        node: Node, tmp_path: Path, trusts: str) -> None:
    """A node fenced earlier, its agent healthy now: the aggregator pulls /health over HTTPS and
    runs the handover suite there, then releases it. Trusting another CA it gets nothing: the
    pulls are 'could not tell', no handover passes, the node stays fenced."""
    ca, cert = (node.ca, node.aggregator) if trusts == "site" else (node.rogue, node.rogue_aggregator)
    s = Store(tmp_path / "agg.db")
    s.apply([Store.op_node_insert(NodeRow("dgx01", first_seen=1.0)),
             Store.op_node_fields("dgx01", fence="fenced", fence_reason=render_reason(R))])
    s.close()
    fencer = MemFencer(fenced={"dgx01": render_reason(R)})
    cfg = dataclasses.replace(
        config(tmp_path, healthy_for=0.5, pull_interval=0.2, pull_timeout=5.0, unreachable_after=3600.0,
               auth=AggAuthConfig(cluster_secret=SECRET),
               tls=ServerTlsConfig(cert=str(cert.cert), key=str(cert.key), ca=str(ca.cert))),
        nodes=(NodeEntry(name="dgx01", agent_url=node.url),))
    async with running(cfg, [fencer]) as (agg, _):
        def rec() -> Any:
            return agg.mem.nodes["dgx01"]
        if trusts == "site":
            await until(lambda: "dgx01" not in fencer.fenced and rec().fence is FenceMode.NONE, 150,
                        "the handover suite over HTTPS, then the release")
            assert rec().status is Status.OK and rec().last_seen > 0
            suites = [a["output"] for a in agg.store.audit_tail() if a["what"] == "handover suite"]
            assert suites and "PASS" in suites[-1], suites
        else:
            unproven = lambda: agg.metrics.pulls.labels("unproven")._value.get()  # noqa: E731
            await until(lambda: unproven() >= 1, 30, "an unverified pull")
            assert rec().unreachable_since is not None  # 'could not tell', never a verdict
            # Many times healthy_for of pulls later: the verified run above had released it by now.
            await until(lambda: unproven() >= 20, 60, "more unverified pulls")
            assert rec().fence is FenceMode.FENCED and "dgx01" in fencer.fenced
            assert rec().handover != "passed" and rec().last_seen == 0


def test_the_hooks_verify_their_agent_by_the_node_name_on_loopback(node: Node,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = load_config(node.config)
    assert local_base(cfg) == node.url
    rep = agent_report(local_base(cfg), "dgx01", KEY, timeout=10, tls=local_tls(cfg))
    assert rep is not None and rep.node == "dgx01" and not any("not proven" in r.summary for r in rep.results)
    # The certificate names dgx01 only: asked as another node's agent, the handshake fails.
    with pytest.raises(agentclient.Unproven, match="dgx02"):
        agentclient.ask(f"{node.url}/health", "dgx02", KEY, deadline_s=10, signed=False, tls=local_tls(cfg))
    # A hook that trusts another CA ($PODHEALTH_TLS_CA) gets an UNKNOWN verdict: it drains nothing.
    monkeypatch.setenv("PODHEALTH_TLS_CA", str(node.rogue.cert))
    rep = agent_report(local_base(cfg), "dgx01", KEY, timeout=10, tls=local_tls(cfg))
    assert rep is not None and [r.status for r in rep.results] == [Status.UNKNOWN]
    assert "certificate" in rep.results[0].summary


def check(node: Node, *extra: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PODHEALTH_")}
    return subprocess.run([sys.executable, "-m", "podhealth", "check", "--config", str(node.config),
                           "--url", node.url, "--format", "json", "--timeout", "120", *extra],
                          capture_output=True, text=True, timeout=180, env={**clean, **(env or {})})


def test_check_url_https_verifies_the_agent_by_the_node_name(node: Node) -> None:
    ok = check(node)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["node"] == "dgx01"
    bad = check(node, env={"PODHEALTH_TLS_CA": str(node.rogue.cert)})
    assert bad.returncode == 2 and "certificate verify failed" in bad.stderr, bad.stderr
    assert not bad.stdout.strip()


def test_a_rotated_agent_certificate_is_served_after_sighup(node: Node) -> None:
    first = served_serial(node)
    second = node.ca.issue("dgx01", server=True, client=True, loopback=False, stem="dgx01-second")
    install(second, node.live)
    want = int(subprocess.run([shutil.which("openssl") or "openssl", "x509", "-noout", "-serial", "-in",
                               str(second.cert)], capture_output=True, text=True, check=True,
                              timeout=30).stdout.split("=", 1)[1], 16)
    assert want != first
    os.kill(node.svc.proc.pid, signal.SIGHUP)  # an operator's `systemctl reload podhealth-agent`
    deadline = time.monotonic() + 60
    while served_serial(node) != want:
        assert node.svc.proc.poll() is None, node.svc.log_tail()
        assert time.monotonic() < deadline, "the rotated certificate was not served"
        time.sleep(0.1)
    assert node.svc.proc.poll() is None  # reloaded, not restarted

