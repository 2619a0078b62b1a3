"""Full-jitter backoff: bounded, growing ceilings, Retry-After as a floor."""

from __future__ import annotations

import random

from gateway.flush.backoff import Backoff


def test_backoff_delays_stay_under_growing_ceiling() -> None:
    backoff = Backoff(base_s=0.1, cap_s=5.0, rng=random.Random(7))
    for attempt in range(12):
        ceiling = min(5.0, 0.1 * 2**attempt)
        delays = [backoff.delay_s(attempt) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        # Full jitter: the spread covers most of [0, ceiling], not a fixed value.
        assert max(delays) - min(delays) > ceiling * 0.5


def test_backoff_honours_retry_after_up_to_cap() -> None:
    backoff = Backoff(base_s=0.1, cap_s=5.0, rng=random.Random(1))
    assert backoff.delay_s(0, retry_after_s=2.0) >= 2.0
    assert backoff.delay_s(0, retry_after_s=60.0) == 5.0


def test_backoff_huge_attempt_does_not_overflow() -> None:
    assert Backoff(rng=random.Random(3)).delay_s(10_000) <= 30.0
