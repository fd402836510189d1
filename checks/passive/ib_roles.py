"""Which role each network port has: the profile's pins, then its rules, first match wins.

Pure: facts in (what sysfs says about each port), assignments out. A rule that needs a fact the
node did not give (no PCI address in the tree, say) can neither match nor be skipped: the port
is *undecided*, which is not the same as unassigned, because a role count that undecided ports
could make up is UNKNOWN, never FAIL.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from podhealth.checks.ib_profile import UNASSIGNED, NetworkProfile, Rule

PortKey = tuple[str, str]  # (device, port)


@dataclass(frozen=True)
class PortFacts:
    device: str
    port: str
    link_layer: str | None = None
    hca_type: str | None = None
    pci: str | None = None  # "0000:aa:00.0"
    numa: int | None = None
    netdev: str | None = None
    bond_slaves: tuple[str, ...] | None = None  # members when netdev is a bonding master; None = not known
    bonded: bool = False  # mlx5_bond_N, or its netdev is a bonding master
    dual_port: bool | None = None  # another port on the same adapter; None = not known

    @property
    def key(self) -> PortKey:
        return (self.device, self.port)

    @property
    def links(self) -> int | None:
        """Links this port stands for in a role's count: a bond its members; None = a bond whose
        members are not known."""
        if not self.bonded:
            return 1
        return max(1, len(self.bond_slaves)) if self.bond_slaves is not None else None


@dataclass(frozen=True)
class Assignment:
    role: str | None  # None: unassigned or undecided
    how: str  # for evidence: "pin", "rule 2", "no rule matched", "undecided: rule 1 needs pci"
    undecided: bool = False


def _slot(pci: str) -> str:
    """'0000:aa:00.1' -> '0000:aa:00': the adapter, whatever its function."""
    return pci.rpartition(".")[0] or pci


def with_dual_port(facts: Iterable[PortFacts]) -> list[PortFacts]:
    """Each port's `dual_port`: its adapter carries another port, either as another PCI function
    (mlx5 gives each port of a dual-port card its own function and RDMA device) or as another
    port of the same device (mlx4). Unknown where the PCI address is."""
    facts = list(facts)
    by_slot: dict[str, set[str]] = {}
    ports_of: dict[str, int] = {}
    for f in facts:
        ports_of[f.device] = ports_of.get(f.device, 0) + 1
        if f.pci is not None:
            by_slot.setdefault(_slot(f.pci), set()).add(f.device)
    out = []
    for f in facts:
        if ports_of[f.device] > 1:
            dual: bool | None = True
        elif f.pci is None:
            dual = None
        else:
            dual = len(by_slot[_slot(f.pci)]) > 1
        out.append(dataclasses.replace(f, dual_port=dual))
    return out


def _match(rule: Rule, f: PortFacts) -> tuple[bool | None, str]:
    """(True/False, "") when the rule decides; (None, the missing fact) when it cannot."""
    checks: list[tuple[str, bool | None]] = []
    if rule.device is not None:
        checks.append(("device", bool(rule.device.search(f.device))))
    if rule.link_layer is not None:
        checks.append(("link_layer", None if f.link_layer is None else f.link_layer in rule.link_layer))
    if rule.hca_type is not None:
        checks.append(("hca_type", None if f.hca_type is None else f.hca_type in rule.hca_type))
    if rule.pci is not None:
        checks.append(("pci", None if f.pci is None else bool(rule.pci.search(f.pci))))
    if rule.numa is not None:
        checks.append(("numa", None if f.numa is None else f.numa in rule.numa))
    if rule.netdev is not None:
        checks.append(("netdev", None if f.netdev is None else bool(rule.netdev.search(f.netdev))))
    if rule.bonded is not None:
        checks.append(("bonded", f.bonded == rule.bonded))
    if rule.dual_port is not None:
        checks.append(("dual_port", None if f.dual_port is None else f.dual_port == rule.dual_port))
    if any(v is False for _, v in checks):
        return False, ""
    missing = [k for k, v in checks if v is None]
    return (None, ",".join(missing)) if missing else (True, "")


def classify_one(f: PortFacts, net: NetworkProfile) -> Assignment:
    pin = net.pins.get(f"{f.device}/{f.port}", net.pins.get(f.device))
    if pin is not None:
        return Assignment(None if pin == UNASSIGNED else pin, "pin")
    for i, rule in enumerate(net.rules, 1):
        hit, missing = _match(rule, f)
        if hit:
            return Assignment(rule.role, f"rule {i}")
        if hit is None:
            return Assignment(None, f"undecided: rule {i} needs {missing}", undecided=True)
    return Assignment(None, "no rule matched")


def classify(facts: Sequence[PortFacts], net: NetworkProfile) -> dict[PortKey, tuple[PortFacts, Assignment]]:
    """Every port's facts (with dual_port filled in) and its assignment."""
    return {f.key: (f, classify_one(f, net)) for f in with_dual_port(facts)}


def other_link_layer(assigned: Mapping[PortKey, tuple[PortFacts, Assignment]], net: NetworkProfile,
                     role: str) -> list[PortKey]:
    """Unassigned ports that a rule of `role` would take but for their link layer: the ports of
    a RoCE fabric (Ethernet on the same adapters) judged by a profile that expects InfiniBand."""
    out = []
    for key, (f, a) in assigned.items():
        if a.role is not None or a.undecided or a.how == "pin" or f.link_layer is None:
            continue
        for rule in net.rules:
            if rule.role == role and rule.link_layer is not None and f.link_layer not in rule.link_layer:
                if _match(dataclasses.replace(rule, link_layer=None), f)[0]:
                    out.append(key)
                    break
    return sorted(out)


@dataclass(frozen=True)
class RoleCount:
    role: str
    expected: int
    present: int  # links of ports assigned to the role (bonds counted as their members)
    uncertain: int  # bonds with members not known (each counted once in present) + undecided ports

    @property
    def short(self) -> bool:
        return self.present < self.expected

    @property
    def decided(self) -> bool:
        """A shortfall that bonds of unknown size or undecided ports cannot explain."""
        return not self.short or self.uncertain == 0


def count_roles(assigned: Mapping[PortKey, tuple[PortFacts, Assignment]], net: NetworkProfile) -> list[RoleCount]:
    undecided = sum(1 for _, a in assigned.values() if a.undecided)
    out = []
    for name, spec in net.roles.items():
        present = uncertain = 0
        for f, a in assigned.values():
            if a.role != name:
                continue
            links = f.links
            present += 1 if links is None else links
            uncertain += 1 if links is None else 0
        out.append(RoleCount(name, spec.count, present, uncertain + undecided))
    return out
