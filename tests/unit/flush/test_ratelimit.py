"""TokenBucket, refill bounds and AimdRate: pure rate policies driven by an explicit ``now_s``."""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

import pytest

from gateway.flush.ratelimit import (
    AimdRate,
    RatePool,
    TokenBucket,
    refill_bounds,
    refill_estimate,
)

# -- TokenBucket ----------------------------------------------------------------------------


def test_bucket_rate_zero_is_unlimited() -> None:
    bucket = TokenBucket(0.0, 0.0, 0.0)
    assert bucket.unlimited
    assert [bucket.reserve(1e9, 0.0) for _ in range(5)] == [0.0] * 5


def test_bucket_negative_rate_is_unlimited() -> None:
    bucket = TokenBucket(-5.0, 10.0, 0.0)
    assert bucket.unlimited
    assert bucket.reserve(100.0, 0.0) == 0.0


def test_bucket_default_burst_is_one_second_of_rate() -> None:
    assert TokenBucket(50.0, 0.0, 0.0).burst == 50.0
    assert TokenBucket(0.5, 0.0, 0.0).burst == 1.0  # at least one token
    assert TokenBucket(50.0, 7.0, 0.0).burst == 7.0


def test_bucket_burst_passes_then_debt_over_rate() -> None:
    bucket = TokenBucket(10.0, 5.0, 100.0)
    assert [bucket.reserve(1, 100.0) for _ in range(5)] == [0.0] * 5
    assert bucket.reserve(1, 100.0) == pytest.approx(0.1)
    assert bucket.reserve(1, 100.0) == pytest.approx(0.2)
    assert bucket.reserve(3, 100.0) == pytest.approx(0.5)


def test_bucket_refill_is_capped_at_burst() -> None:
    bucket = TokenBucket(10.0, 5.0, 0.0)
    assert bucket.reserve(5, 0.0) == 0.0
    # An hour idle earns only the burst back.
    assert bucket.reserve(5, 3600.0) == 0.0
    assert bucket.reserve(1, 3600.0) == pytest.approx(0.1)


def test_bucket_partial_refill() -> None:
    bucket = TokenBucket(10.0, 5.0, 0.0)
    assert bucket.reserve(5, 0.0) == 0.0
    assert bucket.reserve(2, 0.25) == 0.0  # 2.5 tokens earned
    assert bucket.reserve(1, 0.25) == pytest.approx(0.05)


def test_bucket_debt_is_paid_back_by_time() -> None:
    bucket = TokenBucket(10.0, 1.0, 0.0)
    assert bucket.reserve(1, 0.0) == 0.0
    assert bucket.reserve(1, 0.0) == pytest.approx(0.1)
    # Once the waiter's time has come, the debt is paid: the next caller waits its own turn.
    assert bucket.reserve(1, 0.1) == pytest.approx(0.1)
    assert bucket.reserve(1, 10.0) == 0.0


def test_bucket_reservation_larger_than_burst_is_possible() -> None:
    bucket = TokenBucket(100.0, 10.0, 0.0)
    assert bucket.reserve(1000, 0.0) == pytest.approx(9.9)  # (1000 - 10) / 100
    # The next caller queues behind the whole debt (FIFO).
    assert bucket.reserve(1, 0.0) == pytest.approx(9.91)
    assert bucket.reserve(1, 9.91) == pytest.approx(0.01)


def test_bucket_fifo_debt_accumulates() -> None:
    bucket = TokenBucket(4.0, 1.0, 0.0)
    waits = [bucket.reserve(1, 0.0) for _ in range(6)]
    assert waits == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 1.25])
    assert waits == sorted(waits)


def test_bucket_set_rate_keeps_earned_tokens() -> None:
    bucket = TokenBucket(10.0, 100.0, 0.0)
    assert bucket.reserve(100, 0.0) == 0.0
    # 2 s at 10/s earned 20 tokens; the new rate applies only from now on.
    bucket.set_rate(1.0, 2.0)
    assert bucket.reserve(20, 2.0) == 0.0
    assert bucket.reserve(1, 2.0) == pytest.approx(1.0)


def test_bucket_set_rate_faster_applies_from_now() -> None:
    bucket = TokenBucket(1.0, 10.0, 0.0)
    assert bucket.reserve(10, 0.0) == 0.0
    bucket.set_rate(100.0, 0.0)
    assert bucket.reserve(1, 0.0) == pytest.approx(0.01)


