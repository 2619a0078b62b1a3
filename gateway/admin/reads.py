"""Admin routes for restarts: prefetch a prefix into the cache, list checkpoints.

- ``POST /admin/v1/prefetch?bucket=B&prefix=P``: start (or join) a prefetch; 202 with its
  progress, 507 ``InsufficientStorage`` when the prefix would not fit under the cache's
  high watermark (nothing is fetched then), the upstream's status for an S3 error
  (``NoSuchBucket``: 404).
- ``GET /admin/v1/prefetch?bucket=B&prefix=P``: that prefetch's progress (404 if none);
  without parameters every remembered prefetch (``{"prefetches": [...]}``).
- ``GET /admin/v1/checkpoints?bucket=B&prefix=P``: checkpoint directories under P, newest
  first (core/checkpoints.py), and ``latest_complete`` / ``latest_durable``.

Errors are JSON: ``{"error": <code>, "message": <text>}``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.core.checkpoints import CheckpointService, directory
from gateway.core.prefetch import Prefetcher, PrefetchRefused
from gateway.errors import S3Error

PREFETCHER = web.AppKey("prefetcher", Prefetcher)
CHECKPOINTS = web.AppKey("checkpoints", CheckpointService)


def install(app: web.Application, prefetcher: Prefetcher, checkpoints: CheckpointService) -> None:
    """Register the routes on the admin app (before it starts)."""
    app[PREFETCHER] = prefetcher
    app[CHECKPOINTS] = checkpoints
    app.router.add_post("/admin/v1/prefetch", start_prefetch)
    app.router.add_get("/admin/v1/prefetch", prefetch_progress)
    app.router.add_get("/admin/v1/checkpoints", list_checkpoints)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": code, "message": message}, status=status)


def _target(request: web.Request) -> tuple[str, str] | web.Response:
    bucket = request.query.get("bucket", "")
    if not bucket:
        return _error(400, "InvalidArgument", "the bucket parameter is required")
    return bucket, request.query.get("prefix", "")


async def start_prefetch(request: web.Request) -> web.Response:
    target = _target(request)
    if isinstance(target, web.Response):
        return target
    prefetcher = request.app[PREFETCHER]
    try:
        job = await prefetcher.start(*target)
    except PrefetchRefused as exc:
        return _error(507, "InsufficientStorage", str(exc))
    except S3Error as exc:
        return _error(exc.status, exc.code, exc.message)
    return web.json_response(_progress(prefetcher, job.bucket, job.prefix), status=202)


async def prefetch_progress(request: web.Request) -> web.Response:
    prefetcher = request.app[PREFETCHER]
    if "bucket" not in request.query:
        return web.json_response({"prefetches": prefetcher.status()})
    target = _target(request)
    if isinstance(target, web.Response):
        return target
    progress = _progress(prefetcher, *target)
    if progress is None:
        return _error(404, "NoSuchPrefetch", "no prefetch of this bucket and prefix is known")
    return web.json_response(progress)


def _progress(prefetcher: Prefetcher, bucket: str, prefix: str) -> dict[str, Any] | None:
    for job in prefetcher.status():
        if job["bucket"] == bucket and job["prefix"] == prefix:
            return job
    return None


async def list_checkpoints(request: web.Request) -> web.Response:
    target = _target(request)
    if isinstance(target, web.Response):
        return target
    bucket, prefix = target
    try:
        found = await request.app[CHECKPOINTS].checkpoints(bucket, prefix)
    except S3Error as exc:
        return _error(exc.status, exc.code, exc.message)
    complete = next((c for c in found if c.is_complete), None)
    durable = next((c for c in found if c.is_durable), None)
    return web.json_response(
        {
            "bucket": bucket,
            "prefix": directory(prefix),
            "checkpoints": [c.as_dict() for c in found],
            "latest_complete": complete.prefix if complete else None,
            "latest_durable": durable.prefix if durable else None,
        }
    )
