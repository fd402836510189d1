"""nccl-tests output parsing and gates: every real capture, plus our own failure shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.checks.active import nccl
from podhealth.checks.active import nccl_slurm
from podhealth.vocab import Action, Status

CORPUS = {
    # file: (rows, avg busbw, hosts, outcome with a 400 GB/s gate)
    "all_reduce_perf_a100_2node_16gpu_gcm.txt": (6, 150.209, 2, Status.FAIL),
    "all_reduce_perf_a100_8gpu_single_node_gcm.txt": (6, 210.99, 1, Status.FAIL),
    "all_reduce_perf_h200_2node_16gpu_oci_slurm.txt": (5, 476.572, 2, Status.OK),
    "all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt": (25, 178.222, 2, Status.OK),
    "all_reduce_perf_failed_launch_openmpi_slots_gcm.txt": (0, None, 0, Status.UNKNOWN),
    "all_reduce_perf_h100_8gpu_fail_system_not_yet_initialized.txt": (0, None, 0, Status.FAIL),
}


def test_corpus_is_covered(shared_fixtures: Path) -> None:
    files = {p.name for p in (shared_fixtures / "nccl_tests").glob("*.txt") if not p.name.endswith(".source.txt")}
    assert files == set(CORPUS), "a new capture needs an expectation here"


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_corpus(shared_fixtures: Path, name: str) -> None:
    rows, avg, hosts, status = CORPUS[name]
    run = nccl.parse((shared_fixtures / "nccl_tests" / name).read_text())
    assert len(run.rows) == rows
    assert run.avg_busbw == avg
    assert len(run.hosts) == hosts
    assert nccl.judge(run, nccl.Gates(busbw_gbps=400)).status is status


def test_new_format_gate_reads_large_sizes_not_the_average(shared_fixtures: Path) -> None:
    run = nccl.parse((shared_fixtures / "nccl_tests" / "all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt").read_text())
    assert run.tests_version == "2.18.3" and run.concluded and run.nccl_version == "2.30.4+cuda13.2"
    last = run.rows[-1]
    assert (last.size_bytes, last.oop_busbw, last.ip_busbw, last.oop_wrong) == (17179869184, 485.66, 485.52, 0)
    assert run.large_busbw() == pytest.approx((485.57 + 485.66 + 481.78) / 3)   # top three sizes, best of oop/ip
    assert run.avg_busbw is not None and run.avg_busbw < 200        # the average would wrongly fail a 400 gate
    assert nccl.judge(run, nccl.Gates(400)).status is Status.OK


def test_classic_rows_and_devices(shared_fixtures: Path) -> None:
    run = nccl.parse((shared_fixtures / "nccl_tests" / "all_reduce_perf_h200_2node_16gpu_oci_slurm.txt").read_text())
    assert run.rows[0].size_bytes == 1073741824 and run.rows[0].oop_time_us == 4396.8
    assert run.devices[9].host == "GPU-3841" and run.devices[9].device == 1 and run.devices[9].bus == "0x2d"
    assert run.out_of_bounds == 0


def test_failure_lines_are_kept(shared_fixtures: Path) -> None:
    run = nccl.parse((shared_fixtures / "nccl_tests" / "all_reduce_perf_h100_8gpu_fail_system_not_yet_initialized.txt").read_text())
    assert run.started and not run.rows
    assert "system not yet initialized" in run.errors[0]
    r = nccl.judge(run, nccl.Gates())
    assert r.status is Status.FAIL and r.action is Action.DRAIN and "system not yet initialized" in r.summary


def test_wrong_values_fail(own_fixtures: Path) -> None:
    run = nccl.parse((own_fixtures / "nccl" / "all_reduce_perf_2gpu_wrong_values.txt").read_text())
    assert [r.wrong for r in run.rows] == [0, 17, 0] and run.out_of_bounds == 17
    r = nccl.judge(run, nccl.Gates())
    assert r.status is Status.FAIL and "wrong" in r.summary


def test_ib_error_mid_table_names_the_hca(own_fixtures: Path) -> None:
    text = (own_fixtures / "nccl" / "all_reduce_perf_2node_ib_error.txt").read_text()
    run = nccl.parse(text)
    assert len(run.rows) == 1 and run.errors
    assert nccl.judge(run, nccl.Gates()).status is Status.FAIL
    assert nccl.hcas_in(text) == ("mlx5_3",)
    pr = nccl_slurm.classify(nccl_slurm.PairRun("dgx03", "dgx04", 1, text, run), 0.0, 0.0, 10.0)
    assert pr.outcome == "fail" and pr.hcas == ("mlx5_3",) and not pr.slow_only


def test_validation_off_parses_na(own_fixtures: Path) -> None:
    run = nccl.parse((own_fixtures / "nccl" / "all_reduce_perf_validation_off.txt").read_text())
    assert [r.oop_wrong for r in run.rows] == [None, None]
    assert nccl.judge(run, nccl.Gates(400)).status is Status.OK


def test_fleet_median_warns() -> None:
    text = ("# nThread 1\n 1048576 262144 float sum -1 10.0 100.0 175.0 0 10.0 100.0 175.0 0\n"
            "# Avg bus bandwidth    : 175\n")
    run = nccl.parse(text)
    assert nccl.judge(run, nccl.Gates(0, fleet_median_gbps=200, fleet_slow_pct=10)).status is Status.WARN
    assert nccl.judge(run, nccl.Gates(0, fleet_median_gbps=190, fleet_slow_pct=10)).status is Status.OK
    assert nccl.judge(run, nccl.Gates(180)).status is Status.FAIL


@pytest.mark.parametrize("text", ["", "garbage\n\x00\x01", "# nThread 1\n 12 x float\n", "1 2 3 4 5 6 7 8 9 10 11 12 13"])
def test_malformed_never_raises(text: str) -> None:
    r = nccl.judge(nccl.parse(text), nccl.Gates(100))
    assert r.status in (Status.UNKNOWN, Status.FAIL, Status.OK)


def test_truncated_capture_keeps_complete_rows(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "nccl_tests" / "all_reduce_perf_a100_8gpu_single_node_gcm.txt").read_text()
    cut = text[: text.index("   268435456")]     # the run died after three sizes
    run = nccl.parse(cut)
    assert len(run.rows) == 3 and run.avg_busbw is None


def test_pair_classification() -> None:
    def pr(busbw: float, rc: int | None = 0) -> nccl_slurm.PairRun:
        text = f"# nThread 1\n 1048576 262144 float sum -1 10.0 1.0 {busbw} 0 10.0 1.0 {busbw} 0\n"
        return nccl_slurm.PairRun("a", "b", rc, text, nccl.parse(text))
    assert nccl_slurm.classify(pr(100), 0, 100, 10).outcome == "pass"
    slow = nccl_slurm.classify(pr(50), 0, 100, 10)
    assert slow.outcome == "fail" and slow.slow_only
    assert nccl_slurm.classify(pr(100), 150, 0, 10).outcome == "fail"
    refused = nccl_slurm.PairRun("a", "b", 1, "srun: error: Unable to allocate resources: Invalid node name specified",
                                 nccl.parse("srun: error: Unable to allocate resources: Invalid node name specified"))
    assert nccl_slurm.classify(refused, 0, 0, 10).outcome == "unknown"
    hung = nccl_slurm.PairRun("a", "b", None, "\n# pair test timed out after 5s\n", nccl.parse("# pair test timed out after 5s"))
    assert nccl_slurm.classify(hung, 0, 0, 10).outcome == "fail"


def test_srun_argv_validates_names() -> None:
    argv = nccl_slurm.srun_argv(nccl_slurm.PairJob(python="/usr/bin/python3", device="cpu"), "dgx01", "dgx02")
    assert argv[:5] == ["srun", "-N2", "--ntasks-per-node=1", "-w", "dgx01,dgx02"]
    assert "--slurm" in argv
    with pytest.raises(ValueError):
        nccl_slurm.srun_argv(nccl_slurm.PairJob(), "dgx01", "dgx02;rm -rf /")
