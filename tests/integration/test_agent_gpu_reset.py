"""POST /v1/gpu-reset end to end: `podhealth agent --simulate dgx-h100` checks NVML's running
processes through real pynvml (the simulated library), refuses a busy GPU, and runs the
simulator's `nvidia-smi -r` stand-in, which clears the GPU's resettable faults or fails."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.harness.fakeagent import signed_headers
from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "reset-token-0123456789"
CONFIG = f"""
auth: {{token: {TOKEN}}}
checks:
  damping: {{fail_after: 1, recover_after: 1}}
  grace: 0
collectors:
  nvml: {{interval: 0.5, timeout: 2}}
  nvlink: {{interval: 1, timeout: 2}}
  infiniband: {{interval: 2, timeout: 2}}
  host: {{interval: 2, timeout: 2}}
  kmsg: {{interval: 0.5, timeout: 2}}
  nfs: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("reset")
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"],
                 tmp, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200,
                 ready_timeout=60) as svc:
        svc.extra["root"] = tmp / "sim"
        yield svc


def sim(svc: Service, verb: str, *tokens: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run([sys.executable, "-m", "podhealth", "simulate", verb, "dgx01", *tokens,
                        "--root", str(svc.extra["root"])], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r


def faults(svc: Service) -> list[tuple[str, Any]]:
    state = json.loads(sim(svc, "show").stdout)
    return [(f["kind"], f["gpu"]) for f in state["faults"]]


def reset(svc: Service, body: Any, token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if token:  # signed with the node's agent key, as the aggregator does (core/nodeproof.py)
        headers = signed_headers(token, "dgx01", "POST", f"{svc.url}/v1/gpu-reset", data, **headers)
    req = urllib.request.Request(f"{svc.url}/v1/gpu-reset", data=data, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def gpu_results(svc: Service, entity: str) -> list[tuple[str, str, str]]:
    code, body = http_get(f"{svc.url}/health")
    return [(r["check"], r["status"], r["action"]) for r in json.loads(body)["results"]
            if r["entity"] == entity and r["status"] != "OK"]


def test_refuses_without_the_token_and_bad_bodies(agent: Service) -> None:
    assert reset(agent, {"gpu": 0}, token=None)[0] == 401
    assert reset(agent, {"gpu": 0}, token="wrong")[0] == 401
    for bad in ({}, {"gpu": "0"}, {"gpu": -1}, {"gpu": True}, {"gpu": 99}, [0]):
        assert reset(agent, bad)[0] == 400, bad
    # Not JSON, and JSON nested deeper than the parser recurses (a 500 before): 400 as well.
    for raw in (b"\xff", b'{"gpu": ' + b"[" * 30_000 + b"]" * 30_000 + b"}"):
        assert reset(agent, raw)[0] == 400, raw[:20]
    code, body = reset(agent, {"gpu": 9})  # the H100 node has GPUs 0..7
    assert code == 404 and "no GPU 9" in body["error"]


def test_a_reset_clears_a_pending_row_remap(agent: Service) -> None:
    sim(agent, "inject", "fault=row-remap-pending", "gpu=3")
    wait_until(lambda: any(a == "RESET_GPU" for _, _, a in gpu_results(agent, "gpu3")), 30, 0.25,
               "gpu3 to ask for RESET_GPU")
    code, body = reset(agent, {"gpu": 3, "reason": "ladder test"})
    assert code == 200 and body["ok"] and "was successfully reset" in body["output"], body
    assert body["command"][-1] == "3" and ("row-remap-pending", 3) not in faults(agent)
    wait_until(lambda: not gpu_results(agent, "gpu3"), 30, 0.25, "gpu3 to be OK after the reset")


def test_a_busy_gpu_is_never_reset(agent: Service) -> None:
    sim(agent, "inject", "fault=gpu-busy", "gpu=2")
    sim(agent, "inject", "fault=dbe", "gpu=2")
    code, body = reset(agent, {"gpu": 2})
    assert code == 409 and body["pids"] == [4242], body
    assert ("dbe", 2) in faults(agent) and ("gpu-busy", 2) in faults(agent)  # nothing ran
    sim(agent, "clear", "gpu-busy")
    # The simulated driver re-reads its state file at most every 0.1 s: until it has, the
    # process still holds the GPU and the reset is refused as above (a 409 that changes nothing).
    answers: list[tuple[int, dict[str, Any]]] = []

    def not_refused() -> bool:
        answers.append(reset(agent, {"gpu": 2}))
        return answers[-1][0] != 409

    wait_until(not_refused, 10, 0.05, "the reset to stop being refused once the process is gone")
    code, body = answers[-1]
    assert code == 200 and ("dbe", 2) not in faults(agent), body


def test_a_reset_that_fails_is_a_500_and_changes_nothing(agent: Service) -> None:
    sim(agent, "inject", "fault=gpu-reset-fails", "gpu=1")
    sim(agent, "inject", "fault=dbe", "gpu=1")
    code, body = reset(agent, {"gpu": 1})
    assert code == 500 and not body["ok"] and "Failed to reset" in body["output"], body
    assert ("dbe", 1) in faults(agent) and ("gpu-reset-fails", 1) in faults(agent)
    sim(agent, "clear")


def test_the_simulated_reboot_clears_all_but_persistent_faults(agent: Service, tmp_path: Path) -> None:
    sim(agent, "inject", "fault=gpu-reset-fails", "gpu=1")
    sim(agent, "inject", "fault=dbe", "gpu=1", "persist=1")
    sim(agent, "inject", "fault=row-remap-failure", "gpu=5")
    sim(agent, "inject", "fault=nvlink-down", "gpu=0", "link=3")
    sim(agent, "inject", "fault=reboot")
    assert sorted(faults(agent), key=str) == sorted([("dbe", 1), ("row-remap-failure", 5), ("reboot", None)], key=str)
    sim(agent, "clear")
