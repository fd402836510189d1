"""The shipped hardware profiles per SKU, loaded from checks/data/profiles.yaml, with overrides.

A profile is plain data (facts and thresholds); checks read it, the simulator builds nodes from it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

from podhealth import yamldata
from podhealth.checks import ib_profile
from podhealth.checks.ib_profile import NetworkProfile


@dataclass(frozen=True)
class Profile:
    name: str
    gpu_count: int
    gpu_model: str
    gpu_memory_mib: int
    nvlink_links: int
    pcie_gen: int
    pcie_width: int
    power_limit_w: int
    min_driver: str
    nfs_mounts: tuple[str, ...]
    has_nvswitch_fabric: bool
    has_row_remapping: bool
    thresholds: Mapping[str, float]
    # expected versions and the verdict when one differs (checks/passive/drift.py); see profiles.yaml
    versions: Mapping[str, Any] = field(default_factory=dict)
    drift: Mapping[str, str] = field(default_factory=dict)
    # network adapters by role (checks/ib_profile.py); see profiles.yaml `network`
    network: NetworkProfile = field(default_factory=lambda: ib_profile.parse({}))
    units: tuple[str, ...] = ()  # systemd units this kind of node needs (with checks.required_units)
    nvlink_domain: "NvlinkDomain" = field(default_factory=lambda: NvlinkDomain())

    def threshold(self, key: str) -> float:
        return float(self.thresholds[key])

    # The one-number-per-node view of `network` that the simulator builds nodes from.
    @property
    def compute_hcas(self) -> int:
        r = self.network.roles.get("compute")
        return r.count if r else 0

    @property
    def storage_hcas(self) -> int:
        r = self.network.roles.get("storage")
        return r.count if r else 0

    @property
    def ib_rate_gbps(self) -> int:
        r = self.network.roles.get("compute")
        return max(r.rate_gbps) if r and r.rate_gbps else 0

    @property
    def ib_link_layer(self) -> str:
        r = self.network.roles.get("compute")
        return r.link_layers[0] if r and r.link_layers else "InfiniBand"


@dataclass(frozen=True)
class NvlinkDomain:
    """A multi-node NVLink domain the node belongs to (GB200 NVL72: 72 GPUs); 0 = none."""

    gpus: int = 0
    imex: bool = False  # the IMEX service must hold the domain up (nvidia-imex-ctl)


class ProfileError(ValueError):
    pass


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    data: dict[str, Any] = yamldata.shipped("profiles.yaml")
    return data


def names() -> tuple[str, ...]:
    """THE list of hardware profiles: checks/data/profiles.yaml's. The config schema
    (core/config.py PROFILES), the simulator's per-SKU facts and every CLI's choices derive from it."""
    return tuple(_raw()["profiles"])


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)  # overrides edit the result in place: never the cached data
    return out


def _apply_override(d: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = d
    for k in keys[:-1]:
        if not isinstance(cur.get(k), dict):
            raise ProfileError(f"checks.overrides.{dotted}: unknown profile key")
        cur = cur[k]
    if keys[-1] not in cur:
        raise ProfileError(f"checks.overrides.{dotted}: unknown profile key (known: {', '.join(sorted(cur))})")
    old = cur[keys[-1]]
    if isinstance(old, (int, float)) and not isinstance(old, bool):
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ProfileError(f"checks.overrides.{dotted}: expected a number, got {value!r}")
    elif isinstance(old, bool) and not isinstance(value, bool):
        raise ProfileError(f"checks.overrides.{dotted}: expected true or false, got {value!r}")
    elif isinstance(old, str) and not isinstance(value, str):
        raise ProfileError(f"checks.overrides.{dotted}: expected a string, got {value!r}")
    cur[keys[-1]] = value


def load(name: str, overrides: Mapping[str, Any] | None = None) -> Profile:
    """The profile `name` with `overrides` ({"min_driver": "550", "thresholds.gpu_temp_warn_c": 80}
    or nested mappings) applied; unknown keys and wrong types raise ProfileError."""
    raw = _raw()
    if name not in raw["profiles"]:
        raise ProfileError(f"unknown profile {name!r} (known: {', '.join(names())})")
    d = _merge(raw["defaults"], raw["profiles"][name] or {})
    for k, v in (overrides or {}).items():
        k = ib_profile.LEGACY_KEYS.get(str(k), k)  # a site's overrides may still use the old names
        # {"thresholds": {...}} overrides keys of a section; a dotted key sets its value whole
        # (a site profile's "versions.hca_fw": {board_id: fw})
        if isinstance(v, Mapping) and "." not in str(k):
            for k2, v2 in v.items():
                _apply_override(d, f"{k}.{k2}", v2)
        else:
            _apply_override(d, str(k), v)
    d["nfs_mounts"] = tuple(d["nfs_mounts"])
    d["units"] = tuple(str(u) for u in d.get("units") or ())
    d["nvlink_domain"] = NvlinkDomain(**(d.get("nvlink_domain") or {}))
    try:
        d["network"] = ib_profile.parse(d.get("network"))
    except ib_profile.NetworkError as e:
        raise ProfileError(str(e)) from None
    bad = {k: v for k, v in d.get("drift", {}).items() if v not in DRIFT_VERDICTS}
    if bad:
        k, v = next(iter(bad.items()))
        raise ProfileError(f"drift.{k}: expected one of {', '.join(DRIFT_VERDICTS)}, got {v!r}")
    return Profile(name=name, **d)


DRIFT_VERDICTS = ("OK", "WARN", "FAIL")