def test_bucket_set_rate_zero_makes_it_unlimited() -> None:
    bucket = TokenBucket(1.0, 1.0, 0.0)
    bucket.reserve(5, 0.0)
    bucket.set_rate(0.0, 0.0)
    assert bucket.reserve(1000, 0.0) == 0.0


def test_bucket_time_going_backwards_earns_nothing() -> None:
    bucket = TokenBucket(10.0, 5.0, 100.0)
    assert bucket.reserve(5, 100.0) == 0.0
    assert bucket.reserve(1, 50.0) > 0.0  # an earlier reading earns no tokens
    assert bucket.reserve(1, 100.1) == pytest.approx(0.1)  # nor does it move time back


# -- TokenBucket.restart --------------------------------------------------------------------


def test_bucket_restart_empties_it_and_drops_debt() -> None:
    bucket = TokenBucket(2.0, 2.0, 0.0)
    assert [bucket.reserve(1, 0.0) for _ in range(4)] == pytest.approx([0.0, 0.0, 0.5, 1.0])
    bucket.restart(0.1)
    assert bucket.reserve(1, 0.1) == pytest.approx(0.5)  # one interval, not 1.5 s of debt


def test_bucket_restart_from_an_earlier_empty_moment_keeps_what_it_earned_since() -> None:
    bucket = TokenBucket(2.0, 2.0, 0.0)
    bucket.reserve(5, 0.0)
    bucket.restart(1.0, empty_since_s=0.8)  # 0.2 s at 2/s: 0.4 of a token
    assert bucket.reserve(1, 1.0) == pytest.approx(0.3)
    bucket.restart(10.0, empty_since_s=0.0)  # never more than the burst
    assert [bucket.reserve(1, 10.0) for _ in range(3)] == pytest.approx([0.0, 0.0, 0.5])
    bucket.restart(20.0, empty_since_s=25.0)  # a moment still to come: empty now
    assert bucket.reserve(1, 20.0) == pytest.approx(0.5)


# -- what a token bucket's answers say about its rate ---------------------------------------


class _Upstream:
    """A prefix's token bucket as the emulator keeps it: ``rate`` per second, ``burst``
    (the bench's 2 near one request per second; S3's is about a second's worth)."""

    def __init__(self, rate: float, burst: float = 2.0) -> None:
        self.rate, self.burst, self.tokens, self.at = rate, burst, burst, 0.0

    def answer(self, arrival_s: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (arrival_s - self.at) * self.rate)
        self.at = arrival_s
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        return False


def _probe(rate: float, every_s: float, until_s: float) -> list[tuple[float, bool]]:
    upstream = _Upstream(rate)
    return [(t, upstream.answer(t)) for t in (i * every_s for i in range(int(until_s / every_s)))]


def test_refill_bounds_of_nothing_are_open() -> None:
    assert refill_bounds([], 0.0) == (0.0, math.inf)
    assert refill_bounds([(0.0, True), (0.1, True)], 0.0) == (0.0, math.inf)


def test_refill_bounds_from_refusals_and_acceptances() -> None:
    # Refused at 0, accepted at 1 and 2: two tokens came in less than 2 s -> more than
    # 1 per 2 s... precisely: one acceptance in [0, 2) over 2 s.
    low, high = refill_bounds([(0.0, False), (1.0, True), (1.5, False), (2.0, True)], 0.0)
    assert low == pytest.approx(1 / 2.0)
    # Accepted at 1, refused at 1.5: the bucket earned less than one token in 0.5 s.
    assert high == pytest.approx(1 / 0.5)


def test_refill_bounds_widen_by_the_slack() -> None:
    outcomes = [(0.0, False), (1.0, True), (1.5, False), (2.0, True)]
    low, high = refill_bounds(outcomes, 0.1)
    assert low == pytest.approx(1 / 2.1)
    assert high == pytest.approx(1 / 0.4)


@pytest.mark.parametrize("rate", [0.8, 1.0, 1.25, 7.0])
def test_refill_bounds_contain_the_rate_and_the_estimate_is_close(rate: float) -> None:
    outcomes = _probe(rate, every_s=0.05 / rate, until_s=4.0 / rate)
    low, high = refill_bounds(outcomes, 0.0)
    assert low <= rate <= high
    estimate = refill_estimate(outcomes)
    assert estimate is not None
    assert estimate == pytest.approx(rate, rel=0.05)


def test_refill_estimate_needs_two_token_marks() -> None:
    assert refill_estimate([(0.0, True), (0.1, False), (0.2, True)]) is None
    # Marks at 0.5 (between 0 and 1) and 1.55 (between 1.1 and 2): one token in 1.05 s.
    outcomes = [(0.0, False), (1.0, True), (1.1, False), (2.0, True)]
    assert refill_estimate(outcomes) == pytest.approx(1 / 1.05)


