"""The simulated node's network adapters as a real DGX has them (podhealth.sim.topology/tree_ib),
its link-flap and saturated-counter faults, and seeding from a captured sysfs tree (from_sysfs)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.sim import faults, from_sysfs, tree_ib
from podhealth.sim.node import SimNode
from podhealth.sim.state import Fault, NodeState, default_state
from podhealth.vocab import Sample

T0 = 1_700_000_000.0
COMPUTE = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9"]
OWN_TREE = "infiniband/dgx_h100_bond"


def _collect(sys_root: Path) -> tuple[Sample, ...]:
    r = InfinibandCollector(sys_root).collect()
    assert r.errors == ()
    return r.samples


def _v(samples: tuple[Sample, ...], name: str, **labels: str) -> float | None:
    want = set(labels.items())
    hits = [s.value for s in samples if s.name == name and want <= set(s.labels)]
    assert len(hits) <= 1, hits
    return hits[0] if hits else None


def _read(p: Path) -> str:
    return p.read_text().strip()


# --- topology -----------------------------------------------------------------------------------


def test_dgx_h100_default_is_8_ndr_rails_and_a_bonded_roce_pair(tmp_path: Path) -> None:
    tree_ib.write(default_state("dgx01", "dgx-h100", now=T0), tmp_path, T0 + 5)
    ib = tmp_path / "class" / "infiniband"
    assert sorted(p.name for p in ib.iterdir()) == sorted(COMPUTE + ["mlx5_bond_0"])
    # class entries are links into the PCI device, which links back, as in sysfs
    for dev in COMPUTE + ["mlx5_bond_0"]:
        assert (ib / dev).is_symlink()
        target = os.readlink(ib / dev / "device")
        assert target.startswith("../../../0000:") and target.endswith(".0")
        assert (ib / dev / "device").resolve() == (ib / dev).resolve().parent.parent
        assert _read(ib / dev / "device" / "vendor") == "0x15b3"
    assert [_read(ib / d / "device" / "numa_node") for d in COMPUTE] == ["0"] * 4 + ["1"] * 4
    assert {_read(ib / d / "hca_type") for d in COMPUTE} == {"MT4129"}
    assert {_read(ib / d / "fw_ver") for d in COMPUTE} == {"28.41.1000"}
    assert _read(ib / "mlx5_0" / "device" / "device") == "0x1021"  # MT4129 = PCI device 4129
    # an IB port's netdev is found through its PCI device; its ndevs entry does not exist
    assert [p.name for p in (ib / "mlx5_0" / "device" / "net").iterdir()] == ["ibp23s0"]
    assert not (ib / "mlx5_0" / "ports" / "1" / "gid_attrs").exists()
    assert _read(tmp_path / "class" / "net" / "ibp23s0" / "type") == "32"
    # the storage pair: ONE RoCE device on the bonding master bond0
    port = ib / "mlx5_bond_0" / "ports" / "1"
    assert (_read(ib / "mlx5_bond_0" / "hca_type"), _read(ib / "mlx5_bond_0" / "fw_ver")) == ("MT41692", "32.38.3056")
    assert (_read(port / "link_layer"), _read(port / "rate")) == ("Ethernet", "200 Gb/sec (4X HDR)")
    assert _read(port / "gid_attrs" / "ndevs" / "0") == "bond0"
    assert "np_cnp_sent" in os.listdir(port / "hw_counters")  # RoCE congestion counters
    bond = tmp_path / "class" / "net" / "bond0"
    assert os.readlink(bond) == "../../devices/virtual/net/bond0"
    slaves = _read(bond / "bonding" / "slaves").split()
    assert slaves == ["enp169s0f0np0", "enp169s0f1np1"]
    assert _read(bond / "bonding" / "mode") == "802.3ad 4" and _read(bond / "bonding" / "mii_status") == "up"
    for i, slave in enumerate(slaves):
        member = tmp_path / "class" / "net" / slave
        assert member.resolve().parent.parent.name == f"0000:a9:00.{i}"
        assert (member / "master").resolve() == bond.resolve()
        assert _read(member / "speed") == "100000" and _read(member / "bonding_slave" / "state") == "active"
    got = _collect(tmp_path)
    assert _v(got, "infiniband_port_state", device="mlx5_bond_0") == 4
    assert _v(got, "infiniband_port_rate_bytes_per_second", device="mlx5_bond_0") == 2.5e10


@pytest.mark.parametrize("storage,devices,layer,rate", [
    ("ib", ["mlx5_2", "mlx5_3"], "InfiniBand", "400 Gb/sec (4X NDR)"),
    ("ethernet", ["mlx5_2", "mlx5_3"], "Ethernet", "200 Gb/sec (4X HDR)"),
    ("none", [], "", ""),
])
def test_documented_storage_alternatives(tmp_path: Path, storage: str, devices: list[str], layer: str,
                                         rate: str) -> None:
    st = default_state("dgx01", "dgx-h100", now=T0, storage=storage)
    tree_ib.write(st, tmp_path, T0 + 5)
    ib = tmp_path / "class" / "infiniband"
    assert sorted(p.name for p in ib.iterdir()) == sorted(COMPUTE + devices)
    assert not (tmp_path / "class" / "net" / "bond0").exists()
    for fn, dev in enumerate(devices):
        # one dual-port card: functions .0 and .1 of the same bus
        assert os.readlink(ib / dev / "device") == f"../../../0000:a9:00.{fn}"
        assert _read(ib / dev / "ports" / "1" / "link_layer") == layer
        assert _read(ib / dev / "ports" / "1" / "rate") == rate
    if storage == "ethernet":
        assert _read(ib / "mlx5_3" / "ports" / "1" / "gid_attrs" / "ndevs" / "0") == "enp169s0f1np1"


def test_dgx_a100_storage_is_infiniband_on_cx6(tmp_path: Path) -> None:
    st = default_state("dgx01", "dgx-a100", now=T0)
    assert [h.device for h in st.hcas if h.role == "storage"] == ["mlx5_4", "mlx5_5"]
    tree_ib.write(st, tmp_path, T0 + 5)
    assert _read(tmp_path / "class/infiniband/mlx5_4/hca_type") == "MT4123"
    assert _read(tmp_path / "class/infiniband/mlx5_9/ports/1/rate") == "200 Gb/sec (4X HDR)"


def test_unknown_storage_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="bad storage mode 'bonded'"):
        default_state("dgx01", "dgx-h100", storage="bonded")


def test_recreating_a_node_with_another_topology_leaves_no_stale_devices(tmp_path: Path) -> None:
    SimNode.create(tmp_path, "dgx01", seed=default_state("dgx01", "dgx-h100", storage="ib"))
    node = SimNode.create(tmp_path, "dgx01", seed=default_state("dgx01", "dgx-h100", storage="bond"))
    ib = node.sys_root / "class" / "infiniband"
    assert sorted(p.name for p in ib.iterdir()) == sorted(COMPUTE + ["mlx5_bond_0"])
    assert "ibp169s0f0" not in os.listdir(node.sys_root / "class" / "net")


def test_state_with_topology_round_trips_through_json() -> None:
    st = default_state("dgx01", "dgx-h100", now=T0)
    back = NodeState.loads(st.dumps())
    assert back == st and back.hcas[-1].bond_slaves == ("enp169s0f0np0", "enp169s0f1np1")


# --- faults -------------------------------------------------------------------------------------


def test_ib_flap_goes_down_and_up_count_times_with_link_downed(tmp_path: Path) -> None:
    f = faults.parse("fault=ib-flap device=mlx5_4 count=3 period=20".split(), T0 + 100)
    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(f)
    port = tmp_path / "class/infiniband/mlx5_4/ports/1"
    seen = []
    # cycle i: down at 100 + 20 i for 10 s, then up; after three cycles it stays up
    for dt in (99, 101, 109, 111, 119, 121, 131, 141, 151, 200, 1000):
        tree_ib.write(st, tmp_path, T0 + dt)
        s = _collect(tmp_path)
        seen.append((dt, _read(port / "state"), _read(port / "phys_state"),
                     _v(s, "infiniband_port_stat", device="mlx5_4", counter="link_downed")))
    assert seen == [
        (99, "4: ACTIVE", "5: LinkUp", 0), (101, "1: DOWN", "2: Polling", 1), (109, "1: DOWN", "2: Polling", 1),
        (111, "4: ACTIVE", "5: LinkUp", 1), (119, "4: ACTIVE", "5: LinkUp", 1), (121, "1: DOWN", "2: Polling", 2),
        (131, "4: ACTIVE", "5: LinkUp", 2), (141, "1: DOWN", "2: Polling", 3), (151, "4: ACTIVE", "5: LinkUp", 3),
        (200, "4: ACTIVE", "5: LinkUp", 3), (1000, "4: ACTIVE", "5: LinkUp", 3),
    ]
    assert _read(tmp_path / "class/net/ibp57s0/operstate") == "up"
    # traffic stops while down and resumes after: 30 s of downtime are missing at the end
    tree_ib.write(st, tmp_path, T0 + 105)
    a = _v(_collect(tmp_path), "infiniband_port_data_transmitted_bytes", device="mlx5_4")
    tree_ib.write(st, tmp_path, T0 + 109)
    b = _v(_collect(tmp_path), "infiniband_port_data_transmitted_bytes", device="mlx5_4")
    assert a == b
    other = _v(_collect(tmp_path), "infiniband_port_stat", device="mlx5_5", counter="link_downed")
    assert other == 0


def test_ib_flap_on_the_bond_shows_ethernet_states(tmp_path: Path) -> None:
    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(
        faults.parse("fault=ib-flap device=mlx5_bond_0 port=1 count=1 period=10".split(), T0))
    tree_ib.write(st, tmp_path, T0 + 1)
    port = tmp_path / "class/infiniband/mlx5_bond_0/ports/1"
    assert (_read(port / "state"), _read(port / "phys_state")) == ("1: DOWN", "3: Disabled")
    assert _read(tmp_path / "class/net/bond0/bonding/mii_status") == "down"
    assert _read(tmp_path / "class/net/bond0/operstate") == "down"
    tree_ib.write(st, tmp_path, T0 + 6)
    assert _read(port / "state") == "4: ACTIVE" and _read(port / "counters/link_downed") == "1"


def test_link_downed_saturates_at_8_bits_under_a_long_flap(tmp_path: Path) -> None:
    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(
        Fault("ib-flap", T0, device="mlx5_0", count=300, period=2.0))
    tree_ib.write(st, tmp_path, T0 + 700)
    assert _read(tmp_path / "class/infiniband/mlx5_0/ports/1/counters/link_downed") == "255"


def test_ib_counter_saturated(tmp_path: Path) -> None:
    f = faults.parse("fault=ib-counter-saturated device=mlx5_5 counter=symbol_error".split(), T0 + 60)
    g = faults.parse("fault=ib-counter-saturated device=mlx5_5 counter=local_link_integrity_errors".split(), T0 + 60)
    st = default_state("dgx01", "dgx-h100", now=T0).with_fault(f).with_fault(g)
    tree_ib.write(st, tmp_path, T0 + 30)
    assert _v(_collect(tmp_path), "infiniband_port_stat", device="mlx5_5", counter="symbol_error") == 0
    tree_ib.write(st, tmp_path, T0 + 61)
    s = _collect(tmp_path)
    assert _v(s, "infiniband_port_stat", device="mlx5_5", counter="symbol_error") == 65535
    assert _v(s, "infiniband_port_stat", device="mlx5_5", counter="local_link_integrity_errors") == 15
    assert _v(s, "infiniband_port_stat", device="mlx5_6", counter="symbol_error") == 0
    assert _v(s, "infiniband_port_state", device="mlx5_5") == 4  # the port itself still works


@pytest.mark.parametrize("tokens,message", [
    ("fault=ib-counter-saturated device=mlx5_0", "needs counter=<value>"),
    ("fault=ib-counter-saturated device=mlx5_0 counter=port_xmit_data", "width-limited PMA counters"),
    ("fault=ib-flap device=mlx5_0 count=0", "count is 1..1000"),
    ("fault=ib-flap device=mlx5_0 period=-1", "period must be a finite number > 0"),
    ("fault=ib-flap device=mlx5_0 port=0", "IB ports are numbered 1..255"),
    ("fault=ib-flap device=mlx5_2", "node dgx01 has HCAs mlx5_0, mlx5_1, mlx5_4"),
    ("fault=ib-flap device=mlx5_0 port=2", "mlx5_0 has ports 1"),
])
def test_bad_ib_fault_tokens_are_refused(tokens: str, message: str) -> None:
    state = default_state("dgx01", "dgx-h100", now=T0)
    with pytest.raises(ValueError) as e:
        faults.validate(faults.parse(tokens.split(), T0), state)
    assert message in str(e.value)


# --- seeding from a captured tree ---------------------------------------------------------------


def test_seed_from_own_dgx_bond_tree(tmp_path: Path, own_fixtures: Path) -> None:
    cap = from_sysfs.read(own_fixtures / OWN_TREE)
    assert cap.warnings == ()
    by = {h.device: h for h in cap.hcas}
    assert sorted(by) == sorted(COMPUTE + ["mlx5_bond_0"])
    assert (by["mlx5_0"].pci_addr, by["mlx5_0"].numa_node, by["mlx5_0"].netdev) == ("0000:18:00.0", 0, "ibp24s0")
    bond = by["mlx5_bond_0"]
    assert (bond.netdev, bond.bond_slaves, bond.bond_mode) == ("bond0", ("enp170s0f0np0", "enp170s0f1np1"),
                                                               "802.3ad 4")
    assert (bond.link_layer, bond.rate_gbps, bond.hca_type, bond.role) == ("Ethernet", 200, "MT41692", "storage")
    assert {by[d].role for d in COMPUTE} == {"compute"}
    node = SimNode.create(tmp_path, "dgx07", seed=replace(default_state("dgx07", "dgx-h100"), hcas=cap.hcas))
    orig = own_fixtures / OWN_TREE / "sys" / "class" / "infiniband"
    sim = node.sys_root / "class" / "infiniband"
    for dev in COMPUTE + ["mlx5_bond_0"]:
        for rel in ("fw_ver", "board_id", "hca_type", "node_guid", "ports/1/state", "ports/1/rate",
                    "ports/1/phys_state", "ports/1/link_layer", "ports/1/counters/symbol_error",
                    "ports/1/counters/link_downed", "device/numa_node"):
            assert _read(sim / dev / rel) == _read(orig / dev / rel), (dev, rel)
        assert sorted(os.listdir(sim / dev / "ports/1/counters")) == sorted(os.listdir(orig / dev / "ports/1/counters"))
        assert sorted(os.listdir(sim / dev / "ports/1/hw_counters")) == sorted(os.listdir(orig / dev / "ports/1/hw_counters"))
        assert os.readlink(sim / dev / "device") == os.readlink(orig / dev / "device")
        # traffic keeps moving from the captured value, never below it
        assert int(_read(sim / dev / "ports/1/counters/port_xmit_data")) >= int(_read(orig / dev / "ports/1/counters/port_xmit_data"))
    assert _read(node.sys_root / "class/net/bond0/bonding/slaves") == "enp170s0f0np0 enp170s0f1np1"
    assert _read(sim / "mlx5_bond_0/ports/1/gid_attrs/ndevs/0") == "bond0"
    # faults apply on top of a seeded node
    node.inject(faults.parse("fault=ib-down device=mlx5_6".split(), node.state.t0 + 1))
    node.refresh(now=node.state.t0 + 2)
    assert _read(sim / "mlx5_6/ports/1/state") == "1: DOWN"
    assert _read(sim / "mlx5_6/ports/1/counters/link_downed") == "2"  # the captured 1, plus this one


@pytest.mark.parametrize("tree", ["procfs_tree", "node_exporter_tree"])
def test_seed_from_real_trees_reads_back_as_captured(tmp_path: Path, shared_fixtures: Path, tree: str) -> None:
    src = shared_fixtures / "infiniband" / tree
    if not src.is_dir():
        pytest.skip(f"{src} absent (the real-capture corpus lives in ../shared/fixtures)")
    cap = from_sysfs.read(src)
    st = replace(default_state("real01", "generic", now=T0), hcas=cap.hcas)
    tree_ib.write(st, tmp_path, T0)  # at t0 nothing has moved yet: the capture, exactly
    ours = _collect(tmp_path)
    theirs = _collect(src / "sys")
    key = lambda s: (s.name, s.labels)  # noqa: E731
    assert sorted(map(key, ours)) == sorted(map(key, theirs))
    assert {key(s): s.value for s in ours} == {key(s): s.value for s in theirs}


def test_from_sysfs_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no InfiniBand devices found"):
        from_sysfs.read(tmp_path / "nope")
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    with pytest.raises(ValueError, match="no InfiniBand devices found"):
        from_sysfs.read(tmp_path)


def test_cli_from_sysfs_and_storage(tmp_path: Path, own_fixtures: Path) -> None:
    def sim(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "podhealth", "simulate", *args, "--root", str(tmp_path)],
                              capture_output=True, text=True, timeout=60)

    r = sim("node", "dgx01", "--from-sysfs", str(own_fixtures / OWN_TREE))
    assert r.returncode == 0, r.stderr
    assert "9 HCAs" in r.stdout
    st = SimNode.open(tmp_path, "dgx01").state
    assert st.hcas[0].pci_addr == "0000:18:00.0"
    r = sim("node", "dgx02", "--from-sysfs", str(tmp_path / "missing"))
    assert r.returncode == 64 and "--from-sysfs" in r.stderr and "no InfiniBand devices" in r.stderr
    assert not (tmp_path / "dgx02").exists()
    r = sim("node", "dgx03", "--storage", "ethernet")
    assert r.returncode == 0, r.stderr
    assert [h.link_layer for h in SimNode.open(tmp_path, "dgx03").state.hcas][-2:] == ["Ethernet"] * 2
    r = sim("inject", "dgx01", "fault=ib-flap", "device=mlx5_bond_0", "count=2", "period=30")
    assert r.returncode == 0 and "fault=ib-flap" in r.stdout and "count=2" in r.stdout, r.stderr


def test_profile_storage_role_picks_the_build() -> None:
    from podhealth.sim import topology

    assert topology.storage_mode(2, "allowed", ("InfiniBand", "Ethernet")) is None  # the SKU's default
    assert topology.storage_mode(0, "allowed", ("InfiniBand",)) == "none"
    assert topology.storage_mode(2, "required", ("Ethernet",)) == "bond"
    assert topology.storage_mode(2, "forbidden", ("Ethernet",)) == "ethernet"
    assert topology.storage_mode(2, "allowed", ("InfiniBand",)) == "ib"
    # a site profile that forbids bonding on InfiniBand storage builds mlx5_2/mlx5_3 as IB ports
    from unittest import mock

    from podhealth.checks import profiles

    real = profiles.load
    pinned = real("dgx-h100", {"network.roles.storage.bonded": "forbidden",
                               "network.roles.storage.link_layers": ["InfiniBand"]})
    with mock.patch.object(profiles, "load", lambda name, overrides=None: pinned):
        st = default_state("dgx01", "dgx-h100", now=T0)
    assert [(h.device, h.link_layer) for h in st.hcas if h.role == "storage"] == [
        ("mlx5_2", "InfiniBand"), ("mlx5_3", "InfiniBand")]


def test_seed_from_a_class_dir_copied_without_devices(tmp_path: Path, own_fixtures: Path) -> None:
    """A capture of class/infiniband alone: its device links dangle, but still name the PCI address."""
    src = own_fixtures / OWN_TREE / "sys" / "class" / "infiniband" / "mlx5_4"
    dev = tmp_path / "infiniband" / "mlx5_4"
    (dev / "ports" / "1").mkdir(parents=True)
    for name in ("fw_ver", "board_id", "hca_type"):
        (dev / name).write_text((src / name).read_text())
    for name in ("state", "phys_state", "rate", "link_layer"):
        (dev / "ports" / "1" / name).write_text((src / "ports" / "1" / name).read_text())
    os.symlink(os.readlink(src / "device"), dev / "device")
    (h,) = from_sysfs.read(tmp_path / "infiniband").hcas
    assert (h.device, h.pci_addr, h.numa_node, h.rate_gbps, h.counters) == ("mlx5_4", "0000:4f:00.0", -1, 400, {})
    assert h.absent == ("node_guid", "node_type")


def test_fleet_storage_builds_in_turn(tmp_path: Path) -> None:
    import argparse

    from podhealth.sim import fleet

    def args(storage: str | None) -> argparse.Namespace:
        return argparse.Namespace(nodes=3, profile="dgx-h100", root=str(tmp_path), base_port=None, no_slurm=True,
                                  cluster="simpod", partition="gpu", storage=storage)

    with pytest.raises(ValueError, match="--storage: 'bonded' is not one of bond, ethernet, ib, none"):
        fleet.options(args("bond,bonded"))
    opts = fleet.options(args("bond, ib"))
    assert opts.storage == ("bond", "ib")
    f = fleet.Fleet(opts)
    f.say = lambda text="": None  # type: ignore[method-assign]
    f._create_nodes(fleet.make_plan(opts))
    builds = [sorted(h.device for h in SimNode.open(tmp_path, n).state.hcas if h.role == "storage")
              for n in ("dgx01", "dgx02", "dgx03")]
    assert builds == [["mlx5_bond_0"], ["mlx5_2", "mlx5_3"], ["mlx5_bond_0"]]


def test_link_transitions_reach_the_kernel_log_once_each(tmp_path: Path) -> None:
    node = SimNode.create(tmp_path, "dgx01")
    t0 = node.state.t0
    node.inject(Fault("ib-flap", t0 + 10, device="mlx5_0", count=2, period=20))
    node.refresh(now=t0 + 15)  # first down
    node.refresh(now=t0 + 15)  # again: nothing repeated
    node.refresh(now=t0 + 45)  # up, down, up
    lines = node.kmsg_path.read_text().splitlines()
    assert [ln.split(";", 1)[1] for ln in lines] == [
        "mlx5_core 0000:17:00.0 mlx5_0: Port: 1 Link DOWN", "mlx5_core 0000:17:00.0 mlx5_0: Port: 1 Link ACTIVE",
    ] * 2
    # /dev/kmsg records: consecutive sequence numbers, microseconds since boot at each transition
    assert [ln.split(";")[0] for ln in lines] == ["6,1,10000000,-", "6,2,20000000,-", "6,3,30000000,-",
                                                  "6,4,40000000,-"]
    # a node created again under the same name starts a fresh log
    node = SimNode.create(tmp_path, "dgx01")
    node.inject(Fault("ib-down", node.state.t0 + 1, device="mlx5_bond_0"))
    node.refresh(now=node.state.t0 + 2)
    assert node.kmsg_path.read_text().splitlines() == [
        "6,1,1000000,-;mlx5_core 0000:a9:00.0 mlx5_bond_0: Port: 1 Link DOWN"]
