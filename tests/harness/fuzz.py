"""Hypothesis strategies that turn real-format samples into hostile input for the parsers.

Random text almost never gets past a parser's first check, so the fuzz suite starts from the
project's own fixtures (tests/fixtures, written in the formats of the real captures) and mutates
them the way outside input goes wrong: cut short, bytes flipped, lines spliced, numbers replaced
by huge / negative / non-ASCII-digit / non-finite ones, NULs and odd unicode inserted. JSON and
YAML also get structure-aware mutations (a value anywhere replaced by a value of another type),
because their validators reject malformed text long before the interesting code runs.

Settings: a small, derandomized run in the unit suite (reproducible in CI); scripts/fuzz.sh sets
PODHEALTH_FUZZ_EXAMPLES (and passes --hypothesis-seed) for a long, random one.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# Numbers that have broken parsers elsewhere: > 4,300 digits (CPython's int() limit), > 2**64,
# > float range, signs, leading zeros (int(x, 0) refuses them), other bases, non-ASCII digits
# that str.isdigit() and regex \d accept, and the float words.
HOSTILE_NUMBERS = (
    "", "0", "-1", "-0", "+7", "007", "0123", "0x1f", "0xZZ", "1.5", "1e999", "-1e999", "nan", "inf", "-inf",
    "18446744073709551616", "340282366920938463463374607431768211456", "9" * 400, "9" * 5000,
    "\u00b2", "\u0663\u0664", "\U0001d7d7", "1_000", "\uff11\uff12",
)
HOSTILE_SNIPPETS = (
    "\x00", "\ufeff", "\u202e", "\r", "\n", "\t", " ", ":", ",", "=", "(", ")", "[", "]", "{", "}", "|", "#",
    "'", '"', "\\", "\u00e9", "\U0001f4a5", "\udcff", "\x1b[31m", "N/A", "-", "+", "0x", ".", "%s", "${x}",
)
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def examples(default: int) -> int:
    """How many examples each fuzz test runs: small in the unit suite, PODHEALTH_FUZZ_EXAMPLES in
    the long run."""
    return int(os.environ.get("PODHEALTH_FUZZ_EXAMPLES", default))


def fuzz_settings(default: int = 60) -> settings:
    long_run = "PODHEALTH_FUZZ_EXAMPLES" in os.environ
    return settings(
        max_examples=examples(default),
        deadline=None,  # a shared CI machine is slow at random; speed is bench/'s business
        derandomize=not long_run,  # the unit suite draws the same examples every run
        database=None,  # nothing written under the working tree
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
        print_blob=True,
    )


def read(*parts: str) -> str:
    return (FIXTURES.joinpath(*parts)).read_text(encoding="utf-8", errors="surrogateescape")


# ---- text mutations ----------------------------------------------------------------------------


def _truncate(draw: Any, s: str) -> str:
    return s[: draw(st.integers(0, len(s)))]


def _delete(draw: Any, s: str) -> str:
    i = draw(st.integers(0, len(s)))
    return s[:i] + s[i + draw(st.integers(1, 64)):]


def _duplicate(draw: Any, s: str) -> str:
    i = draw(st.integers(0, len(s)))
    j = min(len(s), i + draw(st.integers(1, 200)))
    return s[:j] + s[i:j] * draw(st.integers(1, 3)) + s[j:]


def _insert(draw: Any, s: str) -> str:
    i = draw(st.integers(0, len(s)))
    piece = draw(st.one_of(st.sampled_from(HOSTILE_SNIPPETS), st.sampled_from(HOSTILE_NUMBERS), st.text(max_size=8)))
    return s[:i] + piece + s[i:]


def _flip(draw: Any, s: str) -> str:
    if not s:
        return s
    i = draw(st.integers(0, len(s) - 1))
    return s[:i] + draw(st.characters()) + s[i + 1:]


def _number(draw: Any, s: str) -> str:
    """Replace a few numbers of the sample: the mutation that reaches int()/float() calls. Several
    at once, because a line's interesting number (an Xid code, a pid) is one among many."""
    spans = [m.span() for m in _NUMBER.finditer(s)]
    if not spans:
        return s
    picked = sorted(set(draw(st.lists(st.sampled_from(spans), min_size=1, max_size=8))), reverse=True)
    for a, b in picked:  # from the end, so earlier spans stay where they were
        s = s[:a] + draw(st.sampled_from(HOSTILE_NUMBERS)) + s[b:]
    return s


