"""TokenBucket and AimdRate: pure rate policies driven by an explicit ``now_s``."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import pytest

from gateway.flush.ratelimit import AimdRate, TokenBucket

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


# -- AimdRate -------------------------------------------------------------------------------


def test_aimd_starts_at_ceiling() -> None:
    rate = AimdRate(3500.0, 1.0, 0.0)
    assert rate.rate_per_s == 3500.0
    assert rate.sent_rate_per_s(0.0) == 0.0


def test_aimd_floor_never_exceeds_ceiling() -> None:
    rate = AimdRate(2.0, 10.0, 0.0)
    assert rate.floor_per_s == 2.0
    assert rate.on_throttle(0.0)
    assert rate.rate_per_s == 2.0


def test_aimd_sent_rate_counts_the_measuring_span() -> None:
    rate = AimdRate(100.0, 1.0, 0.0, window_s=2.0)  # span: 4 windows = 8 s
    for i in range(10):
        rate.on_send(i * 0.1)
    assert rate.sent_rate_per_s(0.9) == 5.0  # 10 sends, at least one window (2 s)
    assert rate.sent_rate_per_s(2.45) == pytest.approx(10 / 2.45)  # since the first send
    assert rate.sent_rate_per_s(8.5) == pytest.approx(5 / 8.0)  # 0.5..0.9 left, over 8 s
    assert rate.sent_rate_per_s(10.0) == 0.0


def test_aimd_throttle_cuts_to_half_of_the_sent_rate() -> None:
    rate = AimdRate(3500.0, 1.0, 0.0)
    for i in range(40):
        rate.on_send(10.0 + i * 0.02)
    assert rate.on_throttle(10.8)
    assert rate.rate_per_s == pytest.approx(20.0)  # 0.5 * 40 sent within the last second


def test_aimd_throttle_cuts_the_limit_when_below_the_sent_rate() -> None:
    rate = AimdRate(100.0, 1.0, 0.0, decrease=0.7)
    for i in range(500):
        rate.on_send(5.0 + i * 0.001)
    assert rate.on_throttle(5.5)
    assert rate.rate_per_s == pytest.approx(70.0)  # 0.7 * min(limit 100, sent 500)


def test_aimd_throttle_never_below_floor() -> None:
    rate = AimdRate(100.0, 4.0, 0.0)
    rate.on_send(0.0)
    assert rate.on_throttle(0.5)
    assert rate.rate_per_s == 4.0  # 0.5 * max(sent 1, floor 4) = 2 -> floor
    for t in (2.0, 4.0, 6.0):
        assert rate.on_throttle(t)
        assert rate.rate_per_s == 4.0


def test_aimd_cuts_at_most_once_per_window() -> None:
    rate = AimdRate(1000.0, 1.0, 0.0)
    for i in range(200):
        rate.on_send(10.0 + i * 0.001)
    assert rate.on_throttle(10.2)
    after_first = rate.rate_per_s
    assert after_first == pytest.approx(100.0)
    # The other answers of the same overload arrive within the window: no further cut.
    assert not rate.on_throttle(10.2)
    assert not rate.on_throttle(11.19)
    assert rate.rate_per_s == after_first
    assert rate.on_throttle(11.2)  # one window later
    assert rate.rate_per_s < after_first


def test_aimd_first_throttle_cuts_at_once() -> None:
    # The window of the initial "last cut" has passed when the lane is created.
    rate = AimdRate(100.0, 1.0, 50.0)
    assert rate.on_throttle(50.0)


def test_aimd_success_grows_five_percent_per_second_of_successes() -> None:
    rate = AimdRate(1000.0, 1.0, 0.0)
    rate.rate_per_s = 200.0
    for _ in range(200):  # one second of successes at 200/s
        rate.on_success(0.0)
    assert rate.rate_per_s == pytest.approx(210.0)


def test_aimd_slow_lane_grows_by_requests_not_by_seconds() -> None:
    rate = AimdRate(1000.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for _ in range(4):  # one second of successes at 4/s: +0.2 % each (+5 %/s is the cap)
        rate.on_success(0.0)
    assert rate.rate_per_s == pytest.approx(4.0 * 1.002**4)
    rate.rate_per_s = 0.9
    for _ in range(10):  # ten successes near 1/s: +2 % in all, not +1/s per second
        rate.on_success(0.0)
    assert rate.rate_per_s == pytest.approx(0.9 * 1.002**10)


def test_aimd_cut_lands_under_the_accepted_rate() -> None:
    """The prefix accepted one request per 1.1 s while the lane offered 4/s: one cut takes
    the lane to 0.9 x what was accepted, not half of what it offered."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for i in range(4):
        rate.on_success(i * 1.1)
    assert rate.accepted_rate_per_s(3.4) == pytest.approx(3 / 3.3)
    assert rate.on_throttle(3.4)
    assert rate.rate_per_s == pytest.approx(0.9 * 3 / 3.3)


