"""How a bucket's lanes share its adaptive budget: through ``Lanes.submit``/``pump`` and
the answers, with explicit times (no clock, no I/O). The rate itself is test_control.py;
the window of requests in flight and the answers' bookkeeping are test_gate.py."""

from __future__ import annotations

import math

import pytest

from gateway.flush.admission import _chance_of_at_least
from gateway.flush.control import RateConfig
from gateway.flush.gate import Gate, GateConfig, Outcome
from gateway.flush.lanes import Lane, LaneConfig, Lanes, Ticket
from gateway.flush.window import WindowConfig


def _lanes(rate: float = 1000.0, **lane: float) -> Lanes:
    config = LaneConfig(depth=1, **lane)  # type: ignore[arg-type]
    return Lanes(config, RateConfig(initial_per_s=rate))


def _submit(lanes: Lanes, key: str, order: int, now_s: float = 0.0) -> Ticket:
    return lanes.submit(lanes.lane_for("b", key, now_s), order, 1, 0, now_s)


def _granted(lanes: Lanes, now_s: float) -> list[tuple[str, int]]:
    granted, _ = lanes.pump(now_s)
    return [(t.lane.prefix, t.order) for t in granted]


def _send(lanes: Lanes, tickets: list[Ticket], now_s: float) -> None:
    for ticket in tickets:
        lanes.on_sent(ticket, now_s)


# -- order and fairness -----------------------------------------------------------------------


def test_fair_rounds_oldest_work_first_within_a_round() -> None:
    """Each lane with work gets one request per round; within a round the lane with the
    oldest waiting request goes first. A lane with a deep backlog does not make a lane with
    one object wait behind all of it."""
    lanes = _lanes()
    for order in (1, 2, 3, 4):
        _submit(lanes, f"a/{order}", order)
    _submit(lanes, "b/x", 10)
    _submit(lanes, "c/x", 5)
    expected = [("a/", 1), ("c/", 5), ("b/", 10), ("a/", 2), ("a/", 3), ("a/", 4)]
    assert _granted(lanes, 0.0) == expected


def test_a_lane_that_joins_later_joins_the_current_round() -> None:
    lanes = _lanes(rate=10.0)  # a burst of 2, then one every 0.1 s
    for order in range(1, 7):
        _submit(lanes, f"a/{order}", order)
    assert _granted(lanes, 0.0) == [("a/", 1), ("a/", 2)]
    _submit(lanes, "late/x", 100)  # younger than everything waiting: still next in turn
    assert _granted(lanes, 0.1) == [("late/", 100)]
    assert _granted(lanes, 0.2) == [("a/", 3)]


def test_rate_freed_by_a_lane_that_empties_goes_to_the_others_at_once() -> None:
    lanes = _lanes(rate=10.0)
    for order in range(5):
        _submit(lanes, f"a/{order}", order)
    _submit(lanes, "b/x", 1)
    times: dict[str, list[float]] = {"a/": [], "b/": []}
    now_s = 0.0
    while lanes.has_waiting:
        granted, next_s = lanes.pump(now_s)
        for ticket in granted:
            times[ticket.lane.prefix].append(now_s)
        now_s = next_s
    assert times["b/"] == [0.0]
    assert times["a/"] == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4])  # the whole rate


def test_a_lane_held_by_its_own_gates_does_not_hold_back_the_others() -> None:
    lanes = _lanes()
    hot = _submit(lanes, "hot/x", 1)
    hot.lane.paused_until_s = 5.0  # Retry-After
    _submit(lanes, "cold/x", 2)
    granted, next_s = lanes.pump(0.0)
    assert [t.lane.prefix for t in granted] == ["cold/"]
    assert next_s == 5.0  # the pump wants to be called when the pause ends
    assert _granted(lanes, 5.0) == [("hot/", 1)]


