"""The site's thresholds (`checks.policy.thresholds`) over a profile's, applied where every
profile for a config is made (profiles.of_config), so the passive rules, the active tests
(burn-in and NCCL gates) and the agent's own limits all judge with the same numbers.

The profile's own values stay known (`SiteThresholds.profile`): the Evaluator names, in the
evidence of every verdict a site threshold changed, the threshold and what the profile said.
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Mapping

from podhealth.checks.profiles.catalog import Profile
from podhealth.config_policy import PolicyConfig


class SiteThresholds(Mapping[str, float]):
    """A profile's thresholds with the site's over them; `profile` keeps the profile's own, `site`
    the site values that differ from them."""

    def __init__(self, profile: Mapping[str, float], site: Mapping[str, float]) -> None:
        self.profile = dict(profile)
        self.site = {k: float(v) for k, v in site.items()
                     if k not in self.profile or float(self.profile[k]) != float(v)}
        self._merged = {**self.profile, **self.site}

    def __getitem__(self, key: str) -> float:
        return self._merged[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._merged)

    def __len__(self) -> int:
        return len(self._merged)


def base(profile: Profile) -> Profile:
    """The profile without the site's thresholds."""
    t = profile.thresholds
    return dataclasses.replace(profile, thresholds=t.profile) if isinstance(t, SiteThresholds) else profile


def apply(profile: Profile, policy: PolicyConfig) -> Profile:
    """`profile` with `policy.thresholds` over its own (idempotent: applied to the profile's own)."""
    own = base(profile)
    if not policy.thresholds:
        return own
    return dataclasses.replace(own, thresholds=SiteThresholds(own.thresholds, policy.thresholds))


def site_values(profile: Profile) -> Mapping[str, float]:
    """The site thresholds in force in `profile` (those that differ from the profile's own)."""
    t = profile.thresholds
    return t.site if isinstance(t, SiteThresholds) else {}
