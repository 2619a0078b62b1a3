"""Token buckets (pure, clock-injected: every method takes ``now_s``).

The flusher's hard caps (``--flush-rate``, ``--flush-bandwidth``, ``--lane-rate``,
``--lane-bandwidth``) and the pacing of each adaptive budget are token buckets. The
adaptive rates themselves are in ``control.py``.
"""

from __future__ import annotations

_RESOLUTION_S = 1e-6


class TokenBucket:
    """Tokens accrue at ``rate_per_s`` up to ``burst``; a rate of 0 means unlimited.

    Two ways to use it:

    - ``reserve(n)`` takes ``n`` tokens at once and returns how long the caller must wait
      before acting. It may overdraw (a debt later reservations queue behind), which keeps
      requests larger than the burst possible and keeps callers in first-come order, as
      aiolimiter does with its waiters.
    - ``wait_s(n)`` says how long until ``n`` tokens (at most a burst) are there, without
      taking any; ``take(n)`` then takes them (the balance may go below zero for a request
      larger than the burst: the next one waits for the debt). A scheduler that decides
      who goes next uses these, so nothing is committed to a waiter that may not need it.
    """

    def __init__(self, rate_per_s: float, burst: float, now_s: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst if burst > 0 else max(rate_per_s, 1.0)
        self._tokens = self.burst
        self._at_s = now_s

    @property
    def unlimited(self) -> bool:
        return self.rate_per_s <= 0

    def _refill(self, now_s: float) -> None:
        elapsed = max(0.0, now_s - self._at_s)
        self._tokens = min(self.burst, self._tokens + elapsed * self.rate_per_s)
        self._at_s = max(self._at_s, now_s)

    def set_rate(self, rate_per_s: float, now_s: float, burst: float | None = None) -> None:
        """Change the rate from now on; tokens earned so far are kept up to the (new) burst."""
        self._refill(now_s)
        self.rate_per_s = rate_per_s
        if burst is not None:
            self.burst = burst
            self._tokens = min(self._tokens, burst)

    def reserve(self, n: float, now_s: float) -> float:
        """Take ``n`` tokens; seconds to wait before they are really there (0 if now)."""
        if self.unlimited:
            return 0.0
        self._refill(now_s)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s

    def wait_s(self, n: float, now_s: float) -> float:
        """Seconds until ``min(n, burst)`` tokens are there (0: now). Takes nothing."""
        if self.unlimited:
            return 0.0
        self._refill(now_s)
        wait_s = (min(n, self.burst) - self._tokens) / self.rate_per_s
        # Below a microsecond is now: the clock cannot tell it apart (now + wait == now
        # in floating point), and a waiter woken "then" would find it still missing.
        return 0.0 if wait_s < _RESOLUTION_S else wait_s

    def take(self, n: float, now_s: float) -> None:
        """Take ``n`` tokens now (after ``wait_s`` said 0)."""
        if not self.unlimited:
            self._refill(now_s)
            self._tokens -= n

    def drain(self, now_s: float) -> None:
        """Empty the bucket (debt is kept): after a rate cut the next request waits one
        interval at the new rate, as the upstream's own bucket is empty then."""
        if not self.unlimited:
            self._refill(now_s)
            self._tokens = min(self._tokens, 0.0)


PACING_S = 0.05  # a pacer holds this long's worth of its rate (at least 2 requests)


class Pacer(TokenBucket):
    """The token bucket that paces an adaptive rate: a short burst, so requests leave
    evenly spaced (as a partition's small bucket wants them), but at least 2, so that a
    late wake-up of the event loop is made good at the next one instead of lost."""

    def __init__(self, rate_per_s: float, now_s: float) -> None:
        super().__init__(rate_per_s, self.burst_for(rate_per_s), now_s)

    @staticmethod
    def burst_for(rate_per_s: float) -> float:
        return max(2.0, rate_per_s * PACING_S)

    def follow(self, rate_per_s: float, now_s: float, *, cut: bool = False) -> None:
        """Pace at ``rate_per_s`` from now on; after a ``cut`` start empty (the upstream's
        bucket is empty: the next request waits one interval at the new rate)."""
        self.set_rate(rate_per_s, now_s, burst=self.burst_for(rate_per_s))
        if cut:
            self.drain(now_s)
