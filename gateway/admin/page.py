"""The admin listener's status page (``GET /``) and the flush history it charts.

The page is one static HTML file (inline CSS, JS and SVG: no CDN, works air-gapped) that
polls ``/admin/v1/status`` and ``/admin/v1/history``. The history is sampled here, in the
admin app, by one task owned by the app's ``cleanup_ctx``: every ``SAMPLE_EVERY_S`` it
records the journal's flushed and pending totals into a bounded ring, so the page can draw
the flush rate over the last ``HISTORY_S`` seconds without any state in the browser.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.resources
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from gateway.clock import Clock
from gateway.store.journal import Journal

log = logging.getLogger(__name__)

SAMPLE_EVERY_S = 2.0
HISTORY_S = 15 * 60.0


@dataclass(frozen=True, slots=True)
class Sample:
    """Totals at one wall-clock instant (seconds since the epoch)."""

    at_s: float
    flushed_bytes: int
    flushed_objects: int
    pending_bytes: int
    pending_objects: int

    def as_json(self) -> dict[str, float | int]:
        return {
            "t": self.at_s,
            "flushed_bytes": self.flushed_bytes,
            "flushed_objects": self.flushed_objects,
            "pending_bytes": self.pending_bytes,
            "pending_objects": self.pending_objects,
        }


@dataclass(slots=True)
class FlushHistory:
    """A ring of samples, oldest first. Loop-bound: touched only from the admin app's loop."""

    capacity: int = int(HISTORY_S / SAMPLE_EVERY_S)
    samples: collections.deque[Sample] = field(default_factory=collections.deque)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        while len(self.samples) > self.capacity:
            self.samples.popleft()


@dataclass(slots=True)
class HistorySource:
    """What the sampler reads, and the ring it fills."""

    journal: Journal
    clock: Clock
    history: FlushHistory = field(default_factory=FlushHistory)


HISTORY = web.AppKey("flush_history", HistorySource)


async def take_sample(journal: Journal, clock: Clock) -> Sample:
    stats = await journal.stats()
    return Sample(
        at_s=clock.wall(),
        flushed_bytes=stats.flushed_bytes,
        flushed_objects=stats.flushed_objects,
        pending_bytes=stats.backlog.pending_bytes,
        pending_objects=stats.backlog.pending_objects,
    )


async def _sample_forever(app: web.Application) -> None:
    while True:
        try:
            src = app[HISTORY]
            src.history.add(await take_sample(src.journal, src.clock))
        except Exception:  # the worker loop: one bad sample must not end the history
            log.exception("flush history sample failed")
        await asyncio.sleep(SAMPLE_EVERY_S)


async def history_sampler(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: runs the sampler while the admin app is up; cancels it on cleanup."""
    task = asyncio.create_task(_sample_forever(app), name="flush-history")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def history(request: web.Request) -> web.Response:
    """``GET /admin/v1/history``: ``{"interval_seconds", "samples": [{t, flushed_bytes,
    flushed_objects, pending_bytes, pending_objects}, ...]}``, oldest first, with a fresh
    sample of this instant appended (not stored) so the last point is always current."""
    src = request.app[HISTORY]
    now = await take_sample(src.journal, src.clock)
    samples = [s.as_json() for s in src.history.samples] + [now.as_json()]
    return web.json_response({"interval_seconds": SAMPLE_EVERY_S, "samples": samples})


def _page_html() -> bytes:
    return importlib.resources.files("gateway.admin").joinpath("static/status.html").read_bytes()


async def status_page(request: web.Request) -> web.Response:
    """``GET /``: the live status page (HTML; figures are filled in by its script)."""
    return web.Response(
        body=_page_html(),
        content_type="text/html",
        charset="utf-8",
        headers={"Cache-Control": "no-store"},
    )


def install(app: web.Application, journal: Journal, clock: Clock) -> None:
    """Add the page, the history endpoint and the sampler to the admin app."""
    app[HISTORY] = HistorySource(journal, clock)
    app.cleanup_ctx.append(history_sampler)
    app.router.add_get("/", status_page)
    app.router.add_get("/admin/v1/history", history)
