"""The window of requests in flight (``flush/window.py``): explicit times, no clock. A round
here is a window's worth of answers spread over the time the test says they took, so the
throughput a size achieves is the test's to choose."""

from __future__ import annotations

import pytest

from gateway.flush.window import Window, WindowConfig

MB = 1_000_000


def _window(initial: int = 8, **config: float) -> Window:
    return Window(WindowConfig(initial=initial, **config), 0.0)  # type: ignore[arg-type]


def _round(
    window: Window,
    now_s: float,
    duration_s: float,
    size_bytes: int = 0,
    *,
    bound: bool = True,
    accepted: bool = True,
) -> float:
    """A window's worth of answers over ``duration_s`` from ``now_s``; the time after."""
    n = window.size
    for i in range(n):
        t = now_s + duration_s * (i + 1) / n
        window.on_answer(t, size_bytes, accepted=accepted, bound=bound)
    return now_s + duration_s


def _linked(window: Window, now_s: float, rounds: int, link_per_s: float) -> float:
    """Rounds of small requests through a path that carries ``link_per_s`` of them: a round
    of ``size`` requests takes ``size / link_per_s`` seconds, whatever the size."""
    for _ in range(rounds):
        now_s = _round(window, now_s, window.size / link_per_s)
    return now_s


def test_slow_start_doubles_per_round_while_it_pays() -> None:
    """Each round takes as long as the last (the round trip), so twice the window carries
    twice the requests: it keeps doubling."""
    window = _window(8)
    now_s = 0.0
    for expected in (16, 32, 64, 128):
        now_s = _round(window, now_s, 0.05)
        assert window.size == expected
    assert window.is_slow_start


def test_a_window_that_is_not_the_limit_does_not_move() -> None:
    window = _window(8)
    _round(window, 0.0, 0.05, bound=False)
    assert window.size == 8


def test_refused_and_failed_requests_do_not_grow_it() -> None:
    window = _window(8)
    _round(window, 0.0, 0.05, accepted=False)
    assert window.size == 8


def test_it_stops_growing_when_more_in_flight_carry_no_more() -> None:
    """A path that carries 1000 requests/s whatever is in flight: slow start doubles the
    window until a round at twice the size carried no more, then holds near the size
    that got there, far below where doubling would have taken it."""
    window = _window(8)
    _linked(window, 0.0, 8, 1000.0)
    assert not window.is_slow_start
    assert 8 <= window.size <= 48, window.size


def test_large_bodies_stop_it_where_the_link_is_full() -> None:
    """16 MB bodies at 4 MB/s per connection through a 200 MB/s link: 50 in flight fill
    it. Starting at 32, it grows while bytes per second grow, and holds once they stop."""
    window = _window(32)
    now_s, link_bps, conn_bps = 0.0, 200 * MB, 4 * MB
    for _ in range(6):
        per_s = min(conn_bps, link_bps / window.size)
        now_s = _round(window, now_s, 0.05 + 16 * MB / per_s, 16 * MB)
    assert not window.is_slow_start
    assert 50 <= window.size <= 100, window.size


def test_holding_it_probes_and_keeps_what_pays() -> None:
    """Held at 40 (a throttle's cut), the path then carries everything in one round trip:
    after a few rounds it probes a quarter more, which pays in full, and slow start
    resumes."""
    window = _window(50)
    window.on_congestion(0.0, bound=True)
    assert (window.size, window.is_slow_start) == (40, False)
    now_s = 0.0
    for _ in range(4):
        now_s = _round(window, now_s, 0.05)
    assert window.size == 50  # the probe
    now_s = _round(window, now_s, 0.05)
    assert window.is_slow_start
    _round(window, now_s, 0.05)
    assert window.size > 50


def test_a_probe_that_does_not_pay_goes_back() -> None:
    window = _window(50)
    window.on_congestion(0.0, bound=True)
    now_s = _linked(window, 0.0, 4, 800.0)  # 40 in flight carry 800/s
    assert window.size == 50  # the probe
    _linked(window, now_s, 1, 800.0)  # ... and 50 carry no more
    assert window.size == 40 and not window.is_slow_start


def test_a_throttle_cuts_it_only_when_it_is_the_limit() -> None:
    window = _window(100)
    window.on_congestion(0.0, bound=False)
    assert (window.size, window.is_slow_start) == (100, True)
    window.on_congestion(0.0, bound=True)
    assert (window.size, window.is_slow_start) == (80, False)


@pytest.mark.parametrize(("cuts", "expected"), [(1, 16), (30, 4)])
def test_it_stays_within_its_bounds(cuts: int, expected: int) -> None:
    window = _window(16, min_size=4, max_size=20)
    _round(window, 0.0, 0.05)
    assert window.size == 20
    for _ in range(cuts):
        window.on_congestion(1.0, bound=True)
    assert window.size == expected


def test_requests_on_their_way_grow_it_ahead_of_answers_within_bounds() -> None:
    """Large bodies take seconds: those sent while the window was the limit and not
    refused grow it before their answers, up to four times what answers confirmed."""
    window = _window(8)
    for _ in range(100):
        window.on_progress(bound=True)
    assert window.size == 32
    window.on_progress(bound=False)
    assert window.size == 32
    _round(window, 0.0, 5.0, 16 * MB)  # answers confirm 32 and more
    for _ in range(200):
        window.on_progress(bound=True)
    assert window.size >= 128
