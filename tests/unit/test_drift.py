"""The drift check (driver, VBIOS, HCA firmware, OFED, kernel against the profile), and the host
collector's kernel/OFED readers it depends on."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from podhealth.checks.passive import drift
from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.collectors.host_versions import VersionReader, parse_ofed_info
from podhealth.config import ChecksConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Sample, Status

pytestmark = pytest.mark.timeout(60)

BASE = profiles.load("dgx-h100")
CX7, BF3 = "MT_0000000838", "MT_0000000884"
STATED = {"driver": "550.54.15", "vbios": "96.00.89.00.01", "kernel": "5.15.0-1042-nvidia",
          "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0", "hca_fw": {CX7: "28.39.1002", BF3: "32.41.1000"}}


def samples(driver: str = "550.54.15", vbios: dict[int, str] | None = None, fw: dict[str, str] | None = None,
            kernel: str | None = "5.15.0-1042-nvidia", ofed: str | None = "MLNX_OFED_LINUX-23.10-1.1.9.0") -> dict[str, list[Sample]]:
    vb = {i: "96.00.89.00.01" for i in range(8)} | (vbios or {})
    nvml = [Sample.of("gpu_devices", 8)] + [Sample.of("gpu_up", 1, gpu=i) for i in range(8)]
    nvml += [Sample.of("gpu_info", 1, gpu=i, driver_version=driver, vbios_version=vb[i]) for i in range(8)]
    hcas = {f"mlx5_{d}": (CX7, "28.39.1002") for d in range(8)} | {"mlx5_8": (BF3, "32.41.1000"), "mlx5_9": (BF3, "32.41.1000")}
    for dev, v in (fw or {}).items():
        hcas[dev] = (hcas[dev][0], v)
    ib = [Sample.of("infiniband_info", 1, device=d, board_id=b, firmware_version=v, hca_type="MT4129") for d, (b, v) in hcas.items()]
    host = [Sample.of("host_kernel_info", 1, release=kernel)] if kernel else []
    host += [Sample.of("host_ofed_info", 1, version=ofed, source="ofed_info")] if ofed else []
    return {"nvml": nvml, "infiniband": ib, "host": host}


def judge(by: dict[str, list[Sample]], versions: dict[str, Any] | None = STATED, drift_cfg: dict[str, str] | None = None,
          stale: tuple[str, ...] = ()) -> dict[str, CheckResult]:
    prof = dataclasses.replace(BASE, versions={**BASE.versions, **(versions or {})},
                               drift={**BASE.drift, **(drift_cfg or {})})
    snap = Snapshot(1000.0, {c: CollectorState(c, samples=tuple(v), stale=c in stale, last_success=1000.0,
                             last_attempt=1000.0)
                             for c, v in by.items()})
    res = Evaluator(prof, ChecksConfig()).evaluate(snap, 1000.0, damped=False, only=["drift"])
    return {r.entity: r for r in res}


def test_every_field_same_is_ok_and_reports_what_runs() -> None:
    res = judge(samples())
    assert set(res) == set(drift.FIELDS)
    assert all(r.status is Status.OK for r in res.values()), res
    assert dict(res["hca_fw"].evidence)["observed"] == "28.39.1002, 32.41.1000"
    assert dict(res["driver"].evidence)["expected"] == "550.54.15"


def test_not_stated_is_ok_with_the_observed_version() -> None:
    res = judge(samples(driver="560.35.03"), versions={})
    assert all(r.status is Status.OK for r in res.values())
    assert res["driver"].summary == "560.35.03 (not stated in the profile)"
    assert dict(res["driver"].evidence)["observed"] == "560.35.03"


@pytest.mark.parametrize("field, kw, shown", [
    ("driver", {"driver": "560.35.03"}, "gpu0=560.35.03"),
    ("vbios", {"vbios": {3: "96.00.61.00.01"}}, "gpu3=96.00.61.00.01"),
    ("hca_fw", {"fw": {"mlx5_2": "28.37.1014"}}, "mlx5_2=28.37.1014"),
    ("ofed", {"ofed": "MLNX_OFED_LINUX-24.04-0.6.6.0"}, "node=MLNX_OFED_LINUX-24.04-0.6.6.0"),
    ("kernel", {"kernel": "5.15.0-1053-nvidia"}, "node=5.15.0-1053-nvidia"),
])
def test_a_differing_field_warns_by_default_and_follows_its_setting(field: str, kw: dict[str, Any], shown: str) -> None:
    res = judge(samples(**kw))
    r = res[field]
    assert r.status is Status.WARN and r.action is Action.NONE
    assert shown in dict(r.evidence)["differs"]
    assert [f for f, x in res.items() if x.status is not Status.OK] == [field]
    failing = judge(samples(**kw), drift_cfg={field: "FAIL"})[field]
    assert failing.status is Status.FAIL and failing.action is Action.DRAIN
    quiet = judge(samples(**kw), drift_cfg={field: "OK"})[field]
    assert quiet.status is Status.OK and "drift: OK" in quiet.summary


@pytest.mark.parametrize("field, by, stale", [
    ("kernel", samples(kernel=None), ()),
    ("ofed", samples(ofed=None), ()),
    ("hca_fw", samples(), ("infiniband",)),
    ("kernel", samples(), ("host",)),
    ("hca_fw", {**samples(), "infiniband": []}, ()),
])
def test_unreadable_stated_version_is_unknown_even_when_set_to_fail(field: str, by: dict[str, list[Sample]],
                                                                     stale: tuple[str, ...]) -> None:
    r = judge(by, drift_cfg={field: "FAIL"}, stale=stale)[field]
    assert r.status is Status.UNKNOWN and r.action is Action.NONE
    assert "could not be read" in r.summary


def test_hca_firmware_is_judged_per_board() -> None:
    # a board the profile does not list is reported, not judged; the listed ones still are
    res = judge(samples(fw={"mlx5_8": "32.38.1002"}), versions={"hca_fw": {CX7: "28.39.1002"}})
    assert res["hca_fw"].status is Status.OK
    assert "mlx5_8:MT_0000000884=32.38.1002" in dict(res["hca_fw"].evidence)["unlisted"]
    only_other = judge(samples(), versions={"hca_fw": {"MT_0000000999": "1.0"}})["hca_fw"]
    assert only_other.status is Status.UNKNOWN


def test_drift_severity_is_validated_in_overrides() -> None:
    with pytest.raises(profiles.ProfileError, match="drift.kernel"):
        profiles.load("dgx-h100", {"drift.kernel": "PANIC"})
    assert profiles.load("dgx-h100", {"drift": {"kernel": "FAIL"}}).drift["kernel"] == "FAIL"


def test_version_reader_reads_roots_and_leaves_out_what_is_missing(tmp_path: Path) -> None:
    proc, sys_ = tmp_path / "proc", tmp_path / "sys"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "osrelease").write_text("5.15.0-1042-nvidia\n")
    calls: list[int] = []
    t = [0.0]

    def ofed_info() -> str | None:
        calls.append(1)
        return None

    reader = VersionReader(proc, sys_, ofed_info=ofed_info, clock=lambda: t[0])
    got = {s.name: dict(s.labels) for s in reader.samples()}
    assert got == {"host_kernel_info": {"release": "5.15.0-1042-nvidia"}}  # no OFED: left out, not ""
    (sys_ / "module" / "mlx5_core").mkdir(parents=True)
    (sys_ / "module" / "mlx5_core" / "version").write_text("23.10-1.1.9\n")
    got = {s.name: dict(s.labels) for s in reader.samples()}
    assert got["host_ofed_info"] == {"version": "23.10-1.1.9", "source": "mlx5_core"}
    assert len(calls) == 1  # ofed_info's answer is kept, not asked every collection
    t[0] = 4000.0
    reader.samples()
    assert len(calls) == 2


def test_version_reader_prefers_ofed_info_and_never_runs_it_for_a_foreign_root(tmp_path: Path) -> None:
    reader = VersionReader(tmp_path, tmp_path, ofed_info=lambda: "MLNX_OFED_LINUX-23.10-1.1.9.0")
    assert [dict(s.labels) for s in reader.samples() if s.name == "host_ofed_info"] == [
        {"version": "MLNX_OFED_LINUX-23.10-1.1.9.0", "source": "ofed_info"}]
    assert VersionReader(tmp_path, tmp_path)._ofed_info is None  # a fixture/sim tree: the host's OFED is not its


def test_parse_ofed_info() -> None:
    assert parse_ofed_info("MLNX_OFED_LINUX-23.10-1.1.9.0:\n") == "MLNX_OFED_LINUX-23.10-1.1.9.0"
    assert parse_ofed_info("\n  \n") is None


@pytest.mark.parametrize("tree", ["procfs_tree", "node_exporter_tree"])
def test_hca_firmware_drift_on_real_sysfs_trees(shared_fixtures: Path, tree: str) -> None:
    """Real captured /sys/class/infiniband trees through the collector: what each board runs is
    its fw_ver file, and a profile stating another version for one board flags only that board."""
    from podhealth.collectors.infiniband import InfinibandCollector

    sys_dir = shared_fixtures / "infiniband" / tree / "sys"
    class_dir = sys_dir / "class" / "infiniband"
    files = {d.name: ((d / "board_id").read_text().strip(), (d / "fw_ver").read_text().strip())
             for d in sorted(class_dir.iterdir()) if (d / "fw_ver").exists()}
    assert files, f"no fw_ver in {class_dir}"
    col = InfinibandCollector(sys_dir).collect()
    by = samples() | {"infiniband": list(col.samples)}
    stated = {board: fw for board, fw in files.values() if board}
    res = judge(by, versions={"hca_fw": stated})
    assert res["hca_fw"].status is Status.OK, res["hca_fw"]
    assert dict(res["hca_fw"].evidence)["observed"] == ", ".join(sorted({fw for _, fw in files.values()}))
    device, (board, fw) = next((d, bf) for d, bf in files.items() if bf[0])
    res = judge(by, versions={"hca_fw": {**stated, board: fw + ".1"}})
    assert res["hca_fw"].status is Status.WARN
    assert f"{device}={fw}" in dict(res["hca_fw"].evidence)["differs"]
