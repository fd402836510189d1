"""The XID fast path, end to end: `podhealth simulate inject xid=79` writes the kernel line to the
simulated node's kmsg stream, the agent reads it on readiness (its kmsg interval is 5 minutes
here, so only readiness can explain a fast arrival), judges the immediate checks at once and
pushes the event and the xid FAIL transition to the aggregator's /v1/events. Then the full
evaluation of a later snapshot runs and must not publish anything twice (same event ids, one
transition)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.harness.proc import free_port, http_get, service, wait_until
from tests.harness.stack import kernel_line_written

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

NODE = "dgx07"
BOUND_S = 5.0  # line -> transition at the aggregator; the kmsg interval (300 s) cannot explain it


class Sink(ThreadingHTTPServer):
    """Stands in for the aggregator's /v1/events and /v1/reports; notes when each record arrived."""

    def __init__(self) -> None:
        self.records: list[tuple[float, dict[str, Any]]] = []
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/events":
                    with outer.lock:
                        outer.records.extend((time.time(), r) for r in body["events"])
                answer = json.dumps({"applied": 1}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *a: object) -> None:
                pass
        super().__init__(("127.0.0.1", 0), H)

    def of(self, kind: str) -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(t, r) for t, r in self.records if r.get("type") == kind]

    def xid_fails(self, entity: str) -> list[tuple[float, dict[str, Any]]]:
        return [(t, r) for t, r in self.of("transition")
                if r["new"]["check"] == "xid" and r["new"]["entity"] == entity and r["new"]["status"] == "FAIL"]


def metrics(port: int) -> dict[tuple[str, str], float]:
    text = http_get(f"http://127.0.0.1:{port}/metrics")[1].decode()
    return {(s.name, s.labels.get("collector") or s.labels.get("state") or ""): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_xid_line_reaches_the_aggregator_at_once_and_only_once(tmp_path: Path) -> None:
    sink = Sink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = free_port()
    sim = tmp_path / "sim"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text(f"publish: {{aggregator_url: 'http://127.0.0.1:{sink.server_address[1]}', "
                   f"spool_dir: {tmp_path / 'spool'}}}\n"
                   "collectors: {kmsg: {interval: 300, timeout: 10}, nvml: {interval: 2}}\n")
    try:
        with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate",
                               "dgx-h100", "--sim-root", str(sim), "--node", NODE, "--listen", f"127.0.0.1:{port}"],
                     tmp_path, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200,
                     ready_timeout=60):
            wait_until(lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200
                       and json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["evaluated_at"] > 0,
                       60, 0.2, "the first judgement")
            subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", NODE, "xid=79", "gpu=2",
                            "--root", str(sim)], check=True, capture_output=True, timeout=60)
            t0 = kernel_line_written(sim, NODE)
            wait_until(lambda: sink.xid_fails("gpu2"), 30, 0.02, "the xid FAIL transition at /v1/events")
            arrived = sink.xid_fails("gpu2")[0][0]
            assert arrived - t0 <= BOUND_S, f"line -> aggregator took {arrived - t0:.2f} s"
            # The XID event itself went out before (or with) its transition.
            events = [(t, r) for t, r in sink.of("event") if r["event"]["code"] == 79 and r["event"]["kind"] == "xid"]
            assert events and events[0][0] <= arrived

            # Now the snapshot path: an nvml collection finishing after the fast verdict brings a
            # full evaluation (/health evaluated_at moves past it); nothing may be published twice.
            after = wait_until(lambda: (v := metrics(port).get(
                ("podhealth_collector_last_success_timestamp_seconds", "nvml"), 0.0)) > arrived + 0.5 and v,
                30, 0.2, "an nvml collection after the fast verdict")
            wait_until(lambda: json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])["evaluated_at"] >= after,
                       30, 0.1, "the full evaluation of that snapshot")
            wait_until(lambda: (m := metrics(port))[("podhealth_publish_records_total", "delivered")]
                       >= m[("podhealth_publish_records_total", "published")], 30, 0.2, "every record delivered")
            health = json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])
    finally:
        sink.shutdown()
    fails = sink.xid_fails("gpu2")
    assert len({r["id"] for _, r in fails}) == 1, f"one FAIL transition for gpu2, got {len(fails)}"
    x79 = [r for _, r in sink.of("event") if r["event"]["code"] == 79]
    # One fault, one event: the Xid line (NVML's XID event for it and the driver's "GPU has fallen
    # off the bus" line after it are folded in), sent once.
    assert sorted(r["event"]["kind"] for r in {r["id"]: r for r in x79}.values()) == ["xid"]
    assert {r["id"] for r in x79} == {r["event"]["id"] for r in x79}
    xid = [r for r in health["results"] if r["check"] == "xid" and r["entity"] == "gpu2"]
    assert xid and xid[0]["status"] == "FAIL"


def test_a_fatal_aer_line_drains_before_the_counters_are_read_again(tmp_path: Path) -> None:
    """issue 31 §4: a fatal PCIe AER took one pcie_aer collection (30 s) to fence. Its kernel line
    is read like an XID's: with the counters read once an hour here, only the line can explain
    kernel_aer FAIL while pcie_aer_fatal still has the old reading."""
    port = free_port()
    sim = tmp_path / "sim"
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("collectors: {kmsg: {interval: 300, timeout: 10}, pcie_aer: {interval: 3600, timeout: 10}}\n")
    with service("agent", [sys.executable, "-m", "podhealth", "agent", "--config", str(cfg), "--simulate",
                           "dgx-h100", "--sim-root", str(sim), "--node", NODE, "--listen", f"127.0.0.1:{port}"],
                 tmp_path, port=port, ready=lambda: http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200,
                 ready_timeout=60):
        def results() -> dict[tuple[str, str], dict[str, Any]]:
            body = json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])
            return {(r["check"], r["entity"]): r for r in body["results"]}
        wait_until(lambda: ("pcie_aer_fatal", "node") in results(), 60, 0.2, "the first judgement of the counters")
        subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", NODE, "fault=pcie-aer-fatal", "gpu=2",
                        "--root", str(sim)], check=True, capture_output=True, timeout=60)
        got = wait_until(lambda: (r := results()).get(("kernel_aer", "gpu2"), {}).get("status") == "FAIL" and r,
                         60, 0.1, "kernel_aer gpu2 FAIL")
        assert got[("kernel_aer", "gpu2")]["action"] == "DRAIN"  # type: ignore[index]
        assert got[("pcie_aer_fatal", "node")]["status"] == "OK"  # type: ignore[index]  # counters not read again yet
