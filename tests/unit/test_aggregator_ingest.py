"""ingest.read_report: the same answer and the same errors as parse_report(loads(body)), cheaper
when a node's results text is the one it sent last time (its memo)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from podhealth.aggregator import ingest
from podhealth.vocab import Status


def results(xid: str = "OK") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"check": c, "entity": f"gpu{g}", "status": "OK", "action": "NONE", "since": 0.0,
                                  "summary": "", "evidence": {"uuid": f"GPU-{g}"}}
                                 for g in range(8) for c in ("gpu_ecc", "xid")]
    out[1].update(status=xid, action="REBOOT" if xid != "OK" else "NONE", summary="XID 79")
    return out


def body(node: str = "dgx01", t: float = 100.0, res: Any = None, **extra: Any) -> bytes:
    doc = {"node": node, "agent_version": "0.1", "profile": "dgx-h100", "time": t, "staleness": {"nvml": 0.4},
           "results": results() if res is None else res, **extra}
    return json.dumps(doc, separators=(",", ":")).encode()


def plain(raw: bytes, node: str | None = None) -> ingest.ParsedReport:
    obj = ingest.loads(raw)
    if node is not None and isinstance(obj, dict):
        obj = {**obj, "node": node}
    return ingest.parse_report(obj, raw.decode("utf-8"))


def text(raw: str | bytes) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else raw


def same(a: ingest.ParsedReport, b: ingest.ParsedReport) -> None:
    assert (a.node, a.time, a.verdicts, text(a.raw), a.fp) == (b.node, b.time, b.verdicts, text(b.raw), b.fp)


def learn(raw: bytes, memos: dict[str, ingest.ResultsMemo]) -> ingest.ParsedReport:
    rep = ingest.read_report(raw, memos)
    assert rep.memo is not None
    memos[rep.node] = rep.memo
    return rep


@pytest.mark.parametrize("raw", [
    body(), body(res=results("FAIL")), body(res=[]), b'{"results": [], "time": 5, "node": "dgx02"}',
    b' \n{ "node" : "dgx01" , "time" : 1e2 , "results" : [ ] } \r\n',
    json.dumps({"node": "dgx01", "time": 1, "results": results("WARN")}, indent=2).encode(),
    b'{"node": "dgx01", "time": 1, "results": [], "results": [{"check": "x", "status": "FAIL", "action": "DRAIN"}]}',
    b'{"node": "dgx09", "time": 1, "results": [], "node": "dgx01"}',
    '{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "WARN", "summary": "caf\u00e9 \\u2603"}]}'.encode(),
])
def test_same_as_the_plain_parse(raw: bytes) -> None:
    memos: dict[str, ingest.ResultsMemo] = {}
    same(ingest.read_report(raw, memos), plain(raw))
    learn(raw, memos)
    same(ingest.read_report(raw, memos), plain(raw))  # through the memo this time
    same(ingest.read_report(raw, memos, node="dgx42"), plain(raw, "dgx42"))


@pytest.mark.parametrize("raw", [
    b'{"node": "dgx01", "results": [', b"\xff\xfe", b"[]", b"", b"nul", b'{"node": "dgx01"} x',
    b'{"results": []}', b'{"node": "dgx01", "time": 1, "results": {}}', b'{"node": "dgx01;rm", "time": 1, "results": []}',
    b'{"node": "dgx01", "time": "soon", "results": []}', b'{"node": "dgx01", "time": NaN, "results": []}',
    b'{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "BROKEN"}]}',
    b'{"node": "dgx01", "time": 1, "results": [], }', b'{"node" "dgx01"}', b'{node: 1}',
    b'\xef\xbb\xbf{"node": "dgx01", "time": 1, "results": []}', '{"node": "dgx01"}'.encode("utf-16"),
])
def test_same_errors_as_the_plain_parse(raw: bytes) -> None:
    try:
        want: Any = plain(raw)
    except (ingest.BadRequest, UnicodeDecodeError) as e:
        want = (type(e), str(e))
    try:
        got: Any = ingest.read_report(raw, {})
    except (ingest.BadRequest, UnicodeDecodeError) as e:
        got = (type(e), str(e))
    if isinstance(want, ingest.ParsedReport):
        same(got, want)
    else:
        assert got == want


def test_an_unchanged_report_reuses_the_memo_and_a_changed_one_does_not() -> None:
    memos: dict[str, ingest.ResultsMemo] = {}
    first = learn(body(t=1), memos)
    again = ingest.read_report(body(t=2), memos)
    assert again.memo is first.memo and again.time == 2 and again.fp == first.fp
    failing = ingest.read_report(body(t=3, res=results("FAIL")), memos)
    assert failing.memo is not first.memo and failing.fp != first.fp
    assert [v.status for v in failing.verdicts] == [Status.FAIL]
    # same length, one byte different: not mistaken for the remembered text
    flipped = body(t=4).replace(b'"GPU-7"', b'"GPU-8"')
    assert len(flipped) == len(body(t=4))
    assert ingest.read_report(flipped, memos).memo is not first.memo
    # another node's memo is not consulted for this node
    assert ingest.read_report(body("dgx02", t=5), memos).memo is not first.memo


def test_a_remembered_prefix_followed_by_more_is_still_checked() -> None:
    memos: dict[str, ingest.ResultsMemo] = {}
    learn(b'{"node": "dgx01", "time": 1, "results": []}', memos)
    with pytest.raises(ingest.BadRequest, match="not JSON"):
        ingest.read_report(b'{"node": "dgx01", "time": 2, "results": []]}', memos)
    rep = ingest.read_report(b'{"node": "dgx01", "time": 2, "results": [], "extra": [1, 2]}', memos)
    assert rep.time == 2 and rep.verdicts == ()
