"""Multi-node NCCL gates: from the profile per SKU, never a default of 0, blaming the hosts the
nccl-tests output names (own fixtures in tests/fixtures/nccl, real captures when present)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.checks.active import localize, nccl, nccl_slurm
from podhealth.checks import profiles
from podhealth.vocab import Action, Status

pytestmark = pytest.mark.timeout(120)

H100 = profiles.load("dgx-h100")
GENERIC = profiles.load("generic")


def run_of(own: Path, name: str) -> nccl.NcclRun:
    return nccl.parse((own / "nccl" / name).read_text())


@pytest.mark.parametrize("name", ["dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200"])
def test_every_dgx_profile_states_a_multinode_gate(name: str) -> None:
    p = profiles.load(name)
    assert p.threshold("nccl_multinode_busbw_gbps") > 0
    assert p.threshold("nccl_multinode_min_bytes") >= 1 << 28


def test_slow_two_node_run_fails_and_blames_the_hosts_it_names(own_fixtures: Path) -> None:
    run = run_of(own_fixtures, "all_reduce_perf_2node_slow_rail.txt")
    res = nccl.judge_hosts(run, nccl.multinode_gates(H100.thresholds))
    assert [r.entity for r in res] == ["dgx07", "dgx08"]          # not "node", not this host
    assert socket.gethostname().split(".")[0] not in {r.entity for r in res}
    for r in res:
        ev = dict(r.evidence)
        assert r.status is Status.FAIL and r.action is Action.DRAIN
        assert "below the gate 300" in r.summary and ev["hosts"] == "dgx07,dgx08" and ev["ranks"] == "8"
        assert float(ev["gate_gbps"]) == 300
    assert "with dgx08" in res[0].summary and "with dgx07" in res[1].summary


def test_healthy_two_node_run_passes(own_fixtures: Path) -> None:
    res = nccl.judge_hosts(run_of(own_fixtures, "all_reduce_perf_2node_h100_healthy.txt"),
                           nccl.multinode_gates(H100.thresholds))
    assert [(r.entity, r.status) for r in res] == [("dgx11", Status.OK), ("dgx12", Status.OK)]


def test_profile_without_gate_is_unknown_not_pass(own_fixtures: Path) -> None:
    assert GENERIC.threshold("nccl_multinode_busbw_gbps") == 0
    res = nccl.judge_hosts(run_of(own_fixtures, "all_reduce_perf_2node_h100_healthy.txt"),
                           nccl.multinode_gates(GENERIC.thresholds))
    assert {r.status for r in res} == {Status.UNKNOWN}
    assert "no multi-node busbw gate measured for this fabric" in res[0].summary
    # A broken run still fails without a gate: wrong values and errors need no bandwidth figure.
    broken = nccl.judge_hosts(run_of(own_fixtures, "all_reduce_perf_2node_ib_error.txt"),
                              nccl.multinode_gates(GENERIC.thresholds))
    assert [(r.entity, r.status) for r in broken] == [("dgx03", Status.FAIL), ("dgx04", Status.FAIL)]


def test_site_override_replaces_the_profile_gate(own_fixtures: Path) -> None:
    run = run_of(own_fixtures, "all_reduce_perf_2node_slow_rail.txt")
    assert {r.status for r in nccl.judge_hosts(run, nccl.multinode_gates(H100.thresholds, 200.0))} == {Status.OK}
    site = profiles.load("dgx-h100", {"thresholds.nccl_multinode_busbw_gbps": 200})
    assert {r.status for r in nccl.judge_hosts(run, nccl.multinode_gates(site.thresholds))} == {Status.OK}


def test_sweep_short_of_the_gate_size_is_unknown(own_fixtures: Path) -> None:
    res = nccl.judge_hosts(run_of(own_fixtures, "all_reduce_perf_2node_small_sweep.txt"),
                           nccl.multinode_gates(H100.thresholds))
    assert {r.status for r in res} == {Status.UNKNOWN}      # 105 GB/s at 8 MiB is not a slow fabric
    assert "below the 1073741824 B the gate is stated for" in res[0].summary


def test_larger_run_below_the_two_node_gate_warns_each_host(own_fixtures: Path) -> None:
    res = nccl.judge_hosts(run_of(own_fixtures, "all_reduce_perf_4node_below_2node_gate.txt"),
                           nccl.multinode_gates(H100.thresholds))
    assert [r.entity for r in res] == ["dgx21", "dgx22", "dgx23", "dgx24"]
    assert {(r.status, r.action) for r in res} == {(Status.WARN, Action.NONE)}
    assert "--nodes" in res[0].summary


REAL = {
    # capture: (profile, hosts, status against that profile's multi-node gate)
    "all_reduce_perf_a100_2node_16gpu_gcm.txt": ("dgx-a100", 2, Status.OK),          # 177 GB/s vs 150
    "all_reduce_perf_h200_2node_16gpu_oci_slurm.txt": ("dgx-h200", 2, Status.OK),    # 484 vs 300
    "all_reduce_perf_h200_2node_g8_nccltests2.18_newformat.txt": ("dgx-h200", 2, Status.OK),
    "all_reduce_perf_a100_8gpu_single_node_gcm.txt": ("dgx-a100", 1, Status.OK),     # in-node: not gated here
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_multinode_captures_pass_their_sku_gate(shared_fixtures: Path, name: str) -> None:
    prof, hosts, status = REAL[name]
    run = nccl.parse((shared_fixtures / "nccl_tests" / name).read_text())
    assert len(run.hosts) == hosts
    if hosts < 2:
        return
    res = nccl.judge_hosts(run, nccl.multinode_gates(profiles.load(prof).thresholds))
    assert [r.entity for r in res] == list(run.hosts)
    assert {r.status for r in res} == {status}, res


def test_real_a100_pair_fails_an_h100_gate(shared_fixtures: Path) -> None:
    """The same capture judged against the wrong SKU's gate fails: the gate is per SKU."""
    run = nccl.parse((shared_fixtures / "nccl_tests" / "all_reduce_perf_a100_2node_16gpu_gcm.txt").read_text())
    assert {r.status for r in nccl.judge_hosts(run, nccl.multinode_gates(H100.thresholds))} == {Status.FAIL}


