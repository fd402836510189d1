"""Fail-slow's HTTP surface on the aggregator, added by server.make_app through `setup()`.

- `POST /v1/perf`: a node's probe round and/or job window (aggregator/failslow_fleet.py's
  format), with that node's own credential, through server.py's one ingest path (auth before
  the body, size and encoding limits, 400 with the reason; nothing is kept from a bad body).
- `GET /api/v1/failslow/outliers[?metric=gemm]`, `GET /api/v1/failslow/nodes/{name}`,
  `GET /api/v1/failslow/stragglers`: reads, open like the rest of the API.
- The judge runs every `aggregator.failslow.interval` on the replica that acts (the leader):
  its findings become conditions, committed like any other ingest, and the policy runs.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, NamedTuple

from aiohttp import web

from podhealth import log
from podhealth.aggregator.failslow_fleet import BadPerf, Exported, FailslowFleet, metric_name, parse
from podhealth.hostnames import node_name_problem
from podhealth.webguard import Handler, same_site_only
from podhealth.worker import offload

if TYPE_CHECKING:
    from podhealth.aggregator.auth import Speaker
    from podhealth.aggregator.service import Aggregator

_log = log.get("podhealth.aggregator.failslow")
FLEET = web.AppKey("failslow", FailslowFleet)


class Ingest(NamedTuple):
    """What /v1/perf needs of server.py's one ingest path, handed over by make_app (so this module
    neither imports the server nor reaches into it)."""

    endpoint: Callable[..., Handler]  # _ingest_endpoint: auth before the body, metrics, answers
    body: Callable[[web.Request, int], Awaitable[tuple[Any, bytes]]]  # the bounded body, decoded
    reject: Callable[[int, str, str], Exception]  # status, result, message -> the refusal to raise
    check_node: Callable[["Aggregator", web.Request, str, "Speaker"], None]  # the credential speaks for the node


def _perf_handler(kit: Ingest) -> Callable[["Aggregator", web.Request, "Speaker"], Awaitable[dict[str, Any]]]:
    async def perf(agg: "Aggregator", request: web.Request, bound: "Speaker") -> dict[str, Any]:
        obj, _ = await kit.body(request, agg.cfg.max_body_bytes)
        try:
            post = parse(obj, agg.cfg.failslow.max_probes_per_node)
        except BadPerf as e:
            raise kit.reject(400, "bad_request", str(e)) from None
        kit.check_node(agg, request, post.node, bound)
        try:
            taken = request.app[FLEET].take(post, agg.clock())
        except BadPerf as e:
            raise kit.reject(400, "bad_request", str(e)) from None
        return {"applied": taken}
    return perf


async def judge_once(app: web.Application, agg: "Aggregator") -> None:
    """One judgement of the fleet: findings to conditions, committed; then the policy runs."""
    fleet = app[FLEET]
    if not agg.acting():
        return
    now = agg.clock()
    # Scoring 10,000 nodes' figures takes seconds of Python: off the loop, on copies of the inputs.
    scored, strag = await offload(FailslowFleet.compute, *fleet.inputs(now), fleet.cfg, now)
    ops = fleet.apply(agg.mem, now, scored, strag)
    if ops:
        await agg.commit(ops)
        agg.poke()


async def _api_outliers(request: web.Request) -> web.Response:
    try:
        metric = metric_name(request.query.get("metric"))
    except BadPerf as e:
        return web.json_response({"error": str(e)}, status=400)
    fleet = request.app[FLEET]
    return web.json_response(fleet.outliers(metric, fleet.clock()))


async def _api_node(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if node_name_problem(name):
        return web.json_response({"error": f"bad node name: {node_name_problem(name)}"}, status=400)
    fleet = request.app[FLEET]
    return web.json_response(fleet.history(name, fleet.clock()))


async def _api_stragglers(request: web.Request) -> web.Response:
    return web.json_response(request.app[FLEET].stragglers_json())


def setup(app: web.Application, agg: "Aggregator", reads: Callable[[Handler], Handler], ingest: Ingest) -> None:
    fleet = FailslowFleet(agg.cfg.failslow)
    fleet.adopt_open(agg.mem.conditions)
    fleet.clock = agg.clock
    app[FLEET] = fleet
    agg.metrics.registry.register(Exported(fleet))
    app.router.add_post("/v1/perf", same_site_only(ingest.endpoint("perf", _perf_handler(ingest))))
    for path, read in (("/api/v1/failslow/outliers", _api_outliers), ("/api/v1/failslow/nodes/{name}", _api_node),
                       ("/api/v1/failslow/stragglers", _api_stragglers)):
        app.router.add_get(path, reads(read))

    async def loop(app: web.Application) -> AsyncIterator[None]:
        async def run() -> None:
            while True:
                await asyncio.sleep(agg.cfg.failslow.interval)
                try:
                    await judge_once(app, agg)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - the next round tries again; it is logged
                    _log.exception("fail-slow judgement failed")
        task = asyncio.create_task(run(), name="failslow")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    app.cleanup_ctx.append(loop)
