"""The collector registry: one literal dict, so a test can walk every entry.

Each factory takes the agent Config and returns a Collector (or raises CollectorDisabled).
Modules are imported lazily so a missing optional library disables one collector, not the agent.
"""

from __future__ import annotations

import importlib
from typing import Callable

from podhealth.collectors.base import Collection, Collector, CollectorDisabled

# name -> "module:factory"
REGISTRY: dict[str, str] = {
    "nvml": "podhealth.collectors.nvml:create",
    "nvlink": "podhealth.collectors.nvlink:create",
    "infiniband": "podhealth.collectors.infiniband:create",
    "nfs": "podhealth.collectors.nfs:create",
    "host": "podhealth.collectors.host:create",
    "dcgm": "podhealth.collectors.dcgm:create",
    "kmsg": "podhealth.collectors.kmsg:create",
    "pcie_aer": "podhealth.collectors.pcie_aer:create",
    "edac": "podhealth.collectors.edac:create",
    "nvme": "podhealth.collectors.nvme:create",
    "jobs": "podhealth.collectors.jobs:create",
    "imex": "podhealth.collectors.imex:create",
}


def factory(name: str) -> Callable[..., Collector]:
    """The factory REGISTRY names (importing its module now): `factory(name)(cfg, **seams)`."""
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


__all__ = ["REGISTRY", "Collection", "Collector", "CollectorDisabled", "factory"]
