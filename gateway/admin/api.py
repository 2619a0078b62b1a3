"""The admin listener's aiohttp app. JSON field names are the contract of DESIGN.md."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from gateway import metrics as gm
from gateway.admin import page
from gateway.admin.auth import bearer_auth
from gateway.admin.status import status_document
from gateway.clock import Clock
from gateway.flush import stuck
from gateway.flush.flusher import Flusher
from gateway.models import FlushState
from gateway.store.journal import Journal

_MAX_WAIT_S = 3600.0


@dataclass(slots=True)
class AdminServices:
    journal: Journal
    flusher: Flusher
    clock: Clock
    capacity_bytes: int
    is_ready: bool = False
    token: str | None = None  # when set, every path but the probes needs it (admin/auth.py)
    # More top-level fields of /admin/v1/status, computed at each call (e.g. "prefetch").
    status_extras: dict[str, Callable[[], Any]] = field(default_factory=dict)
    # With replicas: "copies/wanted" of a version acknowledged with fewer (degrade).
    replicas_short: Callable[[str, str, int], str | None] | None = None


ADMIN = web.AppKey("admin_services", AdminServices)
# With peers (admin/fleet.py): the drain of the whole fleet, for (services, bucket, prefix,
# wait seconds).
FleetDrain = Callable[[AdminServices, str | None, str, float], Awaitable[dict[str, Any]]]
FLEET_DRAIN: web.AppKey[FleetDrain] = web.AppKey("fleet_drain")


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = request.app[ADMIN].is_ready
    return _json({"ready": ready}, status=200 if ready else 503)


async def status(request: web.Request) -> web.Response:
    return _json(await node_status(request))


async def node_status(request: web.Request) -> dict[str, Any]:
    """The status document (admin/status.py) with the extras (e.g. ``prefetch``)."""
    svc = request.app[ADMIN]
    doc = await status_document(svc)
    doc.update({name: figure() for name, figure in svc.status_extras.items()})
    return doc


def _float_arg(request: web.Request, name: str, default: float) -> float:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        return min(max(0.0, float(raw)), _MAX_WAIT_S)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{name} must be a number") from exc


async def drain(request: web.Request) -> web.Response:
    """A fence: is everything acknowledged before this call (under bucket/prefix) durable?

    Unlike the status document, ``pending_objects``/``pending_bytes`` here keep their
    original meaning (scripts rely on it): everything of the fence not durable yet (what
    the status calls ``unflushed_*``); ``in_flight_sent_bytes`` of it is already sent by
    uploads in flight (not durable until they end). Of them, ``failed_objects`` failed
    permanently and ``held_objects`` are commit markers held back behind one: they wait
    for an operator (``POST /admin/v1/flush/retry``), not for time, so a waiting drain
    returns as soon as nothing else is left, rather than at its timeout."""
    svc = request.app[ADMIN]
    bucket = request.query.get("bucket") or None
    prefix = request.query.get("prefix", "")
    wait = request.query.get("wait", "false").lower() in ("1", "true", "yes")
    timeout_s = _float_arg(request, "timeout", 30.0)
    fleet_drain = request.app.get(FLEET_DRAIN)
    if fleet_drain is not None:  # every node of the fleet answers (docs/fleet.md)
        return _json(await fleet_drain(svc, bucket, prefix, timeout_s if wait else 0.0))
    left = await stuck.wait_movable(
        svc.journal,
        svc.flusher.policy,
        bucket,
        prefix,
        svc.journal.last_seq,
        timeout_s if wait else 0.0,
    )
    return _json(
        {
            "drained": left.objects == 0,
            "pending_objects": left.objects,
            "pending_bytes": left.bytes,
            "failed_objects": left.failed,
            "held_objects": left.held,
            # Of pending_bytes: already sent by uploads in flight (progress, not durable).
            "in_flight_sent_bytes": svc.flusher.progress.sent_bytes(bucket, prefix),
        }
    )


async def object_state(request: web.Request) -> web.Response:
    svc = request.app[ADMIN]
    bucket, key = request.match_info["bucket"], request.match_info["key"]
    obj = await svc.journal.get(bucket, key)
    if obj is None:
        return _json(
            {
                "bucket": bucket,
                "key": key,
                "state": None,
                "detail": "not held locally (never written here, or flushed and evicted)",
            },
            404,
        )
    doc = {
        "bucket": bucket,
        "key": key,
        "state": obj.state.value,
        "is_delete": obj.is_delete,
        "size_bytes": obj.meta.size_bytes,
        "etag": obj.meta.etag,
        "seq": obj.seq,
        "attempts": obj.attempts,
        "last_error": obj.last_error,
    }
    short = svc.replicas_short
    if short is not None and obj.state is not FlushState.DURABLE:
        doc["replicas"] = short(bucket, key, obj.seq)  # None: as many as wanted
    return _json(doc)


async def flush_pause(request: web.Request) -> web.Response:
    request.app[ADMIN].flusher.pause()
    return _json({"flush_state": "paused"})


async def flush_resume(request: web.Request) -> web.Response:
    request.app[ADMIN].flusher.resume()
    return _json({"flush_state": "running"})


async def flush_retry(request: web.Request) -> web.Response:
    count = await request.app[ADMIN].flusher.retry_failed()
    return _json({"retried_objects": count})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus exposition of ``gateway.metrics.REGISTRY``. Counters are recorded where
    things happen; the gauges mirroring the backlog are refreshed here, at scrape, from the
    status document (the same figures as /admin/v1/status: O(lanes), no scan)."""
    doc = await status_document(request.app[ADMIN])
    for gauge, name in (
        (gm.PENDING_OBJECTS, "pending_objects"),
        (gm.PENDING_BYTES, "pending_bytes"),
        (gm.FAILED_OBJECTS, "failed_objects"),
        (gm.FAILED_BYTES, "failed_bytes"),
        (gm.HELD_OBJECTS, "held_objects"),
        (gm.UNFLUSHED_OBJECTS, "unflushed_objects"),
        (gm.UNFLUSHED_BYTES, "unflushed_bytes"),
        (gm.IN_FLIGHT_SENT_BYTES, "in_flight_sent_bytes"),
        (gm.FLUSH_RATE, "flush_rate_bytes_per_s"),
        (gm.FLUSHED_OBJECTS, "flushed_objects"),
        (gm.FLUSHED_BYTES, "flushed_bytes"),
        (gm.CACHE_USED_BYTES, "cache_used_bytes"),
    ):
        gauge.set(doc[name])
    gm.RECOVERY_POINT_S.set(doc["oldest_pending_seconds"] or 0.0)
    gm.FLUSH_PAUSED.set(1 if doc["flush_state"] == "paused" else 0)
    # Lanes come and go: rebuild their series so a finished lane does not linger.
    lane_gauges = (gm.LANE_RATE, gm.LANE_ACCEPTED, gm.LANE_PENDING_OBJECTS, gm.LANE_PENDING_BYTES)
    for gauge in lane_gauges:
        gauge.clear()
    for lane in doc["lanes"]:
        labels = (lane["bucket"], lane["prefix"])
        gm.LANE_RATE.labels(*labels).set(lane["rate_limit_per_s"])
        gm.LANE_ACCEPTED.labels(*labels).set(lane["accepted_per_s"])
        gm.LANE_PENDING_OBJECTS.labels(*labels).set(lane["pending_objects"])
        gm.LANE_PENDING_BYTES.labels(*labels).set(lane["pending_bytes"])
    # Text format 0.0.4 unless the scraper asks for OpenMetrics (or text 1.0.0).
    encode, content_type = choose_encoder(request.headers.get("Accept", ""))
    return web.Response(body=encode(gm.REGISTRY), headers={"Content-Type": content_type})


def build_admin_app(services: AdminServices) -> web.Application:
    app = web.Application(middlewares=[bearer_auth(services.token)] if services.token else [])
    app[ADMIN] = services
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/admin/v1/status", status)
    app.router.add_get("/admin/v1/drain", drain)
    app.router.add_get("/admin/v1/objects/{bucket}/{key:.+}", object_state)
    app.router.add_post("/admin/v1/flush/pause", flush_pause)
    app.router.add_post("/admin/v1/flush/resume", flush_resume)
    app.router.add_post("/admin/v1/flush/retry", flush_retry)
    app.router.add_get("/metrics", metrics)
    # The status page at / and the flush history it charts (issue 6).
    page.install(
        app,
        services.journal,
        services.clock,
        lambda: services.flusher.is_paused,
        services.flusher.progress.total_bytes,
    )
    return app
