"""Rate policies of the flusher, pure and clock-injected (every method takes ``now_s``).

``TokenBucket`` limits a rate with a burst allowance; ``AimdRate`` is the adaptive limit of
one prefix lane: cut multiplicatively on a throttle, grown additively on success, so it
settles just under what the upstream accepts for that prefix instead of oscillating.
"""

from __future__ import annotations

import itertools
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

    def forgive(self, now_s: float) -> None:
        """Drop the debt of the reservations made so far: their holders MUST reserve again
        (a rate cut re-times queued requests; kept, their old debt would be paid twice)."""
        self._refill(now_s)
        self._tokens = max(self._tokens, 0.0)

    def reserve(self, n: float, now_s: float) -> float:
        """Take ``n`` tokens; seconds to wait before they are really there (0 if now)."""
        if self.unlimited:
            return 0.0
        self._refill(now_s)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s


class AimdRate:
    """Additive-increase / multiplicative-decrease request rate of one lane.

    - On a throttle, once the lane has seen ``_MIN_SAMPLES`` successes in the last
      measuring span (four ``window_s`` or ``_SAMPLES`` requests at the current rate,
      whichever is longer), the rate drops to ``accepted_decrease`` times the lower of the current
      limit and the rate the upstream actually accepted over that span: what a prefix
      accepts while it throttles is its limit, so the cut lands just under it in one step.
      The accepted rate is measured between the first and the last success of the span,
      and only once they are a window apart (a burst of successes is no rate); it is
      never taken above one over the median gap between successes (a prefix whose bucket
      starts full answers its first requests at once, which a count would take as rate). Before
      that, it halves (``decrease``) the lower of the limit and the rate sent over the
      span (a limit never reached would take many cuts to bite); or, once the first
      success is a window old, it goes to ``accepted_decrease`` times the successes so far
      per second since the first: while a lane pushes, that figure is above the prefix's
      limit and falls towards it.
    - At most one cut per ``window_s`` or one request interval at the current rate,
      whichever is longer: one overload answers every request in flight with 503 at once.
    - Each success adds ``growth_per_request`` of the rate, but no more than ``growth``
      of the rate per second of successes: slow lanes probe upward by requests (about 350
      successes to double), fast lanes by seconds (+5 %/s), so a lane near a limit of one
      request per second does not overshoot it every few requests.
    - Once a level was measured that way, later throttles are marginal ones: the rate is
      cut by ``marginal_decrease`` and the level follows it down.
    - Below the measured level, a success adds ``recovery_per_request`` of the rate instead:
      a lane cut deeper by a stray 503 (timing jitter) or by cuts made before the accepted
      rate was known returns to that level in a few requests, not a few hundred.
    """

    _MIN_SAMPLES = 3  # successes before the accepted rate is trusted
    _SAMPLES = 8  # the measuring span holds this many requests at the current rate
    _SPAN_WINDOWS = 4  # and lasts at least this many windows
    _MAX_KEPT = 4096  # successes remembered at most (a fast lane's span holds thousands)

    def __init__(
        self,
        ceiling_per_s: float,
        floor_per_s: float,
        now_s: float,
        *,
        decrease: float = 0.5,
        accepted_decrease: float = 0.9,
        marginal_decrease: float = 0.85,
        growth: float = 0.05,
        growth_per_request: float = 0.002,
        recovery_per_request: float = 0.1,
        window_s: float = 1.0,
    ) -> None:
        self.ceiling_per_s = ceiling_per_s
        self.floor_per_s = min(floor_per_s, ceiling_per_s)
        self.rate_per_s = ceiling_per_s
        self._decrease = decrease
        self._accepted_decrease = accepted_decrease
        self._marginal_decrease = marginal_decrease
        self._growth = growth
        self._growth_per_request = growth_per_request
        self._recovery_per_request = recovery_per_request
        self._known_good_per_s = 0.0  # the level of the last cut to a measured rate
        self._window_s = window_s
        self._last_cut_s = -float("inf")
        self._sent: deque[float] = deque()
        self._accepted: deque[float] = deque(maxlen=self._MAX_KEPT)

    def on_send(self, now_s: float) -> None:
        """A request was sent (to measure the rate actually achieved)."""
        self._sent.append(now_s)
        self._trim(now_s)

    def sent_rate_per_s(self, now_s: float) -> float:
        """Requests sent per second over the measuring span (a send scheduled later is not
        counted): at one request per second, a one-second window would often read 0."""
        self._trim(now_s)
        sent = [t for t in self._sent if t <= now_s]
        if not sent:
            return 0.0
        # Over the span, or since the first send if the lane is younger (a window at least).
        return len(sent) / max(self._window_s, min(self._span_s(), now_s - sent[0]))

    def _span_s(self) -> float:
        return max(self._SPAN_WINDOWS * self._window_s, self._SAMPLES / self.rate_per_s)

    def accepted_rate_per_s(self, now_s: float) -> float | None:
        """Successes per second over the measuring span (None until there are enough)."""
        span_s = self._span_s()
        while self._accepted and self._accepted[0] < now_s - span_s:
            self._accepted.popleft()
        count = len(self._accepted)
        if count < self._MIN_SAMPLES or now_s - self._accepted[0] < self._window_s:
            return None  # too few, or seen for too short a time (a burst is no rate)
        first_s, last_s = self._accepted[0], self._accepted[-1]
        if last_s <= first_s:
            return None
        return min((count - 1) / (last_s - first_s), self._typical_rate_per_s())

    def _typical_rate_per_s(self) -> float:
        """One over the (upper) median gap between successes: a clump of successes (the
        prefix's bucket was full) does not count as a rate, as it does in a plain count."""
        times = list(self._accepted)
        gaps = sorted(b - a for a, b in itertools.pairwise(times))
        if not gaps or gaps[len(gaps) // 2] <= 0:
            return float("inf")
        return 1.0 / gaps[len(gaps) // 2]

    def _trim(self, now_s: float) -> None:
        while self._sent and self._sent[0] < now_s - self._span_s():
            self._sent.popleft()

    def on_throttle(self, now_s: float) -> bool:
        """Cut the rate (unless cut within the last window). True if it was cut."""
        if now_s - self._last_cut_s < max(self._window_s, 1.0 / self.rate_per_s):
            return False
        cut, level = self._cut(now_s)
        self.rate_per_s = max(self.floor_per_s, cut)
        if level is not None:
            # Remembered as known to be accepted; an older level fades by a cut's worth, so
            # a prefix whose limit really fell is not pushed back up to its old one.
            self._known_good_per_s = max(level, self._known_good_per_s * self._accepted_decrease)
        self._last_cut_s = now_s
        return True

    def _cut(self, now_s: float) -> tuple[float, float | None]:
        """The rate after a cut, and the level measured from successes (None if none)."""
        if self._known_good_per_s > 0:
            # Measured once: the lane is near the limit and the 503 is a marginal one. A
            # prefix with a small burst accepts about half of what a lane a little over its
            # limit offers (each early request wastes a slot), so successes now would read
            # far below the limit: cut the rate gently and lower the level to it instead.
            cut = self.rate_per_s * self._marginal_decrease
            self._known_good_per_s = 0.0
            return cut, cut
        accepted = self.accepted_rate_per_s(now_s)
        if accepted is not None:
            level = accepted * self._accepted_decrease
            return min(self.rate_per_s * self._accepted_decrease, level), level
        if self._accepted and now_s - self._accepted[0] >= self._window_s:
            # The successes so far, over the time since the first, bound the prefix's
            # limit from above and tend to it while the lane pushes: cut to just under.
            seen = len(self._accepted) / (now_s - self._accepted[0])
            level = min(seen, self._typical_rate_per_s()) * self._accepted_decrease
            return min(self.rate_per_s * self._accepted_decrease, level), level
        sent = max(self.sent_rate_per_s(now_s), self.floor_per_s)
        return min(self.rate_per_s, sent) * self._decrease, None

    def on_success(self, now_s: float) -> None:
        """One successful request: the rate grows (see the class docstring)."""
        self._accepted.append(now_s)
        if self.rate_per_s < self._known_good_per_s:
            grown = self.rate_per_s * (1.0 + self._recovery_per_request)
            self.rate_per_s = min(self._known_good_per_s, grown)
            return
        step = min(self._growth_per_request * self.rate_per_s, self._growth)
        self.rate_per_s = min(self.ceiling_per_s, self.rate_per_s + step)
