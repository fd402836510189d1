"""The aggregator's HTTP surface: ingest (/v1/*), the JSON API (/api/v1/*), /metrics, /healthz.

Bad input never changes state: authentication is checked before the body is read (401), its
Content-Encoding (415 unless bodycoding.py decodes it) and size before it is parsed (413), and
the whole body is validated before anything is applied (400 with the reason). Reads are open
(the UI is read-only without a token); mutations need the admin token in an Authorization
header, which browsers never send on their own, so they are CSRF-safe without cookies.
"""

from __future__ import annotations

import gc
import json
import math
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from podhealth import bodycoding, bodyread, log as plog, tls
from podhealth.aggregator import bundles, ingest, overrides, versions
from podhealth.hostnames import node_name_problem
from podhealth.vocab import Status
from podhealth.webguard import from_this_host, host_guard, require_guarded, require_host_checked, same_site_only

from podhealth.aggregator.auth import Auth, Refused, Speaker
from podhealth.aggregator.service import Aggregator, OperatorError
from podhealth.aggregator.state import Checkpoint
from podhealth.worker import offload

log = plog.get("podhealth.aggregator")

AGG = web.AppKey("aggregator", Aggregator)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
MAX_REASON = 500


def _error(status: int, message: str, retry_after: int | None = None) -> web.Response:
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return web.json_response({"error": message}, status=status, headers=headers)


_Reject = Refused


# Seconds a body may take to arrive after its request head. The idle timeout (httpguard) stops
# at the head; without this a caller with a token trickling a byte a second held a connection and
# its handler for ever (enough of them fill the connection cap). 1 MB in 60 s is 17 KB/s.
BODY_TIMEOUT = 60.0


async def _raw_body(request: web.Request, limit: int) -> bytes:
    try:
        return await bodyread.read_body(request, limit, BODY_TIMEOUT)
    except bodycoding.BodyError as e:
        raise _Reject(e.status, e.kind, e.message) from None


async def _body(request: web.Request, limit: int) -> tuple[Any, bytes]:
    raw = await _raw_body(request, limit)
    try:
        return ingest.loads(raw), raw
    except ingest.BadRequest as e:
        raise _Reject(400, "bad_request", str(e)) from None


def _ingest_endpoint(name: str, fn: Callable[[Aggregator, web.Request, Speaker], Awaitable[dict[str, Any]]],
                     central: bool = False) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        agg = request.app[AGG]
        auth: Auth = request.app[AUTH]
        m = agg.metrics.ingest_children(name)
        t0 = time.perf_counter()
        try:
            bound = auth.ingest(request, central)
            out = await fn(agg, request, bound)
        except _Reject as r:
            agg.metrics.ingest_requests.labels(name, r.result).inc()
            return _error(r.status, r.message, r.retry_after)
        finally:
            m[0].observe(time.perf_counter() - t0)
        m[1].inc()
        return web.Response(body=_answer(out), headers=_JSON)
    return handler


_JSON = {"Content-Type": "application/json; charset=utf-8"}
_ANSWERS: dict[tuple[tuple[str, Any], ...], bytes] = {}


def _answer(out: dict[str, Any]) -> bytes:
    """The JSON of an ingest answer; the few distinct ones (counts) are encoded once."""
    digest = out.pop("digest", None)
    if digest is not None:  # one per node: splice it into the shared encoding of the counts
        return _with_digest(_answer(out), digest)
    key = tuple(out.items())
    body = _ANSWERS.get(key)
    if body is None:
        body = json.dumps(out).encode()
        if len(_ANSWERS) < 1024:
            _ANSWERS[key] = body
    return body


# The answer to one report or lease, by what became of it (a digest is spliced in: _with_digest).
_ONE = {r: _answer(ingest.Applied(**{r: 1}).to_json()) for r in ("applied", "unchanged", "stale")}


def _check_node(agg: Aggregator, request: web.Request, node: str, bound: Speaker) -> None:
    request.app[AUTH].check_node(bound, node)
    _certified(agg, request, node)
    if node not in agg.mem.nodes and not agg.cfg.learn_nodes:
        raise _Reject(403, "forbidden", f"unknown node {node} (learn_nodes is off)")


