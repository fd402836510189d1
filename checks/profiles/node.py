"""The profile a node is judged against: a shipped one (catalog.py) or the site's own (site.py),
with the config's overrides and the site policy on top; and what the collectors take from it.

This is the one module that knows both kinds of profile, so neither imports the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from podhealth.checks import policy
from podhealth.checks.profiles import site
from podhealth.checks.profiles.catalog import Profile, load

if TYPE_CHECKING:
    from podhealth.config import Config


def collector_seams(cfg: "Config", seams: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, dict[str, Any]]:
    """The profile facts collectors need, as factory seams, under the builder's own `seams` (which
    win key by key). Collectors sit below checks and never read a profile themselves."""
    prof = of_config(cfg)
    out: dict[str, dict[str, Any]] = {"nvlink": {"links_expected": prof.nvlink_links}}
    if prof.units:
        out["host"] = {"extra_units": prof.units}
    for name, kw in (seams or {}).items():
        out[name] = {**out.get(name, {}), **kw}
    return out


def collectors_not_here(cfg: "Config") -> tuple[str, ...]:
    """Collectors for hardware this kind of node does not have, which the agent does not build at
    all (rather than list as disabled: two series each on every node, and the 1,000-series budget):
    the IMEX service's off a multi-node NVLink domain."""
    return () if of_config(cfg).nvlink_domain.imex else ("imex",)


def of_config(cfg: "Config", profile_file: str | Path | None = None) -> Profile:
    """The profile a node is judged against: `checks.profile_file` (a site profile that `extends`
    a shipped one, checks/profiles/site.py) or `node.profile`, then `checks.overrides` on top, then
    the site's `checks.policy.thresholds` (checks/policy.py).
    `profile_file` (a CLI flag) wins over the config's. Errors name file, line and key."""
    path = profile_file or cfg.checks.profile_file
    if not path:
        return policy.apply(load(cfg.node.profile, cfg.checks.overrides), cfg.checks.policy)
    return policy.apply(site.load(Path(path), cfg.checks.overrides), cfg.checks.policy)
