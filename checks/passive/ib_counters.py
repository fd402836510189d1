"""What InfiniBand counters mean, from checks/data/ib_counters.yaml: widths (where each one
saturates), which rising ones are trouble, what still moves once they saturate, how to clear.

Validated once and cached; a malformed file raises CountersError naming the file and the key.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any, Mapping

from podhealth import yamldata

_SRC = "checks/data/ib_counters.yaml"


# Widths a driver may count a PMA error counter in beyond the spec's (see saturated_width).
_WIDER_BITS = (32, 64)


class CountersError(ValueError):
    pass


@dataclass(frozen=True)
class CounterMeanings:
    widths: Mapping[str, int]  # sysfs counters/ file name -> bits (error and other counters)
    errors: frozenset[str]  # the error counters among them: saturated = blind to new errors
    rising: Mapping[str, str | None]  # counter -> profile threshold key (per hour); None = any increase
    substitutes: Mapping[str, float]  # hw_counters file name -> per-hour rate worth reporting
    clear: Mapping[str, str]  # link layer -> how operators clear the counters ({device}, {port})

    def max_value(self, counter: str) -> int | None:
        w = self.widths.get(counter)
        return None if w is None else (1 << w) - 1

    def saturated_width(self, counter: str, value: float) -> int | None:
        """The width at which `counter` is stuck (its value all ones), or None while it counts.

        A counter saturates at 2^w - 1 of the width it is really counted in: the spec width,
        or 32/64 bits where a driver fills the sysfs file from a wider firmware counter (a
        16-bit port_rcv_errors seen stuck at 4294967295). A value above the spec maximum that
        is not all ones is such a wider counter still counting, not a saturated one."""
        w = self.widths.get(counter)
        if w is None or value < (1 << w) - 1:  # below the narrowest maximum: counting (the usual case)
            return None
        for width in (w, *(x for x in _WIDER_BITS if x > w)):
            if value == float((1 << width) - 1):
                return width
        return None

    def saturated(self, counter: str, value: float) -> bool:
        return self.saturated_width(counter, value) is not None

    def how_to_clear(self, link_layer: str | None, device: str, port: str) -> str:
        text = self.clear.get(link_layer or "InfiniBand") or self.clear.get("InfiniBand", "")
        return text.format(device=device, port=port)


def _section(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    v = doc.get(key)
    if not isinstance(v, Mapping):
        raise CountersError(f"{_SRC}: {key}: expected a mapping")
    return v


def parse(doc: Any) -> CounterMeanings:
    if not isinstance(doc, Mapping):
        raise CountersError(f"{_SRC}: expected a mapping at the top")
    unknown = sorted(set(doc) - {"error_counters", "other_counters", "rising", "substitutes", "clear"})
    if unknown:
        raise CountersError(f"{_SRC}: {unknown[0]}: unknown key")
    widths: dict[str, int] = {}
    for section in ("error_counters", "other_counters"):
        for k, v in _section(doc, section).items():
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
                raise CountersError(f"{_SRC}: {section}.{k}: expected a width in bits (1-64), got {v!r}")
            widths[str(k)] = v
    rising: dict[str, str | None] = {}
    for k, v in _section(doc, "rising").items():
        if not isinstance(v, str) or not v:
            raise CountersError(f"{_SRC}: rising.{k}: expected `any` or a threshold key, got {v!r}")
        rising[str(k)] = None if v == "any" else v
    subs: dict[str, float] = {}
    for k, v in _section(doc, "substitutes").items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise CountersError(f"{_SRC}: substitutes.{k}: expected a rate per hour > 0, got {v!r}")
        subs[str(k)] = float(v)
    clear = {str(k): str(v) for k, v in _section(doc, "clear").items()}
    return CounterMeanings(widths, frozenset(map(str, _section(doc, "error_counters"))), rising, subs, clear)


@lru_cache(maxsize=1)
def load() -> CounterMeanings:
    text = resources.files("podhealth.checks.data").joinpath("ib_counters.yaml").read_text(encoding="utf-8")
    return parse(yamldata.load(text))
