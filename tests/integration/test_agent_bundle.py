"""POST /v1/bundle end to end on `podhealth agent --simulate dgx-h100`: the handover suite's
credential guards it, and the tar.gz holds the simulated node's XID line, /health, versions and
a manifest whose sizes and hashes match. The simulator has no nvidia-smi binary: the bundle
says so in a note instead of failing."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.agent.bundle import MAX_BYTES
from tests.harness.fakeagent import signed_headers
from tests.harness.proc import Service, free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

TOKEN = "bundle-token-0123456789"
CONFIG = f"""
auth: {{token: {TOKEN}}}
checks:
  damping: {{fail_after: 1, recover_after: 1}}
  grace: 0
collectors:
  nvml: {{interval: 0.5, timeout: 2}}
  nvlink: {{interval: 1, timeout: 2}}
  infiniband: {{interval: 1, timeout: 2}}
  host: {{interval: 2, timeout: 2}}
  kmsg: {{interval: 0.5, timeout: 2}}
  nfs: {{enabled: false}}
"""


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    tmp = tmp_path_factory.mktemp("bundle")
    cfg = tmp / "agent.yaml"
    cfg.write_text(CONFIG)
    port = free_port()
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                           "--sim-root", str(tmp / "sim"), "--node", "dgx01", "--listen", f"127.0.0.1:{port}"],
                 tmp, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200,
                 ready_timeout=60) as svc:
        svc.extra["root"] = tmp / "sim"
        yield svc


def post(svc: Service, token: str | None = TOKEN, headers: dict[str, str] | None = None,
         body: bytes = b"{}") -> tuple[int, bytes, dict[str, str]]:
    h = {"Content-Type": "application/json"}
    if token:  # signed with the node's agent key, as the aggregator does (core/nodeproof.py)
        h = signed_headers(token, "dgx01", "POST", f"{svc.url}/v1/bundle", body, **h)
    h.update(headers or {})
    req = urllib.request.Request(f"{svc.url}/v1/bundle", data=body, method="POST", headers=h)
    try:
        with urllib.request.urlopen(req, timeout=90) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def notes_ok(manifest: dict, name: str) -> bool:  # type: ignore[type-arg]
    return next(p["note"] for p in manifest["parts"] if p["name"] == name) == ""


def test_the_bundle_needs_the_agents_credential(agent: Service) -> None:
    assert post(agent, token=None)[0] == 401
    assert post(agent, token="wrong")[0] == 401
    assert post(agent, headers={"Sec-Fetch-Site": "cross-site"})[0] == 403
    assert post(agent, headers={"Content-Type": "text/plain"})[0] == 415


def test_the_bundle_holds_the_evidence_and_its_manifest_matches(agent: Service) -> None:
    subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "dgx01", "xid=79", "gpu=3",
                    "--root", str(agent.extra["root"])], check=True, capture_output=True, timeout=60)
    wait_until(lambda: any(r["check"] == "xid" and r["status"] == "FAIL"
                           for r in json.loads(http_get(f"{agent.url}/health")[1])["results"]), timeout=60)
    code, blob, headers = post(agent)
    assert code == 200 and headers["Content-Type"] == "application/gzip"
    assert 0 < len(blob) <= MAX_BYTES and headers["X-Podhealth-Sha256"] == hashlib.sha256(blob).hexdigest()
    with tarfile.open(fileobj=io.BytesIO(blob), mode="r:gz") as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}  # type: ignore[union-attr]
    manifest = json.loads(files.pop("manifest.json"))
    assert manifest["node"] == "dgx01"
    assert {p["name"] for p in manifest["parts"]} == set(files) == {
        "nvidia-smi-q.txt", "kernel-events.json", "ib-counter-history.json", "handover-last.json", "health.json",
        "dmesg-tail.txt", "versions.json"}
    for p in manifest["parts"]:
        assert len(files[p["name"]]) == p["bytes"] and hashlib.sha256(files[p["name"]]).hexdigest() == p["sha256"]
    events = json.loads(files["kernel-events.json"])
    assert any(e["kind"] == "xid" and e["code"] == 79 and e["gpu"] == 3 for e in events), events
    health = json.loads(files["health.json"])
    assert health["node"] == "dgx01" and any(r["check"] == "xid" and r["status"] == "FAIL" for r in health["results"])
    versions = json.loads(files["versions.json"])
    assert versions["driver"] and versions["vbios"] and versions["podhealth"]
    # the simulated node's kernel and kernel log, never this machine's (issue 31 §4)
    from podhealth.sim.tree_proc import KERNEL_RELEASE
    assert versions["kernel_running"] == KERNEL_RELEASE and versions["kernel"] == [KERNEL_RELEASE]
    dmesg = files["dmesg-tail.txt"].decode()
    assert "Xid (PCI:" in dmesg and ": 79, " in dmesg, dmesg[-2000:]  # the injected XID, as dmesg prints it
    assert all(line.startswith("[") for line in dmesg.splitlines()), dmesg[:500]
    assert notes_ok(manifest, "dmesg-tail.txt")
    ib = json.loads(files["ib-counter-history.json"])
    assert ib and all(r["metric"].startswith("infiniband_") and r["points"] for r in ib)
    notes = {p["name"]: p["note"] for p in manifest["parts"]}
    if shutil.which("nvidia-smi") is None:  # the simulator has no nvidia-smi: said, not faked
        assert "not installed" in notes["nvidia-smi-q.txt"]
        assert files["nvidia-smi-q.txt"].startswith(b"not collected:")
    assert "no handover suite" in notes["handover-last.json"]
