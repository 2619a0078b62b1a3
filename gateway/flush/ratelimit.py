"""Rate policies of the flusher, pure and clock-injected (every method takes ``now_s``).

``TokenBucket`` limits a rate with a burst allowance; ``AimdRate`` is the adaptive limit of
one prefix lane: cut multiplicatively on a throttle, grown additively on success, so it
settles just under what the upstream accepts for that prefix instead of oscillating.
"""

from __future__ import annotations

from collections import deque


class TokenBucket:
    """Tokens accrue at ``rate_per_s`` up to ``burst``; a rate of 0 means unlimited.

    ``reserve(n)`` takes ``n`` tokens at once and returns how long the caller must wait
    before acting. It may overdraw (a debt later reservations queue behind), which keeps
    requests larger than the burst possible and keeps callers in first-come order, as
    aiolimiter does with its waiters.
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


class AimdRate:
    """Additive-increase / multiplicative-decrease request rate of one lane.

    - On a throttle the rate drops to ``decrease`` times the lower of the current limit and
      the rate actually sent over the last ``window_s`` (cutting a limit the lane never
      reached would take many rounds to bite); at most once per ``window_s``, because one
      overload answers several requests in flight with 503 at once.
    - Each success adds ``growth`` of the rate per second of successes (about +5 %/s),
      up to ``ceiling_per_s``.
    """

    def __init__(
        self,
        ceiling_per_s: float,
        floor_per_s: float,
        now_s: float,
        *,
        decrease: float = 0.5,
        growth: float = 0.05,
        window_s: float = 1.0,
    ) -> None:
        self.ceiling_per_s = ceiling_per_s
        self.floor_per_s = min(floor_per_s, ceiling_per_s)
        self.rate_per_s = ceiling_per_s
        self._decrease = decrease
        self._growth = growth
        self._window_s = window_s
        self._last_cut_s = now_s - window_s
        self._sent: deque[float] = deque()

    def on_send(self, now_s: float) -> None:
        """A request was sent (to measure the rate actually achieved)."""
        self._sent.append(now_s)
        self._trim(now_s)

    def sent_rate_per_s(self, now_s: float) -> float:
        """Requests sent within the last window (a send scheduled later is not counted)."""
        self._trim(now_s)
        return sum(1 for t in self._sent if t <= now_s) / self._window_s

    def _trim(self, now_s: float) -> None:
        while self._sent and self._sent[0] < now_s - self._window_s:
            self._sent.popleft()

    def on_throttle(self, now_s: float) -> bool:
        """Cut the rate (unless cut within the last window). True if it was cut."""
        if now_s - self._last_cut_s < self._window_s:
            return False
        base = min(self.rate_per_s, max(self.sent_rate_per_s(now_s), self.floor_per_s))
        self.rate_per_s = max(self.floor_per_s, base * self._decrease)
        self._last_cut_s = now_s
        return True

    def on_success(self, now_s: float) -> None:
        """One successful request: grow by ``growth`` of the rate per second of them."""
        step = max(1.0, self._growth * self.rate_per_s) / max(self.rate_per_s, 1.0)
        self.rate_per_s = min(self.ceiling_per_s, self.rate_per_s + step)
