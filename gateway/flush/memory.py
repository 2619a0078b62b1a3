"""What the flusher learnt of each bucket's request rate, kept across restarts.

A fresh gateway starts every bucket at ``--flush-initial-rate`` (10 requests/s) and
doubles at most once a second, since a fresh rate cannot tell S3's limit of 3,500
requests/s from a cold partition's few: reaching R takes ``log2(R / 10)`` seconds, the
fixed cost left in a short drain at S3's scale (1.26-1.28x the minimum at 200
requests/s, BENCHMARKS.md 7.11). A running gateway keeps what it learnt from one
checkpoint to the next; a restarted one (a rolling upgrade, a crash, a node rebooted with
its disk) paid the whole cost again. So each bucket's learnt rate
(``BucketBudget.known_per_s``: this gateway's own share of the limit, at least the
fleet's fair share) is written to the journal whenever it changed (checked every
``interval_s``) and, with every bucket's, hourly and at the stop. At the next start a
bucket's budget slow-starts to it doubling per round trip (``control.py``, "A limit
remembered"): 1.08x where a fresh start takes 1.28x. A record older than ``max_age_s``
is not used: S3 scales a partition to the load it sees, and a day without it may have
undone that. A record too high costs one congestion event (the first 503 cuts the rate
as it cuts a fresh slow start's overshoot); one too low, the cubic's probe past it
(about 10 s), as any raised limit does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Protocol

from gateway.clock import Clock
from gateway.flush.lanes import Lanes

log = logging.getLogger(__name__)

MAX_AGE_S = 24 * 3600.0
SAVE_INTERVAL_S = 5.0
REFRESH_S = 3600.0  # every rate is recorded again this often (its age after a kill -9)


class RateStore(Protocol):
    """Where the rates are kept (``store.rates.RateTable``)."""

    async def load(self, since_wall_s: float) -> dict[str, float]: ...

    async def save(self, rates: Mapping[str, float], now_wall_s: float) -> None: ...


class RateMemory:
    """``recall`` once before the flusher starts, ``run`` as a task, ``stop`` to end it
    with a last save. Use from the event loop only."""

    def __init__(
        self,
        lanes: Lanes,
        store: RateStore,
        clock: Clock,
        *,
        max_age_s: float = MAX_AGE_S,
        interval_s: float = SAVE_INTERVAL_S,
    ) -> None:
        self._lanes = lanes
        self._store = store
        self._clock = clock
        self._max_age_s = max_age_s
        self._interval_s = interval_s
        self._saved: dict[str, float] = {}
        self._saved_all_s = clock.wall()  # when every rate was last recorded
        self._stopping = asyncio.Event()

    async def recall(self) -> dict[str, float]:
        """Hand the rates recorded within ``max_age_s`` to the lanes; returns them."""
        rates = await self._store.load(self._clock.wall() - self._max_age_s)
        self._lanes.remember(rates)
        self._saved = dict(rates)
        return rates

    async def save(self, *, every: bool = False) -> None:
        """Record the rates that changed since the last save (``every``, and once every
        ``REFRESH_S``: those of every bucket sent to since the start, as of now, so that
        a rate in use is never too old to be recalled after a kill -9)."""
        now_s = self._clock.wall()
        every = every or now_s - self._saved_all_s >= REFRESH_S
        known = self._lanes.known_rates()
        rates = known if every else {b: r for b, r in known.items() if self._saved.get(b) != r}
        if rates:
            await self._store.save(rates, now_s)
            self._saved.update(rates)
        if every:
            self._saved_all_s = now_s

    async def run(self) -> None:
        """Save every ``interval_s`` until ``stop``, then once more with every rate. A
        failed save is logged and tried again (the rates are a hint: nothing waits on it)."""
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
            try:
                await self.save(every=self._stopping.is_set())
            except Exception as exc:  # (the rates are a hint: the flush goes on without them)
                log.warning("could not record the buckets' learnt rates: %s", exc)

    def stop(self) -> None:
        self._stopping.set()
