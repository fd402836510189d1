"""The benchmarks start podhealth's own processes as `sys.executable -m podhealth`, so they must run
with the project's environment (`.venv/bin/python bench/X.py`, as README says for `podhealth`
itself). Run with another interpreter they used to wait 90 s for an agent that could never start
and end in a traceback; `require()` says so at once instead."""

from __future__ import annotations

import sys


def require() -> None:
    try:
        import aiohttp  # noqa: F401
        import podhealth  # noqa: F401
        import structlog  # noqa: F401
        import yaml  # noqa: F401
    except ImportError as e:
        sys.exit(f"{sys.argv[0]}: {e.name} is not importable from {sys.executable}: run the benchmarks with the "
                 f"project's environment, `.venv/bin/python {sys.argv[0]}` (bash scripts/setup.sh --test makes it)")
