"""dcgmi diag and nccl-tests outputs from versions and launchers the first fixtures did not cover.

Each test names the variant, what podhealth said before it was handled (in the docstring), and
what it must say: a false FAIL fences a healthy node; a crash or a silent PASS on a broken run is
as bad. The fixtures are the project's own (tests/fixtures/{dcgm,nccl}), written in the formats
seen in public captures; the real captures' numbers are checked against the profiles' gates
when ../shared/fixtures is present.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.active import dcgm, nccl, nccl_slurm
from podhealth.vocab import Action, CheckResult, Status

pytestmark = pytest.mark.timeout(120)


def _by_key(results: list[CheckResult]) -> dict[tuple[str, str], CheckResult]:
    out = {(r.check, r.entity): r for r in results}
    assert len(out) == len(results), "one result per (check, entity)"
    return out


def _in_node_gates(profile: str) -> nccl.Gates:
    """The gates `podhealth nccl` uses in one node (checks/cli/cmd_nccl.py)."""
    t = profiles.load(profile).thresholds
    return nccl.Gates(float(t["nccl_allreduce_busbw_gbps"]), 0.0, 10.0, int(t.get("nccl_allreduce_min_bytes", 0)))


# ---- nccl-tests ---------------------------------------------------------------------------------


def test_old_error_column_and_device_lines_without_group(own_fixtures: Path) -> None:
    """nccl-tests < 2.10: `error` holds the largest relative error ("1e-06" on a healthy float
    sum) and device lines have no "Group". Before: no row parsed, the header's "error" read as a
    failure line -> FAIL+DRAIN of a healthy 2-node run, blamed on the launching host."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_old_error_column_2node.txt").read_text()
    run = nccl.parse(text)
    assert len(run.rows) == 4 and run.errors == () and run.out_of_bounds == 0
    assert all(r.oop_wrong is None and r.ip_wrong is None for r in run.rows)   # a max error, not a count
    assert run.hosts == ("gpu-a07", "gpu-a08")
    res = nccl.judge_hosts(run, nccl.multinode_gates(profiles.load("dgx-a100").thresholds))
    assert [(r.entity, r.status) for r in res] == [("gpu-a07", Status.OK), ("gpu-a08", Status.OK)]
    # The same format with corrupted data: Out of bounds is what says so.
    bad = nccl.parse(text.replace("Out of bounds values : 0 OK", "Out of bounds values : 12 FAILED"))
    r = nccl.judge(bad, nccl.Gates())
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN) and "12 out of bounds" in r.summary


