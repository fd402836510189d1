"""Fault tokens, the on-disk simulated node, its kernel log, units file and NFS probe."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from podhealth.collectors.probe import Probe, ProbeResult
from podhealth.sim import faults, kmsg_lines
from podhealth.sim.node import SimNode, default_root, list_nodes
from podhealth.sim.state import NodeState, default_state
from tests.harness.proc import wait_until

NOW = 1_700_000_000.0


# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens,expect", [
    ("xid=79 gpu=3", dict(kind="xid", code=79, gpu=3)),
    ("fault=fallen-off-bus gpu=3", dict(kind="fallen-off-bus", gpu=3)),
    ("fault=dbe gpu=1", dict(kind="dbe", gpu=1)),
    ("fault=row-remap-pending gpu=2", dict(kind="row-remap-pending", gpu=2)),
    ("fault=row-remap-failure gpu=2", dict(kind="row-remap-failure", gpu=2)),
    ("fault=nvlink-down gpu=0 link=5", dict(kind="nvlink-down", gpu=0, link=5)),
    ("fault=nvlink-crc gpu=0 link=5 rate=50", dict(kind="nvlink-crc", gpu=0, link=5, rate=50.0)),
    ("fault=nvlink-crc gpu=0 link=5", dict(kind="nvlink-crc", rate=10.0)),
    ("fault=pcie-degraded gpu=4 width=8 gen=4", dict(kind="pcie-degraded", gpu=4, width=8, gen=4)),
    ("fault=pcie-degraded gpu=4", dict(width=8, gen=4)),
    ("fault=thermal gpu=6", dict(kind="thermal", gpu=6)),
    ("fault=power-brake gpu=6", dict(kind="power-brake", gpu=6)),
    ("fault=ib-down device=mlx5_3", dict(kind="ib-down", device="mlx5_3")),
    ("fault=ib-rate device=mlx5_3 rate=200", dict(kind="ib-rate", device="mlx5_3", rate=200.0)),
    ("fault=ib-symbol-errors device=mlx5_3 rate=20", dict(kind="ib-symbol-errors", rate=20.0)),
    ("fault=ib-flap device=mlx5_0", dict(kind="ib-flap", device="mlx5_0", port=None, count=3, period=60.0)),
    ("fault=ib-flap device=mlx5_0 port=1 count=5 period=2.5", dict(port=1, count=5, period=2.5)),
    ("fault=ib-counter-saturated device=mlx5_4 counter=symbol_error",
     dict(kind="ib-counter-saturated", device="mlx5_4", counter="symbol_error")),
    ("fault=nfs-missing mount=/home", dict(kind="nfs-missing", mount="/home")),
    ("fault=nfs-hung mount=/home/", dict(kind="nfs-hung", mount="/home")),
    ("fault=nvml-hang seconds=30", dict(kind="nvml-hang", seconds=30.0, gpu=None)),
    ("fault=nvml-hang seconds=2.5 gpu=1", dict(kind="nvml-hang", seconds=2.5, gpu=1)),
    ("fault=unit-down unit=nvidia-fabricmanager.service", dict(kind="unit-down", unit="nvidia-fabricmanager.service")),
    ("fault=fabric-incomplete gpu=2", dict(kind="fabric-incomplete", gpu=2)),
    ("fault=persistence-off gpu=1", dict(kind="persistence-off", gpu=1)),
    ("fault=reboot", dict(kind="reboot", gpu=None)),
    ("gpu=3 xid=79", dict(kind="xid", code=79, gpu=3)),  # order does not matter
    ("fault=slow-gpu gpu=3 pct=7", dict(kind="slow-gpu", gpu=3, pct=7.0)),
    ("fault=slow-nvlink gpu=1 link=4", dict(kind="slow-nvlink", gpu=1, link=4, pct=20.0)),
    ("fault=thermal-throttle-intermittent", dict(gpu=None, pct=15.0, period=600.0)),
])
def test_parse_every_kind(tokens: str, expect: dict[str, object]) -> None:
    f = faults.parse(tokens.split(), NOW)
    assert f.injected_at == NOW
    for k, v in expect.items():
        assert getattr(f, k) == v, k


def test_every_kind_has_a_parse_case() -> None:
    covered = {faults.parse(t.split(), NOW).kind for t in [
        "xid=1 gpu=0", "fault=fallen-off-bus gpu=0", "fault=dbe gpu=0", "fault=row-remap-pending gpu=0",
        "fault=row-remap-failure gpu=0", "fault=row-remap-low gpu=0", "fault=nvlink-down gpu=0 link=0", "fault=nvlink-crc gpu=0 link=0",
        "fault=pcie-degraded gpu=0", "fault=thermal gpu=0", "fault=power-brake gpu=0",
        "fault=fabric-incomplete gpu=0", "fault=persistence-off gpu=0", "fault=nvml-hang seconds=1",
        "fault=ib-down device=mlx5_0", "fault=ib-rate device=mlx5_0", "fault=ib-symbol-errors device=mlx5_0",
        "fault=nfs-missing mount=/x", "fault=nfs-hung mount=/x", "fault=unit-down unit=a.service", "fault=reboot",
        "fault=ib-flap device=mlx5_0", "fault=ib-counter-saturated device=mlx5_0 counter=symbol_error",
        "fault=pcie-aer-fatal gpu=0", "fault=edac-ue", "fault=nvme-critical", "fault=gpu-reset-fails gpu=0",
        "fault=gpu-busy gpu=0", "fault=nvml-events-unsupported gpu=0", "fault=slow-gpu gpu=0",
        "fault=slow-hbm gpu=0", "fault=slow-nvlink gpu=0", "fault=slow-hca device=mlx5_0",
        "fault=thermal-throttle-intermittent", "fault=imex-down",
        "fault=fabric-degraded-bw gpu=0", "fault=fabric-wrong-cluster gpu=0"]}
    assert covered == set(faults.KINDS)


@pytest.mark.parametrize("tokens,message", [
    ("xid79 gpu=3", "bad token 'xid79': expected key=value"),
    ("xid=abc gpu=3", "bad token 'xid=abc': xid must be a whole number"),
    ("xid=0 gpu=3", "bad token 'xid=0': XID codes are 1..999"),
    ("xid=79", "fault xid needs gpu=<value>"),
    ("gpu=3", "no fault given"),
    ("xid=79 fault=dbe gpu=1", "either xid=<code> or fault=<kind>"),
    ("fault=meltdown gpu=1", "bad token 'fault=meltdown': unknown fault kind (allowed: fallen-off-bus"),
    ("fault=dbe gpu=1 link=2", "bad token 'link=2': fault dbe takes gpu"),
    ("fault=dbe gpu=-1", "bad token 'gpu=-1': gpu must be >= 0"),
    ("fault=dbe gpu=1 gpu=2", "bad token 'gpu=2': gpu given twice"),
    ("fault=nvlink-down gpu=0", "fault nvlink-down needs link=<value>"),
    ("fault=nvlink-crc gpu=0 link=1 rate=-5", "bad token 'rate=-5': rate must be a finite number > 0"),
    ("fault=nvlink-crc gpu=0 link=1 rate=nan", "rate must be a finite number > 0"),
    ("fault=pcie-degraded gpu=0 width=3", "bad token 'width=3': PCIe width is one of"),
    ("fault=pcie-degraded gpu=0 gen=9", "bad token 'gen=9': PCIe gen is 1..6"),
    ("fault=nfs-hung mount=home", "bad token 'mount=home': mount must be an absolute path"),
    ("fault=unit-down unit=rm;-rf", "bad token 'unit=rm;-rf': expected a systemd unit name"),
    ("fault=ib-down device=../x", "bad token 'device=../x': expected an HCA name"),
    ("fault=nvml-hang", "fault nvml-hang needs seconds=<value>"),
])
def test_bad_tokens_name_the_token_and_what_is_allowed(tokens: str, message: str) -> None:
    with pytest.raises(ValueError) as e:
        faults.parse(tokens.split(), NOW)
    assert message in str(e.value)


@pytest.mark.parametrize("tokens,message", [
    ("xid=79 gpu=8", "bad token 'gpu=8': node dgx01 has GPUs 0..7"),
    ("fault=nvlink-down gpu=0 link=18", "bad token 'link=18': GPU 0 has NVLink links 0..17"),
    ("fault=ib-down device=mlx5_10", "bad token 'device=mlx5_10': node dgx01 has HCAs mlx5_0"),
    ("fault=nfs-missing mount=/scratch", "bad token 'mount=/scratch': node dgx01 mounts /home, /cm/shared"),
    ("fault=unit-down unit=foo.service", "bad token 'unit=foo.service': node dgx01 has units"),
    ("fault=pcie-degraded gpu=0 gen=6", "maxes at gen5 x16"),
])
def test_validate_against_the_node(tokens: str, message: str) -> None:
    state = default_state("dgx01", "dgx-h100", now=NOW)
    with pytest.raises(ValueError) as e:
        faults.validate(faults.parse(tokens.split(), NOW), state)
    assert message in str(e.value)


def test_climbed_is_monotonic_and_zero_before_injection() -> None:
    f = faults.parse("fault=nvlink-crc gpu=0 link=1 rate=50".split(), NOW)
    assert faults.climbed(f, NOW - 5) == 0
    values = [faults.climbed(f, NOW + dt) for dt in (0, 0.01, 1, 1.5, 10, 100)]
    assert values == sorted(values) and values[0] == 0 and values[2] == 50 and values[-1] == 5000


# --- state ------------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-h200", "dgx-b200", "dgx-a100", "generic"])
def test_state_round_trips_through_json(profile: str) -> None:
    s = default_state("dgx01", profile, now=NOW)
    s = s.with_fault(faults.parse("fault=nfs-hung mount=/home".split(), NOW)) if s.mounts else s
    assert NodeState.loads(s.dumps()) == s


def test_default_state_is_deterministic_per_name_and_realistic() -> None:
    a, b, c = (default_state(n, "dgx-h100", now=NOW) for n in ("dgx01", "dgx01", "dgx02"))
    assert a == b and [g.uuid for g in a.gpus] != [g.uuid for g in c.gpus]
    assert [g.pci_bus_id[9:11] for g in a.gpus] == ["18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"]
    # the captured DGX H100: 8 NDR compute rails + the bonded RoCE storage pair as one device
    assert [h.device for h in a.hcas] == ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7",
                                          "mlx5_8", "mlx5_9", "mlx5_bond_0"]
    assert [h.role for h in a.hcas] == ["compute"] * 8 + ["storage"]
    assert all(h.rate_gbps == 400 and h.link_layer == "InfiniBand" for h in a.hcas[:8])
    bond = a.hcas[8]
    assert (bond.rate_gbps, bond.link_layer, bond.netdev) == (200, "Ethernet", "bond0")
    assert len(bond.bond_slaves) == 2
    assert a.units["nvidia-fabricmanager.service"] == "active"


def test_state_schema_mismatch_is_a_clear_error() -> None:
    d = default_state("dgx01", now=NOW).to_json()
    d["schema"] = 99
    with pytest.raises(ValueError, match="schema 99"):
        NodeState.from_json(d)


# --- the node on disk -------------------------------------------------------------------------


def test_create_open_inject_clear(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    assert node.dir == tmp_path / "dgx01" and node.state_path.is_file()
    assert node.sys_root == node.dir / "sys" and node.proc_root == node.dir / "proc"
    assert list_nodes(tmp_path) == ["dgx01"]
    f = node.inject(faults.parse("fault=dbe gpu=1".split(), time.time()))
    assert f.seq == 1 and node.state.faults == (f,)
    reopened = SimNode.open(tmp_path, "dgx01")
    assert reopened.state == node.state
    node.inject(faults.parse("xid=13 gpu=2".split(), time.time()))
    assert node.clear("dbe") == 1
    assert [x.kind for x in node.state.faults] == ["xid"]
    assert node.clear() == 1 and node.state.faults == ()
    with pytest.raises(ValueError, match="unknown fault kind"):
        node.clear("nonsense")


def test_bad_inject_changes_nothing(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    before = node.state_path.read_bytes(), node.kmsg_path.read_bytes()
    with pytest.raises(ValueError):
        node.inject(faults.parse("xid=79 gpu=12".split(), time.time()))
    assert (node.state_path.read_bytes(), node.kmsg_path.read_bytes()) == before


def test_open_missing_node_and_bad_names(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="podhealth simulate node dgx09"):
        SimNode.open(tmp_path, "dgx09")
    for bad in ("../etc", "a b", "", "-x", "x" * 64):
        with pytest.raises(ValueError, match="bad node name"):
            SimNode.create(tmp_path, bad)


def test_default_root_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PODHEALTH_SIM_DIR", str(tmp_path))
    assert default_root() == tmp_path
    monkeypatch.delenv("PODHEALTH_SIM_DIR")
    assert default_root() == Path(f"/tmp/podhealth-sim-{os.getuid()}")  # one per user


def test_another_process_injection_is_seen_by_a_running_node(tmp_path: Path) -> None:
    running = SimNode.create(tmp_path, "dgx01")
    assert running.state.faults == ()
    other = SimNode.open(tmp_path, "dgx01")  # stands for the CLI process
    other.inject(faults.parse("fault=thermal gpu=6".split(), time.time()))
    wait_until(lambda: len(running.state.faults) == 1, timeout=5, what="state reload")
    assert running.state.faults[0].kind == "thermal"


def test_units_file_flips_a_unit_to_failed(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    units = json.loads(node.units_path.read_text())
    assert set(units.values()) == {"active"}
    node.inject(faults.parse("fault=unit-down unit=nvidia-fabricmanager.service".split(), time.time()))
    after = json.loads(node.units_path.read_text())
    assert after.pop("nvidia-fabricmanager.service") == "failed"
    units.pop("nvidia-fabricmanager.service")
    assert after == units
    node.clear()
    assert json.loads(node.units_path.read_text())["nvidia-fabricmanager.service"] == "active"


# --- kernel log -------------------------------------------------------------------------------

KMSG_RECORD = re.compile(r"^(\d+),(\d+),(\d+),-;(.*)$")
# The shape of real driver lines (checked against the captures below).
XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2})\): (\d+), (.*)$")


def test_xid_lines_in_kmsg_record_format(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    assert node.kmsg_path.read_text() == ""
    node.inject(faults.parse("xid=48 gpu=1".split(), time.time()))
    node.inject(faults.parse("fault=fallen-off-bus gpu=3".split(), time.time()))
    node.inject(faults.parse("fault=dbe gpu=2".split(), time.time()))  # no kernel line of its own
    node.refresh()  # refreshing again must not repeat lines
    records = [KMSG_RECORD.match(line) for line in node.kmsg_path.read_text().splitlines()]
    assert all(records)
    seqs = [int(m.group(2)) for m in records if m]
    assert seqs == list(range(1, len(seqs) + 1))
    messages = [m.group(4) for m in records if m]
    assert messages[0] == ("NVRM: Xid (PCI:0000:2a:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
                           "double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
                           "0x12bac1c3e0 partition 2, subpartition 1.")
    uuid3 = node.state.gpu(3).uuid
    assert messages[1:] == [
        f"NVRM: GPU at PCI:0000:5d:00: {uuid3}",
        f"NVRM: GPU Board Serial Number: {node.state.gpu(3).serial}",
        "NVRM: Xid (PCI:0000:5d:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
        "NVRM: GPU 0000:5d:00.0: GPU has fallen off the bus.",
        f"NVRM: GPU 0000:5d:00.0: GPU serial number is {node.state.gpu(3).serial}.",
    ]


@pytest.mark.parametrize("code", sorted(kmsg_lines.XID_TEXT))
def test_every_described_code_formats_like_the_driver(code: int) -> None:
    state = default_state("dgx01", now=NOW)
    line = kmsg_lines.xid_message(state.gpu(0), code)
    m = XID_LINE.search(line)
    assert m and m.group(1) == "0000:18:00" and int(m.group(2)) == code


def test_real_xid_lines_share_our_shape(shared_fixtures: Path) -> None:
    logs = sorted((shared_fixtures / "xid_kernel_logs").glob("*.log"))
    assert logs
    real = [line for p in logs for line in p.read_text(errors="replace").splitlines() if "NVRM: Xid" in line]
    assert len(real) > 20
    matched = [XID_LINE.search(line) for line in real]
    assert all(matched), [line for line, m in zip(real, matched) if not m][:3]
    # Our descriptive texts for 79/94/48/63/31 appear verbatim in the captures.
    real_text = "\n".join(real)
    for code in (79, 94, 48, 63):
        assert kmsg_lines.XID_TEXT[code] in real_text, code


# --- NFS probe --------------------------------------------------------------------------------


def _probe(node: SimNode, mount: str, timeout: float) -> ProbeResult:
    """One probe through the collector's own client, as the agent asks it."""
    p = Probe(node.probe_argv(mount))
    try:
        return p.run(timeout)
    finally:
        p.close()


