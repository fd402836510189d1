"""Optional dependencies, installed as pip extras: `podhealth[kubernetes]`, `podhealth[influx]`,
`podhealth[postgresql]`, `podhealth[podresources]` (grpcio only, for the agent's kubelet source:
collectors/podresources.py raises its own GrpcMissing naming it).

The node agent needs neither (the Kubernetes client alone is ~126 MB installed), so they are not
core dependencies; every import of them is lazy and goes through `require()`, which turns a
missing package into one line naming the extra to install. `needed_by()` says which of them a
config turns on, for `podhealth config check` and for start-up.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podhealth.config import Config


@dataclass(frozen=True)
class Extra:
    name: str      # the pip extra
    module: str    # what it provides, as imported
    package: str   # the distribution, as pip names it
    what: str      # the feature that needs it


EXTRAS = {
    "kubernetes": Extra("kubernetes", "kubernetes", "kubernetes", "the Kubernetes fencer"),
    "influx": Extra("influx", "influxdb_client", "influxdb-client", "InfluxDB export"),
    "postgresql": Extra("postgresql", "psycopg", "psycopg", "the aggregator's PostgreSQL store (replicas)"),
}


class MissingExtra(ImportError):
    def __init__(self, extra: Extra, why: str = "") -> None:
        self.extra = extra
        super().__init__(f"{extra.what} needs the {extra.package} package, which is not installed"
                         f"{f' ({why})' if why else ''}: pip install 'podhealth[{extra.name}]'")


def require(name: str) -> None:
    """Import the extra's module or raise MissingExtra (an ImportError) naming the extra."""
    extra = EXTRAS[name]
    try:
        importlib.import_module(extra.module)
    except ImportError as e:
        raise MissingExtra(extra, str(e) if getattr(e, "name", None) not in (extra.module, None) else "") from None


def needed_by(cfg: "Config") -> list[tuple[str, str]]:
    """(config key, extra) for each extra the config turns on."""
    out: list[tuple[str, str]] = []
    if cfg.exporters.influxdb.enabled:
        out.append(("exporters.influxdb.enabled", "influx"))
    if cfg.aggregator.fencers.kubernetes.enabled:
        out.append(("aggregator.fencers.kubernetes.enabled", "kubernetes"))
    if cfg.aggregator.store.url.startswith(("postgresql://", "postgres://")):
        out.append(("aggregator.store.url", "postgresql"))
    return out


def missing(cfg: "Config") -> list[tuple[str, MissingExtra]]:
    """(config key, error) for each extra the config turns on that is not importable."""
    out: list[tuple[str, MissingExtra]] = []
    for key, name in needed_by(cfg):
        try:
            require(name)
        except MissingExtra as e:
            out.append((key, e))
    return out
