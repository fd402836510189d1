"""Multi-node NCCL gates for fabrics that are not the DGX's (issue 28 section 1).

A profile without a gate measured on its fabric judges a completed multi-node run UNKNOWN, never
against another fabric's figure; `podhealth profile capture --nccl FILE` states the site's own gate
from a healthy run, and that gate then passes the healthy run and fails a degraded one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.profiles import nccl as profile_nccl, site as site_profile
from podhealth.checks.active import nccl
from podhealth.vocab import Status

pytestmark = pytest.mark.timeout(120)

HEALTHY = "all_reduce_perf_2node_h100_healthy.txt"  # 2x8 H100, plateau 361.8 .. 388.1 GB/s
SLOW = "all_reduce_perf_2node_slow_rail.txt"  # the same pair with one rail at a fraction of its rate


def _gate(profile: profiles.Profile) -> nccl.Gates:
    return nccl.multinode_gates(profile.thresholds)


def test_an_oem_fabric_without_a_measured_gate_is_unknown_never_the_dgx_figure(own_fixtures: Path) -> None:
    run = nccl.parse((own_fixtures / "nccl" / HEALTHY).read_text())
    for name in ("hgx-h100", "hgx-h200", "h100-nvl", "l40s", "gh200", "gb200-nvl72", "generic"):
        res = nccl.judge_hosts(run, _gate(profiles.load(name)))
        assert res and all(r.status is Status.UNKNOWN and "profile capture --nccl" in r.summary for r in res), (name, res)
    # the DGX's own fabric keeps its gate
    assert {r.status for r in nccl.judge_hosts(run, _gate(profiles.load("dgx-h100")))} == {Status.OK}


def test_measured_gate_is_80_percent_of_the_healthy_plateau(own_fixtures: Path) -> None:
    g = profile_nccl.measured_gate((own_fixtures / "nccl" / HEALTHY).read_text(), HEALTHY, 1 << 30)
    plateau = (377.50 + 384.00 + 388.10) / 3  # sizes within 4x of the largest (4 GiB)
    assert g.gate_gbps == round(plateau * 0.8, 1)
    assert "2 nodes x 8 GPUs" in g.comment and HEALTHY in g.comment


@pytest.mark.parametrize("name, why", [
    ("all_reduce_perf_8gpu_h100_ring_nccl_info.txt", r"host\(s\); a multi-node gate needs a run across nodes"),
    ("all_reduce_perf_2node_small_sweep.txt", "is below the 1073741824 B the gate is stated for"),
    ("all_reduce_perf_2node_ib_error.txt", "did not complete cleanly"),
    ("all_reduce_perf_8gpu_killed_midrun.txt", "did not complete cleanly|host"),
])
def test_a_run_that_cannot_set_a_gate_is_refused(own_fixtures: Path, name: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        profile_nccl.measured_gate((own_fixtures / "nccl" / name).read_text(), name, 1 << 30)


def test_capture_states_the_gate_and_the_site_profile_then_judges_with_it(tmp_path: Path, own_fixtures: Path) -> None:
    got = subprocess.run([sys.executable, "-m", "podhealth", "profile", "capture", "--simulate", "hgx-h100",
                          "--sim-root", str(tmp_path / "sim"), "--nccl", str(own_fixtures / "nccl" / HEALTHY)],
                         capture_output=True, text=True, timeout=90)
    assert got.returncode == 0, got.stderr
    assert "extends: hgx-h100" in got.stdout  # the simulated OEM board has no DGX rails: not a DGX
    path = tmp_path / "site.yaml"
    path.write_text(got.stdout)
    site = site_profile.load(path)
    gate = profile_nccl.measured_gate((own_fixtures / "nccl" / HEALTHY).read_text(), HEALTHY, 1 << 30).gate_gbps
    assert site.threshold("nccl_multinode_busbw_gbps") == gate
    healthy = nccl.parse((own_fixtures / "nccl" / HEALTHY).read_text())
    slow = nccl.parse((own_fixtures / "nccl" / SLOW).read_text())
    assert {r.status for r in nccl.judge_hosts(healthy, _gate(site))} == {Status.OK}
    assert Status.FAIL in {r.status for r in nccl.judge_hosts(slow, _gate(site))}


def test_capture_refuses_a_single_node_run_with_exit_2(tmp_path: Path, own_fixtures: Path) -> None:
    got = subprocess.run([sys.executable, "-m", "podhealth", "profile", "capture", "--simulate", "hgx-h100",
                          "--sim-root", str(tmp_path / "sim"), "--nccl",
                          str(own_fixtures / "nccl" / "all_reduce_perf_8gpu_h100_ring_nccl_info.txt")],
                         capture_output=True, text=True, timeout=90)
    assert got.returncode == 2 and got.stdout == ""
    assert "a multi-node gate needs a run across nodes" in got.stderr
    assert not (tmp_path / "sim").exists()  # refused before anything was read or created
