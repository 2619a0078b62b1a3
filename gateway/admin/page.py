"""The admin listener's status page (``GET /``) and the flush history it charts.

The page is one static HTML file (inline CSS, JS and SVG: no CDN, works air-gapped) that
polls ``/admin/v1/status``, ``/admin/v1/history`` and ``/admin/v1/checkpoints``. The
history is kept here, in the admin app: the journal's totals and the flusher's progress
counter (bytes of finished uploads plus bytes sent of those in flight; in-memory figures,
O(1)) go into a bounded ring when the journal changes, at most once per ``SAMPLE_EVERY_S``,
so the page can chart the flush rate over up to ``HISTORY_S`` seconds without any state in
the browser; the chart says the span its samples really cover. Nothing runs on a timer: an
idle gateway records nothing (the totals did not move, and the history endpoint appends
the present), and nobody pays for a page nobody looks at. The rate and ETA figures come
from the status document (flush/progress.py), never from this history.
"""

from __future__ import annotations

import collections
import importlib.resources
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiohttp import web

from gateway.clock import Clock
from gateway.store.figures import Stats
from gateway.store.journal import Journal

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
    is_paused: bool = False  # the flusher was paused at that instant
    progress_bytes: int = 0  # the flusher's progress counter (bytes in flight count)

    def as_json(self) -> dict[str, float | int | bool]:
        return {
            "t": self.at_s,
            "flushed_bytes": self.flushed_bytes,
            "flushed_objects": self.flushed_objects,
            "unflushed_bytes": self.pending_bytes,
            "unflushed_objects": self.pending_objects,
            "progress_bytes": self.progress_bytes,
            "paused": self.is_paused,
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
    is_paused: Callable[[], bool] = lambda: False
    progress_bytes: Callable[[], int] = lambda: 0
    history: FlushHistory = field(default_factory=FlushHistory)
    last_sample_s: float | None = None

    def on_changes(self) -> None:
        """Journal listener (after each committed group): sample if the last one is old
        enough. O(1): the figures are in memory."""
        now_s = self.clock.monotonic()
        if self.last_sample_s is None or now_s - self.last_sample_s >= SAMPLE_EVERY_S:
            self.last_sample_s = now_s
            self.history.add(take_sample(self))


HISTORY = web.AppKey("flush_history", HistorySource)


def sample_of(stats: Stats, at_s: float, is_paused: bool, progress_bytes: int = 0) -> Sample:
    return Sample(
        at_s=at_s,
        flushed_bytes=stats.flushed_bytes,
        flushed_objects=stats.flushed_objects,
        pending_bytes=stats.backlog.pending_bytes,
        pending_objects=stats.backlog.pending_objects,
        is_paused=is_paused,
        progress_bytes=progress_bytes,
    )


def take_sample(src: HistorySource) -> Sample:
    stats = src.journal.figures.stats()
    return sample_of(stats, src.clock.wall(), src.is_paused(), src.progress_bytes())


async def history_sampler(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: samples the totals as they change while the admin app is up."""
    src = app[HISTORY]
    src.history.add(take_sample(src))  # where the history starts
    src.journal.add_listener(src.on_changes)
    yield
    src.journal.remove_listener(src.on_changes)


async def history(request: web.Request) -> web.Response:
    """``GET /admin/v1/history``: ``{"interval_seconds", "kept_seconds", "samples": [{t,
    flushed_bytes, flushed_objects, unflushed_bytes, unflushed_objects, progress_bytes,
    paused}, ...]}``, oldest first, with a fresh sample of this instant appended (not
    stored) so the last point is always current. ``progress_bytes`` counts bytes sent of
    uploads in flight (its differences are the flush rate); ``unflushed_*`` count every
    object not durable yet (failed and held ones too)."""
    src = request.app[HISTORY]
    now = take_sample(src)
    samples = [s.as_json() for s in src.history.samples] + [now.as_json()]
    return web.json_response(
        {"interval_seconds": SAMPLE_EVERY_S, "kept_seconds": HISTORY_S, "samples": samples}
    )


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


def install(
    app: web.Application,
    journal: Journal,
    clock: Clock,
    is_paused: Callable[[], bool],
    progress_bytes: Callable[[], int],
) -> None:
    """Add the page, the history endpoint and the sampler to the admin app."""
    app[HISTORY] = HistorySource(journal, clock, is_paused, progress_bytes)
    app.cleanup_ctx.append(history_sampler)
    app.router.add_get("/", status_page)
    app.router.add_get("/admin/v1/history", history)
