"""One list of hardware profiles: checks/data/profiles.yaml (checks/profiles.names()). The config
schema, the simulator's per-SKU facts and topologies, and every CLI's profile choices derive from
it or are held to it here."""

from __future__ import annotations

import argparse

import pytest

from podhealth import config
from podhealth.checks import profiles
from podhealth.cli import build_parser
from podhealth.configload import ConfigError
from podhealth.sim import topology
from podhealth.sim.state import SKUS, simulated_profiles


def _choices(argv: list[str], option: str) -> tuple[str, ...]:
    parser = build_parser()
    for words in argv:
        parser = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[words]
    action = next(a for a in parser._actions if option in a.option_strings)
    assert action.choices is not None
    return tuple(action.choices)


def test_the_config_schema_takes_the_one_list() -> None:
    assert config.PROFILES == profiles.names()
    for name in profiles.names():
        assert config.loads(f"node: {{profile: {name}}}\n").node.profile == name
    with pytest.raises(ConfigError, match=r"^p.yaml:1: node.profile: expected one of"):
        config.loads("node: {profile: dgx-z9}\n", "p.yaml")


def test_the_simulators_facts_are_keyed_by_the_one_list() -> None:
    """Every SKU the simulator knows is a profile, and every profile but `generic` (no hardware
    of its own: the simulator's GENERIC_SKU stands in) has SKU facts; every profile that states
    its adapters has a topology. Every profile can be simulated, `generic` too."""
    names = set(profiles.names())
    assert set(SKUS) <= names, f"simulator SKUs that are no profile: {set(SKUS) - names}"
    assert set(SKUS) == names - {"generic"}, f"profiles without simulator facts: {names - {'generic'} - set(SKUS)}"
    assert set(topology.LAYOUTS) <= set(SKUS)
    assert {n for n in SKUS if profiles.load(n).compute_hcas} <= set(topology.LAYOUTS)
    assert simulated_profiles() == profiles.names()
    for name in SKUS:
        # a stated count is the simulator's; none stated (PCIe cards): the SKU's common build
        assert profiles.load(name).gpu_count in (0, len(SKUS[name].bus_ids)), name


@pytest.mark.parametrize(("argv", "option"), [
    (["agent"], "--simulate"),
    (["profile", "capture"], "--simulate"),
    (["simulate", "fleet"], "--profile"),
])
def test_every_cli_offers_the_simulated_profiles(argv: list[str], option: str) -> None:
    assert _choices(argv, option) == simulated_profiles()