def _pair(own: Path, name: str, a: str, b: str) -> nccl_slurm.PairRun:
    text = (own / "nccl" / name).read_text()
    return nccl_slurm.PairRun(a, b, 0, text, nccl.parse(text))


def test_pair_classification_uses_the_profile_gate(own_fixtures: Path) -> None:
    gates = nccl.multinode_gates(H100.thresholds)
    slow = nccl_slurm.classify(_pair(own_fixtures, "all_reduce_perf_2node_slow_rail.txt", "dgx07", "dgx08"), gates, 0, 10)
    assert slow.outcome == "fail" and slow.slow_only and "gate 300" in slow.reason
    good = nccl_slurm.classify(_pair(own_fixtures, "all_reduce_perf_2node_h100_healthy.txt", "dgx11", "dgx12"), gates, 0, 10)
    assert good.outcome == "pass"
    nogate = nccl_slurm.classify(_pair(own_fixtures, "all_reduce_perf_2node_h100_healthy.txt", "dgx11", "dgx12"),
                                 nccl.multinode_gates(GENERIC.thresholds), 0, 10)
    assert nogate.outcome == "unknown" and "no multi-node busbw gate" in nogate.reason


def test_pairwise_without_a_gate_ends_unknown_saying_why(own_fixtures: Path) -> None:
    text = (own_fixtures / "nccl" / "all_reduce_perf_2node_h100_healthy.txt").read_text()

    def fake_run(job: nccl_slurm.PairJob, a: str, b: str) -> nccl_slurm.PairRun:
        return nccl_slurm.PairRun(a, b, 0, text, nccl.parse(text))

    out = nccl_slurm.run_pairwise(["dgx01", "dgx02", "dgx03", "dgx04"], nccl_slurm.PairJob(),
                                  nccl.multinode_gates(GENERIC.thresholds), run=fake_run)
    assert {r.status for r in out.results} == {Status.UNKNOWN}
    assert all("no multi-node busbw gate" in r.summary for r in out.results)
    assert all(v.state is localize.NodeState.UNKNOWN for v in out.plan.verdicts)


def _nccl_cmd(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "nccl", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_cli_judges_saved_multinode_output_blaming_its_hosts(own_fixtures: Path) -> None:
    f = own_fixtures / "nccl" / "all_reduce_perf_2node_slow_rail.txt"
    r = _nccl_cmd("--judge", str(f), "--profile", "dgx-h100", "--format", "json")
    assert r.returncode == 1, r.stdout + r.stderr
    rep = json.loads(r.stdout)
    assert {(x["entity"], x["status"]) for x in rep["results"]} == {("dgx07", "FAIL"), ("dgx08", "FAIL")}
    r = _nccl_cmd("--judge", str(f), "--profile", "generic", "--format", "json")
    assert r.returncode == 2, r.stdout + r.stderr        # could not decide: no gate for this SKU
    r = _nccl_cmd("--judge", str(own_fixtures / "nccl" / "missing.txt"), "--profile", "dgx-h100")
    assert r.returncode == 2 and "cannot read" in r.stdout
