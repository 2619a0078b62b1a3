"""TokenBucket and Pacer: pure token buckets driven by an explicit ``now_s``."""

from __future__ import annotations

import pytest

from gateway.flush.ratelimit import Pacer, TokenBucket

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


# -- wait_s / take: deciding who goes without committing anything --------------------------


def test_bucket_wait_s_takes_nothing() -> None:
    bucket = TokenBucket(2.0, 2.0, 0.0)
    assert [bucket.wait_s(1, 0.0) for _ in range(5)] == [0.0] * 5
    bucket.take(2, 0.0)
    assert bucket.wait_s(1, 0.0) == pytest.approx(0.5)
    assert bucket.wait_s(1, 0.25) == pytest.approx(0.25)
    assert bucket.wait_s(1, 0.5) == 0.0


def test_bucket_wait_s_for_more_than_the_burst_waits_for_a_full_bucket_then_overdraws() -> None:
    bucket = TokenBucket(100.0, 100.0, 0.0)  # bytes: a 250-byte request on a 100-byte burst
    assert bucket.wait_s(250, 0.0) == 0.0
    bucket.take(250, 0.0)
    assert bucket.wait_s(250, 0.0) == pytest.approx(2.5)  # the debt (1.5 s), then a burst


def test_bucket_wait_below_a_microsecond_is_now() -> None:
    """A wait the clock cannot tell from now (now + wait == now in floating point) would
    wake a waiter that finds its token still missing, forever."""
    bucket = TokenBucket(1e6, 2.0, 1000.0)
    bucket.take(3, 1000.0)
    assert bucket.wait_s(1, 1000.0) == pytest.approx(2e-6)
    assert bucket.wait_s(1, 1000.0 + 1.5e-6) == 0.0


def test_bucket_wait_s_unlimited() -> None:
    bucket = TokenBucket(0.0, 0.0, 0.0)
    bucket.take(1e9, 0.0)
    assert bucket.wait_s(1e9, 0.0) == 0.0


def test_bucket_drain_empties_it_but_keeps_debt() -> None:
    bucket = TokenBucket(2.0, 2.0, 0.0)
    bucket.drain(0.0)
    assert bucket.wait_s(1, 0.0) == pytest.approx(0.5)
    bucket.take(1, 0.5)
    bucket.take(1, 0.5)  # in debt by one token
    bucket.drain(0.5)
    assert bucket.wait_s(1, 0.5) == pytest.approx(1.0)


# -- Pacer ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rate", "burst"), [(0.5, 2.0), (10.0, 2.0), (40.0, 2.0), (3500.0, 175.0)])
def test_pacer_burst_is_a_twentieth_of_a_second_and_at_least_two(rate: float, burst: float) -> None:
    assert Pacer(rate, 0.0).burst == pytest.approx(burst)


def test_pacer_follow_keeps_the_tokens_earned_and_a_cut_empties_it() -> None:
    pacer = Pacer(10.0, 0.0)
    pacer.take(2, 0.0)
    pacer.follow(20.0, 0.1)  # 0.1 s at 10/s earned one token: kept, the next at 20/s
    assert pacer.wait_s(1, 0.1) == 0.0
    pacer.take(1, 0.1)
    assert pacer.wait_s(1, 0.1) == pytest.approx(0.05)
    pacer.follow(5.0, 0.2, cut=True)
    assert pacer.wait_s(1, 0.2) == pytest.approx(0.2)  # one interval at the new rate