def test_nccl_debug_info_lines_and_a_benign_warn_do_not_fail_a_healthy_ring_run(own_fixtures: Path) -> None:
    """NCCL_DEBUG=INFO interleaved ("NCCL_IB_TIMEOUT set by environment", matched "timeout") and
    NCCL's iommu=pt WARN, in a run that completed with correct data at ~365 GB/s (ring, NVLS off).
    Before: FAIL+DRAIN ("all-reduce reported errors"), and below the old 400 GB/s H100 gate."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_8gpu_h100_ring_nccl_info.txt").read_text()
    run = nccl.parse(text)
    assert run.errors == () and len(run.warnings) == 1 and "iommu=pt" in run.warnings[0]
    assert run.complete and run.hosts == ("dgx-h1-04",)
    for profile in ("dgx-h100", "dgx-h200"):
        r = nccl.judge(run, _in_node_gates(profile))
        assert r.status is Status.OK, (profile, r.summary)
        assert "iommu=pt" in dict(r.evidence)["nccl_warn"]          # kept, not hidden


def test_a_warn_in_a_run_that_died_is_its_failure() -> None:
    text = ("# nThread 1 nGpus 8 minBytes 8 maxBytes 1073741824 step: 2(factor) warmup iters: 5 iters: 20\n"
            "dgx07:1203:1290 [3] NCCL WARN Cuda failure 'an illegal memory access was encountered'\n")
    r = nccl.judge(nccl.parse(text), nccl.Gates(300))
    assert (r.status, r.action) == (Status.FAIL, Action.DRAIN) and "illegal memory access" in r.summary


def test_mpirun_tag_output_prefix_still_finds_wrong_values(own_fixtures: Path) -> None:
    """`mpirun --tag-output` puts "[1,0]<stdout>:" before every line. Before: nothing parsed ->
    UNKNOWN "did not start", so a run that counted 1536 wrong values (data corruption) passed
    the fence by."""
    run = nccl.parse((own_fixtures / "nccl" / "all_reduce_perf_2node_tag_output_wrong.txt").read_text())
    assert run.started and len(run.rows) == 3 and run.out_of_bounds == 1536
    res = nccl.judge_hosts(run, nccl.multinode_gates(profiles.load("dgx-h100").thresholds))
    assert {(r.entity, r.status, r.action) for r in res} == {("dgx-h1-11", Status.FAIL, Action.DRAIN),
                                                             ("dgx-h1-12", Status.FAIL, Action.DRAIN)}


def test_srun_label_prefix_reads_as_the_unprefixed_run(own_fixtures: Path) -> None:
    plain = (own_fixtures / "nccl" / "all_reduce_perf_8gpu_h100_ring_nccl_info.txt").read_text()
    labelled = "".join(f"0: {line}" for line in plain.splitlines(keepends=True))
    a, b = nccl.parse(plain), nccl.parse(labelled)
    assert (a.rows, a.devices, a.avg_busbw, a.warnings) == (b.rows, b.devices, b.avg_busbw, b.warnings)


def test_a_run_killed_mid_sweep_is_unknown_unless_it_already_showed_a_fault(own_fixtures: Path) -> None:
    """Rows up to 256 MiB, then nothing (a timeout or OOM kill). Before: judged on those small
    sizes -> FAIL+DRAIN below the H100 gate. Now UNKNOWN; wrong values it printed still FAIL."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_8gpu_killed_midrun.txt").read_text()
    run = nccl.parse(text)
    assert len(run.rows) == 5 and not run.complete
    r = nccl.judge(run, _in_node_gates("dgx-h100"))
    assert r.status is Status.UNKNOWN and "without its summary" in r.summary
    last = text.rstrip().splitlines()[-1]
    corrupt = text.replace(last, last[: last.rindex(" 0")] + "   17")
    assert nccl.judge(nccl.parse(corrupt), _in_node_gates("dgx-h100")).status is Status.FAIL
    header_only = text[: text.index("NCCL version")]
    r = nccl.judge(nccl.parse(header_only), _in_node_gates("dgx-h100"))
    assert r.status is Status.UNKNOWN and "killed or hung" in r.summary


def test_a_run_slurm_cancelled_is_unknown_not_its_kill_lines(own_fixtures: Path) -> None:
    """A time limit or scancel: slurmstepd's CANCELLED line, then "srun: error: ... Killed".
    Before: those lines were failure lines -> FAIL+DRAIN. A real failure before it still FAILs."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_8gpu_killed_midrun.txt").read_text()
    cancelled = text + ("slurmstepd: error: *** STEP 88231.0 ON dgx-h1-09 CANCELLED AT 2026-03-02T04:10:55 "
                        "DUE TO TIME LIMIT ***\nsrun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n"
                        "srun: error: dgx-h1-09: task 0: Killed\n")
    run = nccl.parse(cancelled)
    assert "TIME LIMIT" in run.cancelled and run.errors == ()
    r = nccl.judge(run, _in_node_gates("dgx-h100"))
    assert r.status is Status.UNKNOWN and "cancelled" in r.summary
    failed = cancelled.replace("slurmstepd:", "dgx-h1-09: Test NCCL failure all_reduce.cu:44 'unhandled cuda error'\nslurmstepd:")
    assert nccl.judge(nccl.parse(failed), _in_node_gates("dgx-h100")).status is Status.FAIL
    # Without a cancellation srun's task error is evidence; the test's own failure line decides.
    died = text + "srun: error: dgx-h1-09: task 0: Exited with exit code 1\n"
    r = nccl.judge(nccl.parse(died), _in_node_gates("dgx-h100"))
    assert r.status is Status.UNKNOWN and "Exited with exit code 1" in dict(r.evidence)["error"]
    died = text + " dgx-h1-09 pid 77102: Test failure common.cu:1106\n" + "srun: error: dgx-h1-09: task 0: Exited with exit code 1\n"
    assert nccl.judge(nccl.parse(died), _in_node_gates("dgx-h100")).status is Status.FAIL


def test_mpi_and_hcoll_noise_around_a_completed_run_is_no_failure(own_fixtures: Path) -> None:
    """Open MPI's openib BTL warning and HCOLL's "ml_discover_hierarchy exited with error" print
    on healthy runs. Before: "error" matched -> FAIL+DRAIN of a run that finished with correct
    data; a pair test with them failed and its nodes were suspected. Around a run that stopped
    early they are no failure either (UNKNOWN); the test's own failure line is."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_2node_h100_healthy.txt").read_text()
    noise = ("[dgx01][[31817,1],0][btl_openib_component.c:1704:init_one_device] error obtaining device attributes "
             "for mlx5_0 errno says No space left on device\n"
             "WARNING: There was an error initializing an OpenFabrics device.\n"
             "[LOG_CAT_ML] ml_discover_hierarchy exited with error\n")
    noisy = noise + text
    run = nccl.parse(noisy)
    assert run.errors and not run.fatal_errors
    gates = nccl.multinode_gates(profiles.load("dgx-h100").thresholds)
    assert {r.status for r in nccl.judge_hosts(run, gates)} == {Status.OK}
    pr = nccl_slurm.classify(nccl_slurm.PairRun("dgx01", "dgx02", 0, noisy, run), gates, 0.0, 10.0)
    assert pr.outcome == "pass", pr.reason
    cut = noisy[: noisy.index("# Out of bounds")]
    assert nccl.judge(nccl.parse(cut), gates).status is Status.UNKNOWN
    crashed = cut + "[dgx02:40120] *** Process received signal ***\nSegmentation fault (core dumped)\n"
    assert nccl.judge(nccl.parse(crashed), gates).status is Status.FAIL