def _swap_lines(draw: Any, s: str) -> str:
    lines = s.split("\n")
    if len(lines) < 2:
        return s
    i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
    lines[i] = lines[j]
    return "\n".join(lines)


_MUTATIONS: tuple[Callable[[Any, str], str], ...] = (
    _truncate, _delete, _duplicate, _insert, _flip, _number, _number, _number, _swap_lines)


@st.composite
def mutated(draw: Any, samples: Sequence[str], max_mutations: int = 6) -> str:
    """A sample with a few mutations; sometimes the sample itself (it must parse as well)."""
    s = draw(st.sampled_from(list(samples)))
    for _ in range(draw(st.integers(0, max_mutations))):
        s = draw(st.sampled_from(_MUTATIONS))(draw, s)
    return s


def texts(samples: Sequence[str]) -> st.SearchStrategy[str]:
    """Mostly mutated samples, some unrelated text."""
    return st.one_of(mutated(samples), mutated(samples), mutated(samples), st.text(max_size=300))


# ---- structure-aware JSON / YAML mutations -----------------------------------------------------

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=2**63 - 2, max_value=2**64 + 2),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from(HOSTILE_NUMBERS), st.sampled_from(HOSTILE_SNIPPETS), st.text(min_size=100, max_size=400),
)
json_values = st.recursive(
    _scalars, lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(st.text(max_size=10), kids, max_size=4)),
    max_leaves=12)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, prefix + (i,))
    return out


def _replace(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(obj, dict):
        return {k: (_replace(v, rest, value) if k == head else v) for k, v in obj.items()}
    return [(_replace(v, rest, value) if i == head else v) for i, v in enumerate(obj)]


def _drop(obj: Any, path: tuple[Any, ...]) -> Any:
    if not path:
        return obj
    head, rest = path[0], path[1:]
    if not rest:
        if isinstance(obj, dict):
            return {k: v for k, v in obj.items() if k != head}
        return [v for i, v in enumerate(obj) if i != head]
    if isinstance(obj, dict):
        return {k: (_drop(v, rest) if k == head else v) for k, v in obj.items()}
    return [(_drop(v, rest) if i == head else v) for i, v in enumerate(obj)]


@st.composite
def mutated_doc(draw: Any, docs: Sequence[Any], max_mutations: int = 3) -> Any:
    """A JSON-like document with values replaced (by any type) or keys dropped."""
    doc = draw(st.sampled_from(list(docs)))
    for _ in range(draw(st.integers(0, max_mutations))):
        path = draw(st.sampled_from(_paths(doc)))
        if path and draw(st.booleans()) and draw(st.booleans()):
            doc = _drop(doc, path)
        else:
            doc = _replace(doc, path, draw(json_values))
    return doc


def dumps_loose(obj: Any) -> bytes:
    """JSON as a careless or hostile client writes it: NaN/Infinity allowed, lone surrogates kept."""
    return json.dumps(obj, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def json_bodies(draw: Any, docs: Sequence[Any]) -> bytes:
    """Request bodies: a structurally mutated document, or a mutated serialisation of one."""
    doc = draw(mutated_doc(docs))
    raw = dumps_loose(doc)
    if draw(st.integers(0, 3)) == 0:
        raw = draw(mutated([raw.decode("utf-8", "surrogatepass")])).encode("utf-8", "surrogatepass")
    if draw(st.integers(0, 15)) == 0:
        raw = b"[" * draw(st.integers(1, 200_000)) + raw  # deep nesting
    return raw
