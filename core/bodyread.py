"""Reading a request's body, the one way the agent and the aggregator do it.

Bounded on every side, so no caller, token holder or not, can make a handler hold memory, a
connection or a traceback in the log: the body is refused unread when its Content-Encoding is not
one bodycoding decodes (415) or its Content-Length is over the route's limit (413); it must arrive
within `timeout` seconds of the head (a token holder trickling a byte a second held a connection
and its handler for ever: 408, and the connection is closed, not drained); a chunked body whose
framing breaks is a 400 and the connection ends there; a client that leaves mid-upload is one
info line; the decoded body is at most `limit` bytes (a 1 KB gzip bomb inflates to 1 GB).
Every refusal is a bodycoding.BodyError that each server answers in its own JSON shape.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from podhealth import bodycoding, log

_log = log.get("podhealth.http")


async def read_body(request: web.Request, limit: int, timeout: float) -> bytes:
    """The request's body, decoded, at most `limit` bytes. Raises bodycoding.BodyError."""
    coding = bodycoding.header_of(request.headers.getall("Content-Encoding", []))
    if coding is not None:  # the body arrives as sent (bodycoding.RUNNER_KWARGS): refuse it unread
        problem = bodycoding.unsupported(coding)
        if problem is not None:
            raise bodycoding.BodyError(415, problem)
    if request.content_length is not None and request.content_length > limit:
        raise bodycoding.BodyError(413, f"body of {request.content_length} bytes exceeds {limit}")
    try:
        if request.content.is_eof():  # all here already (a report is one packet): no timer to set
            raw = await request.read()
        else:
            async with asyncio.timeout(timeout):
                raw = await request.read()
    except TimeoutError:
        _end(request)
        raise bodycoding.BodyError(408, f"the body did not arrive within {timeout:g}s") from None
    except web.HTTPRequestEntityTooLarge:  # over the app's client_max_size as it arrived
        raise bodycoding.BodyError(413, f"body exceeds {limit} bytes") from None
    except RequestPayloadError as e:  # e.g. a chunked body whose framing is broken
        # The rest cannot be read either: end it here and close the connection after the answer,
        # rather than let aiohttp drain it afterwards (and log the parser's traceback).
        _end(request)
        why = " ".join(str(getattr(e.__cause__, "message", None) or e).split())
        raise bodycoding.BodyError(400, f"body cannot be read: {why}") from None
    except ConnectionResetError:
        # The client went away mid-upload (a killed agent, a timeout): one structured line, not
        # aiohttp's traceback; there is no one left to answer.
        _log.info("client closed the connection during the upload", path=request.path, peer=request.remote or "",
                  expected=request.content_length)
        raise bodycoding.BodyError(400, "connection closed during the upload", kind="aborted") from None
    return raw if coding is None else bodycoding.decode(raw, coding, limit)


def _end(request: web.Request) -> None:
    request.content.feed_eof()
    if request.protocol is not None:
        request.protocol.close()