def test_non_finite_numbers_and_a_single_rank_are_not_measurements() -> None:
    """A row of "inf"/"nan" (zero time) was read as a measurement: a NaN busbw is below no gate,
    so the run passed. One rank's busbw is 0 by definition: it failed every gate."""
    head = ("# nThread 1 nGpus 1 minBytes 1073741824 maxBytes 2147483648 step: 2(factor) warmup iters: 5 iters: 20\n"
            "#  Rank  0 Group  0 Pid  4242 on dgx01 device  0 [0x18] NVIDIA H100 80GB HBM3\n")
    tail = "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 0\n"
    nan = head + "  1073741824  268435456  float  sum  -1  0.00  inf  nan  0  0.00  inf  nan  0\n" + tail
    run = nccl.parse(nan)
    assert run.rows == () and nccl.judge(run, nccl.Gates(300)).status is Status.UNKNOWN
    one = head + ("  1073741824  268435456  float  sum  -1  2641.2  406.53  0.00  0  2638.0  407.02  0.00  0\n"
                  "  2147483648  536870912  float  sum  -1  5270.9  407.43  0.00  0  5268.1  407.65  0.00  0\n") + tail
    r = nccl.judge(nccl.parse(one), nccl.Gates(300))
    assert r.status is Status.UNKNOWN and "single rank" in r.summary
    corrupt = one.replace("0.00  0\n  2147483648", "0.00  3\n  2147483648")
    assert nccl.judge(nccl.parse(corrupt), nccl.Gates(300)).status is Status.FAIL


