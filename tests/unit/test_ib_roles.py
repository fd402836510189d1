"""The network profile schema (checks/ib_profile.py) and the role classifier (checks/passive/ib_roles.py)."""

from __future__ import annotations

import pytest

from podhealth.checks import ib_profile, profiles
from podhealth.checks.passive.ib_roles import PortFacts, classify, count_roles

H100 = profiles.load("dgx-h100").network


def _compute(dev: str, bus: int) -> PortFacts:
    return PortFacts(dev, "1", link_layer="InfiniBand", hca_type="MT4129", pci=f"0000:{bus:02x}:00.0", numa=0)


def _dgx(storage: list[PortFacts]) -> list[PortFacts]:
    return [_compute(f"mlx5_{i}", 0x18 + 0x10 * i) for i in range(8)] + storage


BOND = PortFacts("mlx5_bond_0", "1", link_layer="Ethernet", hca_type="MT41692", pci="0000:aa:00.0",
                 netdev="bond0", bond_slaves=("enp170s0f0np0", "enp170s0f1np1"), bonded=True)
IB_PAIR = [PortFacts(f"mlx5_1{fn}", "1", link_layer="InfiniBand", hca_type="MT4129", pci=f"0000:aa:00.{fn}")
           for fn in (0, 1)]


def test_shipped_profiles_state_roles_per_sku() -> None:
    for name, rate in (("dgx-a100", 200), ("dgx-h100", 400), ("dgx-h200", 400), ("dgx-b200", 400)):
        net = profiles.load(name).network
        assert net.roles["compute"].count == 8 and net.roles["compute"].rate_gbps == (rate,)
        assert net.roles["compute"].missing == "fail" and net.roles["compute"].bonded == "forbidden"
        assert set(net.roles["storage"].link_layers) == {"InfiniBand", "Ethernet"}
        assert net.roles["storage"].bonded == "allowed" and net.roles["storage"].missing == "warn"
    assert profiles.load("generic").network.roles == {}


@pytest.mark.parametrize("storage, links", [([BOND], 2), (IB_PAIR, 2), ([], 0)])
def test_dgx_builds_classify_by_adapter_shape(storage: list[PortFacts], links: int) -> None:
    got = classify(_dgx(storage), H100)
    assert [k for k, (_, a) in got.items() if a.role == "compute"] == [(f"mlx5_{i}", "1") for i in range(8)]
    assert all(a.role == "storage" for k, (_, a) in got.items() if k[0].startswith(("mlx5_bond", "mlx5_1")) and len(k[0]) > 6)
    counts = {c.role: c for c in count_roles(got, H100)}
    assert counts["compute"].present == 8 and not counts["compute"].short
    assert counts["storage"].present == links


def test_bond_with_unknown_members_is_uncertain_not_short() -> None:
    bond = PortFacts("mlx5_bond_0", "1", link_layer="Ethernet", pci="0000:aa:00.0", bonded=True)
    counts = {c.role: c for c in count_roles(classify(_dgx([bond]), H100), H100)}
    assert counts["storage"].present == 1 and counts["storage"].short and not counts["storage"].decided


def test_ethernet_single_port_is_unassigned_not_compute() -> None:
    vf = PortFacts("mlx5_9", "1", link_layer="Ethernet", pci="0000:f0:00.0")
    got = classify(_dgx([vf]), H100)
    f, a = got[("mlx5_9", "1")]
    assert a.role is None and not a.undecided and a.how == "no rule matched"


def test_missing_pci_makes_ports_undecided_and_counts_uncertain() -> None:
    facts = [PortFacts(f"mlx5_{i}", "1", link_layer="InfiniBand") for i in range(8)]
    got = classify(facts, H100)
    assert all(a.undecided and "dual_port" in a.how for _, a in got.values())
    counts = {c.role: c for c in count_roles(got, H100)}
    assert counts["compute"].short and not counts["compute"].decided


def test_pins_beat_rules_per_device_and_per_port() -> None:
    net = profiles.load("dgx-h100", {"network.pins": {"mlx5_3": "storage", "mlx5_4/1": "unassigned"}}).network
    got = classify(_dgx([]), net)
    assert got[("mlx5_3", "1")][1].role == "storage" and got[("mlx5_3", "1")][1].how == "pin"
    assert got[("mlx5_4", "1")][1].role is None and got[("mlx5_4", "1")][1].how == "pin"
    assert got[("mlx5_5", "1")][1].role == "compute"


def test_rule_keys_match_together() -> None:
    net = ib_profile.parse({
        "roles": {"compute": {"count": 1}, "storage": {"count": 1}},
        "rules": [{"role": "storage", "netdev": "^enp", "numa": [1]}, {"role": "compute", "device": "^mlx5_", "hca_type": "MT4129"}],
    })
    a = PortFacts("mlx5_0", "1", hca_type="MT4129", netdev="enp1s0", numa=0)
    b = PortFacts("mlx5_1", "1", hca_type="MT4129", netdev="enp1s0", numa=1)
    got = classify([a, b], net)
    assert got[("mlx5_0", "1")][1].role == "compute" and got[("mlx5_1", "1")][1].role == "storage"


@pytest.mark.parametrize("over, key", [
    ({"network.roles.compute.count": "8"}, "network.roles.compute.count"),
    ({"network.roles.compute.rate_gbps": [400, 0]}, "network.roles.compute.rate_gbps[1]"),
    ({"network.roles.storage.missing": "maybe"}, "network.roles.storage.missing"),
    ({"network.roles.storage.port_fault": "ok"}, "network.roles.storage.port_fault"),
    ({"network.rules": [{"role": "gpu", "bonded": True}]}, "network.rules[0].role"),
    ({"network.rules": [{"role": "compute"}]}, "network.rules[0]"),
    ({"network.rules": [{"role": "compute", "colour": "red"}]}, "network.rules[0].colour"),
    ({"network.rules": [{"role": "compute", "device": "("}]}, "network.rules[0].device"),
    ({"network.pins": {"mlx5_0": "gpu"}}, "network.pins.mlx5_0"),
    ({"network.flap_count": 0}, "network.flap_count"),
    ({"network.down_max_s": -1}, "network.down_max_s"),
])
def test_bad_network_profile_names_the_key(over: dict[str, object], key: str) -> None:
    with pytest.raises(profiles.ProfileError) as e:
        profiles.load("dgx-h100", over)
    assert f"{key}:" in str(e.value), str(e.value)


def test_legacy_override_keys_still_work() -> None:
    p = profiles.load("dgx-h100", {"compute_hcas": 4, "ib_rate_gbps": 200, "storage_hcas": 0, "ib_link_layer": "Ethernet"})
    c = p.network.roles["compute"]
    assert (c.count, c.rate_gbps, c.link_layers) == (4, (200,), ("Ethernet",))
    assert (p.compute_hcas, p.ib_rate_gbps, p.ib_link_layer, p.storage_hcas) == (4, 200, "Ethernet", 0)
    assert profiles.load("dgx-h100").compute_hcas == 8  # overrides never leak into the shipped data


def test_rate_accepts_listed_rates_or_faster() -> None:
    spec = H100.roles["storage"]
    assert spec.rate_ok(400) and spec.rate_ok(200) and spec.rate_ok(100) and spec.rate_ok(800)
    assert not spec.rate_ok(50) and not spec.rate_ok(40)
    assert not H100.roles["compute"].rate_ok(200) and H100.roles["compute"].rate_ok(800)
