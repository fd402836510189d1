#!/usr/bin/env python3
"""What reading one report costs at best, against the budget issue 20's target leaves (prints figures).

    .venv/bin/python bench/decode_budget.py [--floor-us 65] [--number 20000]

Issue 20 target 3 asks the aggregator's CPU per report to be at most 1.2x that of an empty
aiohttp handler under the same load, so the aggregator's own work per report (authenticate,
decode, judge, store, answer) must fit in 0.2x the peer's per-request CPU. `--floor-us` is that
peer's figure from `aggregator_scale.py` on the same machine (62-70 us at 10,000 nodes on the
2-core machine of bench/README.md). This script times, in a warm loop (the best case: the bench
under load measures each step 3-5x slower, caches cold between requests), the steps no
implementation of POST /v1/reports can skip and still refuse bad input with a clear error:
checking the body is JSON at all, decoding the fields a verdict needs, and podhealth's whole
read of the body (`ingest.read_posted`), for a lease and for a healthy DGX H100's full report
(the same ~16 KB bodies `aggregator_scale.py` sends).
"""

from __future__ import annotations

import sys as _sys
from pathlib import Path as _Path

_sys.path.insert(0, str(_Path(__file__).resolve().parent))
import projectenv  # noqa: E402

projectenv.require()  # before anything that needs the project's packages

import argparse
import sys
import timeit
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

import msgspec  # noqa: E402
import orjson  # noqa: E402

from benchlib import ReportFactory  # noqa: E402
from podhealth.aggregator import ingest  # noqa: E402


def per_call_us(fn: Callable[[], Any], number: int) -> float:
    """The best of 5 repeats (the others met the machine's other load), in microseconds."""
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--floor-us", type=float, default=65.0,
                    help="the empty aiohttp handler's CPU per request from aggregator_scale.py (default 65)")
    ap.add_argument("--number", type=int, default=20000, help="calls per repeat")
    args = ap.parse_args()
    budget = 0.2 * args.floor_us
    head, tail = ReportFactory().healthy_parts("dgx00001")
    full = head + b"1764633600.5" + tail
    lease = (b'{"node":"dgx00001","time":1764633600.5,"digest":"0123456789abcdef",'
             b'"boot_id":"6f1c2a9e-0d3b-4c55-9e0a-2b7d1f4c8a11","seq":4711}')
    assert ingest.read_posted(full).node == ingest.read_posted(lease).node == "dgx00001"
    print(f"budget for all of podhealth's own work per report at 1.2x a {args.floor_us:.0f} us floor: "
          f"{budget:.1f} us")
    print(f"{'step (warm loop, best case)':48s} {'lease':>9s} {'full':>9s}")
    print(f"{'  body size':48s} {len(lease):7d} B {len(full):7d} B")
    rows: list[tuple[str, Callable[[bytes], Any]]] = [
        ("is it JSON (msgspec, no objects built)", lambda b: msgspec.json.decode(b, type=msgspec.Raw)),
        ("generic JSON decode (orjson)", orjson.loads),
        ("typed decode of the fields used (msgspec)", ingest._decode_posted),
        ("podhealth's whole read (ingest.read_posted)", ingest.read_posted),
    ]
    for name, fn in rows:
        lu = per_call_us(lambda: fn(lease), args.number)
        fu = per_call_us(lambda: fn(full), max(1, args.number // 10))
        flag = "  > budget" if fu > budget else ""
        print(f"  {name:46s} {lu:6.1f} us {fu:6.1f} us{flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
