"""The `network` part of a hardware profile: network adapters by role, how to tell the roles
apart, and the link-flap thresholds. Plain data in, frozen dataclasses out, every error naming
the key (`network.roles.storage.rate_gbps: ...`).

A DGX does not have "N identical InfiniBand ports": it has compute rails (one single-port
adapter per GPU) and a storage / in-band pair that sites run bonded or not, Ethernet or
InfiniBand, at a lower rate or not. Each role says what a healthy port of that role looks like;
rules (and per-site pins) say which port has which role. checks/passive/ib_roles.py applies them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

BONDED = ("forbidden", "allowed", "required")
VERDICTS_MISSING = ("fail", "warn", "ok")
VERDICTS_FAULT = ("fail", "warn")
UNASSIGNED = "unassigned"  # a pin value: this port has no role (reported, never judged)
LINK_LAYERS = ("InfiniBand", "Ethernet")
_RULE_KEYS = ("role", "device", "link_layer", "hca_type", "pci", "numa", "netdev", "bonded", "dual_port")


class NetworkError(ValueError):
    """A malformed `network` section; the message starts with the key's dotted path."""


@dataclass(frozen=True)
class RoleSpec:
    name: str
    count: int  # links that must be present (at least); a bond counts as its slaves
    rate_gbps: tuple[int, ...]  # accepted rates; faster than the highest is fine too
    link_layers: tuple[str, ...]
    bonded: str  # forbidden | allowed | required
    missing: str  # fail | warn | ok: the verdict for a shortfall in count
    port_fault: str  # fail | warn: the verdict for a present port that is down, slow, or flapping

    def rate_ok(self, gbps: float) -> bool:
        if not self.rate_gbps:
            return True
        return any(abs(gbps - r) < 0.5 for r in self.rate_gbps) or gbps >= max(self.rate_gbps)


@dataclass(frozen=True)
class Rule:
    """One classification rule: every key that is set must match (None = not part of the rule)."""

    role: str
    device: re.Pattern[str] | None = None
    link_layer: tuple[str, ...] | None = None
    hca_type: tuple[str, ...] | None = None
    pci: re.Pattern[str] | None = None
    numa: tuple[int, ...] | None = None
    netdev: re.Pattern[str] | None = None
    bonded: bool | None = None
    dual_port: bool | None = None


@dataclass(frozen=True)
class NetworkProfile:
    roles: Mapping[str, RoleSpec]
    rules: tuple[Rule, ...]
    pins: Mapping[str, str]  # "mlx5_bond_0" or "mlx5_3/1" -> role name or UNASSIGNED
    flap_count: int
    flap_window_s: float
    down_max_s: float


