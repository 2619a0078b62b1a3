"""The figures of ``GET /admin/v1/status``, ``/metrics``, the status page and ``gateway
status``: one computation, so they never disagree.

What each count means (disjoint; README and docs/operations.md say the same):

- ``pending``: acknowledged, not durable upstream yet, and will get there on its own
  (queued, backing off, or flushing: ``flushing_objects`` is part of it);
- ``failed``: failed permanently; waits for the cause to be fixed and ``gateway retry``;
- ``held``: commit markers held back behind a failed object (the bucket never shows a
  marker without its shards); they go after the retry;
- ``unflushed`` = pending + failed + held: everything not durable upstream yet (what a
  script means by "not safe yet").

Rates are measured as the bytes move (flush/progress.py): bytes sent of uploads in flight
count, and an idle gateway shows 0. The lanes show the measured rate (requests accepted per
second) and the limit (what the lane may send now) in separate fields.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.flush.flusher import Flusher
from gateway.flush.progress import RESUME, RETRY, eta
from gateway.store.queue import FlushQueue
from gateway.store.rows import directory_prefixes

if TYPE_CHECKING:  # api.py imports this module
    from gateway.admin.api import AdminServices


@dataclass(frozen=True, slots=True)
class FlusherView:
    """The flusher as core's ``FlushView`` (held markers, bytes sent in flight)."""

    flusher: Flusher

    def held_markers(self) -> Collection[tuple[str, str]]:
        return self.flusher.order.held_markers()

    def sent_bytes(self, bucket: str | None, prefix: str) -> int:
        return self.flusher.progress.sent_bytes(bucket, prefix)


@dataclass(frozen=True, slots=True)
class Held:
    """Commit markers held back behind failed objects: count, bytes, per lane."""

    objects: int
    size_bytes: int
    by_lane: dict[tuple[str, str], tuple[int, int]]  # objects, bytes


async def held_markers(svc: AdminServices) -> Held:
    """The held markers (few: one per checkpoint at most) with their sizes."""
    by_lane: dict[tuple[str, str], tuple[int, int]] = {}
    total = 0
    keys = svc.flusher.order.held_markers()
    for bucket, key in keys:
        row = await svc.journal.get(bucket, key)
        size = row.meta.size_bytes if row is not None else 0
        total += size
        ident = (bucket, svc.flusher.lanes.prefix_of(key))
        n, lane_bytes = by_lane.get(ident, (0, 0))
        by_lane[ident] = (n + 1, lane_bytes + size)
    return Held(len(keys), total, by_lane)


def own_failed(
    lanes: Iterable[tuple[str, str]], failed_under: Callable[[str, str], tuple[int, int]]
) -> dict[tuple[str, str], tuple[int, int]]:
    """Failed objects and bytes of each lane alone. ``failed_under(bucket, prefix)`` gives
    them for everything under a directory prefix, which includes the lanes nested in it
    (``a/`` holds ``a/b/c/``'s keys too): each lane gives its whole count back to its
    nearest enclosing lane. Every lane with an unflushed row MUST be in ``lanes``."""
    idents = set(lanes)
    own = {ident: list(failed_under(*ident)) for ident in idents}
    for bucket, prefix in idents:
        for outer in reversed(directory_prefixes(prefix)[:-1]):
            if (bucket, outer) in own:
                n, size = failed_under(bucket, prefix)
                own[(bucket, outer)][0] -= n
                own[(bucket, outer)][1] -= size
                break
    return {ident: (max(0, n), max(0, size)) for ident, (n, size) in own.items()}


def lane_figures(svc: AdminServices, held: Held) -> list[dict[str, Any]]:
    """Per prefix lane: pending objects and bytes (failed and held ones apart), uploads in
    flight, the measured rate (requests accepted per second, 0 when idle) and the limit
    (``rate_limit_per_s``: what it may send now, its bucket's shared budget or its own),
    503s, Retry-After pause. Lanes with nothing unflushed, in flight or throttled are left
    out. O(lanes x depth)."""
    flusher = svc.flusher
    backlog = flusher.lane_backlog()
    control = {(s.bucket, s.prefix): s for s in flusher.lane_status()}
    budgets = {b.bucket: b.rate_per_s for b in flusher.budget_status()}
    measured = flusher.progress.lane_rates()
    ceiling = flusher.lanes.config.rate_per_s
    figures = svc.journal.figures

    def failed_under(bucket: str, prefix: str) -> tuple[int, int]:
        tally = figures.unflushed_under(bucket, prefix)
        return tally.failed_objects, tally.failed_bytes

    failed = own_failed(backlog, failed_under) if figures.stats().backlog.failed_objects else {}
    out = []
    for ident in sorted(set(backlog) | set(control)):
        n, size = backlog.get(ident, (0, 0))
        lane = control.get(ident)
        if n == 0 and (lane is None or (lane.in_flight == 0 and lane.throttles == 0)):
            continue
        failed_n, failed_bytes = failed.get(ident, (0, 0))
        held_n, held_bytes = held.by_lane.get(ident, (0, 0))
        out.append(
            {
                "bucket": ident[0],
                "prefix": ident[1],
                "pending_objects": max(0, n - failed_n - held_n),
                "pending_bytes": max(0, size - failed_bytes - held_bytes),
                "failed_objects": failed_n,
                "held_objects": held_n,
                "in_flight": lane.in_flight if lane else 0,
                "accepted_per_s": round(measured.get(ident, 0.0), 3),
                "rate_limit_per_s": lane.rate_limit_per_s if lane else ceiling,
                "throttled_503": lane.throttles if lane else 0,
                "paused_until_s": lane.paused_until_s if lane else None,
                "isolated": lane.is_isolated if lane else False,
                "bucket_rate_per_s": budgets.get(ident[0]),
            }
        )
    return out


