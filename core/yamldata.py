"""YAML for the data files podhealth ships (XID catalog, profiles, DCGM error map).

libyaml's loader when PyYAML was built with it (its wheels are): the same documents and the
same yaml.YAMLError on bad input, about 8x faster (the XID catalog: 0.11 s -> 0.014 s at every
agent and `podhealth check` start). Config files keep the pure-Python composer
(core/configload.py), whose node marks give the file:line of each key.
"""

from __future__ import annotations

from functools import lru_cache
from importlib import resources
from typing import Any

import yaml

LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=LOADER)  # noqa: S506 - a safe loader either way


@lru_cache(maxsize=None)
def shipped(name: str) -> Any:
    """A data file podhealth ships in checks/data (package podhealth.checks.data), parsed once per
    process. Read as data, so a core module (the config schema's list of profiles) can use one
    without importing checks. Callers must not mutate what it returns (it is shared)."""
    return load(resources.files("podhealth.checks.data").joinpath(name).read_text(encoding="utf-8"))