def _certified(agg: Aggregator, request: web.Request, node: str) -> None:
    """With tls.client_certs on, a push for `node` comes over a connection whose client
    certificate (verified against tls.ca in the handshake) names `node`: a stolen token alone
    no longer speaks for a node."""
    if agg.cfg.tls.client_certs == "off":
        return
    transport = request.transport
    names = tls.peer_names(transport.get_extra_info("peercert") if transport is not None else None)
    if not names:
        raise _Reject(401, "unauthorized", "a client certificate signed by the aggregator's tls.ca is needed "
                                           "(tls.client_certs); none was presented")
    if node not in names:
        raise _Reject(403, "forbidden", f"the client certificate is for {', '.join(sorted(names))[:200]}, not {node}")


async def _commit(agg: Aggregator, ops: list[Any], new_ids: Sequence[str] = (),
                  undo: Checkpoint | None = None) -> None:
    try:
        await agg.commit(ops)
    except Exception as e:  # noqa: BLE001 - the client retries; say why
        # Memory follows the store: what this request changed is undone, so a resend is applied.
        if undo is not None:
            agg.mem.rollback(undo)
        agg.mem.forget_ids(new_ids)
        raise _Reject(503, "unavailable", f"the state store cannot write ({e}); nothing was applied, "
                                           "send again later") from None
    agg.poke()


def _reports_endpoint(agg: Aggregator, auth: Auth) -> Handler:
    """POST /v1/reports: the steps of _ingest_endpoint and a body handler, written out in one
    function. At 10,000 nodes it runs ~1,000 times a second, each time with caches cooled by
    everything else the loop did in between, where a Python call costs about a microsecond: a
    lease takes a handful of calls, and the metrics are counted in batches (IngestTally)."""
    tally = agg.metrics.ingest_tally("reports")
    latency = agg.metrics.ingest_children("reports")[0]
    refused = agg.metrics.ingest_requests
    limit, learn = agg.cfg.max_body_bytes, agg.cfg.learn_nodes
    perf_counter = time.perf_counter

    async def handler(request: web.Request) -> web.StreamResponse:
        t0 = perf_counter()
        try:
            bound = auth.ingest(request)
            raw = await _raw_body(request, limit)
            try:
                rep = ingest.read_posted(raw)
            except ingest.BadRequest as e:
                raise _Reject(400, "bad_request", str(e)) from None
            node = rep.node
            auth.check_node(bound, node)
            _certified(agg, request, node)
            mem = agg.mem
            if not learn and node not in mem.nodes:
                raise _Reject(403, "forbidden", f"unknown node {node} (learn_nodes is off)")
            _within_quota(agg, node, len(raw), store=False)
            now = agg.clock()
            if type(rep) is ingest.Lease:
                quiet = mem.lease_quiet(node, rep.digest, rep.time, now, rep.order)
                if quiet is not None:  # nothing to write, nothing to undo: answered here
                    if bound.vouches:
                        mem.vouch(node)
                    tally.ok(perf_counter() - t0, quiet)
                    return web.Response(body=_one(quiet, rep.digest), headers=_JSON)
                undo = mem.checkpoint(node)
                leased, ops = ingest.apply_lease(mem, rep, now)
                if leased is None:
                    raise _Reject(409, "conflict", f"no full report of {node} with digest {rep.digest} here: "
                                                   "send the full report")
                applied = leased
                digest: str | None = rep.digest  # it matched
            else:
                assert isinstance(rep, ingest.ParsedReport)
                undo = mem.checkpoint(node)
                applied, ops = ingest.apply_report(mem, rep, now)
                rec = mem.nodes.get(node)
                # What a lease must name to stand for this report (see ingest.Lease).
                digest = ingest.digest_of(rec.fp) if rec is not None and rec.fp else None
            if bound.vouches:
                mem.vouch(node)  # its own credential: a real node, counted in the breaker's fleet
            if applied.clock_ahead:
                agg.metrics.clock_ahead.inc(applied.clock_ahead)
            if ops:
                await _commit(agg, ops, undo=undo)
        except _Reject as r:
            refused.labels("reports", r.result).inc()
            latency.observe(perf_counter() - t0)
            return _error(r.status, r.message, r.retry_after)
        except BaseException:
            latency.observe(perf_counter() - t0)
            raise
        result = "stale" if applied.stale else "unchanged" if applied.unchanged else "applied"
        tally.ok(perf_counter() - t0, result)
        return web.Response(body=_one(result, digest), headers=_JSON)
    return handler


