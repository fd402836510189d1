"""A site golden profile: a YAML file that `extends` a shipped profile and states what this site's
nodes look like (counts, rates, mounts, versions), as `podhealth profile capture` writes it.

    extends: dgx-h100
    name: site-a-h100          # optional; shown as the node's profile
    versions: {driver: "550.54.15", hca_fw: {MT_0000000838: "28.39.1002"}}
    drift: {kernel: OK}

The file is validated by core/configload.py (errors name file, line and key). Its schema is not
written out by hand: it is derived from the `defaults` of checks/data/profiles.yaml, so a key added
there (by any section of the profile) is accepted here with the same type, and nothing else is.
Every key is optional; what the file leaves out comes from the profile it extends.
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, Mapping, Optional

import yaml

from podhealth.checks.profiles import catalog
from podhealth.configload import ConfigError, load_file, load_text

# Mappings whose keys are the site's own (HCA board ids): their type.
_OPEN_MAPPINGS: dict[str, Any] = {"versions.hca_fw": Mapping[str, str]}
# Lists of strings whose shipped default is empty.
_STR_LISTS = {"nfs_mounts", "units"}
# Keys whose values are words from a fixed set.
_WORDS: dict[str, Any] = {"drift": Literal["OK", "WARN", "FAIL"]}


def _field_type(path: str, default: Any) -> Any:
    if path in _OPEN_MAPPINGS:
        return _OPEN_MAPPINGS[path]
    parent = path.rpartition(".")[0]
    if parent in _WORDS:
        return _WORDS[parent]
    if isinstance(default, bool):
        return bool
    if isinstance(default, int):
        # thresholds are numbers (a site may write 0.5); counts, gens and widths are integers
        return float if path.startswith("thresholds.") else int
    if isinstance(default, float):
        return float
    if isinstance(default, str):
        return str
    if isinstance(default, list):
        # a list of names (nfs_mounts) is typed by its default; a list of rules is the owner's to
        # validate (checks/ib_profile.py for network.rules)
        scalar = path in _STR_LISTS or (default and isinstance(default[0], (str, int, float)))
        return tuple[(_field_type(path + "[]", default[0]) if default else str) if scalar else Any, ...]  # type: ignore[misc]
    if isinstance(default, dict):
        return _schema(path, default) if default else Mapping[str, Any]
    return Any


def _schema(path: str, defaults: Mapping[str, Any]) -> type:
    fields = []
    for key, default in defaults.items():
        name = str(key)
        if not name.isidentifier() or keyword.iskeyword(name):
            raise TypeError(f"profiles.yaml: key {path}.{name} cannot be a site-profile field")
        sub = f"{path}.{name}" if path else name
        fields.append((name, Optional[_field_type(sub, default)], dataclasses.field(default=None)))
    cls_name = "Site" + "".join(p.title() for p in re.split(r"[._]", path) if p) if path else "SiteProfile"
    return dataclasses.make_dataclass(cls_name, fields, frozen=True)


@lru_cache(maxsize=1)
def schema() -> type:
    """The site profile's dataclass: `extends` and `name`, then every profile key, all optional."""
    body = _schema("", catalog._raw()["defaults"])
    head = [
        ("extends", Literal[tuple(catalog.names())], dataclasses.field(default="generic")),  # type: ignore[misc]
        ("name", str, dataclasses.field(default="")),
    ]
    return dataclasses.make_dataclass(
        "SiteProfile", head + [(f.name, f.type, dataclasses.field(default=None)) for f in dataclasses.fields(body)],
        frozen=True)


def _leaves(obj: Any, prefix: str = "") -> dict[str, Any]:
    """The values the file stated, as dotted keys ("thresholds.gpu_temp_warn_c"), so overriding one
    key of a section keeps the rest of the section from the profile it extends."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is None or (not prefix and f.name in ("extends", "name")):
            continue
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            out.update(_leaves(value, key + "."))
        elif isinstance(value, Mapping):
            out[key] = dict(value)
        elif isinstance(value, tuple):
            out[key] = list(value)
        else:
            out[key] = value
    return out


@dataclasses.dataclass(frozen=True)
class SiteProfile:
    extends: str
    name: str
    overrides: Mapping[str, Any]  # dotted profile key -> value


def parse(obj: Any) -> SiteProfile:
    return SiteProfile(obj.extends, obj.name, _leaves(obj))


def read(path: Path) -> SiteProfile:
    """Parse and validate a site profile file; ConfigError names file, line and key."""
    return parse(load_file(schema(), path))


def loads(text: str, source: str = "<site profile>") -> SiteProfile:
    return parse(load_text(schema(), text, source))


def load(path: Path, overrides: Mapping[str, Any] | None = None) -> catalog.Profile:
    """The profile the file describes, with the config's `checks.overrides` on top.

    Raises ProfileError (a ValueError, as for a bad node.profile) with the file's own message."""
    try:
        site = read(path)
    except ConfigError as e:
        raise catalog.ProfileError(str(e)) from None
    try:
        return build(site, overrides)
    except catalog.ProfileError as e:
        # a section validated by its owner (network: checks/ib_profile.py) names only the key
        raise catalog.ProfileError(_locate(path, str(e))) from None


def _locate(path: Path, message: str) -> str:
    """"network.roles.x.count: ..." -> "site.yaml:12: network.roles.x.count: ..." when the file
    holds that key (else the key came from checks.overrides, and the message says so)."""
    key = message.split(": ", 1)[0].removeprefix("checks.overrides.")
    try:
        node = yaml.compose(path.read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        node = None
    line = 0
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", key):
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if str(k.value) == part), None)
        elif isinstance(node, yaml.SequenceNode) and part.startswith("["):
            i = int(part[1:-1])
            node = node.value[i] if i < len(node.value) else None
        else:
            node = None
        if node is None:
            break
        line = node.start_mark.line + 1
    if node is None or not line:
        return f"{path.name}: {message} (with checks.overrides applied)"
    return f"{path.name}:{line}: {message}"


def build(site: SiteProfile, overrides: Mapping[str, Any] | None = None, source: str = "") -> catalog.Profile:
    try:
        prof = catalog.load(site.extends, {**site.overrides, **(overrides or {})})
    except catalog.ProfileError as e:
        raise catalog.ProfileError(f"{source}: {e}" if source else str(e)) from None
    return dataclasses.replace(prof, name=site.name) if site.name else prof