def test_aimd_accepted_rate_ignores_a_burst() -> None:
    """Ten successes within 50 ms are no rate: the first cut halves what was sent."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    for i in range(10):
        rate.on_send(i * 0.005)
        rate.on_success(i * 0.005)
    assert rate.accepted_rate_per_s(0.05) is None
    assert rate.on_throttle(0.05)
    assert rate.rate_per_s == pytest.approx(5.0)  # 10 sent in the last second, halved


def test_aimd_one_cut_per_request_interval_at_a_slow_rate() -> None:
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 0.5
    rate.on_send(9.0)
    rate.on_send(9.5)
    assert rate.on_throttle(10.0)
    assert rate.rate_per_s == pytest.approx(0.25)  # half of the 0.5/s limit
    assert not rate.on_throttle(13.9)  # one request at 0.25/s takes 4 s
    assert rate.on_throttle(14.0)


def test_aimd_growth_is_capped_at_ceiling() -> None:
    rate = AimdRate(100.0, 1.0, 0.0)
    rate.rate_per_s = 99.99
    for _ in range(1000):
        rate.on_success(0.0)
    assert rate.rate_per_s == 100.0


# -- convergence ----------------------------------------------------------------------------


@dataclass
class _Outcome:
    sent: int
    throttled: int
    duration_s: float
    cuts_s: list[float]

    @property
    def throttled_fraction(self) -> float:
        return self.throttled / self.sent

    @property
    def accepted_per_s(self) -> float:
        return (self.sent - self.throttled) / self.duration_s


def _simulate_aimd(limit_per_s: int, duration_s: float) -> _Outcome:
    """A lane sends back to back at exactly its current rate against an upstream that
    throttles a request when it already accepted ``limit_per_s`` in the last second."""
    rate = AimdRate(3500.0, 1.0, 0.0)
    accepted: deque[float] = deque()
    now_s, sent, throttled = 0.0, 0, 0
    cuts_s: list[float] = []
    while now_s < duration_s:
        rate.on_send(now_s)
        sent += 1
        while accepted and accepted[0] <= now_s - 1.0:
            accepted.popleft()
        if len(accepted) >= limit_per_s:
            throttled += 1
            if rate.on_throttle(now_s):
                cuts_s.append(now_s)
        else:
            accepted.append(now_s)
            rate.on_success(now_s)
        now_s += 1.0 / rate.rate_per_s
    return _Outcome(sent, throttled, duration_s, cuts_s)


@pytest.mark.parametrize("limit_per_s", [20, 100, 1000])
def test_aimd_converges_under_an_upstream_limit(limit_per_s: int) -> None:
    # Measured: L=20 -> 1.3 % throttled, 73 % of L; L=100 -> 0.7 %, 73 %;
    # L=1000 -> 0.4 %, 73 % (over 120 s, from the 3500/s start). Below ~L=10 the +1/s
    # minimum growth overshoots more often (L=10: 2.5-3 %, L=5: 8 %); see the report.
    outcome = _simulate_aimd(limit_per_s, 120.0)
    assert outcome.throttled_fraction < 0.02
    assert 0.5 * limit_per_s <= outcome.accepted_per_s <= limit_per_s


def test_aimd_from_the_ceiling_one_cut_brings_it_under_the_limit() -> None:
    # From 3500/s the first cut goes to half of what was really sent (~L/2), not to half of
    # 3500: one cut is enough, and the next one comes only when growth reaches L again
    # (~14 s at +5 %/s).
    outcome = _simulate_aimd(100, 10.0)
    assert len(outcome.cuts_s) == 1
    assert outcome.cuts_s[0] < 0.1
    # What is still throttled is the upstream's memory of the initial burst: about one
    # second at the new rate.
    assert outcome.throttled <= 60


def test_aimd_recovers_quickly_to_the_last_measured_level_then_probes_slowly() -> None:
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for i in range(4):
        rate.on_success(i * 1.0)  # the prefix accepts 1/s
    assert rate.on_throttle(3.5)
    assert rate.rate_per_s == pytest.approx(0.9)
    rate.rate_per_s = 0.3  # cut deeper later (say, by cuts of stray 503s)
    rate.on_success(10.0)
    assert rate.rate_per_s == pytest.approx(0.33)  # +10 % per success below 0.9
    for i in range(20):
        rate.on_success(11.0 + i)
    assert rate.rate_per_s == pytest.approx(0.9 * 1.002**9, rel=0.01)  # then +0.2 % each


def test_aimd_without_an_accepted_rate_the_cut_stops_at_successes_seen() -> None:
    """Two successes 1.2 s apart and a 503 at 2.2 s (a prefix of ~1/s): halving what was
    sent (3 in 2.2 s) would give 0.68/s; the successes seen so far per second (2 / 2.2 s)
    and one over their median gap (1 / 1.2 s) bound the limit from above: the cut goes to
    0.9 x the lower."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for t in (0.0, 1.2, 2.2):
        rate.on_send(t)
    rate.on_success(0.0)
    rate.on_success(1.2)
    assert rate.accepted_rate_per_s(2.2) is None  # two successes are too few
    assert rate.on_throttle(2.2)
    assert rate.rate_per_s == pytest.approx(0.9 / 1.2)