def test_a_complete_sweep_too_short_for_the_in_node_gate_is_not_judged(own_fixtures: Path) -> None:
    """A finished run whose largest size is 256 MiB: NVLink has not reached its plateau there.
    Before: FAIL+DRAIN below the gate. Now UNKNOWN naming the size the gate needs."""
    text = (own_fixtures / "nccl" / "all_reduce_perf_8gpu_killed_midrun.txt").read_text()
    run = nccl.parse(text + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 275.9\n#\n")
    assert run.complete
    r = nccl.judge(run, _in_node_gates("dgx-h100"))
    assert r.status is Status.UNKNOWN and "1073741824" in r.summary
    assert nccl.judge(run, nccl.Gates(300)).status is Status.OK     # no size bound: the gate alone


def test_cli_judge_applies_the_in_node_size_bound(own_fixtures: Path, tmp_path: Path) -> None:
    f = tmp_path / "short.txt"
    f.write_text((own_fixtures / "nccl" / "all_reduce_perf_8gpu_killed_midrun.txt").read_text()
                 + "# Out of bounds values : 0 OK\n# Avg bus bandwidth    : 275.9\n#\n")
    r = subprocess.run([sys.executable, "-m", "podhealth", "nccl", "--judge", str(f), "--profile", "dgx-h100",
                        "--format", "json"], capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert [x["status"] for x in json.loads(r.stdout)["results"]] == ["UNKNOWN"]


def test_pair_classification_ignores_benign_warn_lines(own_fixtures: Path) -> None:
    text = (own_fixtures / "nccl" / "all_reduce_perf_2node_h100_healthy.txt").read_text()
    warned = text.replace("NCCL version", "dgx01:1:1 [0] NCCL WARN Missing \"iommu=pt\" from kernel command line\n"
                                          "dgx01:1:1 [0] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.\nNCCL version")
    gates = nccl.multinode_gates(profiles.load("dgx-h100").thresholds)
    for t in (text, warned):
        pr = nccl_slurm.classify(nccl_slurm.PairRun("dgx01", "dgx02", 0, t, nccl.parse(t)), gates, 0.0, 10.0)
        assert pr.outcome == "pass", pr.reason


def test_real_healthy_captures_clear_their_gates_with_margin(shared_fixtures: Path) -> None:
    """A slightly slower healthy node must not FAIL: every healthy real capture sits at least 10%
    above the gate it is judged against (in-node A100; 2-node A100/H200)."""
    cases = [("all_reduce_perf_a100_8gpu_single_node_gcm.txt", "dgx-a100", "nccl_allreduce_busbw_gbps"),
             ("all_reduce_perf_a100_2node_16gpu_gcm.txt", "dgx-a100", "nccl_multinode_busbw_gbps"),
             ("all_reduce_perf_h200_2node_16gpu_oci_slurm.txt", "dgx-h200", "nccl_multinode_busbw_gbps"),
             ("all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt", "dgx-h200", "nccl_multinode_busbw_gbps")]
    for name, profile, key in cases:
        run = nccl.parse((shared_fixtures / "nccl_tests" / name).read_text())
        large = run.large_busbw()
        assert run.complete and large is not None
        assert large >= 1.1 * profiles.load(profile).threshold(key), (name, large)


@pytest.mark.parametrize("wrap", ["tag-output", "srun-label", "nccl-info"])
def test_real_captures_read_the_same_through_launchers_and_debug_output(shared_fixtures: Path, wrap: str) -> None:
    """Every real nccl-tests capture gives the same rows, hosts and verdict when it comes through
    `mpirun --tag-output`, `srun --label`, or with NCCL_DEBUG=INFO lines between its lines."""
    for path in sorted((shared_fixtures / "nccl_tests").glob("*.txt")):
        if path.name.endswith(".source.txt"):
            continue
        text = path.read_text()
        lines = text.splitlines(keepends=True)
        if wrap == "tag-output":
            other = "".join(f"[1,{i % 2}]<stdout>:{ln}" for i, ln in enumerate(lines))
        elif wrap == "srun-label":
            other = "".join(f"{i % 16}: {ln}" for i, ln in enumerate(lines))
        else:
            other = "".join(f"{ln}gpu01:4242:4250 [0] NCCL INFO NCCL_IB_TIMEOUT set by environment to 22.\n"
                            for ln in lines)
        a, b = nccl.parse(text), nccl.parse("\ufeff" + other.replace("\n", "\r\n"))
        assert (a.rows, a.hosts, a.complete, a.fatal_errors) == (b.rows, b.hosts, b.complete, b.fatal_errors), path.name
        gates = nccl.multinode_gates(profiles.load("dgx-h200").thresholds)
        assert [r.status for r in nccl.judge_hosts(a, gates)] == [r.status for r in nccl.judge_hosts(b, gates)], path.name


# ---- dcgmi diag ---------------------------------------------------------------------------------


def test_real_dcgm_captures_read_the_same_between_log_lines(shared_fixtures: Path) -> None:
    """A wrapper's banner and log lines before a capture (one holding braces), and a shell's lines
    after it, change nothing (JSON and text)."""
    before = ("Executing in Pod nvidia-dcgm-x7k2p on Host 10.0.7.21\n"
              "2026-03-04 10:12:01.114 INFO  [5122:5122] Config {\"globals\": {\"logfile\": \"nvvs.log\"}} applied\n"
              "{not json} either\n" * 5)
    after = "\nrc=226\n$ exit\n"
    for path in sorted((shared_fixtures / "dcgm").glob("dcgmi_diag*")):
        if path.name.endswith(".source.txt"):
            continue
        text = path.read_text()
        a, b = dcgm.parse(text), dcgm.parse(before + text + after)
        assert (a.entries, a.format, a.version) == (b.entries, b.format, b.version), path.name
        assert dcgm.parse("\ufeff" + text.replace("\n", "\r\n")).entries == a.entries, path.name


def test_dcgm3_json_gpu_id_results_are_per_gpu(own_fixtures: Path) -> None:
    """DCGM 2/3 dcgmi -j: `"gpu_id": "2"` per result, metadata at the top level, deployment
    warnings with the message under "warnings". Before: every result landed on "node" (18
    duplicate keys), no version, the row-remap message was lost."""
    rep = dcgm.parse((own_fixtures / "dcgm" / "dcgm3_diag_j_4gpu_gpu_id_row_remap_fail.json").read_text())
    assert (rep.format, rep.version, rep.driver) == ("legacy-json", "3.3.6", "550.54.15")
    res = _by_key(dcgm.results(rep))
    remap = res[("dcgm_diag.page_retirement_row_remap", "gpu2")]
    assert (remap.status, remap.action) == (Status.FAIL, Action.REPLACE)
    assert "row remapping failed" in remap.summary and dict(remap.evidence)["codes"] == "DCGM_FR_ROW_REMAP_FAILURE"
    diag2 = res[("dcgm_diag.diagnostic", "gpu2")]
    assert (diag2.status, dict(diag2.evidence)["codes"]) == (Status.FAIL, "DCGM_FR_GFLOPS_THRESHOLD_VIOLATION")
    assert all(res[("dcgm_diag.diagnostic", f"gpu{g}")].status is Status.OK for g in (0, 1, 3))
    assert res[("dcgm_diag.memory_bandwidth", "gpu1")].status is Status.OK      # disabled for the SKU
    assert res[("dcgm_diag.denylist", "node")].status is Status.OK
    assert {r.entity for r in res.values() if r.status is Status.FAIL} == {"gpu2"}


def test_dcgm4_json_after_log_lines_with_mig_skips_and_warnings(own_fixtures: Path) -> None:
    """DCGM 4 JSON after six dcgm log lines (one holding a "{...}"). Before: DiagParseError
    ("no dcgmi diag table found") -> UNKNOWN for a run that had answers. A Warn with an error
    code is a WARN, a Pass with one is OK, skips are OK one by one; GPU 3 (MIG) skipped every
    hardware test: UNKNOWN, not a pass."""
    text = (own_fixtures / "dcgm" / "dcgm4_diag_j_4gpu_mig_skip_warn_after_log_lines.txt").read_text()
    rep = dcgm.parse(text + "rc=226\n=== dcgmi stderr ===\n")       # a wrapper's lines after it, too
    assert (rep.format, rep.version) == ("dcgm4-json", "4.4.1")
    res = _by_key(dcgm.results(rep))
    assert not [r for r in res.values() if r.status is Status.FAIL]
    assert res[("dcgm_diag.targeted_stress", "gpu1")].status is Status.WARN
    assert res[("dcgm_diag.targeted_stress", "gpu0")].status is Status.OK
    assert res[("dcgm_diag.nvbandwidth", "gpu2")].status is Status.OK
    assert res[("dcgm_diag.memory", "gpu3")].status is Status.OK
    untested = res[("dcgm_diag", "gpu3")]
    assert untested.status is Status.UNKNOWN and "MIG" in untested.summary
    assert not {("dcgm_diag", f"gpu{g}") for g in (0, 1, 2)} & set(res)


def test_a_run_where_every_hardware_test_skipped_is_not_a_pass(own_fixtures: Path) -> None:
    """Before: OK (every skip is OK on its own), so a -r 3 that tested nothing passed handover."""
    res = dcgm.results(dcgm.parse((own_fixtures / "dcgm" / "dcgm4_diag_j_2gpu_everything_skipped.json").read_text()))
    assert dcgm.worst(res) is Status.UNKNOWN
    assert {(r.check, r.entity) for r in res if r.status is Status.UNKNOWN} == {("dcgm_diag", "gpu0"), ("dcgm_diag", "gpu1")}
    # Node-level skips next to a runtime error: one node UNKNOWN (the run's), not two.
    doc = {"DCGM Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic for group 0. Return: (-13) Timeout.",
                               "test_categories": [{"category": "Stress", "tests": [{"name": "cpu_eud", "results": [
                                   {"entity_group": "CPU", "entity_id": 0, "status": "Skip"}]}]}]}}
    res = dcgm.results(dcgm.parse(json.dumps(doc)))
    assert [(r.check, r.status) for r in _by_key(res).values() if r.entity == "node"] == [
        ("dcgm_diag", Status.UNKNOWN), ("dcgm_diag.cpu_eud", Status.OK)]


def test_dcgm3_text_mixed_rows_and_error_rows(own_fixtures: Path) -> None:
    """DCGM 3 text: "Pass - GPUs: 0, 1, 3" / "Fail - GPU: 2" rows, and a deployment failure whose
    message is an "Error" row. Before: that message was filed as info, so its code was lost
    (DRAIN by default instead of the row-remap code's REPLACE)."""
    rep = dcgm.parse((own_fixtures / "dcgm" / "dcgmi_diag_r3_dcgm3_4gpu_mixed_rows_error_row.txt").read_text())
    res = _by_key(dcgm.results(rep))
    remap = res[("dcgm_diag.page_retirement_row_remap", "node")]
    assert (remap.status, remap.action) == (Status.FAIL, Action.REPLACE) and "GPU 2" in remap.summary
    assert res[("dcgm_diag.diagnostic", "gpu2")].status is Status.FAIL
    assert [res[("dcgm_diag.diagnostic", f"gpu{g}")].status for g in (0, 1, 3)] == [Status.OK] * 3
    assert res[("dcgm_diag.targeted_power", "gpu1")].status is Status.WARN
    assert [res[("dcgm_diag.memory_bandwidth", f"gpu{g}")].status for g in range(4)] == [Status.OK] * 4
    # A later build's metadata label ("GPU PCI Device IDs Detected") counts the GPUs the same.
    renamed = dcgm.parse((own_fixtures / "dcgm" / "dcgmi_diag_r3_dcgm3_4gpu_mixed_rows_error_row.txt").read_text()
                         .replace("| GPU Device IDs Detected   |", "| GPU PCI Device IDs Detected |"))
    assert renamed.entries == rep.entries


def test_dcgm45_nvbandwidth_busy_copy_engines_is_unknown_not_a_fault(own_fixtures: Path) -> None:
    """DCGM 4.5.0 -r 3 fails nvbandwidth on idle healthy H100s ("memory copy utilization ... is
    greater than 10%", NVIDIA/DCGM#272). Before: FAIL+DRAIN on the GPU and again on the node (the
    message says "the GPU: 2", which was not read as GPU 2)."""
    rep = dcgm.parse((own_fixtures / "dcgm" / "dcgmi_diag_r3_dcgm4.5_8gpu_nvbandwidth_mcutil.txt").read_text())
    res = _by_key(dcgm.results(rep))
    assert [k for k, r in res.items() if r.status is not Status.OK] == [("dcgm_diag.nvbandwidth", "gpu2")]
    assert res[("dcgm_diag.nvbandwidth", "gpu2")].status is Status.UNKNOWN
    # The same in DCGM 4 JSON, whatever code it carries; with a real fault next to it, FAIL stays.
    busy = {"error_category": 1, "error_id": 34, "error_severity": 2,
            "warning": "The memory copy utilization for the GPU: 2 is greater than 10%. This may affect the results."}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Integration", "tests": [{"name": "nvbandwidth", "results": [
        {"entity_group": "GPU", "entity_id": 2, "status": "Fail", "warnings": [busy]}]}]}]}}
    assert [r.status for r in dcgm.results(dcgm.parse(json.dumps(doc)))] == [Status.UNKNOWN]
    doc["DCGM Diagnostic"]["test_categories"][0]["tests"][0]["results"][0]["warnings"].append(  # type: ignore[index]
        {"error_category": 11, "error_id": 14, "error_severity": 2, "warning": "NVLink 3 on GPU 2 is down."})
    assert [r.status for r in dcgm.results(dcgm.parse(json.dumps(doc)))] == [Status.FAIL]


