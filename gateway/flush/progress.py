"""Flush progress as it happens: bytes of uploads in flight, measured rates, and the ETA rules.

What the operator reads (status, page, metrics, ``gateway checkpoints``) must be what is
true now, so nothing here is an average over a history that outlives the work:

- **Bytes in flight count.** Every body the flusher hands to the upstream client is wrapped
  in a ``CountingBody``: what aiohttp reads of it (to send it) counts at once, so a 2 GiB
  object shows its progress while it goes, not 0 % for a minute and then 100 %. Seeking back
  (a retried part, aiohttp rewinding before it sends) un-counts what will be sent again; an
  upload that fails un-counts all it sent; one that succeeds counts its whole size (an early
  multipart upload sent its parts before the row was claimed).
- **Rates decay to 0.** A rate is what moved in the last ``WINDOW_S`` seconds divided by
  that span (or by the time since the current burst of work began, when that is shorter: a
  drain that began 4 s ago is measured over 4 s, not 10). Ten seconds after the last byte
  moved the rate is exactly 0: an idle gateway never shows a flush rate.
- **No ETA while nothing is accepted.** When the latest thing the upstream did was fail a
  request (connection refused, 5xx, throttled), with no byte or request accepted since,
  there is no ETA but ``waiting for the upstream: <that error>`` (``eta``).

``FlushProgress`` is written from the event loop (``upload``, ``accepted``, ``failed``) and
from aiohttp's executor threads (``CountingBody`` reads), so every figure is kept under one
lock; ``RateWindow`` and ``eta`` are pure (times are passed in) and tested with a fake clock.
"""

from __future__ import annotations

import collections
import contextlib
import io
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO, cast

from gateway.upstream.client import PartSource

WINDOW_S = 10.0  # rates are what moved over (at most) this many seconds back
_STEP_S = 0.1  # resolution of a rate window
_MIN_SPAN_S = 1.0  # a burst younger than this is still divided by a second (no spikes)
_MAX_LANES = 1024  # lane windows kept before idle ones are dropped (also at each read)
RESUME = "gateway resume"
RETRY = "gateway retry"


class RateWindow:
    """An amount per second over the last ``window_s`` seconds. Pure: every call takes the
    time it happens at (monotonic seconds); not thread-safe (``FlushProgress`` locks).

    ``rate(now)`` is the sum recorded in the span ending at ``now`` divided by the span,
    which is ``window_s``, or the time since the current burst began when shorter (a burst
    begins with the first record after ``window_s`` without any), but at least
    ``min_span_s``. Negative amounts (work undone) are allowed; the rate never goes below
    0, and it is exactly 0 once ``window_s`` passed without a record."""

    def __init__(
        self, window_s: float = WINDOW_S, step_s: float = _STEP_S, min_span_s: float = _MIN_SPAN_S
    ) -> None:
        self.window_s, self._step_s, self._min_span_s = window_s, step_s, min_span_s
        self._slots: collections.deque[list[float]] = collections.deque()  # [slot, amount]
        self._last_s: float | None = None
        self._burst_s = 0.0

    def add(self, now_s: float, amount: float) -> None:
        if self._last_s is None or now_s - self._last_s >= self.window_s:
            self._burst_s = now_s
        self._last_s = now_s
        slot = float(int(now_s / self._step_s))
        if self._slots and self._slots[-1][0] == slot:
            self._slots[-1][1] += amount
        else:
            self._slots.append([slot, amount])
        self._prune(now_s)

    def rate(self, now_s: float) -> float:
        self._prune(now_s)
        if not self._slots:
            return 0.0
        span_s = min(self.window_s, max(self._min_span_s, now_s - self._burst_s))
        first = float(int((now_s - span_s) / self._step_s))  # the slot the span starts in
        total = sum(amount for slot, amount in self._slots if slot >= first)
        return max(0.0, total / span_s)

    @property
    def is_idle(self) -> bool:
        """Nothing recorded within the window of the last ``rate``/``add`` call."""
        return not self._slots

    def _prune(self, now_s: float) -> None:
        oldest = (now_s - self.window_s) / self._step_s - 1
        while self._slots and self._slots[0][0] < oldest:
            self._slots.popleft()


class CountingBody(io.RawIOBase):
    """A readable, seekable view of an open body file that reports every byte read of it
    (``on_read(n)``, negative after seeking back over bytes already counted). The file is
    not closed with it: its owner closes it."""

    def __init__(self, raw: BinaryIO, on_read: Callable[[int], None]) -> None:
        super().__init__()
        self._raw, self._on_read = raw, on_read
        self._counted = 0  # read since the last seek

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._raw.tell()

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        where = self._raw.seek(pos, whence)
        if self._counted:
            self._on_read(-self._counted)  # what follows is read (and counted) again
            self._counted = 0
        return where

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        data = self._raw.read(len(buffer))
        buffer[: len(data)] = data
        if data:
            self._counted += len(data)
            self._on_read(len(data))
        return len(data)


@dataclass(slots=True)
class _Upload:
    size_bytes: int
    sent_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Eta:
    """Seconds until the backlog is flushed, or None with ``note`` saying why there is none."""

    seconds: float | None
    note: str | None = None