def _one(result: str, digest: str | None) -> bytes:
    """The answer to one report or lease: what became of it, and the digest a lease may name
    next (none after a stale one: it described nothing)."""
    return _ONE[result] if digest is None or result == "stale" else _with_digest(_ONE[result], digest)


def _with_digest(answer: bytes, digest: str) -> bytes:
    """An answer's JSON with the node's digest spliced in (one per node: not worth caching)."""
    return answer[:-1] + b', "digest": "' + digest.encode() + b'"}'


def _within_quota(agg: Aggregator, node: str, nbytes: int, *, store: bool) -> None:
    """Refuse (429, Retry-After; counted) a push beyond the node's rate or stored-bytes cap."""
    over = agg.quota.admit(node, nbytes, store=store)
    if over is not None:
        agg.metrics.ingest_throttled.labels(node, over.reason).inc()
        raise _Reject(429, "throttled", over.message, retry_after=over.retry_after)


async def _events(agg: Aggregator, request: web.Request, bound: Speaker) -> dict[str, Any]:
    obj, raw = await _body(request, agg.cfg.max_body_bytes)
    try:
        batch = ingest.parse_events(obj)
    except ingest.BadRequest as e:
        raise _Reject(400, "bad_request", str(e)) from None
    _check_node(agg, request, batch.node, bound)
    caps = agg.cfg.node_ingest
    for rec in batch.events:
        if len(rec.body) > caps.max_event_bytes:
            raise _Reject(413, "too_large", f"record {rec.id}: {len(rec.body)} bytes, more than "
                                            f"node_ingest.max_event_bytes ({caps.max_event_bytes}); nothing applied")
    try:
        _within_quota(agg, batch.node, len(raw), store=True)
    except _Reject:
        # Over its cap, a node that fails must still be fenced: its FAIL transitions are applied.
        fails = tuple(r for r in batch.events if r.transition is not None and r.transition.status is Status.FAIL)
        if fails:
            await _apply_events(agg, ingest.EventBatch(batch.node, fails), bound)
        raise
    return await _apply_events(agg, batch, bound)


async def _apply_events(agg: Aggregator, batch: ingest.EventBatch, bound: Speaker) -> dict[str, Any]:
    started = time.time()
    undo = agg.mem.checkpoint(batch.node)
    applied, ops, new_ids = ingest.apply_events(agg.mem, batch, agg.clock())
    if bound.vouches:
        agg.mem.vouch(batch.node)
    _count(agg, applied)
    await _commit(agg, ops, new_ids, undo)
    if any(r.transition is not None and r.transition.status is Status.FAIL for r in batch.events):
        # The fence path's stage times (bench/fault_to_fence.py --trace reads them at debug level).
        log.debug("fail committed", node=batch.node, started=started, took_ms=round((time.time() - started) * 1e3, 1))
    fresh = set(new_ids)
    agg.quota.add_stored(batch.node, sum(len(e.body) for e in batch.events if e.id in fresh))
    return applied.to_json()


async def _alertmanager(agg: Aggregator, request: web.Request, bound: Speaker) -> dict[str, Any]:
    if bound.is_node:
        raise _Reject(401, "unauthorized", "a node token cannot post alerts; use the cluster token")
    obj, _ = await _body(request, agg.cfg.max_body_bytes)
    now = agg.clock()
    try:
        alerts = ingest.parse_alertmanager(obj, now, ingest.parse_rfc3339)
    except ingest.BadRequest as e:
        raise _Reject(400, "bad_request", str(e)) from None
    undo = agg.mem.checkpoint(*(a.node for a in alerts))
    applied, ops = ingest.apply_alerts(agg.mem, alerts, now, agg.cfg.learn_nodes)
    _count(agg, applied)
    await _commit(agg, ops, undo=undo)
    return applied.to_json()


def _count(agg: Aggregator, a: ingest.Applied) -> None:
    for k, v in a.to_json().items():
        if v:
            agg.metrics.ingest_result(k).inc(v)
    if a.clock_ahead:
        agg.metrics.clock_ahead.inc(a.clock_ahead)


# ---- the JSON API -------------------------------------------------------------------------------


