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


# ---- the typed path (msgspec) and the general path (orjson + _verdicts) agree ------------------

from hypothesis import given, settings  # noqa: E402 - kept beside the tests that use it
from hypothesis import strategies as st  # noqa: E402


def general(raw: bytes) -> ingest.ParsedReport | ingest.Lease:
    """read_posted without its typed fast path: what every body must read as."""
    obj = ingest.loads(raw)
    if isinstance(obj, dict) and "digest" in obj and "results" not in obj:
        return ingest.parse_lease(obj)
    return ingest.parse_report(obj, raw, "report")


def outcome(read: Any, raw: bytes) -> Any:
    try:
        got = read(raw)
    except ingest.BadRequest:
        return "refused"
    if isinstance(got, ingest.Lease):
        return got
    return (got.node, got.time, got.verdicts, got.fp, got.order, got.raw)


# Values of every JSON type, near the edges the checks draw (lengths 0/1/128/129, seq bounds,
# non-printable and non-ASCII text), for each field the two paths read.
_text = st.sampled_from(["", "x", "node", "dgx01", "dgx-01.a", "a b", "all", "dgx[1-2]", "é", "\u0007", "x" * 128,
                         "x" * 129, "0123456789abcdef", "0123456789ABCDEF", "OK", "WARN", "FAIL", "UNKNOWN", "BROKEN",
                         "NONE", "REBOOT", "DRAIN", "ok"])
_number = st.one_of(st.integers(-2, 2), st.sampled_from([0.5, 1e300, -1e300, 2**63 - 1, 2**63, 10**30, 1700000000.25]))
_any = st.one_of(st.none(), st.booleans(), _text, _number, st.just([]), st.just({}))


_good_result = st.fixed_dictionaries(
    {"check": st.sampled_from(["xid", "ecc", "x" * 128]), "status": st.sampled_from(["OK", "WARN", "FAIL", "UNKNOWN"])},
    optional={"entity": st.sampled_from(["gpu0", "", "mlx5_0/1"]), "action": st.sampled_from(["NONE", "REBOOT"]),
              "since": st.sampled_from([0, 5.5, 1700000000.25]), "summary": st.sampled_from(["", "XID 79", "é" * 600]),
              "evidence": st.just({"gpu_c": "41.0"})})
_good = st.fixed_dictionaries(
    {"node": st.sampled_from(["dgx01", "dgx-01.a"]), "time": st.sampled_from([1.5, 7, 1700000000.25])},
    optional={"results": st.lists(_good_result, max_size=4), "digest": st.just("0123456789abcdef"),
              "boot_id": st.just("boot-1"), "seq": st.sampled_from([0, 7, 2**63 - 1]),
              "staleness": st.just({"nvml": 0.4})})
# A field: (top level or the first result, key, what to do: a value of any type, or None to drop it)
_change = st.tuples(st.booleans(), st.sampled_from(["node", "time", "results", "digest", "boot_id", "seq", "check",
                                                    "status", "entity", "action", "since", "summary", "evidence"]),
                    st.one_of(st.none(), _any))


@st.composite
def _body(draw: Any) -> dict[str, Any]:
    """A well-formed report or lease with up to three fields changed or dropped."""
    doc = draw(_good)
    for in_result, key, value in draw(st.lists(_change, max_size=3)):
        results = doc.get("results")
        first = results[0] if isinstance(results, list) and results else None
        target = first if in_result and isinstance(first, dict) else doc
        if value is None:
            target.pop(key, None)
        else:
            target[key] = value
    return doc


@settings(max_examples=600, deadline=None)
@given(_body())
def test_the_typed_path_reads_every_body_as_the_general_path(doc: dict[str, Any]) -> None:
    raw = json.dumps(doc).encode()
    assert outcome(ingest.read_posted, raw) == outcome(general, raw)


@pytest.mark.parametrize("raw", [
    b'{"node": "dgx01", "time": 1e999, "results": []}',  # out of float range: not a finite number
    b'{"node": "dgx01", "time": 1, "results": [{"check": "x", "status": "OK", "since": true}]}',
    b'{"node": "dgx01", "time": 1, "boot_id": "b", "seq": 1.0, "results": []}',
    b'{"node": "dgx01", "time": 1, "digest": null}',
    b'{"node": "dgx01", "time": 1, "results": null, "digest": "0123456789abcdef"}',
    b'{"node": "dgx\\ud800", "time": 1, "results": []}',  # a lone surrogate is not UTF-8 text
    # bytes that are not UTF-8 in a field the typed path skips (it would be stored and served)
    b'{"node": "dgx01", "time": 1, "profile": "\xff\xfe", "results": []}',
    b'{"node": "dgx01", "time": 1, "agent_version": "\xc3", "digest": "0123456789abcdef"}',
    b'{"node": "dgx01", "time": 1, "profile": "caf\xc3\xa9", "results": []}',  # real UTF-8: taken
    # nesting past msgspec's recursion limit (a RecursionError, not a 500)
    b'{"node": "dgx01", "time": 1, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "results": []}',
])
def test_edge_bodies_read_the_same_both_ways(raw: bytes) -> None:
    assert outcome(ingest.read_posted, raw) == outcome(general, raw)


def test_an_event_kind_is_a_short_name() -> None:
    def batch(kind: str) -> dict[str, Any]:
        return {"node": "dgx01", "events": [{"id": "e1", "type": "event", "time": 1.0,
                                             "event": {"kind": kind, "code": 79}}]}
    for bad in ("x" * 129, ""):
        with pytest.raises(ingest.BadRequest, match="kind"):
            ingest.parse_events(batch(bad))
    assert len(ingest.parse_events(batch("xid")).events) == 1