def test_pump_says_when_to_call_again() -> None:
    lanes = _lanes(rate=10.0)
    assert lanes.pump(0.0) == ([], math.inf)
    for order in range(3):
        _submit(lanes, f"a/{order}", order)
    granted, next_s = lanes.pump(0.0)
    assert (len(granted), next_s) == (2, pytest.approx(0.1))
    assert lanes.pump(0.05)[0] == []
    granted, next_s = lanes.pump(0.1)
    assert (len(granted), next_s) == (1, math.inf)


def test_a_cancelled_waiter_is_never_admitted() -> None:
    lanes = _lanes()
    gone = _submit(lanes, "a/x", 1)
    kept = _submit(lanes, "a/y", 2)
    lanes.cancel(gone)
    assert lanes.pump(0.0)[0] == [kept]


def test_pump_admits_at_most_room_requests() -> None:
    lanes = _lanes()
    for i in range(3):
        _submit(lanes, f"p{i}/x", i)
    assert [t.order for t in lanes.pump(0.0, 2)[0]] == [0, 1]
    assert lanes.pump(0.0, 0) == ([], math.inf)  # not the budget's doing: no timer needed
    assert [t.order for t in lanes.pump(0.0, 2)[0]] == [2]


# -- throttles ----------------------------------------------------------------------------


def test_a_burst_of_503s_for_requests_sent_together_cuts_the_budget_once() -> None:
    lanes = _lanes()
    tickets = [_submit(lanes, f"p{i}/x", i) for i in range(10)]
    granted, _ = lanes.pump(0.0)
    _send(lanes, granted, 0.0)
    for ticket in tickets[:5]:
        lanes.on_answer(ticket, 0.05, throttled=True)
    for ticket in tickets[5:]:
        lanes.on_answer(ticket, 0.06, throttled=False)
    [budget] = lanes.budgets()
    assert (budget.throttles, budget.events) == (5, 1)
    assert budget.rate_per_s < 1000.0
    throttles = [s.throttles for s in sorted(lanes.status(0.1), key=lambda s: s.prefix)]
    assert throttles == [1] * 5 + [0] * 5


def _refuse(lanes: Lanes, key: str, order: int, now_s: float) -> Ticket:
    """A request of ``key`` admitted, sent and refused right after; whatever else is
    admitted meanwhile is sent and accepted."""
    ticket = _submit(lanes, key, order, now_s)
    while not ticket.is_granted:
        granted, next_s = lanes.pump(now_s, 4)  # four requests in flight at most
        for other in granted:
            if other is not ticket:
                lanes.on_sent(other, now_s)
                lanes.on_answer(other, now_s + 0.01, throttled=False)
        if not ticket.is_granted:
            now_s = next_s if next_s < math.inf else now_s
    lanes.on_sent(ticket, now_s)
    lanes.on_answer(ticket, now_s + 0.01, throttled=True)
    return ticket


def test_a_lane_refused_again_and_again_while_others_wait_gets_a_rate_of_its_own() -> None:
    """Throttles in a row, over several congestion events, all of the hot lane while the
    cold lane had work waiting and was never refused: S3 throttles that prefix on its own.
    With two lanes sharing the requests, six refusals in a row on one lane are the first
    that an even spread would make under 2 % likely (1/64): isolated at the sixth, not
    the third. From then on its throttles cut its own rate, not the bucket's budget."""
    lanes = _lanes()
    first = [_submit(lanes, f"hot/{k}", order) for order, k in enumerate("ab", 1)]
    for order in range(50):
        _submit(lanes, f"cold/{order}", 1000 + order)
    granted, _ = lanes.pump(0.0, 4)  # in rounds: hot, cold, hot, cold
    assert [t.lane.prefix for t in granted] == ["hot/", "cold/", "hot/", "cold/"]
    _send(lanes, granted, 0.0)
    for ticket in granted:  # all sent before the first answer's cut: one event
        lanes.on_answer(ticket, 0.01, throttled=ticket in first)
    [budget] = lanes.budgets()
    assert (budget.events, budget.throttles, budget.isolated_lanes) == (1, 2, 0)

    hot = lanes.peek("b", "hot/x")
    assert hot is not None
    refused_at = []
    for order, (key, now_s) in enumerate(zip("cdef", (0.3, 0.6, 0.9, 1.2), strict=True), 3):
        _refuse(lanes, f"hot/{key}", order, now_s)
        refused_at.append(hot.isolation is not None)
    assert refused_at == [False, False, False, True]  # the 6th throttle isolates it
    [budget] = lanes.budgets()
    events = budget.events
    assert budget.isolated_lanes == 1
    _refuse(lanes, "hot/g", 7, 1.5)
    _refuse(lanes, "hot/h", 8, 2.0)
    [budget] = lanes.budgets()
    assert budget.events == events  # the hot lane's throttles cut its own rate only
    assert hot.isolation is not None and hot.isolation.events >= 2
    assert [s.prefix for s in lanes.status(2.0) if s.is_isolated] == ["hot/"]