def _int(v: Any, where: str, minimum: int = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise NetworkError(f"{where}: expected a whole number >= {minimum}, got {v!r}")
    return v


def _num(v: Any, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        raise NetworkError(f"{where}: expected a number > 0, got {v!r}")
    return float(v)


def _choice(v: Any, where: str, allowed: tuple[str, ...]) -> str:
    if not isinstance(v, str) or v.lower() not in allowed:
        raise NetworkError(f"{where}: expected one of {', '.join(allowed)}, got {v!r}")
    return v.lower()


def _list(v: Any, where: str) -> list[Any]:
    """A scalar is a one-element list (`rate_gbps: 400` reads as `[400]`)."""
    if v is None:
        raise NetworkError(f"{where}: expected a value or a list, got nothing")
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _layers(v: Any, where: str) -> tuple[str, ...]:
    out = []
    for i, x in enumerate(_list(v, where)):
        if x not in LINK_LAYERS:
            raise NetworkError(f"{where}[{i}]: expected one of {', '.join(LINK_LAYERS)}, got {x!r}")
        out.append(x)
    return tuple(out)


def _regex(v: Any, where: str) -> re.Pattern[str]:
    if not isinstance(v, str):
        raise NetworkError(f"{where}: expected a regular expression string, got {v!r}")
    try:
        return re.compile(v)
    except re.error as e:
        raise NetworkError(f"{where}: bad regular expression {v!r}: {e}") from None


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise NetworkError(f"{where}: expected true or false, got {v!r}")
    return v


def _mapping(v: Any, where: str) -> Mapping[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise NetworkError(f"{where}: expected a mapping, got {type(v).__name__}")
    return v


_ROLE_KEYS = ("count", "rate_gbps", "link_layers", "bonded", "missing", "port_fault")


def _role(name: str, d: Any, where: str) -> RoleSpec:
    d = _mapping(d, where)
    unknown = sorted(set(d) - set(_ROLE_KEYS))
    if unknown:
        raise NetworkError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(_ROLE_KEYS)})")
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or name == UNASSIGNED:
        raise NetworkError(f"{where}: role names are lower-case words other than {UNASSIGNED!r}")
    rates = tuple(_int(r, f"{where}.rate_gbps[{i}]", 1)
                  for i, r in enumerate(_list(d.get("rate_gbps", []), f"{where}.rate_gbps")))
    return RoleSpec(
        name=name,
        count=_int(d.get("count", 0), f"{where}.count"),
        rate_gbps=rates,
        link_layers=_layers(d.get("link_layers", list(LINK_LAYERS)), f"{where}.link_layers"),
        bonded=_choice(d.get("bonded", "allowed"), f"{where}.bonded", BONDED),
        missing=_choice(d.get("missing", "fail"), f"{where}.missing", VERDICTS_MISSING),
        port_fault=_choice(d.get("port_fault", "fail"), f"{where}.port_fault", VERDICTS_FAULT),
    )


def _rule(d: Any, where: str, roles: Mapping[str, RoleSpec]) -> Rule:
    d = _mapping(d, where)
    unknown = sorted(set(d) - set(_RULE_KEYS))
    if unknown:
        raise NetworkError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(_RULE_KEYS)})")
    role = d.get("role")
    if role not in roles:
        raise NetworkError(f"{where}.role: expected one of {', '.join(roles) or '(no roles)'}, got {role!r}")
    if len(d) == 1:
        raise NetworkError(f"{where}: a rule needs at least one match key besides role")
    return Rule(
        role=role,
        device=_regex(d["device"], f"{where}.device") if "device" in d else None,
        link_layer=_layers(d["link_layer"], f"{where}.link_layer") if "link_layer" in d else None,
        hca_type=tuple(str(x) for x in _list(d["hca_type"], f"{where}.hca_type")) if "hca_type" in d else None,
        pci=_regex(d["pci"], f"{where}.pci") if "pci" in d else None,
        numa=tuple(_int(x, f"{where}.numa", -1) for x in _list(d["numa"], f"{where}.numa")) if "numa" in d else None,
        netdev=_regex(d["netdev"], f"{where}.netdev") if "netdev" in d else None,
        bonded=_bool(d["bonded"], f"{where}.bonded") if "bonded" in d else None,
        dual_port=_bool(d["dual_port"], f"{where}.dual_port") if "dual_port" in d else None,
    )


_NETWORK_KEYS = ("roles", "rules", "pins", "flap_count", "flap_window_s", "down_max_s")


def parse(d: Any, where: str = "network") -> NetworkProfile:
    """The validated `network` section; NetworkError naming the key otherwise."""
    d = _mapping(d, where)
    unknown = sorted(set(d) - set(_NETWORK_KEYS))
    if unknown:
        raise NetworkError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(_NETWORK_KEYS)})")
    roles = {str(k): _role(str(k), v, f"{where}.roles.{k}") for k, v in _mapping(d.get("roles"), f"{where}.roles").items()}
    raw_rules = d.get("rules") or []
    if not isinstance(raw_rules, list):
        raise NetworkError(f"{where}.rules: expected a list, got {type(raw_rules).__name__}")
    rules = tuple(_rule(r, f"{where}.rules[{i}]", roles) for i, r in enumerate(raw_rules))
    pins: dict[str, str] = {}
    for k, v in _mapping(d.get("pins"), f"{where}.pins").items():
        if not re.fullmatch(r"[^/\s]+(/[0-9]+)?", str(k)):
            raise NetworkError(f"{where}.pins.{k}: expected a device name or device/port")
        if v != UNASSIGNED and v not in roles:
            raise NetworkError(f"{where}.pins.{k}: expected one of {', '.join([*roles, UNASSIGNED])}, got {v!r}")
        pins[str(k)] = str(v)
    return NetworkProfile(
        roles=roles, rules=rules, pins=pins,
        flap_count=_int(d.get("flap_count", 3), f"{where}.flap_count", 1),
        flap_window_s=_num(d.get("flap_window_s", 43200), f"{where}.flap_window_s"),
        down_max_s=_num(d.get("down_max_s", 240), f"{where}.down_max_s"),
    )


# Keys of the one-number-per-node schema this replaced, as a site's `checks.overrides` may still
# name them: the path each one now means.
LEGACY_KEYS: Mapping[str, str] = {
    "compute_hcas": "network.roles.compute.count",
    "storage_hcas": "network.roles.storage.count",
    "ib_rate_gbps": "network.roles.compute.rate_gbps",
    "ib_link_layer": "network.roles.compute.link_layers",
}
