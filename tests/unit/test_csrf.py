"""csrf: which requests count as cross-site, and no mutating route can be registered unguarded."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from podhealth import webguard as csrf
from podhealth.aggregator.server import make_app
from podhealth.aggregator.service import Aggregator
from tests.harness.agg import config


@pytest.mark.parametrize(("headers", "ok"), [
    ({}, True),  # agents, Alertmanager, curl: no Origin at all
    ({"Origin": "http://agg.example:9420"}, True),
    ({"Origin": "https://agg.example:9420"}, True),
    ({"Origin": "http://evil.example"}, False),
    ({"Origin": "http://agg.example:9421"}, False),  # same host, other port: another origin
    ({"Origin": "null"}, False),  # sandboxed frames, file:// pages
    ({"Origin": "ftp://agg.example:9420"}, False),
    ({"Origin": "http://[::1"}, False),  # urlsplit raises on it (was a 500)
    ({"Sec-Fetch-Site": "cross-site"}, False),
    ({"Sec-Fetch-Site": "cross-site", "Origin": "http://agg.example:9420"}, False),
    ({"Sec-Fetch-Site": "same-origin", "Origin": "http://agg.example:9420"}, True),
])
def test_same_site(headers: dict[str, str], ok: bool) -> None:
    req = make_mocked_request("POST", "/v1/reports", headers={"Host": "agg.example:9420", **headers})
    assert csrf.same_site(req) is ok


@pytest.mark.parametrize(("header", "token"), [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),  # the scheme is case-insensitive (RFC 7235)
    ("BEARER  abc ", "abc"),
    ("Basic YWJj", None),
    ("Bearerabc", None),
    ("", None),
])  # a token that is not UTF-8: test_aggregator_auth.test_a_token_that_is_not_utf8_is_refused_not_a_500
def test_bearer(header: str, token: str | None) -> None:
    req = make_mocked_request("POST", "/v1/reports", headers={"Authorization": header} if header else {})
    assert csrf.bearer(req) == token
    assert csrf.same_token("abc", csrf.bearer(req)) is (token == "abc")


async def test_every_mutating_route_of_the_aggregator_is_guarded(tmp_path: Path) -> None:
    agg = await Aggregator.open(config(tmp_path))
    try:
        app = make_app(agg, manage=False)  # make_app itself runs require_guarded
    finally:
        await agg.stop()
    posts = [r for r in app.router.routes() if r.method not in csrf.SAFE_METHODS]
    assert len(posts) == 12 and all(getattr(r.handler, "_podhealth_same_site_only", False) for r in posts)


def test_an_unguarded_mutating_route_is_refused_at_start() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/read", handler)
    app.router.add_post("/ok", csrf.same_site_only(handler))
    csrf.require_guarded(app)  # GET needs no guard
    app.router.add_delete("/things/{id}", handler)
    with pytest.raises(RuntimeError, match=r"DELETE /things/\{id\} is not wrapped in webguard"):
        csrf.require_guarded(app)
