"""The running agent pushes to the aggregator: every transition, a full report right after a burst
of transitions, XID events (all spooled, to /v1/events), and a heartbeat to /v1/reports that is
a small lease while no verdict changed — received here by a real HTTP endpoint."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.proc import free_port, http_get, service, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class Sink(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.beats: list[dict[str, Any]] = []  # heartbeats: full reports and leases
        self.auth: set[str] = set()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.auth.add(self.headers.get("Authorization", ""))
                answer: dict[str, Any] = {"applied": 1}
                if self.path == "/v1/reports":
                    outer.beats.append(body)
                    if "results" in body:  # name each full report after its position
                        answer["digest"] = f"{len(outer.beats):016x}"
                else:
                    outer.records.extend(body["events"])
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(json.dumps(answer).encode())

            def log_message(self, *a: object) -> None:
                pass
        super().__init__(("127.0.0.1", 0), H)

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in list(self.records) if r.get("type") == kind]


def test_transitions_reports_heartbeat_and_events(tmp_path: Path) -> None:
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = free_port()
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"publish: {{aggregator_url: 'http://127.0.0.1:{sink.server_address[1]}', token: t0k, "
                   f"report_interval: 2, spool_dir: {tmp_path / 'spool'}}}\n"
                   "collectors: {kmsg: {interval: 0.5}}\n")
    try:
        with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate", "dgx-h100",
                               "--sim-root", str(tmp_path / "sim"), "--node", "dgx05", "--listen", f"127.0.0.1:{port}"],
                     tmp_path, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200, ready_timeout=60):
            wait_until(lambda: any(len(r["report"]["results"]) > 100 for r in sink.of("report")), 30, 0.2,
                       "a full report of every check")
            wait_until(lambda: len(sink.beats) >= 3, 15, 0.2, "heartbeats")
            subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "dgx05", "xid=79", "gpu=2",
                            "--root", str(tmp_path / "sim")], check=True, capture_output=True, timeout=60)
            wait_until(lambda: any(r.get("event", {}).get("code") == 79 for r in sink.of("event")), 20, 0.2, "the XID event")
            wait_until(lambda: any(r.get("new", {}).get("check") == "xid" and r["new"]["status"] == "FAIL"
                                   for r in sink.of("transition")), 20, 0.2, "the xid FAIL transition")
            latest = sink.of("report")[-1]["report"]
            wait_until(lambda: sink.of("report")[-1]["report"]["status"] == "FAIL", 10, 0.2, "a report saying FAIL")
            n = len(sink.beats)
            wait_until(lambda: len(sink.beats) >= n + 2, 15, 0.2, "heartbeats after the fault")
            metrics = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
    finally:
        sink.shutdown()
    # A heartbeat is the full report when verdicts changed since the last one (start-up, the
    # fault), otherwise a lease naming the last full report (its digest here: its position).
    assert "results" in sink.beats[0]
    last_full = 0
    for i, b in enumerate(sink.beats, 1):
        if "results" in b:
            last_full = i
        else:
            assert b["digest"] == f"{last_full:016x}" and b["node"] == "dgx05", (i, b)
    full_idx = [i for i, b in enumerate(sink.beats) if "results" in b]
    assert len(full_idx) < len(sink.beats), "leases while nothing changed"
    assert sink.beats[full_idx[-1]]["status"] == "FAIL" and len(sink.beats[full_idx[-1]]["results"]) > 100
    after = sink.beats[full_idx[-1] + 1:]
    assert after and all(b["status"] == "FAIL" for b in after)
    lease = next(b for b in sink.beats if "results" not in b)
    # the push path's own metrics agree with what the aggregator saw (at the last render)
    got = {(s.name, s.labels.get("result") or s.labels.get("state") or ""): s.value
           for fam in text_string_to_metric_families(metrics) if fam.name.startswith("podhealth_publish_")
           for s in fam.samples}
    full, leases = got[("podhealth_publish_heartbeats_total", "full")], got[("podhealth_publish_heartbeats_total", "lease")]
    assert 1 <= full <= len(full_idx) and 1 <= leases <= len(sink.beats) - len(full_idx)
    assert got[("podhealth_publish_records_total", "delivered")] >= 1
    assert got[("podhealth_publish_connected", "")] == 1
    assert len(json.dumps(lease)) < len(json.dumps(sink.beats[full_idx[-1]])) / 20
    assert sink.auth == {"Bearer t0k"}
    assert latest["node"] == "dgx05"
    ids = [r["id"] for r in sink.records]
    assert len(ids) == len(set(ids)), "every record carries its own id"