# -- AimdRate: phases -----------------------------------------------------------------------


def test_aimd_starts_open_at_the_ceiling_and_successes_change_nothing() -> None:
    rate = AimdRate(3500.0, 0.1, 0.0)
    assert (rate.phase, rate.rate_per_s) == ("open", 3500.0)
    for i in range(100):
        rate.on_send(i * 0.01)
        assert not rate.on_success(i * 0.01 + 0.03, i * 0.01)
    assert (rate.phase, rate.rate_per_s) == ("open", 3500.0)


def test_aimd_floor_never_exceeds_ceiling() -> None:
    rate = AimdRate(5.0, 10.0, 0.0)
    assert rate.floor_per_s == 5.0


def test_aimd_first_throttle_starts_a_measurement_at_the_probe_rate() -> None:
    rate = AimdRate(3500.0, 0.1, 0.0, probe_factor=3.0, probe_min_per_s=6.0)
    for t in (0.0, 0.05):
        rate.on_send(t)
        rate.on_success(t + 0.04, t)
    rate.on_send(0.1)
    assert rate.on_throttle(0.14, 0.1)  # the rate fell: queued requests re-time
    assert rate.phase == "measuring"
    # Two successes within the first second: 3 x 2/s = 6/s, and at least 6/s.
    assert rate.rate_per_s == pytest.approx(6.0)
    assert not rate.on_throttle(0.2, 0.16)  # more throttles while measuring cut nothing
    assert rate.rate_per_s == pytest.approx(6.0)


def test_aimd_probe_follows_a_fast_prefix() -> None:
    rate = AimdRate(3500.0, 0.1, 0.0, probe_factor=3.0, probe_min_per_s=6.0)
    for i in range(300):  # 300 successes in 1.5 s: 200/s
        rate.on_success(i * 0.005, i * 0.005)
    rate.on_throttle(1.5, 1.5)
    assert rate.rate_per_s == pytest.approx(3 * 300 / 1.495, rel=0.01)


def test_aimd_measurement_without_throttles_doubles_the_probe_then_opens() -> None:
    rate = AimdRate(100.0, 0.1, 0.0, probe_min_per_s=10.0)
    rate.on_throttle(0.0, 0.0)
    assert rate.rate_per_s == pytest.approx(10.0)
    t = 0.0
    for expected in (20.0, 40.0, 80.0, 100.0):
        for _ in range(8 if expected == 20.0 else 9):  # 1 throttle in 9: still too few
            t += 0.01
            rate.on_success(t, t)
        assert rate.rate_per_s == pytest.approx(expected)
    assert rate.phase == "open"


def test_aimd_steady_grows_per_request_and_cuts_gently_once_per_window() -> None:
    rate = _settled(limit_per_s=1.0)
    assert rate.phase == "steady"
    level = rate.rate_per_s
    rate.on_success(100.0, 99.0)
    assert rate.rate_per_s == pytest.approx(level * 1.002)  # +0.2 % per success
    assert rate.on_throttle(101.0, 100.9)
    assert rate.rate_per_s == pytest.approx(level * 1.002 * 0.9)
    assert not rate.on_throttle(101.1, 101.0)  # the same overload, answered twice
    assert rate.on_throttle(103.0, 102.9)


def test_aimd_steady_grows_slowly_just_under_a_refused_rate() -> None:
    """After a throttle at rate r, growth through [0.93 r, 0.97 r) is 1/16 of the usual
    (r overstates the limit: a prefix's burst takes a while to run out); elsewhere, and
    after a measurement (which may be low), it is the usual."""
    rate = _settled(limit_per_s=1.0)
    assert rate.limit_per_s is None
    assert rate.on_throttle(100.0, 99.9)
    refused = rate.limit_per_s
    assert refused is not None and rate.rate_per_s == pytest.approx(0.9 * refused)
    sent_s = 101.0

    def success() -> float:
        nonlocal sent_s
        before = rate.rate_per_s
        rate.on_success(sent_s + 0.5, sent_s)
        sent_s += 1.0
        return rate.rate_per_s / before - 1

    assert success() == pytest.approx(0.002)  # below the zone
    while rate.rate_per_s < 0.93 * refused:
        success()
    assert success() == pytest.approx(0.002 / 16)  # in it
    rate.rate_per_s = 0.97 * refused
    assert success() == pytest.approx(0.002)  # past it: the limit may have risen


