"""ingest.read_report / read_posted: what a report body parses to, and every way it is refused."""

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


@pytest.mark.parametrize("raw", [
    body(), body(res=results("FAIL")), body(res=[]), b'{"results": [], "time": 5, "node": "dgx02"}',
    b' \n{ "node" : "dgx01" , "time" : 1e2 , "results" : [ ] } \r\n',
    json.dumps({"node": "dgx01", "time": 1, "results": results("WARN")}, indent=2).encode(),
    b'{"node": "dgx01", "time": 1, "results": [], "results": [{"check": "x", "status": "FAIL", "action": "DRAIN"}]}',
    '{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "WARN", "summary": "caf\u00e9 \\u2603"}]}'.encode(),
])
def test_a_report_reads_as_the_standard_library_reads_it(raw: bytes) -> None:
    want = ingest.parse_report(json.loads(raw), raw)
    for got in (ingest.read_report(raw), ingest.read_posted(raw)):
        assert isinstance(got, ingest.ParsedReport)
        assert (got.node, got.time, got.verdicts, got.fp, got.raw) == (want.node, want.time, want.verdicts, want.fp, raw)
    pulled = ingest.read_report(raw, node="dgx42")  # a pulled /health: the configured name wins
    assert (pulled.node, pulled.verdicts, pulled.fp) == ("dgx42", want.verdicts, want.fp)


def test_verdicts_and_fingerprint() -> None:
    ok, failing = ingest.read_report(body()), ingest.read_report(body(res=results("FAIL")))
    assert ok.verdicts == () and ok.fp == ingest.read_report(body(t=200)).fp
    assert [(v.check, v.entity, v.status) for v in failing.verdicts] == [("xid", "gpu0", Status.FAIL)]
    assert failing.fp != ok.fp
    # evidence is not a verdict: a report whose readings changed has the same fingerprint
    moved = results()
    moved[0]["evidence"] = {"uuid": "GPU-0", "gpu_c": "41.0"}
    assert ingest.read_report(body(res=moved)).fp == ok.fp


@pytest.mark.parametrize("raw, message", [
    (b'{"node": "dgx01", "results": [', "body is not JSON"),
    (b"\xff\xfe", "body is not JSON"),
    ('{"node": "dgx01"}'.encode("utf-16"), "body is not JSON"),  # JSON on the wire is UTF-8 (RFC 8259)
    (b'{"node": "dgx01", "time": NaN, "results": []}', "body is not JSON"),  # nor is NaN JSON
    (b'{"node": "dgx01", "time": 1, "results": [], }', "body is not JSON"),
    (b'{"node" "dgx01"}', "body is not JSON"), (b"{node: 1}", "body is not JSON"), (b"", "body is not JSON"),
    (b'{"node": "dgx01"} x', "body is not JSON"),
    (b"[]", "report: expected an object"),
    (b'{"results": []}', "report.node: expected a non-empty string"),
    (b'{"node": "dgx01", "time": 1, "results": {}}', "report.results: expected a list"),
    (b'{"node": "dgx01", "time": 1}', "report.results: expected a list"),
    (b'{"node": "dgx01;rm", "time": 1, "results": []}', "report.node:"),
    (b'{"node": "dgx01", "time": "soon", "results": []}', "report.time: expected a number"),
    (b'{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "BROKEN"}]}',
     "report.results[0].status: expected one of OK, WARN, FAIL, UNKNOWN"),
    (b'{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "OK", "action": "NUKE"}]}',
     "report.results[0].action: expected one of"),
])
def test_a_bad_report_is_refused_with_the_reason(raw: bytes, message: str) -> None:
    for read in (ingest.read_report, ingest.read_posted):
        with pytest.raises(ingest.BadRequest) as e:
            read(raw)
        assert message in str(e.value)


def test_a_lease_is_told_from_a_report() -> None:
    lease = ingest.read_posted(b'{"node": "dgx01", "time": 7.5, "digest": "0123456789abcdef", "status": "OK"}')
    assert lease == ingest.Lease("dgx01", 7.5, "0123456789abcdef")
    # results make it a report, whatever else it carries
    rep = ingest.read_posted(b'{"node": "dgx01", "time": 7.5, "digest": "0123456789abcdef", "results": []}')
    assert isinstance(rep, ingest.ParsedReport) and rep.time == 7.5
    for raw, message in [(b'{"node": "dgx01", "time": 1, "digest": "0123"}', "lease.digest: expected the 16 hex"),
                         (b'{"node": "dgx01", "time": 1, "digest": 12}', "lease.digest"),
                         (b'{"node": "dgx01", "digest": "0123456789abcdef"}', "lease.time: expected a number"),
                         (b'{"node": "a b", "time": 1, "digest": "0123456789abcdef"}', "lease.node:")]:
        with pytest.raises(ingest.BadRequest, match=message):
            ingest.read_posted(raw)
    assert ingest.digest_of(-1) == "ffffffffffffffff" and ingest.digest_of(255) == "00000000000000ff"
