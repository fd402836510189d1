"""What the infiniband collector reads for roles: PCI address, NUMA node, netdev, bond members.
Optional files that are absent give no series and no problem."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podhealth.collectors import ib_parse
from podhealth.collectors.infiniband import RELIST_SECONDS, InfinibandCollector, _Topology
from podhealth.vocab import Sample
from tests.harness.ibtree import Hca, Port, dgx_h100, write_tree

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband" / "dgx_h100_bond" / "sys"


def _info(samples: tuple[Sample, ...], name: str) -> dict[str, dict[str, str]]:
    return {s.label("device"): dict(s.labels) for s in samples if s.name == name}


@pytest.mark.parametrize("link, want", [
    ("../../../devices/pci0000:a8/0000:a9:00.1", "0000:a9:00.1"),
    ("../../../0000:AA:00.0/", "0000:aa:00.0"),
    ("../../devices/virtual/net/ib0", None),
    ("", None),
])
def test_parse_pci_address(link: str, want: str | None) -> None:
    assert ib_parse.parse_pci_address(link) == want


def test_parse_small_files() -> None:
    assert ib_parse.parse_numa_node("1\n") == 1 and ib_parse.parse_numa_node("-1\n") is None
    assert ib_parse.parse_numa_node("x") is None
    assert ib_parse.parse_netdev("bond0\n") == "bond0" and ib_parse.parse_netdev("\n") is None
    assert ib_parse.parse_bond_slaves("a b\n") == ("a", "b") and ib_parse.parse_bond_slaves("\n") == ()
    assert ib_parse.is_bond_device("mlx5_bond_0") and not ib_parse.is_bond_device("mlx5_10")


def test_fixture_tree_gives_placement_netdevs_and_bond_members() -> None:
    c = InfinibandCollector(FIXTURE).collect()
    assert c.errors == ()
    pci = _info(c.samples, "infiniband_device_pci_info")
    nd = _info(c.samples, "infiniband_port_netdev_info")
    assert len(pci) == 9 and len(nd) == 9
    assert pci["mlx5_bond_0"]["pci_address"].endswith(":00.0") and pci["mlx5_bond_0"]["numa_node"] in ("0", "1")
    assert nd["mlx5_bond_0"]["netdev"] == "bond0" and len(nd["mlx5_bond_0"]["bond_slaves"].split()) == 2
    assert nd["mlx5_0"]["netdev"].startswith("ibp") and nd["mlx5_0"]["bond_slaves"] == ""


def test_absent_optional_files_give_no_series_and_no_problem(tmp_path: Path) -> None:
    bare = Hca("mlx5_0")  # no device link, no netdev, no numa
    no_numa = Hca("mlx5_1", pci="0000:40:00.0", numa=None, netdev=None)
    c = InfinibandCollector(write_tree(tmp_path / "sys", [bare, no_numa])).collect()
    assert c.errors == ()
    pci = _info(c.samples, "infiniband_device_pci_info")
    assert "mlx5_0" not in pci and pci["mlx5_1"] == {"device": "mlx5_1", "pci_address": "0000:40:00.0", "numa_node": ""}
    assert _info(c.samples, "infiniband_port_netdev_info") == {}


def test_gid_netdev_wins_over_device_net(tmp_path: Path) -> None:
    h = Hca("mlx5_2", pci="0000:aa:00.0", numa=1, netdev="enp170s0f0np0",
            ports={1: Port(link_layer="Ethernet", gid_netdev="enp170s0f0np0v100")})
    c = InfinibandCollector(write_tree(tmp_path / "sys", [h])).collect()
    assert _info(c.samples, "infiniband_port_netdev_info")["mlx5_2"]["netdev"] == "enp170s0f0np0v100"


def test_bond_without_readable_members_has_empty_slaves(tmp_path: Path) -> None:
    hcas = dgx_h100("bond")
    hcas[-1].bond_slaves = None  # no class/net/bond0/bonding/slaves
    c = InfinibandCollector(write_tree(tmp_path / "sys", hcas)).collect()
    assert c.errors == ()
    assert _info(c.samples, "infiniband_port_netdev_info")["mlx5_bond_0"]["bond_slaves"] == ""


def test_topology_is_read_once_per_relist_period(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "sys", dgx_h100("bond"))
    slaves = root / "class/net/bond0/bonding/slaves"
    topo = _Topology("mlx5_bond_0", str(root / "class/net"))
    dfd = os.open(root / "class/infiniband/mlx5_bond_0", os.O_RDONLY | os.O_DIRECTORY)
    try:
        first = topo.read(dfd, ((1, "1"),), 100.0)
        slaves.write_text("enp170s0f0np0\n")  # a re-bond: seen at the next period, not before
        assert topo.read(dfd, ((1, "1"),), 100.0 + RELIST_SECONDS - 1) is first
        later = topo.read(dfd, ((1, "1"),), 100.0 + RELIST_SECONDS)
    finally:
        os.close(dfd)
    assert [s.label("bond_slaves") for s in later if s.name == "infiniband_port_netdev_info"] == ["enp170s0f0np0"]
