"""Request bodies built to cost the decoder (core/bodycoding.py) more than their size, and a
Content-Encoding sent in several fields.

Many gzip members: zlib hands back what follows a member's end as a copy (unused_data), so a body
fed whole was copied again once per member; 1 MB of 20-byte empty members took most of a second
of the event loop. The copies are counted here through a wrapped zlib.decompressobj (a count,
not a clock, so the test does not depend on the machine's load).
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import pytest

from podhealth import bodycoding
from podhealth.config_aggregator import AggAuthConfig
from tests.harness.agg import MemFencer, config, running
from tests.unit.test_aggregator_http_body import REPORT, exchange, head, status_and_body

pytestmark = pytest.mark.timeout(60)
EMPTY_MEMBER = gzip.compress(b"")  # 20 bytes that decode to nothing


class _Counting:
    """zlib.decompressobj that adds up the bytes it copied into unused_data."""

    copied = 0

    def __init__(self, wbits: int) -> None:
        self._d = _REAL(wbits)

    def decompress(self, data: Any, max_length: int = 0) -> bytes:
        out = self._d.decompress(data, max_length)
        _Counting.copied += len(self._d.unused_data)
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self._d, name)


_REAL = zlib.decompressobj


def test_a_member_after_many_costs_its_own_size_not_the_rest_of_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    body = json.dumps({"pad": "x" * 600_000}).encode()
    raw = EMPTY_MEMBER * (bodycoding.MAX_MEMBERS - 1) + gzip.compress(body, 0)  # stored: ~600 KB on the wire
    monkeypatch.setattr(zlib, "decompressobj", _Counting)
    _Counting.copied = 0
    assert bodycoding.decode(raw, "gzip", 1 << 20) == body
    # Fed whole, each of the 999 empty members copied the ~600 KB after it (~600 MB).
    assert _Counting.copied < 2 * len(raw), _Counting.copied


def test_thousands_of_empty_gzip_members_are_a_400() -> None:
    raw = EMPTY_MEMBER * (1_000_000 // len(EMPTY_MEMBER))
    with pytest.raises(bodycoding.BodyError) as e:
        bodycoding.decode(raw, "gzip", 1 << 20)
    assert e.value.status == 400 and f"more than {bodycoding.MAX_MEMBERS} gzip members" in e.value.message
    two = gzip.compress(b'{"a": ') + gzip.compress(b"1}")  # a few members are still one body
    assert bodycoding.decode(two, "gzip", 1 << 20) == b'{"a": 1}'


def test_a_bomb_still_stops_one_byte_past_the_limit_in_pieces() -> None:
    for coding, raw in (("gzip", gzip.compress(b"\0" * (32 << 20))), ("deflate", zlib.compress(b"\0" * (32 << 20)))):
        with pytest.raises(bodycoding.BodyError) as e:
            bodycoding.decode(raw, coding, 64 * 1024)
        assert e.value.status == 413, coding
    with pytest.raises(bodycoding.BodyError) as e:
        bodycoding.decode(gzip.compress(b"{}" * 1000)[:-30], "gzip", 1 << 20)
    assert e.value.status == 400 and "ends early" in e.value.message


def test_several_content_encoding_fields_are_one_list() -> None:
    assert bodycoding.header_of([]) is None
    assert bodycoding.header_of(["gzip"]) == "gzip"
    assert bodycoding.header_of(["gzip", "gzip"]) == "gzip, gzip"
    assert bodycoding.unsupported(bodycoding.header_of(["gzip", "gzip"])) is not None


async def test_the_aggregator_refuses_a_body_encoded_in_two_fields_with_a_415(tmp_path: Path) -> None:
    """Read as its first field only, a body gzipped twice was decoded once and a proxy that reads
    both fields disagreed with the aggregator about what the body is."""
    auth = AggAuthConfig(node_tokens={"dgx01": "n1tok"}, admin_token="atok")
    async with running(config(tmp_path, auth=auth), [MemFencer()]) as (agg, url):
        data = gzip.compress(json.dumps(REPORT).encode())
        answer = await exchange(url, head("/v1/reports", "n1tok", "Content-Encoding: gzip\r\nContent-Encoding: gzip\r\n"
                                                                  f"Content-Length: {len(data)}\r\n") + data)
        status, out = status_and_body(answer)
        assert status == 415 and "'gzip, gzip' is not supported" in str(out), out
        assert "dgx01" not in agg.mem.nodes or agg.mem.nodes["dgx01"].report_time == 0
