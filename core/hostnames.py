"""Slurm node names and hostlist expressions (`dgx[01-04,07]`), parsed without Slurm.

Node names reach `scontrol` argv and the Kubernetes API, so every name is validated here before
any command is built. The one thing a name must never contain is hostlist syntax: a "name" like
`dgx[01-99]` handed to `scontrol update NodeName=` would drain 99 nodes, not one.

Expansion follows Slurm 22.05's `scontrol show hostnames` (checked against it in
tests/unit/test_hostnames.py): the zero-padding width of a range is the length of its lower bound
(`[01-3]` -> 01,02,03; `[1-010]` -> 1..10), several bracket groups in one host form a cartesian
product (`a[1-2]b[1-2]`), and text after the last bracket is an error in 22.05. Unlike Slurm we
drop duplicates (keeping first-seen order) and cap the expansion size, because the callers (the
aggregator, `podhealth nccl --nodes`) want a set of nodes and must not allocate a billion names
for a typo like `dgx[0-999999999]`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MAX_NAME_LEN = 63  # one DNS label; Slurm itself allows more, but these names also become hostnames
DEFAULT_MAX_HOSTS = 65536

# Letters, digits, '-', '_' and '.', starting and ending with a letter or digit. Quotes, '=',
# spaces, brackets and commas would change the meaning of an scontrol argument.
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")
# Names scontrol/slurm.conf treat as keywords rather than nodes.
_RESERVED = frozenset({"all", "default"})
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TRAILING_DIGITS = re.compile(r"(.*?)([0-9]+)")


_RULE = 'letters, digits, ".", "_", "-"; at most 63'


def _shown(name: str) -> str:
    """The name as an error message quotes it: control characters escaped, long names cut."""
    cut = name[:80] + ("..." if len(name) > 80 else "")
    return f'"{cut}"' if cut.isprintable() else repr(cut)


def node_name_problem(name: object) -> str | None:
    """Why `name` is not one safe node name, or None. THE node-name rule of podhealth: config
    (`nodes`, `opt_out`, `node.name`, `node_tokens`), ingest and the agent API, `podhealth token`,
    the fencers, the NCCL pair tests and the simulator all ask here, so a node the aggregator
    accepts a report from is always one its fencers can fence (a name like `dgx-` or `all` used to
    pass ingest and then be refused by the Slurm fencer, the node unfenceable forever)."""
    if not isinstance(name, str):
        return f"expected a node name, got {type(name).__name__}: a node name must be a string"
    if not name:
        return "expected a node name, got an empty string"
    if len(name) > MAX_NAME_LEN:
        return (f"expected a node name ({_RULE}), got {_shown(name)}: {len(name)} characters, "
                f"the limit is {MAX_NAME_LEN}")
    if any(c in name for c in "[],"):
        return f"expected one node name, got {_shown(name)}: a hostlist expression, not one node (expand it first)"
    if not _NAME.fullmatch(name):
        bad = "".join(sorted({c for c in name if not (c.isascii() and (c.isalnum() or c in "._-"))}))
        why = f"contains {bad!r}" if bad else "must start and end with a letter or digit"
        return f"expected a node name ({_RULE}), got {_shown(name)}: not a valid Slurm node name, {why}"
    if name.lower() in _RESERVED:
        return f"expected a node name, got {_shown(name)}: a Slurm keyword, not a node"
    return None


def validate_node_name(name: str) -> str:
    """Return `name` if it is a safe single Slurm node name, else raise ValueError saying why."""
    problem = node_name_problem(name)
    if problem:
        raise ValueError(problem)
    return name


def is_valid_node_name(name: str) -> bool:
    return node_name_problem(name) is None


def _split_top_level(expr: str) -> list[str]:
    """Split on commas/whitespace that are outside brackets."""
    items: list[str] = []
    depth = 0
    cur: list[str] = []
    for i, c in enumerate(expr):
        if c == "[":
            if depth:
                raise ValueError(f"hostlist {expr!r}: nested '[' at position {i}")
            depth = 1
        elif c == "]":
            if not depth:
                raise ValueError(f"hostlist {expr!r}: ']' without '[' at position {i}")
            depth = 0
        elif depth == 0 and (c == "," or c.isspace()):
            if cur:
                items.append("".join(cur))
            cur = []
            continue
        cur.append(c)
    if depth:
        raise ValueError(f"hostlist {expr!r}: '[' is never closed")
    if cur:
        items.append("".join(cur))
    return items


def _expand_ranges(body: str, expr: str, limit: int) -> list[str]:
    """`01-04,07` -> ['01', '02', '03', '04', '07'] (widths as Slurm pads them)."""
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part.strip())
        if not m:
            raise ValueError(f"hostlist {expr!r}: invalid range {part!r} (want N or N-M with digits)")
        lo_s, hi_s = m.group(1), m.group(2)
        lo, hi = int(lo_s), int(hi_s if hi_s is not None else lo_s)
        if hi < lo:
            raise ValueError(f"hostlist {expr!r}: range {part!r} runs backwards")
        if len(out) + (hi - lo + 1) > limit:
            raise ValueError(f"hostlist {expr!r} expands to more than {limit} hosts")
        width = len(lo_s)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_item(item: str, expr: str, limit: int) -> list[str]:
    # Alternating text and bracket bodies: "a[1-2]b[3]" -> ["a", "1-2", "b", "3"]
    pieces = re.split(r"\[([^\]]*)\]", item)
    if len(pieces) == 1:
        return [item]
    if pieces[-1]:
        # Slurm 22.05 rejects `x[1-2]-y` too; accepting it would name nodes Slurm cannot.
        raise ValueError(f"hostlist {expr!r}: text {pieces[-1]!r} after the last ']' is not allowed")
    names = [""]
    for i, piece in enumerate(pieces[:-1]):
        if i % 2 == 0:
            names = [n + piece for n in names]
        else:
            nums = _expand_ranges(piece, expr, limit)
            if len(names) * len(nums) > limit:
                raise ValueError(f"hostlist {expr!r} expands to more than {limit} hosts")
            names = [n + x for n in names for x in nums]
    return names


def expand_hostlist(expr: str, limit: int = DEFAULT_MAX_HOSTS) -> tuple[str, ...]:
    """`dgx[01-02],gpu7` -> ('dgx01', 'dgx02', 'gpu7'); every name validated, duplicates dropped.

    Items may be separated by commas or whitespace. Raises ValueError naming the problem for
    unbalanced brackets, bad ranges, an empty expression, an invalid name, or more than `limit`
    hosts.
    """
    if not isinstance(expr, str):
        raise ValueError(f"hostlist must be a string, got {type(expr).__name__}")
    items = _split_top_level(expr)
    if not items:
        raise ValueError("hostlist is empty")
    seen: dict[str, None] = {}
    for item in items:
        for name in _expand_item(item, expr, limit):
            try:
                validate_node_name(name)
            except ValueError as e:
                raise ValueError(f"hostlist {expr!r}: {e}") from None
            seen.setdefault(name, None)
            if len(seen) > limit:
                raise ValueError(f"hostlist {expr!r} expands to more than {limit} hosts")
    return tuple(seen)


def compress_hostlist(names: Iterable[str]) -> str:
    """('dgx03', 'dgx01', 'dgx02', 'dgx07') -> 'dgx[01-03,07]': sorted, deduplicated, validated.

    Slurm's own `scontrol show hostlist` keeps input order; we sort so equal sets always give the
    same string (it is used in logs and reasons). A range only joins numbers whose text is the
    number padded to the range's width, so `dgx1,dgx02` stays `dgx[1,02]` and round-trips.
    """
    plain: set[str] = set()
    numbered: dict[str, set[tuple[int, str]]] = {}
    for name in names:
        validate_node_name(name)
        m = _TRAILING_DIGITS.fullmatch(name)
        if m is None:
            plain.add(name)
        else:
            numbered.setdefault(m.group(1), set()).add((int(m.group(2)), m.group(2)))
    groups: list[tuple[str, str]] = [(p, p) for p in plain]
    for prefix, nums in numbered.items():
        ordered = sorted(nums, key=lambda t: (t[0], len(t[1])))
        if len(ordered) == 1:
            groups.append((prefix, prefix + ordered[0][1]))
            continue
        ranges: list[tuple[str, str]] = []  # (lo text, hi text)
        width = 0
        last = -2
        for n, text in ordered:
            if ranges and n == last + 1 and str(n).zfill(width) == text:
                ranges[-1] = (ranges[-1][0], text)
            else:
                ranges.append((text, text))
                width = len(text)
            last = n
        body = ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
        groups.append((prefix, f"{prefix}[{body}]"))
    return ",".join(text for _, text in sorted(groups))