def test_a_few_refusals_that_happen_to_fall_on_one_lane_isolate_nobody() -> None:
    """Three lanes share a limit; three refusals in a row on one lane after one on another
    (one run in nine, at a few 503s a second) is chance, not a hot prefix: no isolation."""
    lanes = _lanes()
    for order in range(60):
        _submit(lanes, f"w{order % 3}/{order}", 1000 + order)
    _refuse(lanes, "w1/r0", 0, 0.0)
    for i, now_s in enumerate((0.4, 0.8, 1.2), 1):
        _refuse(lanes, f"w0/r{i}", i, now_s)
    [budget] = lanes.budgets()
    assert budget.throttles == 4 and budget.isolated_lanes == 0


def _accept_all(lanes: Lanes, from_s: float, to_s: float) -> None:
    """Every request admitted from ``from_s`` to ``to_s`` is sent and accepted."""
    now_s = from_s
    while now_s < to_s:
        granted, _ = lanes.pump(now_s, 8)
        _send(lanes, granted, now_s)
        for ticket in granted:
            lanes.on_answer(ticket, now_s + 0.005, throttled=False)
        now_s += 0.01


def test_refusals_seconds_apart_on_one_of_eight_lanes_isolate_nobody() -> None:
    """A busy partition that eight lanes share refuses one request in hundreds. Three in a
    row on one lane, seconds apart, are two in its recent answers: the 1/64 chance of two
    of two is no proof when it comes up once among hundreds of refusals (in the simulator
    at 3,500/s such a lane was isolated, cut to a few requests a second by the first cut
    of its new rate, and held the drain to 1.62x: BENCHMARKS.md 7.5)."""
    lanes = _lanes()
    for order in range(8000):
        _submit(lanes, f"w{order % 8}/{order}", 1000 + order)
    t = 0.0
    for i in range(3):
        _accept_all(lanes, t, t + 2.0)
        _refuse(lanes, f"w0/r{i}", i, t + 2.0)
        t += 2.0
    [budget] = lanes.budgets()
    assert (budget.throttles, budget.events, budget.isolated_lanes) == (3, 3, 0)


def test_throttles_spread_over_the_lanes_of_a_shared_limit_isolate_nobody() -> None:
    lanes = _lanes()
    for order in range(50):
        _submit(lanes, f"w{order % 3}/{order}", 1000 + order)
    t = 0.0
    for i in range(12):
        _refuse(lanes, f"w{i % 3}/r{i}", i, t)
        t += 0.5
    [budget] = lanes.budgets()
    assert budget.isolated_lanes == 0
    assert budget.events >= 6


def test_isolation_ends_once_the_lane_may_send_what_the_whole_budget_allows() -> None:
    lanes = _lanes(rate=10.0)
    hot = lanes.lane_for("b", "hot/x", 0.0)
    for i in range(100):
        hot.answers.add(i * 0.01, True)  # S3 took 100/s of it
    hot.isolate(lanes.flow, 1.0, 1.0)  # its own rate: ~100/s, above the bucket's 10/s
    _submit(lanes, "hot/x", 1, 1.0)
    assert _granted(lanes, 1.0) == [("hot/", 1)]
    assert hot.isolation is None


