"""Burn-in: the pure judge on constructed results, the metrics watcher against a live endpoint,
and real runs on the CPU (worker processes standing in for GPUs) with injected faults."""

from __future__ import annotations

import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from podhealth.checks.active import burnin
from podhealth.checks.active.burnin_watch import GpuWatch, MetricsWatcher, NvmlWatcher, WatchReport
from podhealth.checks.active.burnin_worker import DtypeResult, WorkerResult, WorkerSpec
from podhealth.vocab import Action, Status

NO_WATCH = WatchReport("none", False, "off")


def dr(dtype: str = "bf16", tflops: float = 100.0, checksum: float = 1234.5, ref_ok: bool = True,
       mismatches: int = 0) -> DtypeResult:
    return DtypeResult(dtype, 100, 1.0, tflops, checksum, 1e6, 1e-3 if ref_ok else 0.9, ref_ok, 10, mismatches,
                       0.5 if mismatches else 0.0)


def wr(i: int, *results: DtypeResult, error: str = "") -> WorkerResult:
    return WorkerResult(i, f"gpu{i}", tuple(results) or (dr(), dr("fp32", 50.0, 99.0)), error)


def by(results: list, check: str) -> dict:  # type: ignore[type-arg]
    return {r.entity: r for r in results if r.check == check}


def test_clean_node_passes() -> None:
    res = burnin.judge([wr(i) for i in range(4)], NO_WATCH, burnin.Thresholds(90, 40, 10))
    assert {r.status for r in res} == {Status.OK}
    assert len(res) == 8 and all(("telemetry", "telemetry unavailable: off") in r.evidence for r in res)


def test_checksum_outlier_is_named() -> None:
    ws = [wr(0), wr(1), wr(2, dr(checksum=1236.5), dr("fp32", 50.0, 99.0)), wr(3)]
    c = by(burnin.judge(ws, NO_WATCH, burnin.Thresholds()), burnin.CHECK_CORRECT)
    assert c["gpu2"].status is Status.FAIL and c["gpu2"].action is Action.REPLACE
    assert "gpu2" in c["gpu2"].summary and "bf16 checksum" in c["gpu2"].summary
    assert all(c[g].status is Status.OK for g in ("gpu0", "gpu1", "gpu3"))


def test_two_gpus_that_disagree_are_both_named() -> None:
    ws = [wr(0), wr(1, dr(checksum=99.0), dr("fp32", 50.0, 99.0))]
    c = by(burnin.judge(ws, NO_WATCH, burnin.Thresholds()), burnin.CHECK_CORRECT)
    assert c["gpu0"].status is Status.FAIL and c["gpu1"].status is Status.FAIL
    assert "no majority" in c["gpu0"].summary


def test_reference_and_repeat_failures() -> None:
    ws = [wr(0, dr(ref_ok=False), dr("fp32")), wr(1, dr(), dr("fp32", mismatches=2)), wr(2, dr(), dr("fp32"))]
    c = by(burnin.judge(ws, NO_WATCH, burnin.Thresholds()), burnin.CHECK_CORRECT)
    assert "float64 reference" in c["gpu0"].summary and c["gpu0"].status is Status.FAIL
    assert "changed between identical products in 2 of 10" in c["gpu1"].summary
    assert c["gpu2"].status is Status.OK


def test_gate_and_peer_comparison() -> None:
    ws = [wr(0, dr(tflops=700)), wr(1, dr(tflops=690)), wr(2, dr(tflops=560)), wr(3, dr(tflops=500))]
    p = by(burnin.judge(ws, NO_WATCH, burnin.Thresholds(gemm_bf16_tflops=550, peer_slow_pct=10)), burnin.CHECK_PERF)
    assert p["gpu3"].status is Status.FAIL and "below the gate 550" in p["gpu3"].summary
    assert p["gpu2"].status is Status.WARN and "below the node median" in p["gpu2"].summary  # 560 < 0.9 * median 625
    assert p["gpu0"].status is Status.OK and dict(p["gpu0"].evidence)["bf16_tflops"] == "700"
    no_gate = by(burnin.judge(ws, NO_WATCH, burnin.Thresholds(550, 0, 10), apply_gates=False), burnin.CHECK_PERF)
    assert no_gate["gpu3"].status is Status.WARN        # cpu stand-ins: gate off, peers still compared


