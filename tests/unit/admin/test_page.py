"""The drain rate and ETA the status page and `gateway status` show (gateway/admin/page.py):
measured over the current drain, not a one-minute average, and none while paused."""

from __future__ import annotations

import pytest

from gateway.admin.page import RATE_SPAN_S, Sample, drain_rate, eta_s

MB = 1_000_000


def _s(t: float, flushed: int, pending: int, *, paused: bool = False) -> Sample:
    return Sample(t, flushed, 0, pending, 1 if pending else 0, is_paused=paused)


def test_a_four_second_drain_gets_a_four_second_eta() -> None:
    # Idle for a minute, then 100 MB land and drain at 25 MB/s (samples every 2 s).
    idle = [_s(t, 0, 0) for t in range(0, 60, 2)]
    drain = [_s(60, 0, 100 * MB), _s(62, 50 * MB, 50 * MB), _s(63, 75 * MB, 25 * MB)]
    rate = drain_rate([*idle, *drain])
    assert rate == pytest.approx(25 * MB)
    assert eta_s(25 * MB, rate) == pytest.approx(1.0)  # the one-minute average said 20 s


def test_no_rate_and_no_eta_while_paused() -> None:
    samples = [_s(0, 0, 10 * MB), _s(2, 5 * MB, 5 * MB), _s(4, 5 * MB, 5 * MB, paused=True)]
    assert drain_rate(samples) is None
    assert eta_s(5 * MB, None) is None


def test_the_rate_after_a_resume_ignores_the_paused_stretch() -> None:
    paused = [_s(t, 0, 80 * MB, paused=True) for t in range(0, 40, 2)]
    running = [_s(40, 0, 80 * MB), _s(42, 20 * MB, 60 * MB), _s(44, 40 * MB, 40 * MB)]
    assert drain_rate([*paused, *running]) == pytest.approx(10 * MB)


def test_a_long_drain_is_measured_over_the_last_span() -> None:
    samples = [_s(t, int(t) * MB, 10_000 * MB) for t in range(0, 300, 2)]
    samples += [_s(300, 300 * MB + 60 * MB, 10_000 * MB)]  # faster in the last 2 s
    assert drain_rate(samples) == pytest.approx((360 - 240) * MB / RATE_SPAN_S)


def test_too_few_samples_give_no_rate() -> None:
    assert drain_rate([]) is None
    assert drain_rate([_s(5, 0, MB)]) is None
    assert eta_s(0, None) == 0.0  # nothing pending: drained
