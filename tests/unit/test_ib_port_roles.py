"""ib_port judges each port against its role, on sysfs trees read by the real collector.

The bonded tree is the project's own fixture (tests/fixtures/infiniband/dgx_h100_bond, modelled on
a real healthy DGX H100 ibstat capture: eight NDR compute ports + mlx5_bond_0, Ethernet, 200);
the other builds are written by tests/harness/ibtree.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from podhealth.checks import profiles
from podhealth.checks.passive.engine import Evaluator
from podhealth.checks.profiles import Profile
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.config import ChecksConfig
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import Action, CheckResult, Status
from tests.harness.ibtree import Hca, Port, dgx_h100, write_tree

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "infiniband" / "dgx_h100_bond" / "sys"
H100 = profiles.load("dgx-h100")
T = 1_700_000_000.0


def snapshot_of(sys_root: Path, now: float = T) -> Snapshot:
    c = InfinibandCollector(sys_root).collect()
    st = CollectorState("infiniband", samples=c.samples, errors=c.errors, stale=False, last_success=now, last_attempt=now)
    return Snapshot(now, {"infiniband": st})


def judge(sys_root: Path, profile: Profile = H100) -> dict[tuple[str, str], CheckResult]:
    ev = Evaluator(profile, ChecksConfig())
    return {(r.check, r.entity): r for r in ev.evaluate(snapshot_of(sys_root), T, damped=False) if r.check == "ib_port"}


def not_ok(res: dict[tuple[str, str], CheckResult]) -> dict[str, tuple[str, str]]:
    return {e: (r.status.value, r.summary) for (_, e), r in res.items() if r.status is not Status.OK}


def test_real_shaped_bonded_ethernet_storage_is_healthy() -> None:
    res = judge(FIXTURE)
    assert not_ok(res) == {}
    bond = dict(res[("ib_port", "mlx5_bond_0/1")].evidence)
    assert bond["role"] == "storage" and bond["link_layer"] == "Ethernet" and bond["rate_gbps"] == "200"
    assert bond["bond_slaves"].split() == ["enp170s0f0np0", "enp170s0f1np1"]
    assert dict(res[("ib_port", "role/compute")].evidence)["present"] == "8"
    assert dict(res[("ib_port", "role/storage")].evidence)["present"] == "2"  # the bond's two members


@pytest.mark.parametrize("profile", ["dgx-h100", "dgx-h200", "dgx-b200"])
@pytest.mark.parametrize("storage", ["bond", "ib"])
def test_documented_alternative_builds_are_healthy(tmp_path: Path, profile: str, storage: str) -> None:
    res = judge(write_tree(tmp_path / "sys", dgx_h100(storage)), profiles.load(profile))
    assert not_ok(res) == {}
    roles = {e: dict(r.evidence)["role"] for (_, e), r in res.items() if not e.startswith("role/")}
    assert sorted(e for e, role in roles.items() if role == "storage") == (
        ["mlx5_bond_0/1"] if storage == "bond" else ["mlx5_2/1", "mlx5_3/1"])


def test_storage_at_lower_listed_rate_is_healthy(tmp_path: Path) -> None:
    hcas = dgx_h100("ib")
    for h in hcas[-2:]:
        h.ports[1].rate = "100 Gb/sec (4X EDR)"
    assert not_ok(judge(write_tree(tmp_path / "sys", hcas))) == {}


def test_compute_port_at_200_on_ndr_profile_fails(tmp_path: Path) -> None:
    hcas = dgx_h100("bond")
    hcas[2].ports[1].rate = "200 Gb/sec (4X HDR)"
    res = judge(write_tree(tmp_path / "sys", hcas))
    r = res[("ib_port", "mlx5_4/1")]
    assert r.status is Status.FAIL and r.action is Action.DRAIN and "200 Gb/s below 400" in r.summary
    assert not_ok(res).keys() == {"mlx5_4/1"}


def test_missing_compute_port_fails_and_names_the_present_ones(tmp_path: Path) -> None:
    hcas = [h for h in dgx_h100("bond") if h.name != "mlx5_7"]
    res = judge(write_tree(tmp_path / "sys", hcas))
    r = res[("ib_port", "role/compute")]
    assert r.status is Status.FAIL and r.action is Action.REBOOT and "7 of 8 compute" in r.summary
    assert "mlx5_7/1" not in dict(r.evidence)["ports"]


def test_missing_storage_is_a_warning_not_a_fence(tmp_path: Path) -> None:
    res = judge(write_tree(tmp_path / "sys", dgx_h100("none")))
    assert not_ok(res) == {"role/storage": ("WARN", "0 of 2 storage links present")}


def test_storage_port_down_warns_compute_port_down_fails(tmp_path: Path) -> None:
    hcas = dgx_h100("ib")
    hcas[0].ports[1].state, hcas[0].ports[1].phys_state = "1: DOWN", "2: Polling"
    hcas[-1].ports[1].state, hcas[-1].ports[1].phys_state = "1: DOWN", "3: Disabled"
    res = judge(write_tree(tmp_path / "sys", hcas))
    assert res[("ib_port", "mlx5_0/1")].status is Status.FAIL  # one-shot: no history to wait on
    assert res[("ib_port", "mlx5_3/1")].status is Status.WARN


def test_compute_port_in_ethernet_mode_is_not_a_rail(tmp_path: Path) -> None:
    # mlxconfig LINK_TYPE set to Ethernet on a compute adapter: it is no longer an IB rail, so the
    # compute role is one short (FAIL), and the port itself is reported, not judged.
    hcas = dgx_h100("bond")
    hcas[5].ports[1].link_layer = "Ethernet"
    res = judge(write_tree(tmp_path / "sys", hcas))
    assert res[("ib_port", "role/compute")].status is Status.FAIL
    assert res[("ib_port", "mlx5_7/1")].status is Status.OK
    assert dict(res[("ib_port", "mlx5_7/1")].evidence)["role"] == "unassigned"


def test_pinned_compute_port_with_wrong_link_layer_fails(tmp_path: Path) -> None:
    hcas = dgx_h100("bond")
    hcas[5].ports[1].link_layer = "Ethernet"
    prof = profiles.load("dgx-h100", {"network.pins": {"mlx5_7": "compute"}})
    r = judge(write_tree(tmp_path / "sys", hcas), prof)[("ib_port", "mlx5_7/1")]
    assert r.status is Status.FAIL and "link layer Ethernet" in r.summary


def test_unassigned_port_is_never_a_failure(tmp_path: Path) -> None:
    # A site's extra adapter nobody described: down, slow, Ethernet. Reported, never failed.
    extra = Hca("mlx5_12", hca_type="MT4125", pci="0000:f1:00.0",
                ports={1: Port(state="1: DOWN", phys_state="3: Disabled", rate="10 Gb/sec (1X QDR)", link_layer="Ethernet")})
    res = judge(write_tree(tmp_path / "sys", dgx_h100("bond") + [extra]))
    assert not_ok(res) == {}
    assert dict(res[("ib_port", "mlx5_12/1")].evidence)["role"] == "unassigned"


def test_bond_on_a_role_that_forbids_bonds_fails(tmp_path: Path) -> None:
    prof = profiles.load("dgx-h100", {"network.pins": {"mlx5_bond_0": "compute"},
                                      "network.roles.compute.link_layers": ["InfiniBand", "Ethernet"],
                                      "network.roles.compute.rate_gbps": [200]})
    r = judge(write_tree(tmp_path / "sys", dgx_h100("bond")), prof)[("ib_port", "mlx5_bond_0/1")]
    assert r.status is Status.FAIL and "bonded" in r.summary


def test_tree_without_pci_links_is_unknown_never_fail(tmp_path: Path) -> None:
    hcas = dgx_h100("bond")
    for h in hcas:
        h.pci = None
    res = judge(write_tree(tmp_path / "sys", hcas))
    assert res[("ib_port", "role/compute")].status is Status.UNKNOWN
    assert not [r for r in res.values() if r.status is Status.FAIL]


def test_device_whose_ports_cannot_be_listed_makes_a_short_count_unknown(tmp_path: Path) -> None:
    root = write_tree(tmp_path / "sys", dgx_h100("bond"))
    shutil.rmtree(root / "class/infiniband/mlx5_9/ports")
    (root / "class/infiniband/mlx5_9/ports").write_text("")  # ENOTDIR: listed, but no ports read
    res = judge(root)
    r = res[("ib_port", "role/compute")]
    assert r.status is Status.UNKNOWN and dict(r.evidence)["devices_without_ports"] == "1"


def test_failed_collection_is_unknown_not_zero_of_ten() -> None:
    # What the scheduler stores when a collection fails (EMFILE/EACCES: SourceUnreadable): no
    # samples, and a last attempt later than the last success.
    st = CollectorState("infiniband", samples=(), errors=("SourceUnreadable: Too many open files",),
                        stale=False, last_success=T - 60, last_attempt=T)
    res = Evaluator(H100, ChecksConfig()).evaluate(Snapshot(T, {"infiniband": st}), T, damped=False)
    ib = [r for r in res if r.check == "ib_port"]
    assert [(r.entity, r.status) for r in ib] == [("node", Status.UNKNOWN)]


def test_absent_infiniband_class_fails_compute_count(tmp_path: Path) -> None:
    # No /sys/class/infiniband at all (driver not loaded): a finding, not a read failure.
    res = judge(tmp_path / "sys")
    assert res[("ib_port", "role/compute")].status is Status.FAIL
    assert res[("ib_port", "role/storage")].status is Status.WARN


def test_optional_role_with_missing_ok_is_ok(tmp_path: Path) -> None:
    prof = profiles.load("dgx-h100", {"network.roles.storage.missing": "ok"})
    r = judge(write_tree(tmp_path / "sys", dgx_h100("none")), prof)[("ib_port", "role/storage")]
    assert r.status is Status.OK and "optional" in r.summary


def test_port_pinned_to_inband_is_judged_as_inband(tmp_path: Path) -> None:
    hcas = dgx_h100("ib")
    hcas[-1].ports[1].state, hcas[-1].ports[1].phys_state = "1: DOWN", "3: Disabled"
    prof = profiles.load("dgx-h100", {"network.pins": {"mlx5_3": "inband"}, "network.roles.storage.count": 1})
    res = judge(write_tree(tmp_path / "sys", hcas), prof)
    assert dict(res[("ib_port", "mlx5_3/1")].evidence)["role"] == "inband"
    assert res[("ib_port", "mlx5_3/1")].status is Status.WARN  # inband's port_fault is warn
    assert dict(res[("ib_port", "role/inband")].evidence)["present"] == "1"
    assert not_ok(res).keys() == {"mlx5_3/1"}