def test_iterations_keep_the_worst_result_of_any_run(own_fixtures: Path) -> None:
    """`dcgmi diag --iterations 2 -j`. Before: DiagParseError -> UNKNOWN."""
    failing = json.loads((own_fixtures / "dcgm" / "dcgm4_diag_4gpu_memory_fail.json").read_text())
    passing = json.loads(json.dumps(failing).replace('"Fail"', '"Pass"'))
    doc = {"iterations": [passing, failing], "Overall Result": "Fail", "Warning": "The diagnostic failed"}
    res = _by_key(dcgm.results(dcgm.parse(json.dumps(doc))))
    assert res[("dcgm_diag.memory", "gpu2")].status is Status.FAIL
    assert res[("dcgm_diag.memory", "gpu0")].status is Status.OK
    with pytest.raises(dcgm.DiagParseError):
        dcgm.parse('{"iterations": [], "Overall Result": "Pass"}')


def test_persistence_mode_off_on_every_gpu_is_one_node_result() -> None:
    """DCGM 4's software test fails each GPU for persistence mode (error_id 29, severity CONFIG;
    DCGM 3 passed it with an Info row). Before: eight GPU-level FAILs, as if eight GPUs were bad;
    now one node-level FAIL naming them (nvidia-persistenced is the node's)."""
    w = {"error_category": 8, "error_id": 29, "error_severity": 5,
         "warning": "Persistence mode for GPU {} is disabled. Enable persistence mode by running nvidia-smi -pm 1 as root."}
    doc = {"DCGM Diagnostic": {"test_categories": [{"category": "Deployment", "tests": [{"name": "software", "results": [
        {"entity_group": "GPU", "entity_id": g, "status": "Fail", "warnings": [dict(w, warning=str(w["warning"]).format(g))]}
        for g in range(8)]}]}]}}
    res = dcgm.results(dcgm.parse(json.dumps(doc)))
    assert [(r.check, r.entity, r.status) for r in res] == [("dcgm_diag.software", "node", Status.FAIL)]
    assert dict(res[0].evidence)["gpus"] == "0,1,2,3,4,5,6,7"