def _isolated(lanes: Lanes, accepted_per_s: int, at_s: float) -> Lane:
    """Lane ``hot/`` after ``at_s`` seconds of ``accepted_per_s`` accepted, isolated at
    ``at_s`` by a refusal of a request sent 10 ms before."""
    hot = lanes.lane_for("b", "hot/x", 0.0)
    n = round(accepted_per_s * at_s)
    for i in range(n):
        hot.answers.add(i * at_s / n, True)
    hot.answers.add(at_s, False)
    hot.isolate(lanes.flow, at_s - 0.01, at_s)
    return hot


def test_an_isolated_lane_left_alone_finds_its_limit_again_by_slow_start() -> None:
    """An isolated lane keeps its own rate while other lanes of the bucket wait. Once none
    does, the rate they used may be its own (a lane isolated by chance shares their
    partition): its rate slow-starts from where it is, once per time it is left alone."""
    lanes = _lanes()
    hot = _isolated(lanes, 100, 1.0)
    assert hot.isolation is not None and not hot.isolation.is_slow_start
    for order in range(3):
        _submit(lanes, f"hot/{order}", order, 1.0)
    _submit(lanes, "cold/a", 10, 1.0)
    _send(lanes, lanes.pump(1.0)[0], 1.0)  # the cold one waits its turn: not alone
    assert not hot.isolation.is_slow_start
    now_s = 1.0
    while not hot.isolation.is_slow_start and now_s < 2.0:
        now_s += 0.01
        _send(lanes, lanes.pump(now_s)[0], now_s)  # cold/a gone: the hot lane is alone
    assert hot.isolation.is_slow_start and hot.alone


def test_an_isolated_lane_measures_its_rate_from_its_answers_before_the_isolation() -> None:
    """A lane S3 took 500/s of is isolated, its rate cut as deep as the share of its
    recent answers refused (one in 500: barely). Its own rate's next cut, a few
    answers later, is measured on what the lane got through in the last seconds, not
    on the few answers since the isolation (they made 500/s look like 4/s: the lane
    then sent 3/s)."""
    lanes = _lanes()
    hot = _isolated(lanes, 500, 2.0)
    assert hot.isolation is not None
    assert 400 < hot.isolation.rate_per_s < 500
    for i in range(3):  # sent after the cut, accepted
        hot.isolation.on_success(2.01 + i * 0.003, 2.02 + i * 0.003)
    assert hot.isolation.on_throttle(2.03, 2.04)  # a new congestion event
    assert hot.isolation.rate_per_s > 250


def test_the_chance_of_a_lopsided_spread_is_the_binomial_tail() -> None:
    """Exact for small counts; finite and right for tens of thousands of refusals (3 s of
    a busy bucket), where the exact sum's integers would overflow a float."""
    assert _chance_of_at_least(3, 4, 1 / 3) == pytest.approx(9 / 81)
    assert _chance_of_at_least(4, 4, 1 / 3) == pytest.approx(1 / 81)
    assert _chance_of_at_least(0, 4, 0.5) == 1.0
    assert _chance_of_at_least(3, 3, 1.0) == 1.0  # the lane sent everything: proves nothing
    assert _chance_of_at_least(30_000, 60_000, 0.5) == pytest.approx(0.5, abs=0.01)
    assert _chance_of_at_least(31_000, 60_000, 0.5) < 1e-9


# -- a start after idle -----------------------------------------------------------------------


