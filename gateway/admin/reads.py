"""Admin routes for restarts: prefetch a prefix into the cache, list checkpoints.

- ``POST /admin/v1/prefetch?bucket=B&prefix=P``: start (or join) a prefetch; 202 with its
  progress, 507 ``InsufficientStorage`` when the prefix would not fit under the cache's
  high watermark (nothing is fetched then), the upstream's status for an S3 error
  (``NoSuchBucket``: 404).
- ``GET /admin/v1/prefetch?bucket=B&prefix=P``: that prefetch's progress (404 if none);
  without parameters every remembered prefetch (``{"prefetches": [...]}``).
- ``GET /admin/v1/checkpoints?bucket=B&prefix=P``: checkpoint directories under P, newest
  first (core/checkpoints.py), each with its state in words, this node's pending, failed
  and held objects and an ETA; ``latest_complete`` / ``latest_durable``; ``flush``: the
  flusher's state, rate and what needs an operator. Without ``bucket`` or without
  ``prefix``: ``{"roots": [<that document per root>], "flush": ...}`` over every bucket
  the journal holds rows for (or ``bucket``), each from ``prefix`` when given, else from
  the roots found from its commit-marker rows (``CheckpointService.roots``). ``limit=N``
  describes only the N newest directories of each root (the status page asks for 10).

Errors are JSON: ``{"error": <code>, "message": <text>}``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.admin.api import ADMIN, AdminServices
from gateway.admin.status import FlusherView, status_document
from gateway.core.checkpoints import CheckpointList, CheckpointService, directory
from gateway.core.prefetch import Prefetcher, PrefetchRefused
from gateway.errors import S3Error
from gateway.flush.progress import RETRY, eta

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
    svc = request.app[ADMIN]
    service = request.app[CHECKPOINTS]
    bucket = request.query.get("bucket") or None
    prefix = request.query.get("prefix")
    limit = _limit(request)
    if isinstance(limit, web.Response):
        return limit
    view = FlusherView(svc.flusher)
    flush = await _flush_summary(svc)
    if bucket is not None and prefix is not None:
        try:
            listing = await service.checkpoints(bucket, prefix, view, limit)
        except S3Error as exc:
            return _error(exc.status, exc.code, exc.message)
        return web.json_response({**_root_doc(svc, listing), "flush": flush})
    if prefix is not None:  # every bucket, from that prefix
        roots = [(name, directory(prefix)) for name in await service.buckets()]
    else:
        roots = await service.roots(bucket)
    docs = []
    for name, root in roots:
        try:
            docs.append(_root_doc(svc, await service.checkpoints(name, root, view, limit)))
        except S3Error as exc:  # nothing local there and the upstream cannot list it
            listing = CheckpointList(name, root, [], f"{exc.code}: {exc.message}")
            docs.append(_root_doc(svc, listing))
    return web.json_response({"roots": docs, "flush": flush})


def _limit(request: web.Request) -> int | web.Response | None:
    """``limit=N``: only the N newest directories of each root are described."""
    raw = request.query.get("limit")
    if raw is None:
        return None
    if not raw.isdigit():
        return _error(400, "InvalidArgument", "limit must be a whole number")
    return int(raw)


def _root_doc(svc: AdminServices, listing: CheckpointList) -> dict[str, Any]:
    """One root's checkpoints, newest first, each with its ETA (``_etas``)."""
    found = listing.checkpoints
    complete = next((c for c in found if c.is_complete), None)
    durable = next((c for c in found if c.is_durable), None)
    return {
        "bucket": listing.bucket,
        "prefix": listing.prefix,
        "checkpoints": _etas(svc, listing),
        "latest_complete": complete.prefix if complete else None,
        "latest_durable": durable.prefix if durable else None,
        "upstream_error": listing.upstream_error,
    }


def _etas(svc: AdminServices, listing: CheckpointList) -> list[dict[str, Any]]:
    """The checkpoints as JSON with ``eta_seconds``/``eta_note``. Uploads go oldest first,
    so a checkpoint is durable once it and the older ones listed are flushed: its ETA is
    their bytes not sent yet at the node's measured rate (flush/progress.py's rules: none
    while paused, while the upstream accepts nothing, or while a failure holds it)."""
    progress = svc.flusher.progress
    rate, waiting = progress.rate_bytes_per_s(), progress.waiting_for()
    rows = [c.as_dict() for c in listing.checkpoints]
    behind_bytes = 0
    for row, checkpoint in reversed(list(zip(rows, listing.checkpoints, strict=True))):
        figures = checkpoint.figures
        behind_bytes += figures.remaining_bytes
        seconds, note = None, None
        if figures.failed_objects or figures.held_objects:
            note = f"waits for `{RETRY}`"
        elif figures.unflushed_objects:
            estimate = eta(
                movable_objects=figures.pending_objects,
                remaining_bytes=behind_bytes,
                stuck_objects=0,
                rate_bytes_per_s=rate,
                is_paused=svc.flusher.is_paused,
                waiting_for=waiting,
            )
            seconds, note = estimate.seconds, estimate.note
        row["eta_seconds"], row["eta_note"] = seconds, note
    return rows


async def _flush_summary(svc: AdminServices) -> dict[str, Any]:
    """The flusher's state, measured rate, why there is no ETA, and what needs an operator
    (the same figures as ``/admin/v1/status``)."""
    doc = await status_document(svc)
    keep = ("flush_state", "flush_rate_bytes_per_s", "eta_note", "attention")
    return {name: doc[name] for name in keep}
