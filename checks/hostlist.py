"""Slurm hostlists (`dgx[01-04,07],login1`) expanded to validated node names.

Node names reach `srun -w`, so every expanded name must pass podhealth's node-name rule; bad
syntax raises ValueError naming the offending part and nothing is run.
"""

from __future__ import annotations

import itertools
import re

from podhealth.config import valid_node_name

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
MAX_HOSTS = 100_000   # a typo like dgx[1-99999999] must not allocate a huge list


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets in hostlist {text!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    parts.append("".join(cur))
    return parts


def _expand_ranges(body: str, whole: str) -> list[str]:
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"bad range {item!r} in hostlist {whole!r}")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"descending range {item!r} in hostlist {whole!r}")
        if hi - lo + 1 > MAX_HOSTS:
            raise ValueError(f"range {item!r} in hostlist {whole!r} is too large")
        width = len(lo_s) if lo_s.startswith("0") or len(lo_s) == len(hi_s) else 0
        out.extend(str(i).zfill(width) for i in range(lo, hi + 1))
    return out


def expand_hostlist(text: str) -> list[str]:
    """`dgx[01-03,07]` -> ['dgx01', 'dgx02', 'dgx03', 'dgx07'], order kept, duplicates dropped."""
    if not text or not text.strip():
        raise ValueError("empty hostlist")
    names: list[str] = []
    for part in _split_top(text.strip()):
        part = part.strip()
        if not part:
            raise ValueError(f"empty element in hostlist {text!r}")
        pieces = re.split(r"(\[[^\]]*\])", part)
        choices: list[list[str]] = []
        for p in pieces:
            if p.startswith("[") and p.endswith("]"):
                choices.append(_expand_ranges(p[1:-1], text))
            elif p:
                choices.append([p])
        count = 1
        for c in choices:
            count *= len(c)
        if count > MAX_HOSTS:
            raise ValueError(f"hostlist {text!r} expands to too many hosts")
        for combo in itertools.product(*choices):
            name = "".join(combo)
            if not valid_node_name(name):
                raise ValueError(f"invalid node name {name!r} in hostlist {text!r}")
            names.append(name)
    return list(dict.fromkeys(names))