def _checkpoint_with_a_share_taken(gate: Gate) -> float:
    """30 requests at t=0 through the gate: 5 of the first 10 refused (a limit learnt),
    then a fleet peer's share of 50/s taken over while the rest wait; all answered by
    t=2. The budget's own share of the limit."""
    tickets = [gate.submit(gate.lane_for("b", f"p{i % 3}/x{i}", 0.0), i, 0, 0.0) for i in range(30)]
    granted, _ = gate.pump(0.0)
    for i, ticket in enumerate(granted[:10]):
        gate.sent(ticket, 0.0)
        gate.answer(ticket, 0.05, Outcome.THROTTLED if i < 5 else Outcome.ACCEPTED)
    budget = gate.lanes.budgets_by_name()["b"]
    own = budget.rate.own_per_s
    assert own is not None and budget.take_share(0.1, 50.0)
    assert budget.rate.w_max_per_s == pytest.approx(own + 50.0)
    assert budget.rate.own_per_s == pytest.approx(own)  # the peer's share is lent, not ours
    now_s = 0.1
    while not all(t.is_done for t in tickets) and now_s < 2.0:
        granted, _ = gate.pump(now_s)
        for ticket in [t for t in tickets if t.is_granted and not t.is_done]:
            gate.sent(ticket, now_s)
            gate.answer(ticket, now_s + 0.005, Outcome.ACCEPTED)
        now_s += 0.01
    assert all(t.is_done for t in tickets) and gate.in_flight == 0
    return own


def _idle_gate() -> Gate:
    lanes = Lanes(LaneConfig(depth=1), RateConfig(initial_per_s=100.0))
    return Gate(lanes, GateConfig(window=WindowConfig(initial=64)), 0.0)


def test_a_budget_idle_between_checkpoints_starts_again_towards_its_own_share() -> None:
    """Work after 5 s of idle starts a fresh rate that slow-starts, per round trip, to
    the share of the limit the budget learnt, the peers' shares it took over left out
    (they start the next checkpoint too)."""
    gate = _idle_gate()
    own = _checkpoint_with_a_share_taken(gate)
    before = gate.lanes.budgets_by_name()["b"].rate
    gate.submit(gate.lane_for("b", "p0/next", 8.0), 100, 0, 8.0)
    after = gate.lanes.budgets_by_name()["b"].rate
    assert after is not before
    assert after.w_max_per_s == pytest.approx(own)  # 50/s less than the limit it had
    # From the initial rate per round trip, or at once when the share is below it.
    assert after.rate_per_s == pytest.approx(min(own, 100.0))
    assert after.is_slow_start == (own > 100.0)
    assert gate.lanes.known_rates() == {"b": pytest.approx(own)}


def test_a_budget_busy_or_idle_for_less_than_5_s_keeps_its_rate() -> None:
    gate = _idle_gate()
    _checkpoint_with_a_share_taken(gate)
    before = gate.lanes.budgets_by_name()["b"].rate
    gate.submit(gate.lane_for("b", "p0/next", 4.0), 100, 0, 4.0)  # 2 s after the last answer
    gate.submit(gate.lane_for("b", "p1/next", 12.0), 101, 0, 12.0)  # work is waiting
    assert gate.lanes.budgets_by_name()["b"].rate is before


# -- a fleet peer's cut ---------------------------------------------------------------------


def test_a_peers_cut_is_followed_by_a_budget_throttled_lately_above_the_fair_share() -> None:
    """A budget never throttled itself may be on another partition than the peer: it does
    not follow. Throttled itself, it follows a peer's cut (not within the quiet time of
    its own cut), unless it gets less than the fleet's fair share through (it grows
    towards it while the others give way), and not once its own throttle is a minute old."""
    lanes = _lanes(50.0)
    for i in range(2000):
        _submit(lanes, f"p{i % 4}/x{i}", i)
    _accept_all(lanes, 0.0, 3.0)
    budget = lanes.budgets_by_name()["b"]
    assert not budget.follow_cut(3.0, 0.8)
    _refuse(lanes, "p0/y", 5000, 3.0)
    assert not budget.rate.is_slow_start
    _accept_all(lanes, 3.1, 6.0)
    budget.note_fair_share(1000.0, 2)  # a peer gets far more through
    assert not budget.follow_cut(6.0, 0.8)
    budget.note_fair_share(1.0, 2)
    rate = budget.rate.rate_per_s
    assert budget.follow_cut(6.0, 0.8) and budget.followed == 1
    assert budget.rate.rate_per_s < rate
    assert not budget.follow_cut(64.0, 0.8)  # its own throttle a minute old
