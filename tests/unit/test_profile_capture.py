"""`podhealth profile capture` / `diff` on the simulator (the real CLI, collectors and simulated
NVML), against a running agent's /metrics, and the pure observe/diff/render pieces."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from podhealth.checks.profiles import capture as profile_capture, render as profile_render, site as site_profile
from podhealth.checks.profiles.source import SourceError, snapshot_from_metrics
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Sample
from tests.harness.proc import free_port, http_get, service

pytestmark = pytest.mark.timeout(120)


def cli(*argv: str, sim_root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "podhealth", "profile", *argv], capture_output=True, text=True,
                          timeout=90, env={"PODHEALTH_SIM_DIR": str(sim_root), "PATH": "/usr/bin:/bin"})


def capture(tmp_path: Path) -> Path:
    got = cli("capture", "--simulate", "dgx-h100", sim_root=tmp_path / "sim")
    assert got.returncode == 0, got.stderr
    # what the YAML leaves out is said on stderr as the YAML says it (no OFED in the simulator; its
    # kernel is the simulated node's own, <proc>/sys/kernel/osrelease)
    assert "not stated (not readable on this node; inherited from dgx-h100): versions.ofed\n" in got.stderr, got.stderr
    path = tmp_path / "site.yaml"
    path.write_text(got.stdout)
    return path


def test_capture_on_the_simulator_round_trips(tmp_path: Path) -> None:
    path = capture(tmp_path)
    text = path.read_text()
    site = site_profile.read(path)  # the captured file is a valid site profile
    assert site.extends == "dgx-h100"
    assert site.overrides["gpu_count"] == 8 and site.overrides["nvlink_links"] == 18
    assert site.overrides["versions.driver"] and site.overrides["versions.hca_fw"]
    from podhealth.sim.tree_proc import KERNEL_RELEASE
    assert site.overrides["versions.kernel"] == KERNEL_RELEASE
    assert site.overrides["network.roles"]["compute"]["count"] == 8
    # every captured value says where it came from
    assert re.search(r"^gpu_count: 8 +# nvml: gpu_devices$", text, re.M)
    assert re.search(r"^  driver: \S+ +# nvml: driver version$", text, re.M)
    # the HCAs' own PCIe links (infiniband collector, device/current_link_*): a comment, not judged
    assert "# HCA PCIe links: 9 at gen5 x16" in text
    # the simulator has no kernel release or OFED: said, not guessed
    assert "# ofed: not readable on this node, not stated" in text
    same = cli("diff", str(path), "--simulate", "dgx-h100", "--format", "json", sim_root=tmp_path / "sim")
    assert same.returncode == 0, same.stdout + same.stderr
    body = json.loads(same.stdout)
    assert body["result"] == "same" and all(r["status"] == "same" for r in body["rows"])
    assert {"gpu_count", "versions.driver", "versions.hca_fw", "network.roles.compute", "nfs_mounts"} <= {
        r["key"] for r in body["rows"]}


def test_diff_shows_a_changed_profile_value_and_a_changed_node(tmp_path: Path) -> None:
    path = capture(tmp_path)
    text = path.read_text()
    driver = site_profile.read(path).overrides["versions.driver"]
    edited = tmp_path / "edited.yaml"
    edited.write_text(text.replace(f"driver: {driver}", "driver: 550.54.15", 1))
    got = cli("diff", str(edited), "--simulate", "dgx-h100", sim_root=tmp_path / "sim")
    assert got.returncode == 1, got.stdout + got.stderr
    assert re.search(rf"versions\.driver +550\.54\.15 +{re.escape(driver)} +differs", got.stdout), got.stdout
    # the node changes: one NVLink link of GPU 2 goes down
    inject = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "inject", "dgx01", "fault=nvlink-down", "gpu=2",
                             "link=5", "--root", str(tmp_path / "sim")], capture_output=True, text=True, timeout=60)
    assert inject.returncode == 0, inject.stderr
    got = cli("diff", str(path), "--simulate", "dgx-h100", "--format", "json", sim_root=tmp_path / "sim")
    assert got.returncode == 1, got.stdout + got.stderr
    rows = {r["key"]: r for r in json.loads(got.stdout)["rows"]}
    assert rows["nvlink_links"]["status"] == "differs" and rows["nvlink_links"]["observed"] == 17
    assert "gpu2=17" in rows["nvlink_links"]["detail"]
    assert rows["gpu_count"]["status"] == "same"


def test_a_bad_profile_file_is_exit_2_naming_file_line_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("extends: dgx-h100\nversions:\n  driver: 550\n  firmware: x\n")
    got = cli("diff", str(bad), "--simulate", "dgx-h100", sim_root=tmp_path / "sim")
    assert got.returncode == 2
    assert "bad.yaml:4: versions.firmware: unknown key" in got.stderr
    assert got.stdout == ""
    missing = cli("diff", str(tmp_path / "nope.yaml"), sim_root=tmp_path / "sim")
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr


def test_diff_against_a_running_agent_by_url(tmp_path: Path) -> None:
    path = capture(tmp_path)
    port = free_port()
    argv = [sys.executable, "-m", "podhealth", "agent", "--simulate", "dgx-h100", "--sim-root", str(tmp_path / "sim"),
            "--listen", f"127.0.0.1:{port}"]

    def ready() -> bool:
        status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        # every collector the profile reads has reported once
        return status == 200 and all(f'podhealth_collector_success{{collector="{c}"' in body.decode()
                                     for c in ("nvml", "nvlink", "infiniband", "nfs", "host"))

    with service("agent", argv, tmp_path / "logs", port, ready=ready, ready_timeout=60):
        got = cli("diff", str(path), "--url", f"http://127.0.0.1:{port}", "--format", "json", sim_root=tmp_path / "sim")
        assert got.returncode == 0, got.stdout + got.stderr
        assert json.loads(got.stdout)["node"] == "dgx01"
        captured = cli("capture", "--url", f"http://127.0.0.1:{port}", sim_root=tmp_path / "sim")
        assert captured.returncode == 0, captured.stderr
        assert "from the agent at http://127.0.0.1" in captured.stdout
    # nobody listening any more: cannot tell
    gone = cli("diff", str(path), "--url", f"http://127.0.0.1:{port}", "--timeout", "2", sim_root=tmp_path / "sim")
    assert gone.returncode == 2 and "cannot reach the agent" in gone.stderr


# ---- the pure pieces ------------------------------------------------------------------------------


def _snap(stale: tuple[str, ...] = ()) -> Snapshot:
    nvml = [Sample.of("gpu_devices", 2)] + [
        s for g in (0, 1) for s in (
            Sample.of("gpu_up", 1, gpu=g, model="NVIDIA H100 80GB HBM3"),
            Sample.of("gpu_memory_total_bytes", 81559 * 1024 * 1024, gpu=g),
            Sample.of("gpu_info", 1, gpu=g, driver_version="550.54.15", vbios_version="96.00.89.00.01"))]
    states = {c: CollectorState(c, samples=tuple(nvml if c == "nvml" else ()), stale=c in stale, last_success=1.0,
                                last_attempt=1.0) for c in ("nvml", "nvlink", "infiniband", "nfs", "host")}
    return Snapshot(1.0, states)


def test_unreadable_values_make_diff_unknown_never_same() -> None:
    obs = profile_capture.observe(_snap(stale=("nvml", "nvlink", "infiniband", "nfs", "host")))
    assert obs.values["gpu_count"] is None and obs.values["nfs_mounts"] is None
    prof = site_profile.build(site_profile.loads("extends: dgx-h100\nversions: {driver: '550.54.15'}\n"))
    d = profile_capture.diff(obs, prof)
    rows = {r.key: r for r in d.rows}
    assert rows["gpu_count"].status == "unknown" and rows["versions.driver"].status == "unknown"
    assert d.exit_code == 2 and {r.status for r in d.rows} == {"unknown"}
    # a fresh NFS collector that lists no mount is an answer: /home is missing
    fresh_nfs = profile_capture.diff(profile_capture.observe(_snap(stale=("nvml",))), prof)
    assert {r.key: r.status for r in fresh_nfs.rows}["nfs_mounts"] == "differs"
    # ... but the GPU values could not be read: cannot tell (2), not DIFFERS (1), as README says
    assert fresh_nfs.exit_code == 2 and fresh_nfs.to_json()["result"] == "unknown"
    read_all = profile_capture.diff(profile_capture.observe(_snap()), prof)
    assert {r.key: r.status for r in read_all.rows}["nfs_mounts"] == "differs"


def test_closest_profile_and_rendered_text_load_back() -> None:
    obs = profile_capture.observe(_snap())
    assert profile_capture.closest(obs)[0] == "dgx-h100"
    odd = profile_capture.Observation({"gpu_model": profile_capture.Seen("NVIDIA H100 NVL", "nvml")})
    assert profile_capture.closest(odd) == ("h100-nvl", 'GPU model "NVIDIA H100 NVL"')
    odd = profile_capture.Observation({"gpu_model": profile_capture.Seen("NVIDIA H100 SXM5 64GB", "nvml")})
    assert profile_capture.closest(odd) == ("dgx-h100", "H100 GPUs")
    unknown_gpu = profile_capture.Observation({"gpu_model": profile_capture.Seen("Tesla T4", "nvml")})
    assert profile_capture.closest(unknown_gpu)[0] == "generic"
    text = profile_render.capture_yaml(obs, "dgx-h100", "test", "a test", now=0)
    site = site_profile.loads(text)
    assert site.overrides["gpu_count"] == 2 and site.overrides["versions.vbios"] == "96.00.89.00.01"
    d = profile_capture.diff(obs, site_profile.build(site))
    # what was captured matches; what this node could not show (no NVLink or HCA data) stays
    # inherited from dgx-h100 and cannot be told
    status = {r.key: r.status for r in d.rows}
    assert {status[k] for k in site.overrides if k in status} == {"same"}
    assert status["nvlink_links"] == "unknown" and d.exit_code == 2


def test_snapshot_from_metrics_marks_failing_collectors_stale() -> None:
    text = "\n".join([
        "# TYPE podhealth_collector_success gauge",
        'podhealth_collector_success{collector="nvml",node="n1"} 1',
        'podhealth_collector_success{collector="host",node="n1"} 0',
        "# TYPE podhealth_collector_stale gauge",
        'podhealth_collector_stale{collector="nvml",node="n1"} 0',
        "# TYPE podhealth_gpu_devices gauge",
        'podhealth_gpu_devices{node="n1"} 8',
        "# TYPE podhealth_nfs_read_bytes counter",
        'podhealth_nfs_read_bytes_total{mountpoint="/home",node="n1"} 5',
        ""])
    snap, node = snapshot_from_metrics(text, now=5.0)
    assert node == "n1"
    assert not snap.stale("nvml") and snap.stale("host")
    assert [s.name for s in snap.samples()] == ["gpu_devices"]  # nfs: no collector health, not trusted
    with pytest.raises(SourceError):
        snapshot_from_metrics("# just text\nfoo 1\n")


def test_pcie_link_parsers() -> None:
    from podhealth.collectors.ib_parse import parse_pcie_speed, parse_pcie_width

    assert parse_pcie_speed("32.0 GT/s PCIe\n") == 5 and parse_pcie_speed("16.0 GT/s PCIe") == 4
    assert parse_pcie_speed("2.5 GT/s PCIe") == 1
    assert parse_pcie_speed("Unknown") is None and parse_pcie_speed("") is None
    assert parse_pcie_width("16\n") == 16 and parse_pcie_width("0") is None and parse_pcie_width("x") is None
