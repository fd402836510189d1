"""UNKNOWN only where the answer could change the action (issue 28 section 5).

A DGX H100 whose storage pair is a bond whose members sysfs does not list (one link, or two?):
the storage role caps a missing link at WARN, so every reading is at worst a WARN: the verdict is
WARN, the uncertainty in its evidence, and the handover passes (exit 0, not 2). The compute role,
whose shortfall FAILs (REBOOT), stays UNKNOWN when its count is uncertain. And `simulate node
--from-sysfs` keeps the PCI addresses a capture has, however it was copied.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from podhealth.checks import profiles
from podhealth.checks.handover.report import EXIT_PASS, SuiteReport
from podhealth.checks.passive import ib
from podhealth.checks.passive.context import Context
from podhealth.checks.passive.rates import RateTracker
from podhealth.collectors.infiniband import InfinibandCollector
from podhealth.sim import from_sysfs
from podhealth.sim.node import SimNode
from podhealth.snapshot import CollectorState, Snapshot
from podhealth.vocab import CheckResult, Status
from tests.harness.ibtree import Hca, Port, dgx_h100, write_tree

T = 1_700_000_000.0


def _ports(tmp: Path, hcas: list[Hca]) -> dict[str, CheckResult]:
    c = InfinibandCollector(write_tree(tmp / "sys", hcas)).collect()
    st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    ctx = Context(snapshot=Snapshot(T, {"infiniband": st}), profile=profiles.load("dgx-h100"), now=T,
                  rates=RateTracker(300))
    return {r.entity: r for r in ib.ib_port(ctx) if r.check == "ib_port"}


def test_an_uncertain_storage_count_is_the_warn_it_could_at_worst_be(tmp_path: Path) -> None:
    hcas = dgx_h100("bond")
    bond = hcas[-1]
    hcas[-1] = replace(bond, bond_slaves=None)  # the bond's members are not in the capture
    res = _ports(tmp_path, hcas)
    st = res["role/storage"]
    assert st.status is Status.WARN, st
    ev = dict(st.evidence)
    assert ev["uncertain"] == "1" and ev["present"] == "1" and ev["expected"] == "2"
    assert "uncertain" in st.summary
    rep = SuiteReport("dgx01", "dgx-h100", tuple(res.values()))
    assert rep.exit_code == EXIT_PASS  # the handover is not blocked by a WARN


def test_an_uncertain_compute_count_stays_unknown(tmp_path: Path) -> None:
    # six rails and a bond of unknown size that a site pinned to compute: 7 or 8 links, FAIL or OK
    hcas = dgx_h100("bond")
    hcas = hcas[:6] + [replace(hcas[-1], bond_slaves=None)]
    c = InfinibandCollector(write_tree(tmp_path / "sys", hcas)).collect()
    st = CollectorState("infiniband", samples=c.samples, stale=False, last_success=T, last_attempt=T)
    prof = profiles.load("dgx-h100", {"network.pins": {"mlx5_bond_0": "compute"}})
    ctx = Context(snapshot=Snapshot(T, {"infiniband": st}), profile=prof, now=T, rates=RateTracker(300))
    res = {r.entity: r for r in ib.ib_port(ctx) if r.check == "ib_port"}
    assert res["role/compute"].status is Status.UNKNOWN, res["role/compute"]


def _port_files(dev: Path) -> None:
    (dev / "ports" / "1").mkdir(parents=True)
    for name, text in (("fw_ver", "28.41.1000"), ("board_id", "MT_0000000838"), ("hca_type", "MT4129")):
        (dev / name).write_text(text + "\n")
    for name, text in (("state", "4: ACTIVE"), ("phys_state", "5: LinkUp"), ("rate", "400 Gb/sec (4X NDR)"),
                       ("link_layer", "InfiniBand")):
        (dev / "ports" / "1" / name).write_text(text + "\n")


def test_from_sysfs_keeps_pci_addresses_however_the_tree_was_copied(tmp_path: Path) -> None:
    root = tmp_path / "cap" / "sys"
    cls = root / "class" / "infiniband"
    cls.mkdir(parents=True)
    # 1. as /sys has it (cp -a, tar): the class entry is a link into devices/, no `device` link kept
    real = root / "devices" / "pci0000:16" / "0000:16:02.0" / "0000:17:00.0" / "infiniband" / "mlx5_0"
    _port_files(real)
    os.symlink(os.path.relpath(real, cls), cls / "mlx5_0")
    # 2. a copy that followed the links (cp -rL): `device` is a directory with the PCI uevent
    _port_files(cls / "mlx5_1")
    (cls / "mlx5_1" / "device").mkdir()
    (cls / "mlx5_1" / "device" / "uevent").write_text("DRIVER=mlx5_core\nPCI_CLASS=20700\nPCI_SLOT_NAME=0000:29:00.0\n")
    (cls / "mlx5_1" / "device" / "numa_node").write_text("0\n")
    cap = from_sysfs.read(tmp_path / "cap")
    by = {h.device: h for h in cap.hcas}
    assert (by["mlx5_0"].pci_addr, by["mlx5_1"].pci_addr, by["mlx5_1"].numa_node) == ("0000:17:00.0", "0000:29:00.0", 0)
    # through the CLI, the simulated node's tree carries them
    got = subprocess.run([sys.executable, "-m", "podhealth", "simulate", "node", "dgx01", "--root", str(tmp_path / "sim"),
                          "--from-sysfs", str(tmp_path / "cap")], capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stderr
    node = SimNode.open(tmp_path / "sim", "dgx01")
    assert {h.device: h.pci_addr for h in node.state.hcas} == {"mlx5_0": "0000:17:00.0", "mlx5_1": "0000:29:00.0"}
    for dev, pci in (("mlx5_0", "0000:17:00.0"), ("mlx5_1", "0000:29:00.0")):
        assert os.readlink(node.sys_root / "class" / "infiniband" / dev / "device").endswith(pci)


def test_port_without_any_pci_trace_stays_empty(tmp_path: Path) -> None:
    cls = tmp_path / "class" / "infiniband"
    _port_files(cls / "mlx5_0")
    (h,) = from_sysfs.read(tmp_path).hcas
    assert h.pci_addr == ""
    assert Port  # the harness' port type is what write_tree builds from