def test_aimd_after_a_measured_cut_later_cuts_are_gentle() -> None:
    """Once cut to a measured level, a 503 is a marginal one: the rate drops by 15 %, not
    to what a small-burst prefix accepted while the lane was a little over its limit
    (about half of it), and the recovery level follows the rate down."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for t in (0.0, 1.0, 2.0, 3.0):
        rate.on_success(t)
    assert rate.on_throttle(3.5)  # accepted 1/s: level 0.9
    assert rate.rate_per_s == pytest.approx(0.9)
    for t in (6.0, 9.0, 12.0):  # then one success in three seconds
        rate.on_success(t)
    rate.rate_per_s = 1.0
    assert rate.on_throttle(12.5)
    assert rate.rate_per_s == pytest.approx(0.85)  # not 0.9 x 1/3
    rate.rate_per_s = 0.5  # (cut deeper by hand) recovers at +10 % per success to 0.85
    rate.on_success(13.0)
    assert rate.rate_per_s == pytest.approx(0.55)
    for t in range(14, 30):
        rate.on_success(float(t))
    assert 0.85 <= rate.rate_per_s <= 0.85 * 1.002**16


def test_aimd_a_clump_of_early_successes_is_not_taken_as_rate() -> None:
    """A prefix whose bucket holds two requests answers the first two at once, then one
    per 1.1 s: the count reads 3 / 2.2 s = 1.36/s; the median gap says 0.91/s."""
    rate = AimdRate(3500.0, 0.1, 0.0)
    rate.rate_per_s = 4.0
    for t in (0.0, 0.01, 1.11, 2.21):
        rate.on_success(t)
    assert rate.accepted_rate_per_s(2.3) == pytest.approx(1 / 1.1)  # not 3 / 2.21
    assert rate.on_throttle(2.3)
    assert rate.rate_per_s == pytest.approx(0.9 / 1.1)