def test_worker_error_fails_that_gpu() -> None:
    res = burnin.judge([wr(0), wr(1, error="RuntimeError: CUDA error: an illegal memory access\n...")], NO_WATCH,
                       burnin.Thresholds())
    c = by(res, burnin.CHECK_CORRECT)
    assert c["gpu1"].status is Status.FAIL and "illegal memory access" in c["gpu1"].summary
    assert c["gpu0"].status is Status.OK


def test_telemetry_verdicts() -> None:
    watch = WatchReport("nvml", True, "", 30, (
        GpuWatch(0, 61.0),
        GpuWatch(1, 70.0, xids=(79,)),
        GpuWatch(2, 84.0, clock_events=("hw_thermal_slowdown", "sw_power_cap")),
        GpuWatch(3, 91.0),
        GpuWatch(4, 60.0, ecc_corrected=0.0, ecc_uncorrected=2.0),
        GpuWatch(5, 60.0, clock_events=("sw_power_cap",)),
    ))
    t = by(burnin.judge([wr(i) for i in range(7)], watch, burnin.Thresholds()), burnin.CHECK_TELEMETRY)
    assert (t["gpu0"].status, t["gpu5"].status) == (Status.OK, Status.OK)     # power cap alone is routine
    assert t["gpu1"].status is Status.FAIL and "XID 79" in t["gpu1"].summary and t["gpu1"].action is Action.RESET_GPU
    assert t["gpu2"].status is Status.WARN and "hw_thermal_slowdown" in t["gpu2"].summary
    assert t["gpu3"].status is Status.FAIL and t["gpu3"].action is Action.DRAIN
    assert t["gpu4"].status is Status.FAIL and "uncorrectable ECC" in t["gpu4"].summary
    assert t["gpu6"].status is Status.UNKNOWN


def test_parse_faults() -> None:
    assert burnin.parse_faults(["corrupt:1", "slow:3"]) == {1: "corrupt", 3: "slow"}
    for bad in (["melt:1"], ["slow"], ["slow:x"]):
        with pytest.raises(ValueError):
            burnin.parse_faults(bad)


def test_nvml_watcher_without_gpu_reports_why() -> None:
    w = NvmlWatcher([0, 1])
    w.start()
    rep = w.stop()
    assert not rep.available and rep.reason.startswith("NVML unavailable")


@pytest.fixture
def metrics_server() -> Iterator[tuple[str, list[str]]]:
    """A loopback /metrics endpoint whose body the test changes between scrapes."""
    bodies: list[str] = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = (bodies[0] if len(bodies) == 1 else bodies.pop(0)).encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/metrics", bodies
    finally:
        srv.shutdown()
        srv.server_close()


def _metrics(temp1: float, xid1: int | None, ecc1: int, brake: int) -> str:
    lines = ["# TYPE podhealth_gpu_temperature_celsius gauge",
             f'podhealth_gpu_temperature_celsius{{gpu="0"}} 55', f'podhealth_gpu_temperature_celsius{{gpu="1"}} {temp1}',
             "# TYPE podhealth_gpu_clocks_event_active gauge",
             f'podhealth_gpu_clocks_event_active{{gpu="1",reason="hw_power_brake_slowdown"}} {brake}',
             "# TYPE podhealth_gpu_ecc_errors counter",
             f'podhealth_gpu_ecc_errors_total{{gpu="1",type="corrected",scope="volatile"}} {ecc1}',
             "# TYPE podhealth_xid_events counter"]
    if xid1 is not None:
        lines.append(f'podhealth_xid_events_total{{gpu="1",code="48",pci_bus_id="0000:18:00.0"}} {xid1}')
    return "\n".join(lines) + "\n"


