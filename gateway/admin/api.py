"""The admin listener's aiohttp app. JSON field names are the contract of DESIGN.md."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from gateway.clock import Clock
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


ADMIN = web.AppKey("admin_services", AdminServices)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.json_response(data, status=status)


async def healthz(request: web.Request) -> web.Response:
    return _json({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    ready = request.app[ADMIN].is_ready
    return _json({"ready": ready}, status=200 if ready else 503)


async def status(request: web.Request) -> web.Response:
    svc = request.app[ADMIN]
    stats = await svc.journal.stats()
    lanes = await svc.journal.lanes()
    flusher = svc.flusher.status()
    backlog = stats.backlog
    oldest = (
        None
        if backlog.oldest_acked_s is None
        else max(0.0, svc.clock.wall() - backlog.oldest_acked_s)
    )
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
            "cache_used_bytes": stats.cached_bytes,
            "cache_capacity_bytes": svc.capacity_bytes,
            "retries": flusher.retries,
            "throttled": flusher.throttles,
            "last_error": flusher.last_error,
            "lanes": [
                {
                    "bucket": b,
                    "prefix": p,
                    "pending_objects": n,
                    "pending_bytes": size,
                    "rate_limit_per_s": None,
                    "throttled_503": 0,
                }
                for b, p, n, size in lanes
            ],
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
    """A fence: is everything acknowledged before this call (under bucket/prefix) durable?"""
    svc = request.app[ADMIN]
    bucket = request.query.get("bucket") or None
    prefix = request.query.get("prefix", "")
    wait = request.query.get("wait", "false").lower() in ("1", "true", "yes")
    timeout_s = _float_arg(request, "timeout", 30.0)
    fence = svc.journal.last_seq
    objects, size = await svc.journal.wait_flushed(
        bucket, prefix, fence, timeout_s if wait else 0.0
    )
    return _json({"drained": objects == 0, "pending_objects": objects, "pending_bytes": size})


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
    count = await request.app[ADMIN].journal.retry_failed()
    return _json({"retried_objects": count})


class Metrics:
    """Prometheus gauges refreshed from the journal and flusher at each scrape."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()

        def g(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, registry=self.registry)

        self.pending_objects = g(
            "gateway_pending_objects", "Acknowledged objects not yet durable upstream"
        )
        self.pending_bytes = g("gateway_pending_bytes", "Bytes not yet durable upstream")
        self.failed_objects = g("gateway_failed_objects", "Objects whose flush failed permanently")
        self.flushed_objects = g("gateway_flushed_objects", "Objects flushed upstream (lifetime)")
        self.flushed_bytes = g("gateway_flushed_bytes", "Bytes flushed upstream (lifetime)")
        self.recovery_point = g(
            "gateway_oldest_unflushed_seconds", "Age of the oldest unflushed write"
        )
        self.retries = g("gateway_flush_retries", "Flush attempts retried since start")
        self.throttles = g(
            "gateway_flush_throttled", "Flush attempts answered 503/SlowDown since start"
        )


METRICS = web.AppKey("admin_metrics", Metrics)


async def metrics(request: web.Request) -> web.Response:
    svc, m = request.app[ADMIN], request.app[METRICS]
    stats = await svc.journal.stats()
    flusher = svc.flusher.status()
    m.pending_objects.set(stats.backlog.pending_objects)
    m.pending_bytes.set(stats.backlog.pending_bytes)
    m.failed_objects.set(stats.backlog.failed_objects)
    m.flushed_objects.set(stats.flushed_objects)
    m.flushed_bytes.set(stats.flushed_bytes)
    oldest = stats.backlog.oldest_acked_s
    m.recovery_point.set(0 if oldest is None else max(0.0, svc.clock.wall() - oldest))
    m.retries.set(flusher.retries)
    m.throttles.set(flusher.throttles)
    body = generate_latest(m.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_admin_app(services: AdminServices) -> web.Application:
    app = web.Application()
    app[ADMIN] = services
    app[METRICS] = Metrics()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/admin/v1/status", status)
    app.router.add_get("/admin/v1/drain", drain)
    app.router.add_get("/admin/v1/objects/{bucket}/{key:.+}", object_state)
    app.router.add_post("/admin/v1/flush/pause", flush_pause)
    app.router.add_post("/admin/v1/flush/resume", flush_resume)
    app.router.add_post("/admin/v1/flush/retry", flush_retry)
    app.router.add_get("/metrics", metrics)
    return app
