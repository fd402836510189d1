"""The pieces of Prometheus text and OpenMetrics lines: family header, series prefix, value.

agent/metrics/blocks.py (the agent's renderer) builds the escaped `name{labels} ` prefix of a
series once and reuses it: between two snapshots almost every series keeps its labels and only
its value changes, so a render costs one lookup and one float formatting per series.
prometheus-client's generate_latest formats every label of every series on every call, which
made rendering the largest part of the agent's CPU per cycle. The bytes are prometheus-client's
(the tests compare them, through tests/oracles/exposition.py); names and label names are already
validated by the rules in agent/metrics/exposition.py.
"""

from __future__ import annotations

import math

from podhealth.vocab import Labels

_TEXT_TYPE = {"counter": "counter", "gauge": "gauge", "info": "gauge"}
MIN_CACHED_SERIES = 20_000


def cache_bound(live: int) -> int:
    """How many entries a render cache keyed by series (or family) may hold: 4x what is live now,
    never under MIN_CACHED_SERIES, so churning labels cannot make it grow without end."""
    return max(4 * live, MIN_CACHED_SERIES)


def _label_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def format_value(v: float) -> str:
    """A sample value as prometheus-client writes it (Prometheus parses any float syntax, but the
    golden files and the byte-for-byte test against prometheus-client want exactly this):
    Python's shortest repr, with Go's spellings of the infinities and NaN, and a positive number
    of 7 to 16 integer digits in exponent form (Go's %g switches at 1e21, repr at 1e16; the
    client library settles in between: d.ddd with trailing zeros dropped, then e+NN)."""
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if v != v:
        return "NaN"
    r = repr(v)
    if v > 0:
        whole, dot, frac = r.partition(".")
        if dot and len(whole) > 6:
            digits = (whole + frac).rstrip("0")
            mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
            return f"{mantissa}e+{len(whole) - 1:02d}"
    return r


def header(f_name: str, sample_name: str, typ: str, help_: str, unit: str, openmetrics: bool) -> str:
    """`# HELP` / `# TYPE` (/ `# UNIT`) lines of one family."""
    if openmetrics:
        if typ == "counter" and sample_name == f_name:
            # a counter sample without `_total` (another exporter's verbatim name) is no
            # OpenMetrics counter: declared unknown, which OpenMetrics allows for any sample name
            typ = "unknown"
        out = f"# HELP {f_name} {_label_value(help_)}\n# TYPE {f_name} {typ}\n"
        return out + f"# UNIT {f_name} {unit}\n" if unit else out
    text_help = help_.replace("\\", r"\\").replace("\n", r"\n")
    return f"# HELP {sample_name} {text_help}\n# TYPE {sample_name} {_TEXT_TYPE[typ]}\n"


def line_prefix(sample_name: str, labels: Labels, node: str) -> str:
    """`name{labels} ` of one series, with the constant node label added (unless it has one)."""
    d = dict(labels)
    d.setdefault("node", node)
    inner = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(d.items()))
    return f"{sample_name}{{{inner}}} "
