"""InfiniBand verdicts on real captures (../shared/fixtures/infiniband): healthy nodes get no FAIL,
the faulty ports are found.

`ibstat`/`ibstatus` print neither PCI addresses nor netdevs: each capture becomes a sysfs tree
in which every adapter sits in its own PCI slot, as single-port adapters do (the bond keeps its
name; its members are unknown, so the storage count can only be UNKNOWN, never FAIL).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from podhealth.checks.passive import ib
from podhealth.checks import profiles
from podhealth.checks.passive.context import Context
from podhealth.checks.profiles import Profile
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Status
from tests.harness.ibtree import from_ibstat, write_tree

T = 1_700_000_000.0


def _judge(shared: Path, tmp: Path, capture: str, profile: Profile) -> dict[str, CheckResult]:
    hcas = from_ibstat((shared / "infiniband" / capture).read_text())
    for i, h in enumerate(hcas):
        h.pci = f"0000:{0x10 + i:02x}:00.0"
    c = InfinibandCollector(write_tree(tmp / "sys", hcas)).collect()
    assert c.errors == ()
    st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    ctx = Context(snapshot=Snapshot(T, {"infiniband": st}), profile=profile, now=T, rates=RateTracker(300))
    return {r.entity: r for r in ib.ib_port(ctx) + ib.ib_errors(ctx) if r.check == "ib_port"}


def _by_status(res: dict[str, CheckResult], status: Status) -> list[str]:
    return sorted(e for e, r in res.items() if r.status is status)


def test_healthy_h100_with_bonded_ethernet_storage_has_no_fail(shared_fixtures: Path, tmp_path: Path) -> None:
    """The capture behind the report: mlx5_0,1,4..9 NDR 400 + mlx5_bond_0 Ethernet 200."""
    res = _judge(shared_fixtures, tmp_path, "ibstat.47.0.h100.all.active.2.txt", profiles.load("dgx-h100"))
    assert _by_status(res, Status.FAIL) == [] and _by_status(res, Status.UNKNOWN) == []
    assert res["role/compute"].status is Status.OK and dict(res["role/compute"].evidence)["present"] == "8"
    assert dict(res["mlx5_bond_0/1"].evidence)["role"] == "storage" and res["mlx5_bond_0/1"].status is Status.OK
    # bond members are not in ibstat: 1 or 2 storage links. Either reading is at worst a WARN (the
    # storage role's shortfall only warns), so WARN it is, saying why; UNKNOWN would block handover.
    st = res["role/storage"]
    assert st.status is Status.WARN and dict(st.evidence)["uncertain"] == "1", st
    assert _by_status(res, Status.WARN) == ["role/storage"]


def test_roce_h100_finds_the_down_compute_ports(shared_fixtures: Path, tmp_path: Path) -> None:
    """An H100 RoCE node (compute rails are Ethernet): a site profile says so and pins its
    ConnectX-6 Dx (MT4125) 100 GbE ports to storage; the two compute ports that are Down fail."""
    site = profiles.load("dgx-h100", {
        "network.roles.compute.link_layers": ["Ethernet"],
        "network.rules": [{"role": "compute", "hca_type": "MT4129"}, {"role": "storage", "hca_type": "MT4125"}],
        "network.roles.storage.count": 4,
    })
    res = _judge(shared_fixtures, tmp_path, "ibstat.47.0.h100.some.down.with.polling.1.txt", site)
    assert _by_status(res, Status.FAIL) == ["mlx5_11/1", "mlx5_5/1"]
    assert "DOWN" in res["mlx5_5/1"].summary and "DOWN" in res["mlx5_11/1"].summary
    assert res["role/storage"].status is Status.OK


def test_roce_h100_on_an_infiniband_profile_is_not_failed(shared_fixtures: Path, tmp_path: Path) -> None:
    """The same node judged as a stock DGX H100 (InfiniBand rails): no port of it is an IB rail,
    but its single-port adapters are all Ethernet. That is the build's fabric, not this node's
    fault (every node of the build would FAIL alike): UNKNOWN naming the ports, never FAIL."""
    res = _judge(shared_fixtures, tmp_path, "ibstat.47.0.h100.some.down.with.polling.1.txt", profiles.load("dgx-h100"))
    assert res["role/compute"].status is Status.UNKNOWN
    assert "fabric is not the profile's" in res["role/compute"].summary
    assert len(dict(res["role/compute"].evidence)["other_link_layer"].split()) == 12
    assert _by_status(res, Status.FAIL) == []


def test_healthy_a100_vm_with_an_ethernet_vf_has_no_fail(shared_fixtures: Path, tmp_path: Path) -> None:
    res = _judge(shared_fixtures, tmp_path, "ibstatus.39.0.a100.all.active.0.txt", profiles.load("dgx-a100"))
    assert _by_status(res, Status.FAIL) == []
    assert dict(res["role/compute"].evidence)["present"] == "8"
    unassigned = [e for e, r in res.items() if dict(r.evidence).get("role") == "unassigned"]
    assert len(unassigned) == 1 and dict(res[unassigned[0]].evidence)["link_layer"] == "Ethernet"


@pytest.mark.parametrize("tree", ["procfs_tree", "node_exporter_tree"])
@pytest.mark.parametrize("profile", ["generic", "dgx-h100"])
def test_sysfs_corpus_trees_never_fail_a_port(shared_fixtures: Path, tree: str, profile: str) -> None:
    """hfi1/mlx4/i40iw test trees (no device links): no port fails. On a DGX profile the
    single-port devices are undecided (no PCI address to tell a rail by), so the missing rails
    are UNKNOWN; mlx4's two ports on one device are the dual-port (storage) shape."""
    c = InfinibandCollector(shared_fixtures / "infiniband" / tree / "sys").collect()
    st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    ctx = Context(snapshot=Snapshot(T, {"infiniband": st}), profile=profiles.load(profile), now=T, rates=RateTracker(300))
    res = ib.ib_port(ctx) + ib.ib_errors(ctx)
    assert [r.entity for r in res if r.status is Status.FAIL and not r.entity.startswith("role/")] == []
    if profile == "generic":
        assert all(dict(r.evidence)["role"] == "unassigned" for r in res
                   if r.check == "ib_port" and not r.entity.startswith("role/"))
    else:
        assert next(r for r in res if r.entity == "role/compute").status is Status.UNKNOWN