async def api_nodes(request: web.Request) -> web.Response:
    agg = request.app[AGG]
    state = request.query.get("state")
    not_state = request.query.get("not_state")  # e.g. OK: the nodes with a problem (the federated view)
    check = request.query.get("check")
    partition = request.query.get("partition")
    out = []
    for name in sorted(agg.mem.nodes):
        rec = agg.mem.nodes[name]
        if state and rec.state != state:
            continue
        if not_state and rec.state == not_state:
            continue
        if partition is not None and rec.partition != partition:
            continue
        conds = agg.mem.conditions_of(name)
        if check and not any(c.check == check for c in conds):
            continue
        out.append({"name": name, "state": rec.state, "status": rec.status.value, "partition": rec.partition,
                    "fence": rec.fence.value, "last_seen": rec.last_seen,
                    "checks": sorted({c.check for c in conds}),
                    # why it is out of service when its verdict is OK again (a reboot in flight)
                    "fence_reason": rec.fence_reason, "hold_reason": rec.hold_reason,
                    "ladder": {"step": rec.ladder, "since": rec.ladder_at, "remedy": rec.view().remedy}})
    return web.json_response({"nodes": out, "count": len(out)})


async def api_node(request: web.Request) -> web.Response:
    agg = request.app[AGG]
    name = request.match_info["name"]
    out = agg.node_json(name)
    if out is None:
        return _error(404, f"unknown node {name}")
    report = await offload(agg.store.node_report, name)
    out["report"] = json.loads(report) if report else None
    return web.json_response(out)


async def api_history(request: web.Request) -> web.Response:
    agg = request.app[AGG]
    name = request.match_info["name"]
    if name not in agg.mem.nodes:
        return _error(404, f"unknown node {name}")
    try:
        limit = min(1000, max(1, int(request.query.get("limit", "100"))))
        before = float(request.query["before"]) if "before" in request.query else None
        if before is not None and not math.isfinite(before):  # NaN matched nothing: an empty page, no error
            raise ValueError
    except ValueError:
        return _error(400, "limit must be an integer and before a number")
    items = await offload(agg.store.history, name, limit, before)
    return web.json_response({"node": name, "items": items})


async def api_repairs(request: web.Request) -> web.Response:
    """The repair queue: nodes the remediation ladder handed to a human, with their attempts."""
    agg = request.app[AGG]
    return web.json_response({"repairs": await offload(agg.repairs_json)})


async def api_fleet(request: web.Request) -> web.Response:
    return web.json_response(request.app[AGG].fleet_json())


async def api_fleet_versions(request: web.Request) -> web.Response:
    """Which nodes run which driver, VBIOS, HCA firmware, OFED, kernel (aggregator/versions.py)."""
    agg = request.app[AGG]
    stamps = {name: rec.stored_at for name, rec in agg.mem.nodes.items()}
    view = await offload(request.app[VERSIONS].view, stamps, agg.store.drift_readings, agg.clock())
    return web.json_response(view)


async def _admin_body(request: web.Request, agg: Aggregator, need_reason: bool) -> tuple[str, str]:
    reason, who, _ = await _admin_request(request, agg, need_reason)
    return reason, who


async def _admin_request(request: web.Request, agg: Aggregator, need_reason: bool) -> tuple[str, str, dict[str, Any]]:
    """The admin token, then the JSON body: (reason, who, the whole object)."""
    request.app[AUTH].require_admin(request)
    # body_exists, not content_length: a chunked body has no Content-Length and is read all the same.
    obj: Any = {}
    if request.body_exists:
        raw = await _raw_body(request, agg.cfg.max_body_bytes)
        if raw.strip():
            try:
                obj = ingest.loads(raw)
            except ingest.BadRequest as e:
                raise _Reject(400, "bad_request", str(e)) from None
    if not isinstance(obj, dict):
        raise _Reject(400, "bad_request", "expected a JSON object")
    reason = obj.get("reason", "")
    who = obj.get("who", "api")
    if not isinstance(reason, str) or not isinstance(who, str):
        raise _Reject(400, "bad_request", "reason and who must be strings")
    reason, who = reason.strip(), who.strip() or "api"
    if need_reason and not reason:
        raise _Reject(400, "bad_request", "a reason is required")
    if len(reason) > MAX_REASON or len(who) > 64:
        raise _Reject(400, "bad_request", f"reason longer than {MAX_REASON} or who longer than 64 characters")
    return reason, who, obj


