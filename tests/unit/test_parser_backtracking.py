"""A long hostile line costs a parser time in proportion to its length, never its square.

Each line here is 64 KiB of near-matches for one pattern (an "Xid (" with no ")", a detail of
spaces before no severity, a dcgmi border of spaces, a warning of "bandwidth " with no verdict).
Before the patterns were bounded each took from 0.2 s to a minute (the NVLink5 detail of 64 K
spaces: 62 s); now each takes a few milliseconds, so the bound below has a margin of ten and
still fails the quadratic forms by far. It is this thread's CPU time, not the wall clock: a
loaded CI machine that preempts the test does not count against the parser. The results are checked too: a
bounded pattern must still read what the driver and dcgmi really print.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from podhealth.checks.active import dcgm
from podhealth.collectors import xid_parse

pytestmark = pytest.mark.timeout(120)
N = 64 * 1024
BOUND_S = 0.1


def _rep(s: str, n: int = N) -> str:
    return (s * (n // len(s) + 1))[:n]


def _timed(fn: Callable[[], Any]) -> Any:
    t0 = time.thread_time()
    out = fn()
    took = time.thread_time() - t0
    assert took < BOUND_S, f"{took:.3f}s of CPU for a {N}-character line"
    return out


@pytest.mark.parametrize("line", [_rep("Xid ("), _rep("NVRM: Xid ("), _rep("SXid ("),
                                  _rep("nvidia-nvswitch0: SXid (")])
def test_xid_markers_without_a_closing_parenthesis(line: str) -> None:
    assert _timed(lambda: xid_parse.parse(line)) is None
    assert _timed(lambda: xid_parse.is_candidate(line)) is False


def test_an_nvlink5_detail_of_spaces() -> None:
    line = "NVRM: Xid (PCI:0000:01:00): 144, pid=1, name=x, a" + " " * N + "b"
    p = _timed(lambda: xid_parse.parse(line))
    assert isinstance(p, xid_parse.ParsedLine) and p.code == 144 and p.nvlink5 is None
    real = "NETIR_LINK_EVT  Fatal XC0 i0 Link 33 (0x00000004 0x00000000 0x00000000 0x00000000)"
    nv5 = xid_parse.parse_nvlink5(real)
    assert nv5 is not None and nv5.unit == "NETIR_LINK_EVT" and nv5.fatal and nv5.link == 33


def test_a_recovery_detail_of_open_parentheses() -> None:
    assert _timed(lambda: xid_parse.parse_recovery(_rep("recovery action changed from 0x1 ("))) is None
    rec = xid_parse.parse_recovery("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)")
    assert rec is not None and (rec.from_value, rec.to_value, rec.to_name) == (0, 2, "Node Reboot Required")


def test_a_dcgmi_border_of_spaces() -> None:
    text = "|- x" + " " * N + "x\n| Diagnostic | Result |\n"
    _timed(lambda: dcgm.parse_text(text))
    assert dcgm._section("|-----  Metadata  ----------+------------------------------------------------|") == "Metadata"
    assert dcgm._section("+-----  Per GPU Tests  ---+--+") == "Per GPU Tests"
    assert dcgm._section("+---------------------------+") is None


@pytest.mark.parametrize("text", [_rep("bandwidth "), _rep("ECC "), _rep("nvlink "),
                                  _rep("memory copy utilization for the GPU ")])
def test_a_warning_of_near_matches_for_the_data_files_patterns(text: str) -> None:
    emap = dcgm.error_map()
    w = dcgm.DiagWarning(text)
    _timed(lambda: (emap.classify(w), emap.inconclusive_warning("", w)))
    found = emap.classify(dcgm.DiagWarning("GPU 0: " + "x" * 1000 + " ECC is disabled"))
    assert found[0] == "DCGM_FR_ECC_DISABLED"