def test_metrics_watcher_sees_changes_during_the_run(metrics_server: tuple[str, list[str]]) -> None:
    url, bodies = metrics_server
    bodies += [_metrics(60, None, 5, 0), _metrics(88, 1, 9, 1), _metrics(70, 1, 9, 0)]
    w = MetricsWatcher(url, [0, 1], interval=0.05)
    w.start()
    from tests.harness.proc import wait_until
    wait_until(lambda: w.samples >= 3, timeout=10, what="three scrapes")
    rep = w.stop()
    g0, g1 = rep.gpu(0), rep.gpu(1)
    assert rep.available and g0 is not None and g1 is not None
    assert g0.max_temp_c == 55 and g0.xids == ()
    assert g1.max_temp_c == 88 and g1.xids == (48,) and g1.ecc_corrected == 4
    assert g1.clock_events == ("hw_power_brake_slowdown",)
    res = by(burnin.judge([wr(0), wr(1)], rep, burnin.Thresholds()), burnin.CHECK_TELEMETRY)
    assert res["gpu1"].status is Status.FAIL and res["gpu0"].status is Status.OK


def test_metrics_watcher_unreachable_is_unavailable() -> None:
    from tests.harness.proc import free_port
    w = MetricsWatcher(f"http://127.0.0.1:{free_port()}/metrics", [0], interval=0.05, timeout=0.5)
    w.start()
    rep = w.stop()
    assert not rep.available and "Error" in rep.reason


# --- real runs on the CPU ---------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="burn-in needs PyTorch (pip install torch==2.13.0, the burnin extra)")


def test_worker_catches_a_transient_flip() -> None:
    from podhealth.checks.active.burnin_worker import run
    r = run(WorkerSpec(0, "cpu", 0.4, 48, ("fp32",), fault="flip", batch_target_s=0.02))
    fp32 = r.results[0]
    assert fp32.ref_ok and fp32.repeat_checks >= 3 and fp32.repeat_mismatches == 1
    clean = run(WorkerSpec(0, "cpu", 0.2, 48, ("bf16",), batch_target_s=0.02)).results[0]
    assert clean.ref_ok and clean.repeat_mismatches == 0 and clean.tflops > 0


def test_cpu_run_with_a_corrupt_and_a_slow_worker() -> None:
    opts = burnin.BurninOptions(duration_s=1.5, gpus=(0, 1, 2), device="cpu", size=96,
                                faults={1: "corrupt", 2: "slow"}, slow_factor=6.0)
    out = burnin.run_burnin(opts, burnin.Thresholds(peer_slow_pct=50))
    assert out.device == "cpu" and [w.error for w in out.workers] == ["", "", ""]
    c, p = by(list(out.results), burnin.CHECK_CORRECT), by(list(out.results), burnin.CHECK_PERF)
    assert c["gpu1"].status is Status.FAIL and "gpu1" in c["gpu1"].summary
    assert "float64 reference" in c["gpu1"].summary and "checksum" in c["gpu1"].summary
    assert c["gpu0"].status is Status.OK and c["gpu2"].status is Status.OK
    assert p["gpu2"].status is Status.WARN and "below the node median" in p["gpu2"].summary
    assert p["gpu0"].status is Status.OK


def test_cli_clean_cpu_run_passes(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "podhealth", "burnin", "--device", "cpu", "--duration", "1",
                        "--gpus", "0,1", "--size", "96", "--format", "json", "--profile", "generic"],
                       capture_output=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr.decode()[-2000:] + r.stdout.decode()[-2000:]
    rep = json.loads(r.stdout)
    correct = [x for x in rep["results"] if x["check"] == burnin.CHECK_CORRECT]
    assert [x["entity"] for x in correct] == ["gpu0", "gpu1"] and all(x["status"] == "OK" for x in correct)
    perf = [x for x in rep["results"] if x["check"] == burnin.CHECK_PERF]
    # A shared 2-core CI box may make one stand-in >10% slower than the other: WARN, never FAIL.
    assert len(perf) == 2 and all(x["status"] in ("OK", "WARN") for x in perf)
    assert all(float(x["evidence"]["bf16_tflops"]) > 0 for x in perf)


def test_cli_rejects_bad_arguments() -> None:
    for extra in (["--gpus", "a,b"], ["--inject-fault", "melt:0"], ["--duration", "0"]):
        r = subprocess.run([sys.executable, "-m", "podhealth", "burnin", "--device", "cpu", *extra],
                           capture_output=True, timeout=60, check=False)
        assert r.returncode == 64, extra  # usage errors: EX_USAGE, not 2 ("could not decide")
