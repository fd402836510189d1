"""Every log line is structured: aiohttp's request-handler tracebacks and access log, and what
asyncio logs itself, come out as single JSON lines with a level, not as plain tracebacks.

Run in a subprocess: logging setup is process-wide, and what matters is the process's stderr."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(120)

SCRIPT = textwrap.dedent("""
    import asyncio, logging, sys
    import aiohttp
    from aiohttp import web
    from podhealth import log

    log.setup("info", "json", sys.stderr)

    async def boom(request):
        raise RuntimeError("handler blew up\\nsecond line of the message")

    async def main():
        app = web.Application()
        app.router.add_get("/boom", boom)
        app.router.add_get("/ok", lambda r: web.Response(text="ok"))
        runner = web.AppRunner(app, access_log=logging.getLogger("aiohttp.access"))
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async with s.get(f"http://127.0.0.1:{port}/boom") as r:
                assert r.status == 500, r.status
            async with s.get(f"http://127.0.0.1:{port}/ok") as r:
                assert r.status == 200
        # a request aiohttp cannot parse: the client's error (400), not a traceback at ERROR
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\nX-Bad: a\\x00b\\r\\n\\r\\n")
        assert (await asyncio.wait_for(reader.read(), 10)).startswith(b"HTTP/1.0 400 ")
        writer.close()
        # what asyncio's default exception handler reports goes through the same path
        asyncio.get_running_loop().call_exception_handler({"message": "loop trouble", "exception": OSError(24, "EMFILE")})
        log.get("podhealth.test").warning("structlog's own line", n=1)
        await runner.cleanup()

    asyncio.run(main())
""")


def test_aiohttp_and_asyncio_log_records_are_json_lines() -> None:
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    records = [json.loads(line) for line in lines]  # every line parses: no bare traceback line
    errors = [x for x in records if x.get("logger") == "aiohttp.server" and x["level"] == "error"]
    assert len(errors) == 1, lines
    client = [x for x in records if x.get("logger") == "aiohttp.server" and x["level"] != "error"]
    assert len(client) == 1 and client[0]["level"] == "info" and "exception" not in client[0], lines
    assert "Invalid header value char" in client[0]["event"]
    err = errors[0]
    assert err["level"] == "error" and err["event"].startswith("Error handling request")
    assert "RuntimeError: handler blew up" in err["exception"] and "Traceback" in err["exception"]
    access = [x for x in records if x.get("logger") == "aiohttp.access"]
    assert len(access) == 3 and all(x["level"] == "info" for x in access)  # the 3rd: the 400
    assert sum("GET /" in x["event"] for x in access) >= 2 and '" 400 ' in access[2]["event"]
    loop = [x for x in records if x.get("logger") == "asyncio"]
    assert len(loop) == 1 and loop[0]["level"] == "error" and loop[0]["event"] == "loop trouble"
    assert "EMFILE" in loop[0]["exception"]
    own = [x for x in records if x.get("event") == "structlog's own line"]
    assert len(own) == 1 and own[0]["level"] == "warning"
    assert all("timestamp" in x for x in records)
