"""Request bodies with a Content-Encoding: which ones the agent and the aggregator decode, and how.

aiohttp decodes a request body by itself, and one it cannot decode it refuses in its own parser,
before any handler runs: `Content-Encoding: br` without the Brotli package (zstd without its
module) was a plain-text 400 from aiohttp, not the JSON error every other refusal is, and whether
br worked at all depended on what happened to be installed. And a coding it does not know (xz,
"gzip, br") it passed on undecoded, to fail as bad JSON. So both servers take bodies as sent
(RUNNER_KWARGS, through httpguard.ConnLimits.runner_kwargs and the test harness) and decode them
here: the same few codings everywhere, anything else refused with 415 naming them (RFC 9110
15.5.16), the decoded size bounded by the route's limit (a 1 KB gzip bomb inflates to 1 GB).
"""

from __future__ import annotations

import zlib
from typing import Any, Sequence

# What web.AppRunner (its web.Server and RequestHandler) takes to leave bodies as sent.
RUNNER_KWARGS: dict[str, Any] = {"auto_decompress": False}

# The codings decoded here, by the names a client may send (x-gzip: RFC 9110 8.4.1.3).
_CODINGS = {"identity": "identity", "gzip": "gzip", "x-gzip": "gzip", "deflate": "deflate"}
SUPPORTED = ("gzip", "deflate", "identity")
_GZIP_WBITS = 16 + zlib.MAX_WBITS


# The short name of each refusal (the aggregator's JSON `code` and its metrics' `result`).
_KINDS = {400: "bad_request", 408: "aborted", 413: "too_large", 415: "unsupported_encoding"}


class BodyError(ValueError):
    """A body that cannot be read or decoded: the HTTP status to answer, the reason, and a short
    name for it (by status unless given: a client that left mid-upload is a 400 "aborted")."""

    def __init__(self, status: int, message: str, kind: str = "") -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.kind = kind or _KINDS.get(status, "bad_request")


def header_of(fields: Sequence[str]) -> str | None:
    """A request's Content-Encoding from all its Content-Encoding fields (request.headers.getall):
    several fields are one list (RFC 9110 5.3), so "gzip" twice is "gzip, gzip", refused, not a
    body decoded once that its sender encoded twice. None when there is none."""
    return ", ".join(fields) if fields else None


def unsupported(header: str | None) -> str | None:
    """Why a body with this Content-Encoding header is refused (415), or None if it is decoded."""
    if header is None or _coding(header) is not None:
        return None
    shown = header if len(header) <= 40 else header[:40] + "..."
    return (f"Content-Encoding {shown!r} is not supported: send the body as one of "
            f"{', '.join(SUPPORTED)} (identity: not encoded)")


def decode(raw: bytes, header: str | None, limit: int) -> bytes:
    """The body as sent with this Content-Encoding header, decoded: at most `limit` bytes.
    BodyError: 415 for a coding not decoded here, 413 over `limit`, 400 for a body that is not
    what its coding says."""
    coding = "identity" if header is None else _coding(header)
    if coding is None:
        raise BodyError(415, unsupported(header) or "")
    if coding == "identity":
        return raw
    try:
        if coding == "gzip":
            return _inflate(raw, _GZIP_WBITS, limit, members=True)
        # "deflate" is the zlib format (RFC 9110 8.4.1.2); some clients send a bare deflate
        # stream instead: a zlib header is a CM of 8 and a multiple of 31 (RFC 1950).
        zlib_header = len(raw) >= 2 and raw[0] & 0x0F == 8 and (raw[0] << 8 | raw[1]) % 31 == 0
        return _inflate(raw, zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS, limit, members=False)
    except zlib.error as e:
        raise BodyError(400, f"body cannot be read: not valid content-encoding: {coding} ({e})") from None


def _coding(header: str) -> str | None:
    return _CODINGS.get(header.strip().lower() or "identity") if header.isascii() else None


# Input is fed to zlib a piece at a time, the piece doubling while a member goes on: zlib copies
# what follows a member's end (unused_data), so feeding it the whole body copied the rest of the
# body once per member, and a 1 MB body of 20-byte empty gzip members took a second of the event
# loop (52,000 copies of up to 1 MB). Fed this way a member copies at most its own size again.
_FIRST_PIECE = 256
_MAX_PIECE = 1 << 20
# No client sends more than a few members (`cat a.gz b.gz`); thousands of empty ones are only a
# way to make each byte of a body cost a decompressor.
MAX_MEMBERS = 1000


def _inflate(raw: bytes, wbits: int, limit: int, members: bool) -> bytes:
    """Decompress `raw`, stopping one byte past `limit`; with `members`, gzip members one after
    another are one body (RFC 1952 2.2)."""
    out = bytearray()
    view = memoryview(raw)
    pos = 0
    for _ in range(MAX_MEMBERS):
        d = zlib.decompressobj(wbits)
        piece = _FIRST_PIECE
        while not d.eof and pos < len(view):
            chunk = view[pos:pos + piece]
            out += d.decompress(chunk, limit + 1 - len(out))
            if len(out) > limit:
                raise BodyError(413, f"body exceeds {limit} bytes once decoded")
            # Below the limit zlib took the whole chunk: all of it but what follows the member's end.
            pos += len(chunk) - len(d.unused_data)
            piece = min(piece * 2, _MAX_PIECE)
        if not d.eof:
            raise zlib.error("the stream ends early")
        if pos == len(view):
            return bytes(out)
        if not members:
            raise zlib.error(f"{len(view) - pos} bytes after the end of the stream")
    raise zlib.error(f"more than {MAX_MEMBERS} gzip members")
