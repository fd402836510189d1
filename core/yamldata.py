"""YAML for the data files podhealth ships (XID catalog, profiles, DCGM error map).

libyaml's loader when PyYAML was built with it (its wheels are): the same documents and the
same yaml.YAMLError on bad input, about 8x faster (the XID catalog: 0.11 s -> 0.014 s at every
agent and `podhealth check` start). Config files keep the pure-Python composer
(core/configload.py), whose node marks give the file:line of each key.
"""

from __future__ import annotations

from typing import Any

import yaml

LOADER: type = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str) -> Any:
    return yaml.load(text, Loader=LOADER)  # noqa: S506 - a safe loader either way
