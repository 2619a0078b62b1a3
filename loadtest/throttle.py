"""The emulator's request throttle: S3's partitions as the clients cannot see them.

S3 limits requests per *partition*: a key prefix whose extent clients do not know. A fresh
bucket throttles coarsely (everything under ``ckpt/``, or the whole bucket); after minutes
of sustained load S3 splits a hot partition, each part getting the full rate; and every
client of the bucket (every gateway of a cluster) draws from the same partitions.
``PrefixLimiter`` models that:

* ``rate`` requests/s per partition, a token bucket of ``burst`` (default one second's
  worth, at least 1), shared by everybody; a partition is the first ``depth`` path
  segments of the key, chosen independently of any client's lanes;
* ``schedule``: the limit changes at given times, ``(t, factor)`` pairs, ``t`` in seconds
  after the first request the limiter saw (``t0``); the buckets keep their tokens;
* ``storm``: ``(start, end)`` seconds after ``t0`` during which every request is refused;
* ``split_after``: a partition that accepted at least half its rate in every one-second
  window for that long splits into the prefixes one level down where its keys differ
  (the next depth that separates them), each with a full bucket of the full rate.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

_KEYS_KEPT = 4096  # keys remembered per partition, to know where it would split


class TokenBucket:
    """A token bucket with an injectable clock.

    ``try_take`` is the non-blocking form (request-rate limits); ``reserve`` always takes
    and returns how long the caller must wait for the tokens to exist (pacing: the bucket
    goes into debt, so concurrent callers are served in reservation order at ``rate``).
    """

    def __init__(
        self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = burst
        self._stamp = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    def set_rate(self, rate: float) -> None:
        """A new rate from now on; the tokens earned so far are kept."""
        self._refill()
        self.rate = rate

    def available(self) -> float:
        self._refill()
        return self._tokens

    def try_take(self, n: float = 1.0) -> bool:
        self._refill()
        if self._tokens >= n:
            self._tokens -= n
            return True
        return False

    def reserve(self, n: float) -> float:
        self._refill()
        self._tokens -= n
        return max(0.0, -self._tokens / self.rate)


def prefix_of(key: str, depth: int) -> str:
    """The first ``depth`` segments of ``key`` (with the trailing slash), or its parent
    directory when it has fewer: ``a/b/c/d`` -> ``a/b/c/`` (depth 3), ``a/b`` -> ``a/``."""
    if depth <= 0:
        return ""
    parts = key.split("/")
    if len(parts) > depth:
        return "/".join(parts[:depth]) + "/"
    head, sep, _ = key.rpartition("/")
    return head + sep


class _Load:
    """Acceptances of one partition over the last second, and since when it has been
    loaded (at least half its rate in every second)."""

    def __init__(self) -> None:
        self.accepted: deque[float] = deque()
        self.loaded_since: float | None = None


class PrefixLimiter:
    """``rate`` requests/s per (bucket, partition); ``rate`` 0 disables it. See the module
    docstring for ``schedule``, ``storm`` and ``split_after``."""

    def __init__(
        self,
        rate: float,
        depth: int,
        burst: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        *,
        schedule: Iterable[tuple[float, float]] = (),
        storm: tuple[float, float] | None = None,
        split_after: float | None = None,
    ) -> None:
        self.rate = rate
        self.depth = depth
        self.burst = burst if burst else max(1.0, rate)
        self.schedule = sorted(schedule)
        self.storm = storm
        self.split_after = split_after
        self.t0: float | None = None  # clock time of the first request seen
        self.splits: dict[tuple[str, str], tuple[int, float]] = {}  # -> (child depth, at)
        self._clock = clock
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self._keys: dict[tuple[str, str], set[str]] = {}
        self._load: dict[tuple[str, str], _Load] = {}

    def factor(self, now: float) -> float:
        """The limit's factor at ``now`` (the last schedule entry at or before it)."""
        factor = 1.0
        for at, f in self.schedule:
            if self.t0 is not None and now - self.t0 >= at:
                factor = f
        return factor

    def in_storm(self, now: float) -> bool:
        return (
            self.storm is not None
            and self.t0 is not None
            and self.storm[0] <= now - self.t0 < self.storm[1]
        )

    def partition_of(self, bucket: str, key: str) -> str:
        """The partition ``key`` falls in now (after any splits)."""
        prefix = prefix_of(key, self.depth)
        while (bucket, prefix) in self.splits:
            prefix = prefix_of(key, self.splits[(bucket, prefix)][0])
        return prefix

    def allow(self, bucket: str, key: str) -> bool:
        if self.rate <= 0:
            return True
        now = self._clock()
        if self.t0 is None:
            self.t0 = now
        ident = (bucket, self.partition_of(bucket, key))
        rate = self.rate * self.factor(now)
        tb = self._buckets.get(ident)
        if tb is None:
            tb = self._buckets[ident] = TokenBucket(rate, self.burst, self._clock)
        elif tb.rate != rate:
            tb.set_rate(rate)
        if self.split_after is not None:
            keys = self._keys.setdefault(ident, set())
            if len(keys) < _KEYS_KEPT:
                keys.add(key)
        if self.in_storm(now):
            return False
        ok = tb.try_take()
        if ok and self.split_after is not None:
            self._note_load(ident, now, rate)
        return ok

    def _note_load(self, ident: tuple[str, str], now: float, rate: float) -> None:
        assert self.split_after is not None
        load = self._load.setdefault(ident, _Load())
        load.accepted.append(now)
        while load.accepted and load.accepted[0] <= now - 1.0:
            load.accepted.popleft()
        if len(load.accepted) < 0.5 * rate:
            load.loaded_since = None
        elif load.loaded_since is None:
            load.loaded_since = now
        elif now - load.loaded_since >= self.split_after:
            self._split(ident, now)

    def _split(self, ident: tuple[str, str], now: float) -> None:
        keys = self._keys.get(ident, set())
        parent_depth = self.depth
        for (bucket, prefix), (depth, _) in self.splits.items():
            if bucket == ident[0] and ident[1].startswith(prefix):
                parent_depth = max(parent_depth, depth)
        for depth in range(parent_depth + 1, parent_depth + 16):
            if len({prefix_of(k, depth) for k in keys}) > 1:
                self.splits[ident] = (depth, now)
                self._buckets.pop(ident, None)
                self._load.pop(ident, None)
                return

    @property
    def prefixes(self) -> int:
        return len(self._buckets)

    def describe(self) -> dict[str, Any]:
        """Where the limiter is: its start, splits so far, the factor now."""
        now = self._clock()
        return {
            "t0": self.t0,
            "factor": self.factor(now),
            "in_storm": self.in_storm(now),
            "splits": {
                f"{bucket}/{prefix}": {
                    "child_depth": depth,
                    "at_s": None if self.t0 is None else round(at - self.t0, 3),
                }
                for (bucket, prefix), (depth, at) in self.splits.items()
            },
        }
