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
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field

from aiohttp import web

from gateway.clock import Clock
from gateway.store.figures import Stats
from gateway.store.journal import Journal

SAMPLE_EVERY_S = 2.0
HISTORY_S = 15 * 60.0
# The drain rate behind an ETA looks back at most this far, and never past the start of the
# current backlog or the last moment the flusher was paused: a one-minute average of a
# drain that began four seconds ago (mostly idle time) gave ETAs a hundred times too long.
RATE_SPAN_S = 60.0


@dataclass(frozen=True, slots=True)
class Sample:
    """Totals at one wall-clock instant (seconds since the epoch)."""

    at_s: float
    flushed_bytes: int
    flushed_objects: int
    pending_bytes: int
    pending_objects: int
    is_paused: bool = False  # the flusher was paused at that instant

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


def drain_rate(samples: Sequence[Sample]) -> float | None:
    """Bytes/s flushed lately, for an ETA: from the newest sample back over the current
    drain only, i.e. to the first sample of the current backlog (after the last one with
    nothing pending) or of the current run of the flusher (after the last one taken
    paused), and at most ``RATE_SPAN_S``. (When the newest sample follows such a boundary
    at once, the boundary itself is the start.) None without two samples apart in time, or
    when the newest one was taken paused."""
    if not samples or samples[-1].is_paused:
        return None
    last = samples[-1]
    first: Sample | None = None
    for sample in reversed(samples[:-1]):
        if last.at_s - sample.at_s > RATE_SPAN_S:
            break
        if sample.pending_bytes == 0 or sample.is_paused:
            first = first or sample
            break
        first = sample
    if first is None or last.at_s <= first.at_s:
        return None
    return max(0.0, (last.flushed_bytes - first.flushed_bytes) / (last.at_s - first.at_s))


def eta_s(pending_bytes: int, rate_bytes_per_s: float | None) -> float | None:
    """Seconds until ``pending_bytes`` are flushed at that rate (0 when nothing is
    pending; None when the rate is unknown, zero, or the flusher is paused)."""
    if pending_bytes == 0:
        return 0.0
    if not rate_bytes_per_s:
        return None
    return pending_bytes / rate_bytes_per_s


@dataclass(slots=True)
class HistorySource:
    """What the sampler reads, and the ring it fills."""

    journal: Journal
    clock: Clock
    is_paused: Callable[[], bool] = lambda: False
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


def sample_of(stats: Stats, at_s: float, is_paused: bool) -> Sample:
    return Sample(
        at_s=at_s,
        flushed_bytes=stats.flushed_bytes,
        flushed_objects=stats.flushed_objects,
        pending_bytes=stats.backlog.pending_bytes,
        pending_objects=stats.backlog.pending_objects,
        is_paused=is_paused,
    )


def take_sample(src: HistorySource) -> Sample:
    return sample_of(src.journal.figures.stats(), src.clock.wall(), src.is_paused())


async def history_sampler(app: web.Application) -> AsyncIterator[None]:
    """cleanup_ctx: samples the totals as they change while the admin app is up."""
    src = app[HISTORY]
    src.history.add(take_sample(src))  # where the history starts
    src.journal.add_listener(src.on_changes)
    yield
    src.journal.remove_listener(src.on_changes)


async def history(request: web.Request) -> web.Response:
    """``GET /admin/v1/history``: ``{"interval_seconds", "samples": [{t, flushed_bytes,
    flushed_objects, pending_bytes, pending_objects}, ...]}``, oldest first, with a fresh
    sample of this instant appended (not stored) so the last point is always current."""
    src = request.app[HISTORY]
    now = take_sample(src)
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


def install(
    app: web.Application, journal: Journal, clock: Clock, is_paused: Callable[[], bool]
) -> None:
    """Add the page, the history endpoint and the sampler to the admin app."""
    app[HISTORY] = HistorySource(journal, clock, is_paused)
    app.cleanup_ctx.append(history_sampler)
    app.router.add_get("/", status_page)
    app.router.add_get("/admin/v1/history", history)
