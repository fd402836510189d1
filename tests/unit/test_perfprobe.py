"""checks/active/perfprobe.py: parsers on captures, UNKNOWN without CUDA or tools, never FAIL."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from podhealth.checks.active import perfprobe
from podhealth.checks.active.perfprobe import ProbeOptions, Reading
from podhealth.checks import perf_peaks
from podhealth.vocab import Status

pytestmark = pytest.mark.timeout(120)
OWN = Path(__file__).resolve().parents[1] / "fixtures" / "perfprobe"
IB_TREE = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband" / "dgx_h100" / "sys"


def test_nvbandwidth_ce_run() -> None:
    tests = perfprobe.parse_nvbandwidth((OWN / "nvbandwidth_4gpu_ce.txt").read_text())
    assert set(tests) == {"h2d", "d2h", "d2d"}
    got = {(r.entity, r.metric): r.value for r in perfprobe.readings_from_nvbandwidth(tests)}
    assert got[("gpu3", "pcie_h2d_gbs")] == 48.10
    assert got[("gpu0", "pcie_d2h_gbs")] == 55.30
    assert got[("gpu1-gpu3", "nvlink_gbs")] == 310.02  # the slower direction of the pair
    assert len([k for k in got if k[1] == "nvlink_gbs"]) == 6


@pytest.mark.parametrize("cut", [0.3, 0.5, 0.8])
def test_nvbandwidth_truncated_is_partial_never_wrong(cut: float) -> None:
    text = (OWN / "nvbandwidth_4gpu_ce.txt").read_text()
    full = {(r.entity, r.metric): r.value for r in perfprobe.readings_from_nvbandwidth(perfprobe.parse_nvbandwidth(text))}
    part = perfprobe.readings_from_nvbandwidth(perfprobe.parse_nvbandwidth(text[: int(len(text) * cut)]))
    for r in part:
        if r.metric != "nvlink_gbs":  # a cut matrix may lose one direction of a pair
            assert full[(r.entity, r.metric)] == r.value


@pytest.mark.parametrize("text", ["", "garbage\n", "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)\n0 1\n 0 abc\n"])
def test_nvbandwidth_malformed_gives_nothing(text: str) -> None:
    assert perfprobe.readings_from_nvbandwidth(perfprobe.parse_nvbandwidth(text)) == []


def test_nvbandwidth_real_captures(shared_fixtures: Path) -> None:
    d2d = perfprobe.parse_nvbandwidth(
        (shared_fixtures / "perf_tests" / "nvbandwidth_v0.8_d2d_memcpy_read_ce_6x_rtxa6000_pcie_nvbw50.txt").read_text())
    pairs = [r for r in perfprobe.readings_from_nvbandwidth(d2d) if r.metric == "nvlink_gbs"]
    assert len(pairs) == 15 and min(r.value for r in pairs) == 21.8
    sm = perfprobe.parse_nvbandwidth((shared_fixtures / "perf_tests" /
                                      "nvbandwidth_h2d_d2h_memcpy_sm_h100_8gpu_asymmetric_nvbw24_excerpt.txt").read_text())
    got = perfprobe.readings_from_nvbandwidth(sm)
    assert len([r for r in got if r.metric == "pcie_h2d_gbs"]) == 8
    assert {r.value for r in got if r.metric == "pcie_d2h_gbs"} <= {52.76, 52.77, 52.78}
    one = perfprobe.parse_nvbandwidth((shared_fixtures / "perf_tests" /
                                       "nvbandwidth_v0.8_h2d_memcpy_sm_b512_a100_sxm4_40gb_nvbw42.txt").read_text())
    assert perfprobe.readings_from_nvbandwidth(one) == [Reading("gpu0", "pcie_h2d_gbs", 25.13, "nvbandwidth")]


def test_ib_write_bw() -> None:
    assert perfprobe.parse_ib_write_bw((OWN / "ib_write_bw_ndr400.txt").read_text()) == pytest.approx(47.99)
    mb = " #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 65536 5000 0.00 11000.0 0.17\n"
    assert perfprobe.parse_ib_write_bw(mb) == pytest.approx(11.534, abs=0.01)
    assert perfprobe.parse_ib_write_bw("Couldn't connect to 127.0.0.1:18515\n") is None


def test_ib_write_bw_real_capture(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "infiniband" / "ib_write_bw_post_list_8B_roce_report_gbits_perftest273_excerpt.txt")
    assert perfprobe.parse_ib_write_bw(text.read_text()) == pytest.approx(0.06)


def test_result_carries_the_fraction_of_peak() -> None:
    r = perfprobe.result_of(Reading("gpu3", "gemm_tflops", 712.0, "torch"), perf_peaks.peaks("dgx-h100"))
    ev = dict(r.evidence)
    assert (r.check, r.status, ev["fraction_of_peak"], ev["unit"]) == ("perfprobe_gemm", Status.OK, "0.720", "TFLOPS")
    assert "72% of the profile's peak" in r.summary
    assert perfprobe.readings_of([r]) == [("gpu3", "gemm_tflops", 712.0)]
    assert "fraction_of_peak" not in dict(perfprobe.result_of(Reading("gpu0", "hbm_gbs", 1.0, "t"), None).evidence)


def test_without_cuda_or_tools_everything_is_unknown(tmp_path: Path) -> None:
    """This host: torch without CUDA (or no torch), no nvbandwidth, no ib_write_bw; HCAs present."""
    opts = ProbeOptions(profile="dgx-h100", budget=30, sysfs_root=IB_TREE, nvbandwidth=str(tmp_path / "none"),
                        ib_write_bw=str(tmp_path / "none"))
    results = perfprobe.run_probes(opts)
    assert results and all(r.status is Status.UNKNOWN for r in results)
    checks = {r.check for r in results}
    assert {"perfprobe_gemm", "perfprobe_clock", "perfprobe_hbm", "perfprobe_nvlink", "perfprobe_rdma"} <= checks
    assert any("is not installed" in r.summary for r in results if r.check == "perfprobe_rdma")


def test_nvbandwidth_on_path_is_used(tmp_path: Path) -> None:
    tool = tmp_path / "nvbandwidth"
    tool.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write(open({str(OWN / 'nvbandwidth_4gpu_ce.txt')!r}).read())\n")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    opts = ProbeOptions(profile="dgx-h100", budget=30, sysfs_root=tmp_path, nvbandwidth=str(tool))
    results = perfprobe.run_probes(opts)
    ok = {(r.entity, r.check) for r in results if r.status is Status.OK}
    assert ("gpu1-gpu3", "perfprobe_nvlink") in ok and ("gpu3", "perfprobe_pcie_h2d") in ok
    # the copies nvbandwidth measured are not asked of the CUDA worker (nor reported UNKNOWN)
    assert not [r for r in results if r.status is Status.UNKNOWN and r.check.startswith("perfprobe_pcie")]
    assert os.access(tool, os.X_OK)


def test_worker_reports_no_cuda_as_an_error_not_a_crash() -> None:
    from podhealth.checks.active import perfprobe_worker

    out = perfprobe_worker.run({"gpus": [0]})
    assert out["readings"] == [] and out["errors"][0]["metric"] == "*"
