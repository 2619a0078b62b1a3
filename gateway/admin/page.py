"""The admin listener's status page (``GET /``) and the flush history it charts.

The page is one static HTML file (inline CSS, JS and SVG: no CDN, works air-gapped) that
polls ``/admin/v1/status`` and ``/admin/v1/history``. The history is kept here, in the
admin app: the journal's flushed and pending totals (in-memory figures, O(1)) go into a
bounded ring when they change, at most once per ``SAMPLE_EVERY_S``, so the page can draw
the flush rate over the last ``HISTORY_S`` seconds without any state in the browser.
Nothing runs on a timer: an idle gateway records nothing (the totals did not move, and the
history endpoint appends the present), and nobody pays for a page nobody looks at.
"""

from __future__ import annotations

import collections
import importlib.resources
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from gateway.clock import Clock
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
    last_sample_s: float | None = None

    def on_changes(self) -> None:
        """Journal listener (after each committed group): sample if the last one is old
        enough. O(1): the figures are in memory."""
        now_s = self.clock.monotonic()
        if self.last_sample_s is None or now_s - self.last_sample_s >= SAMPLE_EVERY_S:
            self.last_sample_s = now_s
            self.history.add(take_sample(self.journal, self.clock))


HISTORY = web.AppKey("flush_history", HistorySource)


def take_sample(journal: Journal, clock: Clock) -> Sample:
    stats = journal.figures.stats()
    return Sample(
        at_s=clock.wall(),
        flushed_bytes=stats.flushed_bytes,
        flushed_objects=stats.flushed_objects,
        pending_bytes=stats.backlog.pending_bytes,
        pending_objects=stats.backlog.pending_objects,
    )


async def history_sampler(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: samples the totals as they change while the admin app is up."""
    src = app[HISTORY]
    src.history.add(take_sample(src.journal, src.clock))  # where the history starts
    src.journal.add_listener(src.on_changes)
    yield
    src.journal.remove_listener(src.on_changes)


async def history(request: web.Request) -> web.Response:
    """``GET /admin/v1/history``: ``{"interval_seconds", "samples": [{t, flushed_bytes,
    flushed_objects, pending_bytes, pending_objects}, ...]}``, oldest first, with a fresh
    sample of this instant appended (not stored) so the last point is always current."""
    src = request.app[HISTORY]
    now = take_sample(src.journal, src.clock)
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
