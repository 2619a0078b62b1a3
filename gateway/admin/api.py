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
from gateway.clock import Clock
from gateway.flush import stuck
from gateway.flush.flusher import Flusher
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


def lane_figures(svc: AdminServices) -> list[dict[str, Any]]:
    """Per prefix lane: unflushed objects and bytes (kept in memory by the flush order)
    with the lane's flow control (the rate it may send at: its bucket's shared budget, or
    its own when S3 throttles its prefix on its own; uploads in flight, 503s, Retry-After
    pause). Lanes with nothing pending, in flight or throttled are left out. O(lanes)."""
    flusher = svc.flusher
    pending = flusher.lane_backlog()
    control = {(s.bucket, s.prefix): s for s in flusher.lane_status()}
    budgets = {b.bucket: b.rate_per_s for b in flusher.budget_status()}
    ceiling = flusher.lanes.config.rate_per_s
    out = []
    for ident in sorted(set(pending) | set(control)):
        n, size = pending.get(ident, (0, 0))
        lane = control.get(ident)
        if n == 0 and (lane is None or (lane.in_flight == 0 and lane.throttles == 0)):
            continue
        out.append(
            {
                "bucket": ident[0],
                "prefix": ident[1],
                "pending_objects": n,
                "pending_bytes": size,
                "in_flight": lane.in_flight if lane else 0,
                "rate_limit_per_s": lane.rate_limit_per_s if lane else ceiling,
                "throttled_503": lane.throttles if lane else 0,
                "paused_until_s": lane.paused_until_s if lane else None,
                "isolated": lane.is_isolated if lane else False,
                "bucket_rate_per_s": budgets.get(ident[0]),
            }
        )
    return out


async def status(request: web.Request) -> web.Response:
    svc = request.app[ADMIN]
    stats = await svc.journal.stats()
    lanes = lane_figures(svc)
    flusher = svc.flusher.status()
    backlog = stats.backlog
    oldest = (
        None
        if backlog.oldest_acked_s is None
        else max(0.0, svc.clock.wall() - backlog.oldest_acked_s)
    )
    now = page.sample_of(stats, svc.clock.wall(), svc.flusher.is_paused)
    rate = page.drain_rate([*request.app[page.HISTORY].history.samples, now])
    return _json(
        {
            "pending_objects": backlog.pending_objects,
            "pending_bytes": backlog.pending_bytes,
            "flushing_objects": backlog.flushing_objects,
            "flushed_objects": stats.flushed_objects,
            "flushed_bytes": stats.flushed_bytes,
            "failed_objects": backlog.failed_objects,
            "oldest_pending_seconds": oldest,
            "flush_state": "paused" if svc.flusher.is_paused else "running",
            # Flushed lately (this backlog, since the last pause, at most a minute), and
            # the ETA it gives; null while paused or unknown.
            "flush_rate_bytes_per_s": rate,
            "eta_seconds": (
                page.eta_s(backlog.pending_bytes, rate)
                if backlog.pending_objects > backlog.failed_objects or not backlog.pending_objects
                else None  # only failed objects are left: they wait for an operator
            ),
            "cache_used_bytes": stats.cached_bytes,
            "cache_capacity_bytes": svc.capacity_bytes,
            "retries": flusher.retries,
            "throttled": flusher.throttles,
            "last_error": flusher.last_error,
            "lanes": lanes,
            **{name: figure() for name, figure in svc.status_extras.items()},
        }
    )


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

    ``failed_objects`` says how many of the pending objects failed permanently and
    ``held_objects`` how many are commit markers held back behind one: they wait for an
    operator (``POST /admin/v1/flush/retry``), not for time, so a waiting drain returns as
    soon as nothing else is left, rather than at its timeout."""
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
    return _json(
        {
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
    )


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
    things happen; the gauges mirroring journal state are refreshed here, at scrape, from
    the figures kept in memory (O(lanes), no query)."""
    svc = request.app[ADMIN]
    stats = await svc.journal.stats()
    backlog = stats.backlog
    gm.PENDING_OBJECTS.set(backlog.pending_objects)
    gm.PENDING_BYTES.set(backlog.pending_bytes)
    gm.FAILED_OBJECTS.set(backlog.failed_objects)
    gm.FLUSHED_OBJECTS.set(stats.flushed_objects)
    gm.FLUSHED_BYTES.set(stats.flushed_bytes)
    gm.CACHE_USED_BYTES.set(stats.cached_bytes)
    oldest = backlog.oldest_acked_s
    gm.RECOVERY_POINT_S.set(0.0 if oldest is None else max(0.0, svc.clock.wall() - oldest))
    # Lanes come and go: rebuild their series so a finished lane does not linger.
    for gauge in (gm.LANE_RATE, gm.LANE_PENDING_OBJECTS, gm.LANE_PENDING_BYTES):
        gauge.clear()
    for lane in lane_figures(svc):
        labels = (lane["bucket"], lane["prefix"])
        gm.LANE_RATE.labels(*labels).set(lane["rate_limit_per_s"])
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
    page.install(app, services.journal, services.clock, lambda: services.flusher.is_paused)
    return app
