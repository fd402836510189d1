"""The action runner is the one retrier: one fence round against a backend that keeps failing
makes exactly `retries.attempts` backend calls, each fencer making one attempt per call.

Before the split, retries lived in three layers (the runner, the fencer's own loop, and for
Kubernetes the client's urllib3 Retry): one round cost up to 9 scontrol runs or 15 API requests.
The stand-ins count what reaches the backend: a fake `scontrol` that logs each run and answers as
a Slurm whose controller is down, and an HTTP server that answers every Kubernetes request 503.
"""

from __future__ import annotations

import json
import stat
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from podhealth.config_aggregator import RetryConfig
from podhealth.aggregator.actions import ActionRunner
from podhealth.fencing.fence import Fencer, Transient
from podhealth.fencing.slurm import SlurmFencer, SlurmUnavailable
from tests.harness.agg import config, running

CAP = 4  # not 3: the old inner loops' counts (3 scontrol runs, 5 API requests) cannot pass by chance


def _cfg(tmp_path: Path) -> Any:
    # Short backoff so the round is quick; the housekeeping loop (which would start the next
    # round of the postponed action) is kept out of the window by a long interval.
    return config(tmp_path, nodes=1, retries=RetryConfig(attempts=CAP, backoff=0.01, max_backoff=0.05))


async def _one_failing_round(tmp_path: Path, fencer: Fencer, calls: Any) -> int:
    """Backend calls made by one operator fence of dgx01 while the backend keeps failing."""
    async with running(_cfg(tmp_path), [fencer], housekeeping=3600.0) as (agg, _):
        before = calls()  # the start's reconcile listed (and retried) already: not this round
        res = await agg.operator_fence("dgx01", "test", "alice", wait=30.0)
        made = calls() - before
        assert res["state"] == "pending" and res["result"] == "will be retried", res
        [p] = agg.pending.values()
        assert p.kind == "fence" and p.attempts == 1 and p.next_attempt > 0  # postponed once, journaled
    return made


@pytest.fixture
def down_scontrol(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    log = tmp_path / "scontrol.calls"
    fake = tmp_path / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n'
                    'echo "slurm_load_node error: Unable to contact slurm controller (connect failure)" >&2\n'
                    "exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    log.touch()
    yield fake, log


async def test_one_failing_slurm_fence_round_is_cap_scontrol_runs(tmp_path: Path,
                                                                 down_scontrol: tuple[Path, Path]) -> None:
    fake, log = down_scontrol
    fencer = SlurmFencer(scontrol=str(fake), squeue=str(fake), timeout=5.0)
    with pytest.raises(SlurmUnavailable) as e:
        await fencer.read("dgx01")  # the fencer itself: one run, then the Transient
    assert isinstance(e.value, Transient) and len(log.read_text().splitlines()) == 1

    made = await _one_failing_round(tmp_path, fencer, lambda: len(log.read_text().splitlines()))
    assert made == CAP


class _Down(BaseHTTPRequestHandler):
    """Every request: 503, as an API server behind a failing load balancer answers."""

    count = 0
    lock = threading.Lock()

    def _answer(self) -> None:
        with _Down.lock:
            _Down.count += 1
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 503,
                           "reason": "ServiceUnavailable", "message": "the server is currently unable"}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PATCH = do_POST = do_PUT = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def down_api(tmp_path: Path) -> Iterator[Path]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Down)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="kube-down", daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "down",
        "clusters": [{"name": "down", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "podhealth", "user": {"token": "t"}}],
        "contexts": [{"name": "down", "context": {"cluster": "down", "user": "podhealth"}}]}))
    _Down.count = 0
    try:
        yield kubeconfig
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


async def test_one_failing_kubernetes_fence_round_is_cap_api_requests(tmp_path: Path, down_api: Path) -> None:
    pytest.importorskip("kubernetes")
    from podhealth.fencing.kube import KubeFencer, KubeUnavailable

    fencer = KubeFencer(kubeconfig=str(down_api), timeout=5.0)
    with pytest.raises(KubeUnavailable, match="503"):
        await fencer.read("dgx01")  # the fencer itself: one request, then the Transient
    assert _Down.count == 1

    made = await _one_failing_round(tmp_path, fencer, lambda: _Down.count)
    assert made == CAP


async def test_a_refused_call_is_not_tried_again(tmp_path: Path, down_scontrol: tuple[Path, Path]) -> None:
    """A name the backend refuses (ValueError/Refused) fails the action at once: no retries."""
    fake, log = down_scontrol
    fencer = SlurmFencer(scontrol=str(fake), timeout=5.0)
    async with running(_cfg(tmp_path), [fencer], housekeeping=3600.0) as (agg, _):
        runner: ActionRunner = agg.actions
        before = len(log.read_text().splitlines())
        tries = 0

        async def refuse() -> None:
            nonlocal tries
            tries += 1
            await fencer.read("bad name")  # refused by the name check before any scontrol run

        from podhealth.fencing.fence import Refused
        with pytest.raises(Refused, match="bad name"):
            await runner.call(fencer, "slurm read bad name", refuse)
        assert tries == 1 and len(log.read_text().splitlines()) == before


def test_the_aggregator_parts_never_import_the_service() -> None:
    """service.py wires the parts together; a part that imported it would make a cycle of the wiring."""
    import ast

    root = Path(__file__).resolve().parents[2] / "aggregator"
    actions = [f"actions/{p.name}" for p in sorted((root / "actions").glob("*.py"))]  # the action wing's rooms
    for name in (*actions, "reconcile.py", "liveness.py", "views.py"):
        tree = ast.parse((root / name).read_text(), name)
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        assert not {m for m in imported if m.endswith("aggregator.service")}, name
        assert not any(isinstance(n, ast.ImportFrom) and n.module == "podhealth.aggregator"
                       and any(a.name == "service" for a in n.names) for n in ast.walk(tree)), name
