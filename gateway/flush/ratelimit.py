"""Rate policies of the flusher, pure and clock-injected (every method takes ``now_s``).

``TokenBucket`` limits a rate with a burst allowance; ``AimdRate`` is the adaptive limit of
one prefix lane: it measures what the upstream accepts for that prefix once the prefix
first throttles, settles just under it, then grows additively on success and is cut
multiplicatively on a throttle, so it stays near the limit instead of oscillating.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Sequence


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

    def restart(self, now_s: float, empty_since_s: float | None = None) -> None:
        """``forgive``, and empty the bucket: the next reservation waits one interval at
        the (new) rate, as the upstream's own bucket is empty when it throttles. With
        ``empty_since_s`` (the upstream's bucket known empty then, and refilling since),
        the bucket holds what the (new) rate earned from then until now."""
        self.forgive(now_s)
        since_s = now_s if empty_since_s is None else min(empty_since_s, now_s)
        self._tokens = min(self.burst, (now_s - since_s) * max(self.rate_per_s, 0.0))

    def reserve(self, n: float, now_s: float) -> float:
        """Take ``n`` tokens; seconds to wait before they are really there (0 if now)."""
        if self.unlimited:
            return 0.0
        self._refill(now_s)
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate_per_s


def refill_bounds(outcomes: Sequence[tuple[float, bool]], slack_s: float) -> tuple[float, float]:
    """Bounds ``(low, high)`` on the refill rate of the token bucket that answered requests
    sent at the given times (sorted) with acceptance (True) or refusal (False).

    A refusal at ``s`` means the bucket held less than one token; an acceptance at ``a``,
    at least one. So from a refusal at ``s`` to a later acceptance at ``a`` the bucket
    earned more than the acceptances sent in ``[s, a)``: ``rate > n / (a - s)``; from an
    acceptance at ``a`` to a later refusal at ``s`` it earned less than the acceptances in
    ``[a, s)``, ``a``'s included: ``rate < n / (s - a)``. The upper bounds assume the bucket
    did not fill up to its burst in between (it drops tokens then), which holds while
    the sender offers more than the rate. A request reaches the bucket up to ``slack_s``
    later than it was sent, which widens every interval. ``(0, inf)`` when nothing is known.
    """
    low, high = 0.0, math.inf
    for i, (start_s, start_ok) in enumerate(outcomes):
        accepted = 1 if start_ok else 0  # acceptances sent in [start_s, end_s)
        for end_s, end_ok in outcomes[i + 1 :]:
            if start_ok and not end_ok and end_s - start_s > slack_s:
                high = min(high, accepted / (end_s - start_s - slack_s))
            elif not start_ok and end_ok and accepted:
                low = max(low, accepted / (end_s - start_s + slack_s))
            accepted += end_ok
    return low, high


def refill_estimate(outcomes: Sequence[tuple[float, bool]]) -> float | None:
    """The refill rate that best explains the outcomes (as in ``refill_bounds``), or None.

    An acceptance right after a refusal (in send order) marks a token's arrival between
    the two sends; from one such mark to the next, the bucket earned exactly the
    acceptances sent in between (it never filled while the sender kept it empty). The
    middles of the first and the last mark's intervals give the rate, without the bias
    of either bound (each takes its marks' intervals at their widest or narrowest).
    """
    marks: list[tuple[float, int]] = []  # (middle of the interval, acceptances before)
    accepted = 0
    previous: tuple[float, bool] | None = None
    for sent_s, ok in outcomes:
        if ok and previous is not None and not previous[1]:
            marks.append(((previous[0] + sent_s) / 2, accepted))
        accepted += ok
        previous = (sent_s, ok)
    if len(marks) < 2 or marks[-1][0] <= marks[0][0]:
        return None
    return (marks[-1][1] - marks[0][1]) / (marks[-1][0] - marks[0][0])


def _accepted_rate(outcomes: Sequence[tuple[float, bool]]) -> float | None:
    """Acceptances per second from the first refusal on: what a prefix kept empty lets
    through. The fallback when jitter beyond the slack crossed the bounds (a fast lane
    whose requests overtake each other); its error is one token over the span."""
    refusals = [s for s, ok in outcomes if not ok]
    if not refusals:
        return None
    span = [s for s, ok in outcomes if ok and s > refusals[0]]
    if len(span) < 2 or span[-1] <= refusals[0]:
        return None
    return (len(span) - 1) / (span[-1] - refusals[0])


class RatePool:
    """The measured per-prefix limits of one bucket's lanes.

    S3 documents one request limit per prefix, the same for every prefix of a bucket,
    and a lane measures it from only two or three token arrivals (10-15 % off either way
    at one request per second); the bucket's lanes together know it far better. Every
    lane's hard bounds hold the same rate, so the pooled figure is the middle of their
    intersection, less the ``1/8`` most extreme bounds on each side (a busy machine's
    timing can make one lane's bounds wrong); the median of the lanes' estimates when
    the bounds do not meet.

    A lane takes the pooled figure within its own bounds (``for_lane``), so a prefix
    whose limit really differs keeps what it measured, unless its bounds miss the others'
    common bounds altogether: then its measurement is the odd one out, more likely wrong
    timing than a different prefix (a lane stuck at 0.78x the limit for a whole burst
    was seen), and a throttle stops a lane following the pool anyway.
    """

    _KEPT = 64

    def __init__(self) -> None:
        self._estimates: deque[float] = deque(maxlen=self._KEPT)
        self._bounds: deque[tuple[float, float]] = deque(maxlen=self._KEPT)
        self.version = 0  # changes with every measurement added

    def add(self, estimate_per_s: float, bounds: tuple[float, float] | None = None) -> None:
        """One lane's estimate, and its hard bounds if they held (did not cross)."""
        self._estimates.append(estimate_per_s)
        if bounds is not None and 0 < bounds[0] <= bounds[1] < math.inf:
            self._bounds.append(bounds)
        self.version += 1

    def _common_bounds(self) -> tuple[float, float] | None:
        """The lanes' trimmed common bounds, if three lanes have bounds and they meet."""
        if len(self._bounds) < 3:
            return None
        trim = len(self._bounds) // 8
        low = sorted(b[0] for b in self._bounds)[-1 - trim]
        high = sorted(b[1] for b in self._bounds)[trim]
        return (low, high) if low <= high else None

    def pooled_per_s(self) -> float | None:
        """The pooled figure, once three lanes have one (None before)."""
        return self._pooled(self._common_bounds())

    def _pooled(self, common: tuple[float, float] | None) -> float | None:
        if len(self._estimates) < 3:
            return None
        if common is not None:
            return (common[0] + common[1]) / 2
        return statistics.median(self._estimates)

    def for_lane(self, bounds: tuple[float, float]) -> float | None:
        """The pooled figure for a lane whose own hard bounds are ``bounds`` (see the
        class docstring), or None if there is none yet."""
        common = self._common_bounds()
        pooled = self._pooled(common)
        if pooled is None:
            return None
        if common is not None and (bounds[1] < common[0] or bounds[0] > common[1]):
            return pooled
        return min(max(pooled, bounds[0]), bounds[1])


class AimdRate:
    """The adaptive request rate of one lane, in three phases.

    - **Open**: at the ceiling (S3's documented per-prefix limit) until the prefix first
      throttles: most prefixes never do, and they pay nothing for adaptation.
    - **Measuring**: from the first throttle, the lane probes at ``probe_factor`` times
      the rate it saw accepted (at least ``probe_min_per_s``), so the prefix's bucket
      stays empty and each acceptance marks when a token arrived. ``refill_bounds`` and
      ``refill_estimate`` turn the send times and answers into the prefix's rate. Once
      the bounds are within ``tolerance`` of each other, or both are known at the
      deadline (``_measure_deadline_s``), the lane settles at ``settle`` times the
      estimate, or ``settle_pooled`` times the bucket's pooled one (``RatePool``, more
      precise, so with less margin) when that is within the bounds. A
      measurement whose first ``_PROBE_DOUBLING`` answers (or more) are less than a
      quarter throttles doubles the probe and starts over (the limit is higher than
      thought; a ratio, not successes in a row, as a sliding-window limiter answers in
      long runs of each). The refusals while measuring are the price of
      knowing the limit: a controller that only cuts on 503s must guess it from a
      handful of successes, and near one request per second those guesses were 10-40 %
      off.
    - **Steady**: additive growth per success (``growth_per_request`` of the rate, no
      more than ``growth`` of it per second, so slow lanes probe by requests and fast
      lanes by seconds), and a cut by ``marginal_decrease`` on a throttle, at most once per
      ``window_s`` or one request interval (one overload answers every request in flight
      at once). A cut remembers the refused rate (``limit_per_s``); growth through the
      ``cautious`` band just under it is ``cautious_slowdown`` times slower (the refused
      rate overstates the limit: a prefix's burst takes a while to run out), and past
      it normal again (the limit may have risen). Without that, at one request per
      second a lane went over the limit about once every 23 requests.

    Every outcome carries the time its request was sent (``sent_s``), and ``on_send``
    announces each request: answers come back out of order, and an acceptance only after
    its body is through (a second or more when the upstream's bandwidth is busy), while a
    throttle comes back within a round trip. So while measuring, a request unanswered for
    three times the slowest throttle answer seen (at least ``presume_s``) counts as
    accepted; otherwise the lane would learn of its tokens a body's transfer late and
    keep probing meanwhile.
    """

    _PROBE_DOUBLING = 8  # answers while measuring before the probe may double
    _KEPT = 48  # outcomes a measurement keeps (bounds cost O(n^2) per outcome)

    def __init__(
        self,
        ceiling_per_s: float,
        floor_per_s: float,
        now_s: float,
        *,
        probe_factor: float = 1.5,
        probe_min_per_s: float = 6.0,
        settle: float = 0.95,
        settle_pooled: float = 0.99,
        tolerance: float = 0.1,
        measure_s: float = 2.4,
        slack_s: float = 0.01,
        presume_s: float = 0.1,
        marginal_decrease: float = 0.9,
        growth: float = 0.02,
        growth_per_request: float = 0.002,
        cautious: tuple[float, float] = (0.93, 0.97),
        cautious_slowdown: float = 16.0,
        window_s: float = 1.0,
        pool: RatePool | None = None,
    ) -> None:
        self.ceiling_per_s = ceiling_per_s
        self.floor_per_s = min(floor_per_s, ceiling_per_s)
        self.rate_per_s = ceiling_per_s
        self.phase = "open"
        self.estimate_per_s: float | None = None  # the last measurement's result
        self._probe_factor = probe_factor
        self._probe_min_per_s = probe_min_per_s
        self._settle = settle
        self._settle_pooled = settle_pooled
        self._tolerance = tolerance
        self._measure_s = measure_s
        self._slack_s = slack_s
        self._presume_s = presume_s
        self._marginal_decrease = marginal_decrease
        self._growth = growth
        self._growth_per_request = growth_per_request
        self._cautious = cautious
        self._cautious_slowdown = cautious_slowdown
        self.limit_per_s: float | None = None  # the rate last known to be refused
        self._window_s = window_s
        self._accepted = 0  # successes while open (the probe's starting point)
        self._first_accepted_s: float | None = None
        self._measure_from_s = 0.0  # outcomes sent earlier are not part of the measurement
        self._measure_began_s = 0.0
        self._first_sent_s: float | None = None
        self._outcomes: list[tuple[float, bool]] = []  # (sent_s, accepted), sorted
        self._in_flight: list[float] = []  # sent_s of unanswered requests, sorted
        self._throttle_answer_s = 0.0  # the slowest throttle answer seen while measuring
        self._fastest_throttle_s = math.inf  # and the fastest: their spread is the jitter
        self._answers = [0, 0]  # throttles, successes of this measurement
        self._last_cut_s = -math.inf
        self._pool = pool
        self._pool_seen = -1
        self._bounds = (0.0, math.inf)  # of the last measurement
        self._throttled_since_settling = False
        self._empty_since_s: float | None = None  # set by a settling measurement

    def on_send(self, sent_s: float) -> None:
        """A request left at ``sent_s``; its outcome will come with the same ``sent_s``."""
        if self._first_sent_s is None:
            self._first_sent_s = sent_s
        if self.phase != "steady":
            bisect.insort(self._in_flight, sent_s)
            del self._in_flight[: -self._KEPT]

    def on_success(self, now_s: float, sent_s: float | None = None) -> bool:
        """One accepted request. True if the rate fell (a measurement settled)."""
        sent_s = self._answered(now_s if sent_s is None else sent_s)
        if self.phase == "open":
            self._accepted += 1
            if self._first_accepted_s is None:
                self._first_accepted_s = now_s
            self._keep(sent_s, True)
            return False
        if self.phase == "measuring":
            self._answers[1] += 1
            if self._observe(now_s, sent_s, True):
                return True
            throttles, successes = self._answers
            if throttles + successes >= self._PROBE_DOUBLING and 4 * throttles < successes:
                # The probe was under the limit, so the prefix's bucket may have refilled
                # meanwhile: what was seen bounds nothing from above. Start again, faster.
                self._answers = [0, 0]
                self._outcomes.clear()
                self._measure_from_s = sent_s
                self.rate_per_s = min(self.ceiling_per_s, self.rate_per_s * 2)
                if self.rate_per_s >= self.ceiling_per_s:
                    self.phase = "open"  # no limit below the ceiling after all
            return False
        fell = self._adopt_pooled()
        if fell is not None:
            return fell
        step = min(self._growth_per_request * self.rate_per_s, self._growth)
        limit = self.limit_per_s
        if limit is not None and self._cautious[0] <= self.rate_per_s / limit < self._cautious[1]:
            step /= self._cautious_slowdown
        self.rate_per_s = min(self.ceiling_per_s, self.rate_per_s + step)
        return False

    def _adopt_pooled(self) -> bool | None:
        """Follow the bucket's pooled measurement (``RatePool.for_lane``) while the lane
        has not been throttled since it settled. None if the rate was not set from it,
        else whether it fell."""
        if self._pool is None or self._pool.version == self._pool_seen:
            return None
        self._pool_seen = self._pool.version
        estimate = self._pool.for_lane(self._bounds)
        if estimate is None or self._throttled_since_settling:
            return None
        if self.estimate_per_s is not None and abs(estimate / self.estimate_per_s - 1) < 0.01:
            return None
        before = self.rate_per_s
        self.estimate_per_s = estimate
        level = self._settle_pooled * estimate
        self.rate_per_s = max(self.floor_per_s, min(self.ceiling_per_s, level))
        return self.rate_per_s < before

    def on_throttle(self, now_s: float, sent_s: float | None = None) -> bool:
        """One throttled request. True if the rate was cut (queued requests re-time)."""
        sent_s = self._answered(now_s if sent_s is None else sent_s)
        if self.phase == "open":
            self._begin_measuring(now_s, sent_s)
            return True
        if self.phase == "measuring":
            self._answers[0] += 1
            self._throttle_answer_s = max(self._throttle_answer_s, now_s - sent_s)
            self._fastest_throttle_s = min(self._fastest_throttle_s, now_s - sent_s)
            return self._observe(now_s, sent_s, False)
        self._throttled_since_settling = True
        if now_s - self._last_cut_s < max(self._window_s, 1.0 / self.rate_per_s):
            return False
        self._last_cut_s = now_s
        self.limit_per_s = self.rate_per_s
        self.rate_per_s = max(self.floor_per_s, self.rate_per_s * self._marginal_decrease)
        return True

    @property
    def bounds_per_s(self) -> tuple[float, float]:
        """The last measurement's hard bounds on the prefix's rate ((0, inf) before one)."""
        return self._bounds

    def pop_empty_since_s(self) -> float | None:
        """When the prefix's bucket was last known empty, once, after a measurement settled
        (None otherwise: after a throttle it is empty now). The pacing bucket may start
        with what the new rate earned since, instead of idling one more interval."""
        since_s, self._empty_since_s = self._empty_since_s, None
        return since_s

    def poll(self, now_s: float) -> bool:
        """Re-check a measurement with no new answer (unanswered requests age into
        presumed acceptances). True if it settled: the rate fell."""
        return self.phase == "measuring" and self._settles(now_s)

    def _answered(self, sent_s: float) -> float:
        at = bisect.bisect_left(self._in_flight, sent_s)
        if at < len(self._in_flight) and self._in_flight[at] == sent_s:
            del self._in_flight[at]
        return sent_s

    def _begin_measuring(self, now_s: float, sent_s: float) -> None:
        self.phase = "measuring"
        # Successes sent just before the first throttle count too: the prefix's bucket
        # was emptied by them (a lane that was open sent as fast as it had work).
        self._measure_from_s, self._measure_began_s = sent_s - self._window_s, now_s
        self._outcomes = [o for o in self._outcomes if o[0] >= self._measure_from_s]
        self._keep(sent_s, False)
        self._throttle_answer_s = self._fastest_throttle_s = now_s - sent_s
        self._answers = [1, 0]
        seen_per_s = 0.0
        if self._first_accepted_s is not None:
            seen_per_s = self._accepted / max(self._window_s, now_s - self._first_accepted_s)
        if self.estimate_per_s is not None:
            seen_per_s = max(seen_per_s, self.estimate_per_s)
        probe = max(self._probe_min_per_s, self._probe_factor * seen_per_s)
        self.rate_per_s = max(self.floor_per_s, min(self.ceiling_per_s, probe))

    def _measure_deadline_s(self) -> float:
        """``measure_s`` after the lane's first request, and at least half of it after
        the first throttle: a lane throttled at once is measured within its first
        seconds, and a later one still gets time for two token arrivals."""
        began_s = self._measure_began_s if self._first_sent_s is None else self._first_sent_s
        return max(began_s + self._measure_s, self._measure_began_s + self._measure_s / 2)

    def _keep(self, sent_s: float, accepted: bool) -> None:
        bisect.insort(self._outcomes, (sent_s, accepted))
        del self._outcomes[: -self._KEPT]

    def _observe(self, now_s: float, sent_s: float, accepted: bool) -> bool:
        """Add an outcome to the measurement; settle if it now says enough."""
        if sent_s >= self._measure_from_s:
            self._keep(sent_s, accepted)
        return self._settles(now_s)

    def _settles(self, now_s: float) -> bool:
        """Settle the measurement if what is known says enough (see the class docstring)."""
        presume_s = max(self._presume_s, 3 * self._throttle_answer_s)
        presumed = [
            (s, True) for s in self._in_flight if self._measure_from_s <= s <= now_s - presume_s
        ]
        outcomes = sorted(self._outcomes + presumed)
        # Requests reach the prefix with a jitter about the spread of the throttles'
        # round trips: more than ``slack_s`` on a busy machine or a fast lane.
        jitter_s = self._throttle_answer_s - self._fastest_throttle_s
        low, high = refill_bounds(outcomes, max(self._slack_s, jitter_s))
        known = low > 0 and math.isfinite(high)
        narrow = known and low <= high <= low * (1 + self._tolerance)
        if not (narrow or (known and now_s >= self._measure_deadline_s())):
            return False
        estimate = refill_estimate(outcomes) if low <= high else _accepted_rate(outcomes)
        own = min(max(estimate or (low + high) / 2, min(low, high)), max(low, high))
        settle = self._settle
        self._bounds = (min(low, high), max(low, high))
        self._throttled_since_settling = False
        if self._pool is not None:
            self._pool.add(own, (low, high) if low <= high else None)
            self._pool_seen = self._pool.version
            pooled = self._pool.for_lane(self._bounds)
            if pooled is not None:
                own, settle = pooled, self._settle_pooled
        self.estimate_per_s = own
        self.limit_per_s = None  # a measurement can be low: growth past it stays quick
        self.phase = "steady"
        # The prefix's bucket was last emptied by the latest request that may have
        # taken a token: an accepted or unanswered one (a refused one took none).
        takers = [s for s, accepted in outcomes if accepted] + self._in_flight
        self._empty_since_s = max(takers, default=now_s)
        self._in_flight.clear()
        self._last_cut_s = now_s
        level = settle * self.estimate_per_s
        self.rate_per_s = max(self.floor_per_s, min(self.ceiling_per_s, level))
        return True