def eta(
    *,
    movable_objects: int,
    remaining_bytes: int,
    stuck_objects: int,
    rate_bytes_per_s: float,
    is_paused: bool,
    waiting_for: str | None,
) -> Eta:
    """The ETA rules, in order:

    1. nothing left that can move: 0 (drained), or none when failed objects (and the commit
       markers held behind them) are left: they wait for ``gateway retry``, not for time;
    2. the flusher is paused: none until ``gateway resume``;
    3. the upstream's latest answer was a failure and nothing was accepted since: none,
       "waiting for the upstream: <the error>";
    4. nothing moved within the rate window: none (no measure);
    5. else ``remaining_bytes`` (pending bytes not yet sent) at the measured rate.
    """
    if movable_objects <= 0:
        if stuck_objects > 0:
            return Eta(None, f"only failed objects are left: fix the cause, then `{RETRY}`")
        return Eta(0.0)
    if is_paused:
        return Eta(None, f"flusher paused: `{RESUME}`")
    if waiting_for is not None:
        return Eta(None, f"waiting for the upstream: {waiting_for}")
    if rate_bytes_per_s <= 0:
        return Eta(None, f"nothing flushed in the last {WINDOW_S:g}s")
    return Eta(max(0, remaining_bytes) / rate_bytes_per_s)


class FlushProgress:
    """The flusher's uploads as they go (see the module docstring). ``clock`` is monotonic."""

    def __init__(self, clock: Callable[[], float], window_s: float = WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._lock = threading.Lock()
        self._uploads: dict[tuple[str, str], _Upload] = {}
        self._moved = RateWindow(window_s)
        self._done_bytes = 0
        self._lanes: dict[tuple[str, str], RateWindow] = {}
        self._last_progress_s: float | None = None
        self._last_failure_s: float | None = None
        self._last_failure: str | None = None

    # -- recording (the flusher) --------------------------------------------------------------

    @contextlib.contextmanager
    def upload(self, bucket: str, key: str, size_bytes: int) -> Iterator[None]:
        """Around one upload of ``key`` (never two of one key at once): it counts whole when
        the block ends normally, and what it sent is taken back when it raises."""
        with self._lock:
            self._uploads[(bucket, key)] = _Upload(size_bytes)
        ok = False
        try:
            yield
            ok = True
        finally:
            with self._lock:
                done = self._uploads.pop((bucket, key), _Upload(0))
                now_s = self._clock()
                if ok:
                    self._done_bytes += done.size_bytes
                    self._moved.add(now_s, done.size_bytes - done.sent_bytes)
                    self._last_progress_s = now_s
                elif done.sent_bytes:
                    self._moved.add(now_s, -done.sent_bytes)

    def body(self, bucket: str, key: str, raw: BinaryIO) -> BinaryIO:
        """``raw`` wrapped so that what is read of it counts for the upload of ``key``."""

        def on_read(n: int) -> None:
            with self._lock:
                upload = self._uploads.get((bucket, key))
                if upload is None:
                    return
                upload.sent_bytes += n
                now_s = self._clock()
                self._moved.add(now_s, n)
                if n > 0:
                    self._last_progress_s = now_s

        return cast(BinaryIO, CountingBody(raw, on_read))

    def parts(self, bucket: str, key: str, sources: Sequence[PartSource]) -> list[PartSource]:
        """``sources`` with counting bodies (``body``)."""
        return [
            PartSource(self.body(bucket, key, s.body), s.size_bytes, s.md5_hex) for s in sources
        ]

    def accepted(self, bucket: str, lane_prefix: str) -> None:
        """The upstream accepted one request of this lane."""
        with self._lock:
            now_s = self._clock()
            window = self._lanes.get((bucket, lane_prefix))
            if window is None:
                if len(self._lanes) >= _MAX_LANES:  # lanes come and go with checkpoint steps
                    self._forget_idle_lanes(now_s)
                window = self._lanes[(bucket, lane_prefix)] = RateWindow(self._window_s)
            window.add(now_s, 1.0)
            self._last_progress_s = now_s

    def failed(self, error: str) -> None:
        """A request failed in a way a retry may cure (refused, 5xx, throttled, timed out)."""
        with self._lock:
            self._last_failure_s = self._clock()
            self._last_failure = error

    # -- reading (status, page, metrics) -----------------------------------------------------

    def total_bytes(self) -> int:
        """Bytes of finished uploads (since start) plus bytes sent of those in flight: a
        counter whose differences over time are the flush rate (the history chart)."""
        with self._lock:
            return self._done_bytes + sum(u.sent_bytes for u in self._uploads.values())

    def sent_bytes(self, bucket: str | None = None, prefix: str = "") -> int:
        """Bytes sent so far of the uploads in flight under ``bucket`` (None: any) and
        ``prefix``. O(uploads in flight)."""
        with self._lock:
            return sum(
                u.sent_bytes
                for (b, k), u in self._uploads.items()
                if (bucket is None or b == bucket) and k.startswith(prefix)
            )

    def rate_bytes_per_s(self) -> float:
        with self._lock:
            return self._moved.rate(self._clock())

    def lane_rates(self) -> dict[tuple[str, str], float]:
        """Requests accepted per second, per (bucket, lane prefix) that had any lately."""
        with self._lock:
            now_s = self._clock()
            rates = {ident: w.rate(now_s) for ident, w in self._lanes.items()}
            self._forget_idle_lanes(now_s)
            return {ident: r for ident, r in rates.items() if r > 0}

    def _forget_idle_lanes(self, now_s: float) -> None:
        """Drop the windows of lanes with nothing in their window (lock held)."""
        for ident in [i for i, w in self._lanes.items() if w.rate(now_s) == 0 and w.is_idle]:
            del self._lanes[ident]

    def waiting_for(self) -> str | None:
        """The upstream's latest failure when nothing was accepted since (no byte moved, no
        request succeeded), else None."""
        with self._lock:
            failed_s, progress_s = self._last_failure_s, self._last_progress_s
            if failed_s is None or (progress_s is not None and progress_s > failed_s):
                return None
            return self._last_failure