def test_nfs_probe_healthy_missing_and_hung(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    argv = node.probe_argv("/home")
    assert argv[:3] == [sys.executable, "-m", "podhealth.sim.nfsprobe"] and argv[3:] == [str(node.dir), "/home"]
    assert _probe(node, "/home", 30).ok
    unknown = _probe(node, "/scratch", 30)
    assert not unknown.ok and "No such file or directory" in unknown.detail
    node.inject(faults.parse("fault=nfs-missing mount=/home".split(), time.time()))
    assert not _probe(node, "/home", 30).ok
    assert _probe(node, "/cm/shared", 30).ok
    node.clear()
    node.inject(faults.parse("fault=nfs-hung mount=/home".split(), time.time()))
    hung = _probe(node, "/home", 1.5)
    assert (hung.ok, hung.seconds, hung.detail) == (False, 1.5, "timed out after 1.5s")
    assert _probe(node, "/cm/shared", 30).ok


def test_persist_survives_a_reboot_and_resets_clear_only_resettable_faults() -> None:
    fs = [faults.parse(t.split(), NOW) for t in (
        "fault=dbe gpu=1", "fault=dbe gpu=2 persist=1", "fault=row-remap-failure gpu=3", "fault=nvlink-down gpu=1 link=2",
        "fault=thermal gpu=1", "fault=reboot")]
    assert [f.kind for f in faults.after_reboot(fs)] == ["dbe", "row-remap-failure", "reboot"]
    assert [f.gpu for f in faults.after_reboot(fs)] == [2, 3, None]
    left = faults.after_reset(fs, 1)
    assert left is not None and [(f.kind, f.gpu) for f in left] == [
        ("dbe", 2), ("row-remap-failure", 3), ("thermal", 1), ("reboot", None)]
    assert faults.after_reset([*fs, faults.parse(["fault=gpu-reset-fails", "gpu=1"], NOW)], 1) is None
    assert faults.after_reset([*fs, faults.parse(["fault=gpu-busy", "gpu=1"], NOW)], 1) is None
    assert faults.after_reset([*fs, faults.parse(["fault=fallen-off-bus", "gpu=2"], NOW)], 1) is not None


@pytest.mark.parametrize("tokens, message", [
    ("fault=dbe gpu=1 persist=2", "persist is 0 or 1"),
    ("fault=reboot persist=1", "fault reboot takes"),
])
def test_persist_is_checked(tokens: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        faults.parse(tokens.split(), NOW)
