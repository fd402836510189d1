"""The fencer registry: one literal dict, so a test can walk every entry (as collectors/__init__.py
is for collectors).

Each factory takes its own section of `fencers:` in the aggregator config and returns one Fencer.
Modules are imported lazily: the Kubernetes client is an extra, and a replica that only drains
through Slurm never loads it.
"""

from __future__ import annotations

import importlib
from typing import Callable

from podhealth.config_aggregator import AggregatorConfig
from podhealth.fencing.fence import DryRunFencer, Fencer

# `fencers.<name>` -> "module:factory", in the order the fencers are asked (and listed)
REGISTRY: dict[str, str] = {
    "slurm": "podhealth.fencing.slurm:from_config",
    "kubernetes": "podhealth.fencing.kube:from_config",
    "file": "podhealth.fencing.filefence:from_config",
    "dryrun": "podhealth.fencing.fence:dryrun_from_config",
}
# `fencers.<name>` -> the extra it needs (MissingExtra names `pip install 'podhealth[<extra>]'`)
EXTRAS: dict[str, str] = {"kubernetes": "kubernetes"}


def factory(name: str) -> Callable[..., Fencer]:
    """The factory REGISTRY names (importing its module now): `factory(name)(section)`."""
    if name in EXTRAS:
        from podhealth.extras import require

        require(EXTRAS[name])
    module, _, attr = REGISTRY[name].partition(":")
    return getattr(importlib.import_module(module), attr)  # type: ignore[no-any-return]


def build_fencers(cfg: AggregatorConfig) -> list[Fencer]:
    """The fencers the config turns on, in REGISTRY order; dry run replaces them all with the
    dry-run fencer, which also stands in when nothing else is on."""
    if cfg.dry_run:
        return [DryRunFencer()]
    out = [factory(name)(getattr(cfg.fencers, name)) for name in REGISTRY
           if name != "dryrun" and getattr(cfg.fencers, name).enabled]
    if cfg.fencers.dryrun.enabled or not out:
        out.append(factory("dryrun")(cfg.fencers.dryrun))
    return out


__all__ = ["EXTRAS", "REGISTRY", "build_fencers", "factory"]
