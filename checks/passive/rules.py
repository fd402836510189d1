"""checks/data/rules.yaml, validated once: per-check damping and the meaning of clock-event reasons.

Errors name the file, the line and the dotted key, like config errors, because a bad rule file
must stop the agent at start rather than judge with half a table.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Mapping

import yaml

from podhealth.vocab import Action, Status

_DAMPING_KEYS = frozenset({"immediate", "consecutive"})
_REASON_KEYS = frozenset({"status", "action", "means", "explained_by"})


class RulesError(ValueError):
    pass


@dataclass(frozen=True)
class DampRule:
    immediate: bool = False      # shown at once, never held by the grace period
    consecutive: int = 0         # readings a FAIL/WARN must hold (0 = checks.damping.fail_after)


@dataclass(frozen=True)
class ClockReason:
    status: Status
    action: Action
    means: str
    explained_by: tuple[str, ...] = ()


@dataclass(frozen=True)
class Rules:
    damping: Mapping[str, DampRule]
    clock_reasons: Mapping[str, ClockReason]

    def damp(self, check: str) -> DampRule:
        return self.damping.get(check, _NO_RULE)


_NO_RULE = DampRule()


class _Doc:
    """Walks composed YAML nodes so every error can say where it is."""

    def __init__(self, src: str) -> None:
        self.src = src

    def err(self, node: yaml.Node, key: str, msg: str) -> RulesError:
        return RulesError(f"{self.src}:{node.start_mark.line + 1}: {key}: {msg}")

    def mapping(self, node: yaml.Node, key: str) -> list[tuple[str, yaml.Node, yaml.Node]]:
        if not isinstance(node, yaml.MappingNode):
            raise self.err(node, key, "expected a mapping")
        out = []
        seen: set[str] = set()
        for k, v in node.value:
            if not isinstance(k, yaml.ScalarNode):
                raise self.err(k, key, "keys must be names")
            if k.value in seen:
                raise self.err(k, f"{key}.{k.value}", "given twice")
            seen.add(k.value)
            out.append((str(k.value), k, v))
        return out

    def scalar(self, node: yaml.Node, key: str) -> object:
        if not isinstance(node, yaml.ScalarNode):
            raise self.err(node, key, "expected a single value")
        return yaml.safe_load(yaml.serialize(node))


def parse(text: str, src: str) -> Rules:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise RulesError(f"{src}: not valid YAML: {e}") from e
    d = _Doc(src)
    if root is None:
        raise RulesError(f"{src}: empty rules file")
    damping: dict[str, DampRule] = {}
    reasons: dict[str, ClockReason] = {}
    for section, knode, vnode in d.mapping(root, "<top>"):
        if section == "damping":
            for check, cnode, body in d.mapping(vnode, "damping"):
                damping[check] = _damp_rule(d, f"damping.{check}", body)
        elif section == "clock_reasons":
            for reason, rnode, body in d.mapping(vnode, "clock_reasons"):
                reasons[reason] = _clock_reason(d, f"clock_reasons.{reason}", body)
        else:
            raise d.err(knode, section, "unknown section (known: clock_reasons, damping)")
    for name, r in reasons.items():
        for other in r.explained_by:
            if other not in reasons:
                raise RulesError(f"{src}: clock_reasons.{name}.explained_by: {other!r} is not a listed reason")
    return Rules(damping, reasons)


def _damp_rule(d: _Doc, key: str, body: yaml.Node) -> DampRule:
    immediate, consecutive = False, 0
    for k, knode, v in d.mapping(body, key):
        value = d.scalar(v, f"{key}.{k}")
        if k == "immediate":
            if not isinstance(value, bool):
                raise d.err(v, f"{key}.immediate", f"expected true or false, got {value!r}")
            immediate = value
        elif k == "consecutive":
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise d.err(v, f"{key}.consecutive", f"expected a whole number >= 1, got {value!r}")
            consecutive = value
        else:
            raise d.err(knode, f"{key}.{k}", f"unknown key (known: {', '.join(sorted(_DAMPING_KEYS))})")
    if immediate and consecutive:
        raise d.err(body, key, "immediate and consecutive contradict each other: give one")
    if not immediate and not consecutive:
        raise d.err(body, key, "give immediate: true or consecutive: N")
    return DampRule(immediate, consecutive)


def _clock_reason(d: _Doc, key: str, body: yaml.Node) -> ClockReason:
    got: dict[str, tuple[yaml.Node, object]] = {}
    explained: tuple[str, ...] = ()
    for k, knode, v in d.mapping(body, key):
        if k not in _REASON_KEYS:
            raise d.err(knode, f"{key}.{k}", f"unknown key (known: {', '.join(sorted(_REASON_KEYS))})")
        if k == "explained_by":
            if not isinstance(v, yaml.SequenceNode):
                raise d.err(v, f"{key}.explained_by", "expected a list of reasons")
            explained = tuple(str(d.scalar(x, f"{key}.explained_by")) for x in v.value)
        else:
            got[k] = (v, d.scalar(v, f"{key}.{k}"))
    if "status" not in got or "means" not in got:
        raise d.err(body, key, "needs status and means")
    snode, status_text = got["status"]
    try:
        status = Status(str(status_text))
    except ValueError:
        raise d.err(snode, f"{key}.status", f"expected OK, WARN or FAIL, got {status_text!r}") from None
    if status is Status.UNKNOWN:
        raise d.err(snode, f"{key}.status", "a reason NVML reports is known: OK, WARN or FAIL")
    action = Action.NONE
    if "action" in got:
        anode, action_text = got["action"]
        try:
            action = Action(str(action_text))
        except ValueError:
            raise d.err(anode, f"{key}.action", f"expected one of {', '.join(a.value for a in Action)}, "
                        f"got {action_text!r}") from None
    if status is not Status.FAIL and action is not Action.NONE:
        raise d.err(body, key, f"only a FAIL asks for an action (status {status.value}, action {action.value})")
    mnode, means = got["means"]
    if not isinstance(means, str) or not means.strip():
        raise d.err(mnode, f"{key}.means", "expected the words for the summary")
    return ClockReason(status, action, means, explained)


def load_file(path: Path) -> Rules:
    return parse(Path(path).read_text(encoding="utf-8"), str(path))


@lru_cache(maxsize=1)
def load() -> Rules:
    """The shipped rules (cached: every agent start and `podhealth check` reads them once)."""
    text = resources.files("podhealth.checks.data").joinpath("rules.yaml").read_text(encoding="utf-8")
    return parse(text, "checks/data/rules.yaml")