async def status_document(svc: AdminServices) -> dict[str, Any]:
    """The ``/admin/v1/status`` document (see the module docstring for the counts)."""
    stats = svc.journal.figures.stats()
    backlog = stats.backlog
    flusher = svc.flusher
    progress = flusher.progress
    counters = flusher.status()
    held = await held_markers(svc)
    failed_n, failed_bytes = backlog.failed_objects, backlog.failed_bytes
    pending_n = max(0, backlog.pending_objects - failed_n - held.objects)
    pending_bytes = max(0, backlog.pending_bytes - failed_bytes - held.size_bytes)
    sent = progress.sent_bytes()
    rate = progress.rate_bytes_per_s()
    waiting = progress.waiting_for()
    estimate = eta(
        movable_objects=pending_n,
        remaining_bytes=pending_bytes - sent,
        stuck_objects=failed_n + held.objects,
        rate_bytes_per_s=rate,
        is_paused=flusher.is_paused,
        waiting_for=waiting,
    )
    oldest = backlog.oldest_acked_s
    doc: dict[str, Any] = {
        "pending_objects": pending_n,
        "pending_bytes": pending_bytes,
        "flushing_objects": backlog.flushing_objects,
        "failed_objects": failed_n,
        "failed_bytes": failed_bytes,
        "held_objects": held.objects,
        "held_bytes": held.size_bytes,
        "unflushed_objects": backlog.pending_objects,
        "unflushed_bytes": backlog.pending_bytes,
        "in_flight_sent_bytes": sent,
        "flushed_objects": stats.flushed_objects,
        "flushed_bytes": stats.flushed_bytes,
        "oldest_pending_seconds": None if oldest is None else max(0.0, svc.clock.wall() - oldest),
        "flush_state": "paused" if flusher.is_paused else "running",
        "flush_rate_bytes_per_s": round(rate, 1),
        "eta_seconds": estimate.seconds,
        "eta_note": estimate.note,
        "cache_used_bytes": stats.cached_bytes,
        "cache_capacity_bytes": svc.capacity_bytes,
        "retries": counters.retries,
        "throttled": counters.throttles,
        "last_error": counters.last_error,
        "lanes": lane_figures(svc, held),
    }
    doc["attention"] = await attention(svc, doc, waiting)
    return doc


async def attention(
    svc: AdminServices, doc: dict[str, Any], waiting: str | None
) -> list[dict[str, str | None]]:
    """What needs an operator, first: paused, failed (and held), waiting for the upstream;
    each with the command that resolves it (None: the upstream must come back)."""
    out: list[dict[str, str | None]] = []
    if doc["flush_state"] == "paused":
        message = "flusher paused: nothing is uploaded until it is resumed"
        out.append({"state": "paused", "message": message, "command": RESUME})
    if doc["failed_objects"]:
        n, held = doc["failed_objects"], doc["held_objects"]
        message = f"{n} object{'s' if n != 1 else ''} failed permanently"
        if held:
            message += f" ({held} commit marker{'s' if held != 1 else ''} held back behind them)"
        oldest = await FlushQueue(svc.journal).failed(1)
        if oldest:
            message += f"; e.g. {oldest[0].meta.bucket}/{oldest[0].meta.key}: "
            message += oldest[0].last_error or "no error recorded"
        message += "; fix the cause, then retry them"
        out.append({"state": "failed", "message": message, "command": RETRY})
    if waiting is not None and doc["pending_objects"] and doc["flush_state"] == "running":
        out.append(
            {"state": "waiting", "message": f"waiting for the upstream: {waiting}", "command": None}
        )
    return out