def test_a_refusal_without_a_table_says_what_dcgmi_said() -> None:
    with pytest.raises(dcgm.DiagParseError, match="Host engine is not loaded"):
        dcgm.parse("Error: Unable to complete diagnostic for group 2147483647. Return: (-38) Host engine is not loaded.\n")


def _fake_dcgmi(tmp: Path, stdout: str, code: int) -> dict[str, str]:
    d = tmp / "bin"
    d.mkdir(exist_ok=True)
    p = d / "dcgmi"
    p.write_text(f"#!{sys.executable}\nimport sys\nsys.stdout.write({stdout!r})\nsys.exit({code})\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": f"{d}{os.pathsep}{os.environ.get('PATH', '')}"}


@pytest.mark.parametrize("stdout,code", [
    # dcgmi's own refusals: host engine down, DCGM not configured, its own timeout, paused.
    ("Error: Unable to complete diagnostic for group 2147483647. Return: (-38) Host engine is not loaded.\n", 255),
    ('{\n   "DCGM Diagnostic" : {\n      "runtime_error" : "Error: Unable to complete diagnostic for group 0. '
     'Return: (-33) Setting not configured.",\n      "version" : "4.2.3"\n   }\n}\n', 255),
    ('{"DCGM GPU Diagnostic": {"runtime_error": "Error: Unable to complete diagnostic for group 0. '
     'Return: (-13) Timeout.\\nError: Could not stop the launched diagnostic.", "version": "3.3.6"}}\n', 241),
    ("Error: Diagnostic could not be run while DCGM is paused.\n", 255),
    # MIG mode on a GPU of the group (NVIDIA/DCGM#70, #94): dcgmi refuses the whole run.
    ("GPU 0's MIG configuration is incompatible with the diagnostic because it prevents access to the entire GPU.\n", 255),
])
def test_aborted_runs_are_unknown_never_fail(tmp_path: Path, stdout: str, code: int) -> None:
    run = dcgm.run_diag(1, env=_fake_dcgmi(tmp_path, stdout, code))
    assert [r.status for r in run.results] == [Status.UNKNOWN]
    assert run.results[0].action is Action.NONE
