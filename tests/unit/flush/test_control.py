"""AdaptiveRate: the bucket budget's rate, driven by explicit times (no clock, no I/O)."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gateway.flush.control import AdaptiveRate, Answers, RateConfig

CONFIG = RateConfig(initial_per_s=10.0, floor_per_s=0.1, beta=0.8, recovery_s=10.0)


def _steady(rate: float = 100.0, at_s: float = 0.0) -> AdaptiveRate:
    """A budget that has sent and had accepted ``rate`` requests/s for 3 s until ``at_s``,
    then was throttled once: out of slow start, w_max = ``rate``."""
    budget = AdaptiveRate(dataclasses.replace(CONFIG, initial_per_s=rate), at_s - 3.0)
    _traffic(budget, rate, at_s - 3.0, at_s)
    assert budget.on_throttle(at_s, at_s)
    assert budget.w_max_per_s == pytest.approx(rate, rel=0.05)
    return budget


def _traffic(budget: AdaptiveRate, rate: float, start_s: float, end_s: float) -> None:
    """Requests sent at ``rate`` over [start, end), each accepted at once."""
    n = round((end_s - start_s) * rate)
    for i in range(n):
        t = start_s + i / rate
        budget.on_success(t, t)


def _grow(budget: AdaptiveRate, from_s: float, to_s: float, step_s: float = 0.1) -> float:
    """Hold work back (binding) from ``from_s`` to ``to_s``; the rate at the end."""
    budget.tick(from_s, binding=True)
    t = from_s
    while t < to_s - 1e-9:
        t = min(to_s, t + step_s)
        budget.tick(t, binding=True)
    return budget.rate_per_s


# -- measurements ---------------------------------------------------------------------------


def test_answers_count_acceptances_per_second() -> None:
    answers = Answers()
    assert answers.accepted_per_s(0.0) == 0.0
    for i in range(60):
        answers.add(i * 0.05, accepted=i % 3 != 0)  # 20 answers/s, two thirds accepted
    assert answers.accepted_per_s(3.0) == pytest.approx(20 * 2 / 3, rel=0.1)


# -- slow start ------------------------------------------------------------------------------


def test_slow_start_adds_one_per_success_while_binding_only() -> None:
    budget = AdaptiveRate(CONFIG, 0.0)
    assert (budget.rate_per_s, budget.is_slow_start, budget.w_max_per_s) == (10.0, True, None)
    budget.on_success(0.0, 0.05)  # not holding work back: nothing learnt about more
    assert budget.rate_per_s == 10.0
    budget.tick(0.1, binding=True)
    for i in range(10):
        budget.on_success(0.1 + i * 0.1, 0.15 + i * 0.1)
    assert budget.rate_per_s == pytest.approx(20.0)  # 10 successes in a second: doubled


def test_slow_start_never_more_than_doubles_per_round_trip() -> None:
    budget = AdaptiveRate(CONFIG, 0.0)
    budget.tick(0.0, binding=True)
    budget.on_success(0.0, 4.0)  # a 4 s round trip: +min(rate, 1/4)
    assert budget.rate_per_s == pytest.approx(10.25)


def test_slow_start_ends_at_the_first_throttle_at_what_was_accepted() -> None:
    """Slow start sent at 40/s while the upstream accepted 20/s: the cut is from 20."""
    budget = AdaptiveRate(RateConfig(initial_per_s=40.0), 0.0)
    for i in range(120):  # 3 s at 40/s, every other request accepted
        t = i / 40
        if i % 2:
            budget.on_success(t, t)
    assert budget.on_throttle(3.0, 3.0)
    assert not budget.is_slow_start
    assert budget.w_max_per_s == pytest.approx(20.0, rel=0.1)
    assert budget.rate_per_s == pytest.approx(0.8 * budget.w_max_per_s)


# -- one cut per congestion event ----------------------------------------------------------


def test_throttles_of_requests_sent_before_the_cut_are_the_same_event() -> None:
    budget = _steady(100.0, at_s=10.0)
    rate = budget.rate_per_s
    for sent_s in (9.95, 9.99, 10.0):  # in flight when the first 503 came back
        assert not budget.on_throttle(sent_s, 10.02)
    assert (budget.rate_per_s, budget.events) == (rate, 1)


def test_a_throttle_after_the_cut_before_anything_got_through_cuts_again() -> None:
    """The cut did not bite (a partition's burst hid the overload): cut again, keep w_max."""
    budget = _steady(100.0, at_s=10.0)
    w_max = budget.w_max_per_s
    assert budget.on_throttle(10.01, 10.03)
    assert budget.w_max_per_s == w_max
    assert budget.rate_per_s == pytest.approx(0.8 * 80.0, rel=0.05)
    assert budget.events == 2


def test_a_throttle_after_recovery_is_a_new_event_cut_by_the_refused_share() -> None:
    """One 503 among 80 answers a second: the overload is about 1 %, and so is the cut
    (fast convergence gives way by half as much again)."""
    budget = _steady(100.0, at_s=10.0)
    _traffic(budget, 80.0, 10.0, 13.0)  # sent after the cut, accepted: recovered
    assert budget.on_throttle(13.0, 13.0)
    cut = 1 - 1 / 81
    # accepted 80/s < w_max 100: w_max = 80 * (1 + cut) / 2, gives way to other gateways
    assert budget.w_max_per_s == pytest.approx(80.0 * (1 + cut) / 2, rel=0.01)
    assert budget.rate_per_s == pytest.approx(cut * budget.w_max_per_s, rel=0.01)


def test_a_heavy_overload_is_cut_by_beta_at_most() -> None:
    """Half the last second's answers refused: the cut is ``beta`` (0.8), not half."""
    budget = _steady(100.0, at_s=10.0)
    _traffic(budget, 80.0, 10.0, 12.5)
    for i in range(40):  # the last half second: 80/s, every other one refused
        t = 12.5 + i / 80
        if i % 2:
            budget.on_throttle(10.0, t)  # sent before the last cut: the same old event
        else:
            budget.on_success(t, t)
    assert budget.on_throttle(13.0, 13.0)
    assert budget.rate_per_s == pytest.approx(0.8 * budget.w_max_per_s, rel=0.01)


# -- CUBIC recovery and probing ----------------------------------------------------------------


def test_recovery_reaches_w_max_after_recovery_s_of_binding_time_only() -> None:
    budget = _steady(100.0, at_s=0.0)
    assert budget.rate_per_s == pytest.approx(80.0, rel=0.05)
    budget.tick(0.0, binding=False)
    budget.tick(30.0, binding=False)  # idle: no growth
    assert budget.rate_per_s == pytest.approx(80.0, rel=0.05)
    assert _grow(budget, 30.0, 35.0) == pytest.approx(97.5, rel=0.02)  # concave: fast first
    assert _grow(budget, 35.0, 40.0) == pytest.approx(100.0, rel=0.02)
    assert _grow(budget, 40.0, 41.0) == pytest.approx(100.0, rel=0.01)  # flat near w_max


@pytest.mark.parametrize("w_max", [5.0, 14.0, 3500.0])
def test_recovery_time_is_the_same_at_any_scale(w_max: float) -> None:
    budget = _steady(w_max, at_s=0.0)
    assert _grow(budget, 0.0, 5.0) / budget.w_max_per_s == pytest.approx(0.975, abs=0.01)


def test_probe_past_w_max_is_at_least_probe_c_in_absolute_terms() -> None:
    """A small budget (one gateway's share) probes as fast as a large one, in requests/s:
    what lets independent gateways converge to fair shares."""
    small, large = _steady(5.0, at_s=0.0), _steady(50.0, at_s=0.0)
    k_s = 10.0
    grown_small = _grow(small, 0.0, k_s + 3.0) - small.w_max_per_s  # type: ignore[operator]
    grown_large = _grow(large, 0.0, k_s + 3.0) - large.w_max_per_s  # type: ignore[operator]
    assert grown_small == pytest.approx(0.02 * 3.0**3, rel=0.05)
    assert grown_large == pytest.approx(grown_small, rel=0.05)


def test_a_probe_far_past_w_max_without_a_throttle_starts_slow_start_again() -> None:
    budget = _steady(10.0, at_s=0.0)
    rate = _grow(budget, 0.0, 14.0)  # 4 s past w_max: +0.02 * 4**3
    assert not budget.is_slow_start and rate == pytest.approx(11.28, rel=0.01)
    _grow(budget, 14.0, 30.0)
    assert budget.is_slow_start  # the limit has risen: found by doubling, not by a cubic
    rate = budget.rate_per_s
    for i in range(round(rate)):  # a second of successes while binding
        budget.on_success(30.0 + i / rate, 30.0 + i / rate)
    assert budget.rate_per_s == pytest.approx(2 * rate, rel=0.05)


# -- outages, floor and ceiling -------------------------------------------------------------


def test_an_outage_keeps_w_max_and_slow_starts_back_to_it() -> None:
    budget = _steady(50.0, at_s=0.0)
    t = 0.0
    for _ in range(40):  # 20 s of nothing but 503s, one request per 0.5 s
        t += 0.5
        budget.on_throttle(t, t + 0.01)
    # Not the floor: a request a second keeps looking for the outage's end.
    assert budget.rate_per_s == CONFIG.outage_per_s
    assert budget.w_max_per_s == pytest.approx(50.0, rel=0.05)
    assert budget.is_slow_start
    budget.tick(t, binding=True)
    sent_s = t + 0.1
    while budget.is_slow_start:  # answers again: doubling per round trip (0.1 s at least)
        budget.on_success(sent_s, sent_s + 0.05)
        sent_s += 1.0 / budget.rate_per_s
    assert budget.rate_per_s == pytest.approx(50.0, rel=0.05)
    # Back at w_max in 1.2 s from 1/s, doubling per round trip (0.1 s at least) and at
    # first per answer, a second apart (per second, as a slow start that knows no limit
    # grows, it took 3.6 s; a cubic, tens).
    assert sent_s - t < 1.5


def test_a_storm_shorter_than_the_answer_window_is_an_outage() -> None:
    """S3 refuses everything for a second and a half, while the 3 s window still holds
    what it accepted before: once the last second's answers are all refusals it is an
    outage (w_max kept, a slow start back to it), not a limit cut 0.8x per round trip
    and climbed back along a cubic (12 s from 5 % of 3,500/s in the simulator)."""
    budget = _steady(1000.0, at_s=0.0)
    _traffic(budget, 1000.0, 0.0, 2.0)
    t = 2.0
    assert budget.on_throttle(t, t + 0.05)  # the storm's first 503: a cut as any other
    w_max = budget.w_max_per_s
    t += 0.1
    while t < 3.5:  # the storm: every request refused, a round trip of 50 ms
        budget.on_throttle(t, t + 0.05)
        t += 1.0 / max(budget.rate_per_s, 20.0)
    assert budget.w_max_per_s == w_max
    assert budget.is_slow_start  # back to w_max by slow start once answers come


def test_a_limit_under_one_request_per_s_is_followed_below_it() -> None:
    """S3 accepting some requests is no outage, whatever the rate: the budget goes below
    the outage probe's 1 request/s when that is what gets through."""
    budget = _steady(0.5, at_s=0.0)
    assert budget.rate_per_s == pytest.approx(0.4, rel=0.05)  # beta x what got through
    assert budget.on_throttle(1.0, 1.05)  # the cut did not bite: cut again
    assert budget.rate_per_s == pytest.approx(0.32, rel=0.05)


def test_slow_start_grows_only_on_requests_sent_since_the_last_cut() -> None:
    """With slow bodies, acceptances of requests sent before a cut arrive long after it:
    they say nothing about the rate since, and must not grow it (a fresh budget whose
    first answers were 503s would otherwise slow-start on them into the next burst of
    503s, again and again)."""
    budget = _steady(50.0, at_s=0.0)
    t = 0.0
    for _ in range(20):  # 10 s of nothing but 503s: an outage, slow start will follow
        t += 0.5
        budget.on_throttle(t, t + 0.01)
    assert budget.is_slow_start
    budget.tick(t + 0.01, binding=True)
    before = budget.rate_per_s
    for i in range(10):  # bodies sent before the last cut, accepted only now
        budget.on_success(t - 5.0 + 0.1 * i, t + 1.0 + 0.1 * i)
    assert budget.rate_per_s == before
    budget.on_success(t + 1.0, t + 1.05)  # sent since: the rate that works now
    assert budget.rate_per_s == pytest.approx(2 * before)


def test_rate_stays_within_floor_and_ceiling() -> None:
    config = RateConfig(initial_per_s=10.0, floor_per_s=2.0, ceiling_per_s=12.0)
    budget = AdaptiveRate(config, 0.0)
    budget.tick(0.0, binding=True)
    for i in range(50):
        budget.on_success(i * 0.01, i * 0.01)
    assert budget.rate_per_s == 12.0
    for i in range(20):
        budget.on_throttle(1.0 + i, 1.0 + i + 0.01)
    assert budget.rate_per_s == 2.0
    assert math.isfinite(_grow(budget, 30.0, 200.0)) and budget.rate_per_s <= 12.0


# -- at S3's scale (issue 22) ---------------------------------------------------------------


def test_answers_keep_only_their_window_and_measure_a_full_memory_exactly() -> None:
    """At thousands of answers a second the memory is seconds long at most; a memory
    that is full measures the time it covers (not a floor of 0.75 s)."""
    answers = Answers()
    for i in range(20_000):
        answers.add(i / 5000, accepted=True)  # 5000/s for 4 s
    assert sum(answers.counts(4.0)) <= 3 * 5000 + 8
    assert answers.accepted_per_s(4.0) == pytest.approx(5000, rel=0.02)


def test_a_throttle_within_a_round_trip_of_the_cut_is_the_same_event() -> None:
    """Requests sent right after a cut meet the overload of those sent before it (the
    partition's bucket is still empty): their 503s are the same congestion event."""
    budget = AdaptiveRate(dataclasses.replace(CONFIG, initial_per_s=1000.0), 7.0)
    _traffic(budget, 1000.0, 7.0, 10.0)
    assert budget.on_throttle(9.9, 10.0)  # round trip 0.1 s: the event takes sends to 10.1
    events, rate = budget.events, budget.rate_per_s
    assert not budget.on_throttle(10.05, 10.15)
    assert (budget.events, budget.rate_per_s) == (events, rate)
    assert budget.on_throttle(10.2, 10.3)  # sent after the round trip: a new event


def test_what_got_through_while_refused_raises_a_limit_measured_low() -> None:
    """A slow start that overshot: the accepted rate of the last 3 s averages its ramp
    (far below the limit), but of the requests sent between the first refused one and
    the cut, the partition (empty) accepted its rate: 3500/s. The curve recovers to it."""
    budget = AdaptiveRate(dataclasses.replace(CONFIG, initial_per_s=500.0), 0.0)
    t = 0.0
    for rate in (500.0, 1000.0, 2000.0):  # the ramp: a second at each rate
        _traffic(budget, rate, t, t + 1.0)
        t += 1.0
    sent, accepted = [], 0.0
    for i in range(int(0.05 * 7000)):  # 7000/s for 50 ms: half of them get through
        s = t + i / 7000
        accepted += 3500 / 7000
        sent.append((s, accepted >= 1.0))
        accepted -= accepted >= 1.0
    budget.on_throttle(sent[0][0] + 0.001, sent[0][0] + 0.05)  # the first 503: a cut
    assert budget.w_max_per_s is not None and budget.w_max_per_s < 2500
    for s, ok in sent[1:]:
        if ok:
            budget.on_success(s, s + 0.05)
        else:
            budget.on_throttle(s, s + 0.05)
    budget.on_success(t + 0.2, t + 0.25)  # a request sent after the cut: it is known
    assert budget.w_max_per_s == pytest.approx(3500, rel=0.05)


# -- the fleet's shares -----------------------------------------------------------------


def test_a_share_taken_over_raises_the_rate_and_the_limit_at_once() -> None:
    budget = _steady(100.0, at_s=0.0)
    _grow(budget, 0.0, 10.0)  # recovered to w_max
    budget.take_share(10.0, 25.0)
    assert budget.w_max_per_s == pytest.approx(125.0, rel=0.02)
    assert budget.rate_per_s == pytest.approx(125.0, rel=0.02)
    assert _grow(budget, 10.0, 11.0) == pytest.approx(125.0, rel=0.01)  # flat from there


def test_a_share_taken_over_in_a_first_slow_start_only_adds_to_the_rate() -> None:
    budget = AdaptiveRate(CONFIG, 0.0)
    budget.take_share(0.5, 15.0)
    assert budget.rate_per_s == pytest.approx(25.0)
    assert budget.w_max_per_s is None and budget.is_slow_start
    budget.take_share(0.6, 0.0)  # nothing freed: nothing changes
    assert budget.rate_per_s == pytest.approx(25.0)


# -- a limit remembered from a previous run --------------------------------------------------


def _slow_start_to_plateau(budget: AdaptiveRate, rtt_s: float = 0.035) -> float:
    """Binding from 0, every request accepted after ``rtt_s``: the time slow start ends."""
    budget.tick(0.0, binding=True)
    sent_s = 0.0
    while budget.is_slow_start and sent_s < 60.0:
        budget.on_success(sent_s, sent_s + rtt_s)
        sent_s += 1.0 / budget.rate_per_s
    return sent_s


def test_a_remembered_rate_is_reached_per_round_trip_where_a_fresh_start_takes_seconds() -> None:
    """A restarted gateway slow-starts to the rate its last run learnt, doubling per round
    trip (0.1 s at least), and plateaus there; a fresh one doubles once a second."""
    known = AdaptiveRate(CONFIG, 0.0, known_per_s=200.0)
    assert (known.rate_per_s, known.w_max_per_s, known.is_slow_start) == (10.0, 200.0, True)
    reached_s = _slow_start_to_plateau(known)
    assert known.rate_per_s == pytest.approx(200.0)
    assert not known.is_slow_start
    assert reached_s < 0.7  # log2(200/10) = 4.3 doublings of 0.1 s, from 10/s
    fresh = AdaptiveRate(dataclasses.replace(CONFIG, ceiling_per_s=200.0), 0.0)
    fresh_s = 0.0
    fresh.tick(0.0, binding=True)
    while fresh.rate_per_s < 200.0 and fresh_s < 60.0:
        fresh.on_success(fresh_s, fresh_s + 0.035)
        fresh_s += 1.0 / fresh.rate_per_s
    assert fresh_s > 2.5  # the cost a remembered rate saves: +1/s per acceptance, ln(20) s


def test_a_remembered_rate_under_the_initial_one_is_the_start() -> None:
    budget = AdaptiveRate(CONFIG, 0.0, known_per_s=0.5)
    assert (budget.rate_per_s, budget.w_max_per_s, budget.is_slow_start) == (0.5, 0.5, False)


def test_a_remembered_rate_over_the_ceiling_is_the_ceiling() -> None:
    capped = dataclasses.replace(CONFIG, ceiling_per_s=50.0)
    budget = AdaptiveRate(capped, 0.0, known_per_s=400.0)
    assert budget.w_max_per_s == 50.0
    _slow_start_to_plateau(budget)
    assert (budget.rate_per_s, budget.is_slow_start) == (50.0, False)


def test_a_remembered_rate_above_the_limit_is_cut_at_the_first_503_by_what_got_through() -> None:
    """The limit fell while the gateway was down: the first throttle ends the slow start
    at what was accepted, one event, and the lower figure replaces the remembered one."""
    budget = AdaptiveRate(CONFIG, 0.0, known_per_s=400.0)
    budget.tick(0.0, binding=True)
    _traffic(budget, 100.0, 0.0, 1.0)  # S3 took 100/s
    assert budget.on_throttle(1.0, 1.02)
    assert not budget.is_slow_start
    assert budget.w_max_per_s is not None and budget.w_max_per_s <= 100.0
    assert budget.rate_per_s < 100.0
    assert not budget.on_throttle(1.0, 1.03)  # the same event


def test_a_share_taken_over_is_lent_not_learnt_and_stays_in_proportion_through_a_cut() -> None:
    """A peer's share taken over raises w_max, not this gateway's own share of it (the
    figure its next start aims for); a cut measures both anew, in the same proportion."""
    budget = _steady(100.0, at_s=0.0)
    _grow(budget, 0.0, 10.0)
    budget.take_share(10.0, 50.0)
    assert (budget.w_max_per_s, budget.own_per_s) == (pytest.approx(150.0), pytest.approx(100.0))
    _traffic(budget, 120.0, 10.0, 13.0)  # S3 took 120/s of the 150
    assert budget.on_throttle(13.0, 13.01)
    assert budget.w_max_per_s is not None and budget.own_per_s is not None
    assert budget.own_per_s == pytest.approx(budget.w_max_per_s * 100.0 / 150.0)
    assert AdaptiveRate(CONFIG, 0.0).own_per_s is None  # nothing learnt


# -- a fleet peer's cut, followed ------------------------------------------------------------


def test_a_peers_cut_is_followed_by_its_factor_once_per_quiet_time() -> None:
    """A peer on the same bucket cut to 0.9 of its rate: this budget cuts to 0.9 of what
    was accepted, counts an event that is not its own (peers do not echo it), and takes
    the next peer's cut within ``_FOLLOW_QUIET_S`` for the same one; its own throttles of
    requests sent before the followed cut are that event too."""
    budget = _steady(100.0, at_s=0.0)
    _grow(budget, 0.0, 20.0)
    _traffic(budget, 100.0, 17.0, 20.0)
    own = (budget.own_events, budget.last_cut_factor)
    assert budget.follow_cut(20.0, 0.9)
    assert budget.rate_per_s == pytest.approx(90.0, rel=0.02)
    assert budget.w_max_per_s == pytest.approx(100.0, rel=0.02)
    assert (budget.own_events, budget.last_cut_factor) == own and budget.events == 2
    assert not budget.follow_cut(21.0, 0.8)  # within the quiet time: the same event
    assert not budget.on_throttle(19.9, 20.1)  # sent before the followed cut
    assert budget.follow_cut(22.5, 0.5)
    assert budget.rate_per_s == pytest.approx(0.8 * budget.w_max_per_s)  # never below beta


def test_a_budget_that_cut_itself_does_not_follow_within_the_quiet_time() -> None:
    budget = _steady(100.0, at_s=10.0)
    assert (budget.own_events, budget.last_cut_factor) == (1, 0.8)
    assert not budget.follow_cut(11.0, 0.8)  # the peers' reports of the same overshoot
    assert budget.follow_cut(12.5, 0.8)


def test_a_slow_start_does_not_follow_a_peers_cut() -> None:
    """A fresh budget learns the limit from its own first 503 (a peer's may be another
    partition's)."""
    budget = AdaptiveRate(CONFIG, 0.0)
    _traffic(budget, 10.0, 0.0, 3.0)
    assert not budget.follow_cut(3.0, 0.8)
    assert budget.is_slow_start


def test_the_absolute_probe_is_split_among_the_fleets_senders() -> None:
    """64 gateways at a few requests/s each probe together as one budget does."""
    alone, shared = _steady(5.0, at_s=0.0), _steady(5.0, at_s=0.0)
    shared.senders = 4
    k_s = 10.0
    grown_alone = _grow(alone, 0.0, k_s + 3.0) - alone.w_max_per_s  # type: ignore[operator]
    grown_shared = _grow(shared, 0.0, k_s + 3.0) - shared.w_max_per_s  # type: ignore[operator]
    assert grown_shared == pytest.approx(grown_alone / 4, rel=0.05)