def test_aimd_settling_says_once_since_when_the_prefix_is_empty() -> None:
    """The latest request that may have taken the prefix's token: accepted, or still
    unanswered (refusals take none)."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.on_send(0.0)
    rate.on_throttle(0.04, 0.0)  # measuring
    for sent_s, ok in ((0.2, True), (0.4, False), (0.6, False)):
        rate.on_send(sent_s)
        (rate.on_success if ok else rate.on_throttle)(sent_s + 0.04, sent_s)
    for sent_s in (0.8, 1.0, 1.1):
        rate.on_send(sent_s)
    assert rate.pop_empty_since_s() is None  # not settled yet
    assert rate.on_success(1.15, 1.0) and rate.phase == "steady"
    assert rate.pop_empty_since_s() == 1.1
    assert rate.pop_empty_since_s() is None  # once
    rate.on_throttle(10.0, 9.9)  # a steady cut: empty now
    assert rate.pop_empty_since_s() is None


def test_aimd_steady_never_below_the_floor() -> None:
    rate = _settled(limit_per_s=1.0, floor_per_s=0.9)
    for i in range(20):
        rate.on_throttle(200.0 + 2 * i, 200.0 + 2 * i)
    assert rate.rate_per_s == 0.9


# -- AimdRate: against a token bucket ---------------------------------------------------------


@dataclass
class _Run:
    """A lane with an endless backlog sending at its rate against ``_Upstream``: a request
    reaches the upstream ``latency_s`` (plus jitter) after it is sent; a throttle comes back
    then, an acceptance only after ``transfer_s`` more (its body)."""

    limit_per_s: float
    rate: AimdRate
    sent: list[tuple[float, bool]] = field(default_factory=list)
    settled_s: float | None = None

    def throttled_after(self, start_s: float) -> float:
        later = [ok for t, ok in self.sent if t >= start_s]
        return later.count(False) / max(1, len(later))

    def accepted_per_s(self, start_s: float, end_s: float) -> float:
        return sum(1 for t, ok in self.sent if ok and start_s <= t < end_s) / (end_s - start_s)


def _run(
    limit_per_s: float,
    duration_s: float,
    *,
    seed: int = 0,
    transfer_s: float = 0.7,
    pool: RatePool | None = None,
    floor_per_s: float = 0.1,
) -> _Run:
    rng = random.Random(seed)
    upstream = _Upstream(limit_per_s, burst=max(2.0, limit_per_s))  # S3: about a second
    rate = AimdRate(3500.0, floor_per_s, 0.0, pool=pool)
    run = _Run(limit_per_s, rate)
    answers: list[tuple[float, float, bool]] = []
    next_send_s = 0.0
    while next_send_s < duration_s:
        while answers and answers[0][0] <= next_send_s:
            at_s, sent_s, ok = heapq.heappop(answers)
            fell = rate.on_success(at_s, sent_s) if ok else rate.on_throttle(at_s, sent_s)
            if fell and run.settled_s is None and rate.phase == "steady":
                run.settled_s = at_s
        if rate.poll(next_send_s) and run.settled_s is None:
            run.settled_s = next_send_s
        rate.on_send(next_send_s)
        arrival_s = next_send_s + 0.035 + rng.uniform(0.0, 0.02)
        ok = upstream.answer(arrival_s)
        run.sent.append((next_send_s, ok))
        heapq.heappush(answers, (arrival_s + (transfer_s if ok else 0.005), next_send_s, ok))
        next_send_s += 1.0 / min(rate.rate_per_s, 200.0)  # concurrency caps a lane's pace
    return run


@pytest.mark.parametrize("limit_per_s", [0.8, 1.0, 1.2])
def test_aimd_measures_a_slow_prefix_within_its_first_seconds(limit_per_s: float) -> None:
    """At about one request per second (the bench's scaled S3), the lane knows the limit
    within 3 s, then runs just under it: no throttle for the next ten seconds, and later
    only the rare one of growth probing upwards (one in 30-40 s at 0.8/s, where the
    probe's 1/6 s grid puts the estimate 4 % high); within 15 % of the limit."""
    for seed in range(5):
        run = _run(limit_per_s, 40.0, seed=seed)
        assert run.settled_s is not None and run.settled_s < 3.0
        assert run.rate.estimate_per_s == pytest.approx(limit_per_s, rel=0.1)
        assert [t for t, ok in run.sent if 3.0 <= t < 13.0 and not ok] == []
        assert run.throttled_after(3.0) < 0.05
        assert run.accepted_per_s(3.0, 40.0) >= 0.85 * limit_per_s


def test_aimd_settles_before_the_acceptances_are_answered() -> None:
    """Acceptances come back 2 s late (a busy upstream's bandwidth); the throttles come
    back at once, so unanswered requests count as accepted and the lane still settles."""
    run = _run(1.0, 10.0, transfer_s=2.0)
    assert run.settled_s is not None and run.settled_s < 3.5
    assert run.rate.estimate_per_s == pytest.approx(1.0, rel=0.1)


@pytest.mark.parametrize("limit_per_s", [20.0, 100.0])
def test_aimd_converges_under_a_faster_limit(limit_per_s: float) -> None:
    """Requests overtake each other here (20 ms of jitter at up to 200 requests/s), so
    the first measurement is rough; steady growth and cuts then hold the lane near the
    limit: measured 2.3 % / 2.6 % throttled and 1.0x / 0.95x the limit after 5 s."""
    run = _run(limit_per_s, 60.0, transfer_s=0.05)
    assert run.throttled_after(5.0) < 0.03
    assert 0.85 * limit_per_s <= run.accepted_per_s(5.0, 60.0) <= limit_per_s * 1.05


def test_aimd_pool_median_is_used_within_the_lanes_own_bounds() -> None:
    pool = RatePool()
    for estimate in (1.0, 1.02, 0.98, 5.0):
        pool.add(estimate)
    assert pool.pooled_per_s() == pytest.approx(1.01)
    run = _run(1.0, 20.0, pool=pool)
    assert run.rate.estimate_per_s == pytest.approx(pool.pooled_per_s(), rel=0.01)
    # A prefix whose limit really is different keeps to its own bounds.
    other = _run(2.0, 20.0, pool=pool)
    assert other.rate.estimate_per_s is not None and other.rate.estimate_per_s > 1.6


def test_pool_is_the_middle_of_the_lanes_common_bounds() -> None:
    pool = RatePool()
    for estimate, bounds in ((1.2, (0.9, 1.12)), (1.25, (1.0, 1.3)), (1.22, (0.95, 1.25))):
        pool.add(estimate, bounds)
    assert pool.pooled_per_s() == pytest.approx((1.0 + 1.12) / 2)  # not the estimates' 1.22
    pool.add(1.3, None)  # crossed bounds add an estimate, no bound
    pool.add(1.3, (2.0, 1.0))
    assert pool.pooled_per_s() == pytest.approx(1.06)


def test_pool_trims_an_eighth_of_the_bounds_on_each_side() -> None:
    pool = RatePool()
    for i in range(8):
        pool.add(1.0, (0.9 + 0.01 * i, 1.2 - 0.01 * i))  # intersection 0.97-1.13
    pool.add(1.0, (0.5, 0.98))  # one lane's timing went wrong: trimmed
    assert pool.pooled_per_s() == pytest.approx((0.96 + 1.13) / 2)


def test_pool_falls_back_to_the_median_estimate_when_bounds_do_not_meet() -> None:
    pool = RatePool()
    for estimate, bounds in ((1.0, (1.05, 1.1)), (1.1, (1.05, 1.1)), (0.9, (1.2, 1.3))):
        pool.add(estimate, bounds)
    assert pool.pooled_per_s() == pytest.approx(1.0)
    few = RatePool()
    for estimate in (1.0, 1.1, 0.9):
        few.add(estimate)  # no bounds at all
    assert few.pooled_per_s() == pytest.approx(1.0)


def test_pool_for_a_lane_within_its_bounds_unless_they_miss_the_common_ones() -> None:
    pool = RatePool()
    for bounds in ((1.0, 1.3), (1.05, 1.25), (0.95, 1.2)):
        pool.add(1.1, bounds)  # common bounds 1.05-1.2: pooled 1.125
    assert pool.for_lane((1.1, 1.4)) == pytest.approx(1.125)
    assert pool.for_lane((0.9, 1.1)) == pytest.approx(1.1)  # held within its own bounds
    assert pool.for_lane((0.7, 1.0)) == pytest.approx(1.125)  # the odd one out: pooled
    assert pool.for_lane((1.3, 1.5)) == pytest.approx(1.125)
    assert RatePool().for_lane((1.0, 1.1)) is None


def test_aimd_pool_needs_three_lanes() -> None:
    pool = RatePool()
    pool.add(1.0)
    pool.add(2.0)
    assert pool.pooled_per_s() is None


def _settled(limit_per_s: float, floor_per_s: float = 0.1) -> AimdRate:
    run = _run(limit_per_s, 10.0, floor_per_s=floor_per_s)
    assert run.rate.phase == "steady"
    return run.rate
