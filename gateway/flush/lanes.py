"""Prefix lanes: pending objects partitioned by bucket and key prefix.

S3 scales its request-rate limits per key prefix, so the flusher keeps per prefix what a
throttle affects: an adaptive request rate (``AimdRate``) feeding a ``TokenBucket``, an
optional bytes-per-second bucket, a concurrency count and a pause after ``Retry-After``.
A lane throttled hard therefore never slows the others.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

from gateway.flush.ratelimit import AimdRate, RatePool, TokenBucket

log = logging.getLogger(__name__)

_MAX_IDLE_LANES = 4096  # idle lanes are forgotten beyond this (a new step makes new lanes)
_THROTTLE_MEMORY_S = 300.0  # a throttled lane's state is kept at least this long


def lane_prefix(key: str, depth: int) -> str:
    """The lane of ``key``: its first ``depth`` directory segments, with the trailing ``/``.

    The file name is never part of it, so the ranks of a checkpoint laid out as
    ``ckpt/step_K/rank_R/shard`` spread over lanes at depth 3; keys without a directory
    share the bucket's root lane ``""``.
    """
    directories = key.split("/")[:-1]
    chosen = directories[: max(depth, 0)]
    return "/".join(chosen) + "/" if chosen else ""


@dataclass(frozen=True, slots=True)
class LaneConfig:
    depth: int = 3
    rate_per_s: float = 3500.0  # ceiling of the adaptive rate; S3's per-prefix write limit
    min_rate_per_s: float = 0.1
    bandwidth_bytes_per_s: int = 0  # 0: unlimited
    concurrency: int = 8


@dataclass(frozen=True, slots=True)
class LaneStatus:
    bucket: str
    prefix: str
    rate_limit_per_s: float
    in_flight: int
    throttles: int
    paused_until_s: float | None


class Lane:
    """One prefix lane's flow-control state (mutated only on the event loop)."""

    def __init__(
        self,
        bucket: str,
        prefix: str,
        config: LaneConfig,
        now_s: float,
        pool: RatePool | None = None,
        probe_jitter: Callable[[], float] | None = None,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix
        self.rate = AimdRate(config.rate_per_s, config.min_rate_per_s, now_s, pool=pool)
        self.requests = TokenBucket(config.rate_per_s, max(config.rate_per_s, 1.0), now_s)
        self.bandwidth = TokenBucket(
            config.bandwidth_bytes_per_s, config.bandwidth_bytes_per_s, now_s
        )
        self.concurrency = config.concurrency
        self.in_flight = 0
        self.throttles = 0
        self.cuts = 0  # rate cuts so far: a request timed before a cut is re-timed
        self.paused_until_s = 0.0
        self.last_used_s = now_s
        self._last_sent_s: float | None = None
        self._probe_jitter = probe_jitter

    def has_room(self, now_s: float, claimed_now: int) -> bool:
        """Whether one more upload may start: a free slot and no Retry-After pause."""
        return self.in_flight + claimed_now < self.concurrency and now_s >= self.paused_until_s

    def reserve(self, requests: int, size_bytes: int, now_s: float) -> float:
        """Take tokens for an upload; seconds to wait before sending it."""
        self.last_used_s = now_s
        wait_s = max(
            self.requests.reserve(requests, now_s), self.bandwidth.reserve(size_bytes, now_s)
        )
        if self._probe_jitter is not None and self.rate.phase == "measuring":
            # Each probe at a random point of its interval: lanes started together would
            # otherwise probe in step, and their measurements err alike (pooled, they
            # would be worth no more than one).
            wait_s += self._probe_jitter() / self.rate.rate_per_s
        return wait_s

    def _apply_rate(self, now_s: float) -> None:
        # The burst follows the rate (one second's worth): a lane cut to 5/s must not
        # spend thousands of tokens banked at its old rate, or the cut would not bite.
        rate = self.rate.rate_per_s
        self.requests.set_rate(rate, now_s, burst=max(1.0, rate))

    def poll(self, now_s: float) -> None:
        """Let a measurement settle on time alone (see ``AimdRate.poll``)."""
        if self.rate.poll(now_s):
            self._cut(now_s)

    def on_send(self, sent_s: float) -> None:
        """A request of this lane left at ``sent_s`` (its outcome will say the same)."""
        self.rate.on_send(sent_s)
        if self._last_sent_s is None or sent_s > self._last_sent_s:
            self._last_sent_s = sent_s

    def on_success(self, now_s: float, sent_s: float | None = None) -> None:
        """A request sent at ``sent_s`` (default: now) was accepted."""
        if self.rate.on_success(now_s, sent_s):
            self._cut(now_s)
        else:
            self._apply_rate(now_s)

    def on_throttle(
        self, now_s: float, retry_after_s: float | None, sent_s: float | None = None
    ) -> None:
        """A request sent at ``sent_s`` (default: now) was throttled."""
        self.throttles += 1
        if self.rate.on_throttle(now_s, sent_s):
            self._cut(now_s)
        if retry_after_s:
            self.paused_until_s = max(self.paused_until_s, now_s + retry_after_s)

    def _cut(self, now_s: float) -> None:
        # Every request waiting for this lane's tokens reserves again at the new rate (the
        # flusher checks ``cuts``), so the debt they ran up is dropped, not paid twice:
        # kept, it idled a lane of one request per second for 15 s after a cut.
        # The prefix's bucket is empty since the latest request that may have taken its
        # token (a measurement knows which; otherwise the latest sent): what it earned
        # since is not waited for again.
        self.cuts += 1
        self._apply_rate(now_s)  # first: the restart counts tokens at the new rate
        since_s = self.rate.pop_empty_since_s()
        if since_s is not None:
            low, high = self.rate.bounds_per_s
            log.info(
                "lane %s/%s measured the prefix's limit: %.3f/s (bounds %.3f-%.3f/s); "
                "flushing at %.3f/s",
                self.bucket,
                self.prefix,
                self.rate.estimate_per_s or 0.0,
                low,
                high,
                self.rate.rate_per_s,
            )
        self.requests.restart(now_s, self._last_sent_s if since_s is None else since_s)
        self.bandwidth.forgive(now_s)

    def status(self, now_s: float) -> LaneStatus:
        return LaneStatus(
            self.bucket,
            self.prefix,
            round(self.rate.rate_per_s, 3),
            self.in_flight,
            self.throttles,
            self.paused_until_s if self.paused_until_s > now_s else None,
        )


class Lanes:
    """The lanes, created on first use."""

    def __init__(self, config: LaneConfig) -> None:
        self.config = config
        self._lanes: dict[tuple[str, str], Lane] = {}
        self._pools: dict[str, RatePool] = {}  # per bucket: its lanes' measured limits
        self._random = random.Random()

    def prefix_of(self, key: str) -> str:
        return lane_prefix(key, self.config.depth)

    def lane_for(self, bucket: str, key: str, now_s: float) -> Lane:
        ident = (bucket, self.prefix_of(key))
        lane = self._lanes.get(ident)
        if lane is None:
            if len(self._lanes) >= _MAX_IDLE_LANES:
                self._forget_idle(now_s)
            pool = self._pools.setdefault(bucket, RatePool())
            lane = self._lanes[ident] = Lane(
                bucket, ident[1], self.config, now_s, pool, self._random.random
            )
        return lane

    def peek(self, bucket: str, key: str) -> Lane | None:
        """The lane of a key if it exists (no side effects: safe from the journal thread)."""
        return self._lanes.get((bucket, self.prefix_of(key)))

    def _forget_idle(self, now_s: float) -> None:
        """Forget the least recently used idle lanes, down to half the cap. A lane paused by
        Retry-After, or cut below its ceiling within the last minutes, keeps its state."""

        def forgettable(lane: Lane) -> bool:
            recovered = lane.rate.rate_per_s >= lane.rate.ceiling_per_s
            return (
                lane.in_flight == 0
                and lane.paused_until_s <= now_s
                and (recovered or now_s - lane.last_used_s > _THROTTLE_MEMORY_S)
            )

        idle = sorted(
            (lane.last_used_s, ident) for ident, lane in self._lanes.items() if forgettable(lane)
        )
        for _, ident in idle[: max(0, len(self._lanes) - _MAX_IDLE_LANES // 2)]:
            del self._lanes[ident]

    def status(self, now_s: float) -> list[LaneStatus]:
        return [lane.status(now_s) for lane in self._lanes.values()]