def _admin(fn: Callable[[Aggregator, web.Request], Awaitable[dict[str, Any]]]) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        agg = request.app[AGG]
        try:
            return web.json_response(await fn(agg, request))
        except _Reject as r:
            return _error(r.status, r.message)
        except OperatorError as e:
            return _error(e.status, str(e))
    return handler


def _node_arg(request: web.Request) -> str:
    name = request.match_info["name"]
    problem = node_name_problem(name)
    if problem:
        raise _Reject(400, "bad_request", problem)
    return name


async def _fence(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who = await _admin_body(request, agg, True)
    return await agg.operator_fence(_node_arg(request), reason, who)


async def _release(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who = await _admin_body(request, agg, True)
    return await agg.operator_release(_node_arg(request), reason, who)


async def _handover(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    _, who = await _admin_body(request, agg, False)
    return await agg.operator_handover(_node_arg(request), who)


async def _reset_order(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who = await _admin_body(request, agg, True)
    return await agg.reset_order(_node_arg(request), who, reason)


async def _override(call: Awaitable[dict[str, Any]]) -> dict[str, Any]:
    try:
        return await call
    except overrides.OverrideError as e:
        raise _Reject(e.status, "bad_request", str(e)) from None


async def _silence(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who, obj = await _admin_request(request, agg, True)
    return await _override(overrides.silence(agg.context(), _node_arg(request), obj.get("check"), obj.get("duration"), reason,
                                             who))


async def _unsilence(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who, obj = await _admin_request(request, agg, False)
    check = obj.get("check")
    if not isinstance(check, str):
        raise _Reject(400, "bad_request", "check is required")
    return await _override(overrides.unsilence(agg.context(), _node_arg(request), check, reason, who))


async def _mark_healthy(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who = await _admin_body(request, agg, True)
    return await _override(overrides.mark_healthy(agg.context(), _node_arg(request), reason, who))


def _bundle_reader(request: web.Request) -> web.Response | None:
    """Bundles hold host names, serial numbers and kernel logs: the admin token, or a caller on
    this host when no admin token is configured. None when allowed, else the refusal."""
    auth: Auth = request.app[AUTH]
    if auth.admin:
        try:
            auth.require_admin(request)
        except _Reject as r:
            return _error(r.status, r.message)
    elif not from_this_host(request):
        return _error(403, "no admin token is configured: bundles are readable only from this host")
    return None


async def api_bundles(request: web.Request) -> web.Response:
    agg = request.app[AGG]
    refusal = _bundle_reader(request)
    if refusal is not None:
        return refusal
    name = request.match_info["name"]
    if name not in agg.mem.nodes:
        return _error(404, f"unknown node {name}")
    rows = await offload(agg.store.bundles_of, name)
    return web.json_response({"node": name, "bundles": [bundles.public(b) for b in rows]})


async def api_bundle(request: web.Request) -> web.StreamResponse:
    agg = request.app[AGG]
    refusal = _bundle_reader(request)
    if refusal is not None:
        return refusal
    name = request.match_info["name"]
    raw_id = request.match_info["id"]
    # ASCII digits only, and within SQLite's INTEGER: int() alone takes "1_0", " 1" and "١", and a
    # 20-digit id overflowed the query (a 500 instead of this 400).
    if not (raw_id.isascii() and raw_id.isdigit() and int(raw_id) <= ingest.MAX_SEQ):
        return _error(400, "a bundle id is an integer")
    bid = int(raw_id)
    b = await offload(agg.store.bundle, bid)
    if b is None or b["node"] != name:
        return _error(404, f"no bundle {bid} of {name}")
    if b["error"]:  # refused or not fetched: there is no file, and the reason is the answer
        return _error(409, f"bundle {bid} of {name} (fence {b['fence_id']}) was not stored: {b['error']}")
    path = Path(b["path"])
    if not await offload(path.is_file):
        return _error(410, f"bundle {bid} of {name} is recorded but its file is not on this aggregator's disk "
                           f"({path.name}: deleted, or fetched by another replica)")
    return web.FileResponse(path, headers={
        "Content-Type": "application/gzip", "X-Podhealth-Sha256": b["sha256"],
        "Content-Disposition": f'attachment; filename="{name}-fence{b["fence_id"]}-bundle{bid}.tar.gz"'})


async def _breaker_reset(agg: Aggregator, request: web.Request) -> dict[str, Any]:
    reason, who = await _admin_body(request, agg, False)
    return await agg.breaker_reset(who, reason)


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[AGG].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def healthz(request: web.Request) -> web.Response:
    agg = request.app[AGG]
    if agg.writer.error:
        # Up, but every change would be refused: not healthy (a load balancer or systemd should know).
        return web.json_response({"status": "store_failing", "error": agg.writer.error,
                                  "pending_actions": len(agg.pending)}, status=503)
    # Built whole by Aggregator.open() and started before the site listens: never "starting" here.
    return web.json_response({"status": "ok", "pending_actions": len(agg.pending)})


AUTH = web.AppKey("auth", Auth)
VERSIONS = web.AppKey("fleet_versions", versions.Readings)


def make_app(agg: Aggregator, *, manage: bool = True) -> web.Application:
    """The aiohttp app; with `manage`, the aggregator starts and stops with it (cleanup_ctx)."""
    app = web.Application(client_max_size=agg.cfg.max_body_bytes)
    app[AGG] = agg
    app[VERSIONS] = versions.Readings()
    app[AUTH] = Auth(agg.cfg.auth)
    if manage:
        async def lifecycle(app: web.Application) -> Any:
            await agg.start()
            # What exists now (modules, config, the loaded store) lives as long as the process:
            # keep it out of every full GC pass, which otherwise stalls ingest for tens of ms.
            gc.collect()
            gc.freeze()
            yield
            gc.unfreeze()
            await agg.stop()
        app.cleanup_ctx.append(lifecycle)
    # Reads answer only a loopback Host while bound to loopback (DNS rebinding): webguard.host_guard.
    reads = host_guard(agg.cfg.listen.address, agg.cfg.allowed_hosts, "aggregator.allowed_hosts")
    app.router.add_post("/v1/reports", same_site_only(_reports_endpoint(agg, app[AUTH])))
    app.router.add_post("/v1/events", same_site_only(_ingest_endpoint("events", _events)))
    app.router.add_post("/v1/alertmanager",
                        same_site_only(_ingest_endpoint("alertmanager", _alertmanager, central=True)))
    app.router.add_post("/api/v1/nodes/{name}/fence", same_site_only(_admin(_fence)))
    app.router.add_post("/api/v1/nodes/{name}/release", same_site_only(_admin(_release)))
    app.router.add_post("/api/v1/nodes/{name}/handover", same_site_only(_admin(_handover)))
    app.router.add_post("/api/v1/nodes/{name}/reset-order", same_site_only(_admin(_reset_order)))
    app.router.add_post("/api/v1/nodes/{name}/silence", same_site_only(_admin(_silence)))
    app.router.add_post("/api/v1/nodes/{name}/unsilence", same_site_only(_admin(_unsilence)))
    app.router.add_post("/api/v1/nodes/{name}/mark-healthy", same_site_only(_admin(_mark_healthy)))
    app.router.add_post("/api/v1/breaker/reset", same_site_only(_admin(_breaker_reset)))
    reads_table: tuple[tuple[str, Handler], ...] = (
        ("/api/v1/nodes", api_nodes), ("/api/v1/nodes/{name}", api_node),
        ("/api/v1/nodes/{name}/history", api_history), ("/api/v1/nodes/{name}/bundles", api_bundles),
        ("/api/v1/nodes/{name}/bundles/{id}", api_bundle), ("/api/v1/fleet", api_fleet),
        ("/api/v1/repairs", api_repairs), ("/api/v1/fleet/versions", api_fleet_versions),
        ("/v1/fleet/versions", api_fleet_versions),  # the name issue 13 gives it
        ("/metrics", metrics), ("/healthz", healthz))
    for path, read in reads_table:
        app.router.add_get(path, reads(read))
    from podhealth.aggregator import ui  # the web UI: /, /ui/*
    ui.setup(app, agg, reads)
    from podhealth.aggregator import failslow_api  # fail-slow: POST /v1/perf, its reads, the judge's loop

    failslow_api.setup(app, agg, reads, failslow_api.Ingest(_ingest_endpoint, _body, _Reject, _check_node))
    require_guarded(app)
    require_host_checked(app)
    return app
