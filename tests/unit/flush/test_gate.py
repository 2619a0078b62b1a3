"""The request gate's core (``flush/gate.py``, ``Gate``): the window of requests in flight,
the caps above the buckets, each answer reported once, the claim room. Explicit times, no
clock, no I/O; the asyncio shell is covered by the flusher's tests."""

from __future__ import annotations

import math

import pytest

from gateway.flush.control import RateConfig
from gateway.flush.gate import Gate, GateConfig, Outcome
from gateway.flush.lanes import LaneConfig, Lanes, Ticket
from gateway.flush.window import WindowConfig


def _gate(
    window: int = 2, *, rate: float = 1000.0, lanes: LaneConfig | None = None, **caps: float
) -> Gate:
    config = GateConfig(
        window=WindowConfig(initial=window, min_size=1, max_size=64),
        **caps,  # type: ignore[arg-type]
    )
    return Gate(Lanes(lanes or LaneConfig(depth=1), RateConfig(initial_per_s=rate)), config, 0.0)


def _submit(
    gate: Gate, key: str, order: int, size_bytes: int = 0, *, claimed: bool = False
) -> Ticket:
    return gate.submit(gate.lane_for("b", key, 0.0), order, size_bytes, 0.0, claimed=claimed)


def _admit(gate: Gate, now_s: float) -> list[Ticket]:
    granted, _ = gate.pump(now_s)
    for ticket in granted:
        gate.sent(ticket, now_s)
    return granted


def test_the_window_bounds_what_is_admitted_until_answered() -> None:
    gate = _gate(window=2)
    tickets = [_submit(gate, f"p{i}/x", i) for i in range(3)]
    assert _admit(gate, 0.0) == tickets[:2]
    assert gate.pump(0.0) == ([], math.inf)  # not the budget's doing: no timer needed
    gate.answer(tickets[0], 0.05, Outcome.ACCEPTED)
    assert _admit(gate, 0.05) == [tickets[2]]
    assert gate.in_flight == 2


def test_each_answer_is_reported_once() -> None:
    gate = _gate(window=4)
    tickets = [_submit(gate, f"p{i}/x", i) for i in range(2)]
    _admit(gate, 0.0)
    for _ in range(3):  # e.g. a throttle seen by the request and again by its retry loop
        gate.answer(tickets[0], 0.05, Outcome.THROTTLED)
    gate.answer(tickets[1], 0.05, Outcome.ACCEPTED)
    gate.answer(tickets[1], 0.06, Outcome.THROTTLED)  # too late: already answered
    [budget] = gate.lanes.budgets()
    assert (budget.throttles, budget.events) == (1, 1)
    assert (gate.throttled, gate.accepted, gate.in_flight) == (1, 1, 0)


def test_a_failure_frees_its_slot_and_teaches_the_budget_nothing() -> None:
    gate = _gate(window=1)
    first, second = _submit(gate, "a/x", 1), _submit(gate, "a/y", 2)
    _admit(gate, 0.0)
    gate.answer(first, 0.05, Outcome.FAILED)
    assert _admit(gate, 0.05) == [second]
    [budget] = gate.lanes.budgets()
    assert (budget.throttles, budget.events, gate.failed) == (0, 0, 1)


def test_a_cancelled_request_is_never_admitted_or_frees_its_slot() -> None:
    gate = _gate(window=1)
    gone = _submit(gate, "a/x", 1, claimed=True)
    kept = _submit(gate, "a/y", 2, claimed=True)
    assert gate.waiting_claimed == 2
    gate.cancel(gone, 0.0)
    gate.cancel(gone, 0.0)  # once only
    assert gate.waiting_claimed == 1
    assert _admit(gate, 0.0) == [kept]
    assert gate.waiting_claimed == 0
    gate.cancel(kept, 0.1)  # after admission: its slot is freed
    assert gate.in_flight == 0


def test_claimed_requests_waiting_for_admission_hold_no_slot() -> None:
    """Claimed uploads whose lane holds them back (its own cap: one a second) leave room to
    claim others; a quarter of the window more (at least 2) may be preparing or recording
    (so that the window itself fills); the tasks stay bounded (the window and three times
    the initial window waiting)."""
    gate = _gate(window=4, lanes=LaneConfig(depth=1, rate_per_s=1.0))
    assert gate.claim_room(0) == 4 + 2
    tickets = [_submit(gate, "slow/x", i, claimed=True) for i in range(6)]
    assert len(_admit(gate, 0.0)) == 1  # the lane's burst: one
    assert gate.claim_room(6) == 6 - 1  # one slot taken by the admitted one, five wait
    assert not any(t.is_granted for t in tickets[1:])
    for i in range(10):
        _submit(gate, "slow/y", 10 + i, claimed=True)
    assert gate.claim_room(16) == 0  # 4 + 3 x 4 tasks at most


def test_caps_are_charged_only_when_a_request_is_admitted() -> None:
    """Global 1 request/s (burst 1); the first lane is held by its own gate (a pause): the
    request held back spends no global token, the other lane's request takes it."""
    gate = _gate(window=8, rate_per_s=1.0, rate_burst=1.0)
    gate.lanes.lane_for("b", "held/x", 0.0).paused_until_s = 10.0  # e.g. a Retry-After
    _submit(gate, "held/x", 1)
    free = _submit(gate, "free/x", 2)
    later = _submit(gate, "free/y", 3)
    granted, next_s = gate.pump(0.0)
    assert granted == [free]
    assert next_s == pytest.approx(1.0)  # the global bucket's next token
    assert gate.pump(1.0)[0] == [later]


def test_a_throttle_while_the_window_is_the_limit_cuts_it() -> None:
    gate = _gate(window=4)
    tickets = [_submit(gate, f"p{i}/x", i) for i in range(10)]
    granted = _admit(gate, 0.0)
    assert len(granted) == 4 and all(t.is_bound for t in granted)  # full, work waiting
    gate.answer(tickets[0], 0.05, Outcome.THROTTLED)
    assert gate.window.size == 3  # 4 x 0.8


def test_lanes_may_claim_as_many_uploads_as_the_window_unless_configured() -> None:
    gate = _gate(window=4)
    assert gate.lanes.lane_concurrency == 4
    tickets = [_submit(gate, f"p{i}/x", i) for i in range(20)]
    now_s = 0.0
    for _ in range(3):  # slow start: the window grows while it is the limit
        for ticket in _admit(gate, now_s):
            gate.answer(ticket, now_s + 0.05, Outcome.ACCEPTED)
        now_s += 0.05
    assert gate.window.size > 4 and gate.lanes.lane_concurrency == gate.window.size
    assert sum(t.is_granted for t in tickets) > 4
    fixed = _gate(window=4, lanes=LaneConfig(depth=1, concurrency=3))
    assert fixed.lanes.lane_concurrency == 3


def test_a_large_body_on_its_way_counts_for_a_slow_start_once() -> None:
    """A 16 MiB request not refused half a second after it left is on its way (S3 refuses
    before the body): a slow start counts it then, not a whole body's time later, and not
    again at its answer. A small request counts only at its answer."""
    gate = _gate(window=8, rate=10.0)
    big = _submit(gate, "a/big", 1, 16 << 20)
    small = _submit(gate, "a/small", 2, 1 << 10)
    waiting = [_submit(gate, f"a/w{i}", 10 + i, 1 << 10) for i in range(10)]
    # Work is held back: the budget is the limit (its burst of 2 for the small ones; a
    # large body goes unpaced until the bucket first refuses: _is_unpaced).
    assert _admit(gate, 0.0) == [big, small, waiting[0]]
    [budget] = gate.lanes.budgets()
    _, next_s = gate.pump(0.1)
    assert next_s <= 0.5
    gate.pump(0.5)
    [grown] = gate.lanes.budgets()
    assert grown.rate_per_s == pytest.approx(budget.rate_per_s + 1)
    gate.answer(small, 0.6, Outcome.ACCEPTED)  # a small one counts at its answer
    gate.answer(big, 4.0, Outcome.ACCEPTED)  # the big one's answer: not counted again
    [after] = gate.lanes.budgets()
    assert after.rate_per_s == pytest.approx(grown.rate_per_s + 1)


def test_large_bodies_go_unpaced_until_the_bucket_first_refuses() -> None:
    """Bodies of 8 MiB and more take seconds each: before the bucket has refused anything
    the slow start's rate bounds them in flight, not per second (per second it would
    take seconds to fill a link); small ones are paced. After a 503 every request is."""
    wide = _gate(window=64, rate=10.0)
    many = [_submit(wide, f"a/big{i}", i, 16 << 20) for i in range(20)]
    # The rate's 10 in flight at once; past them paced (the pacer's burst of 2 now).
    assert _admit(wide, 0.0) == many[:12]
    gate = _gate(window=8, rate=10.0)
    large = [_submit(gate, f"a/big{i}", i, 16 << 20) for i in range(10)]
    assert _admit(gate, 0.0) == large[:8]  # the window's 8, at once
    gate.answer(large[0], 0.1, Outcome.THROTTLED)
    gate.answer(large[1], 0.1, Outcome.ACCEPTED)
    gate.answer(large[2], 0.1, Outcome.ACCEPTED)
    # Three slots free, two large bodies waiting: the cut paces them (one at a time).
    assert _admit(gate, 0.1) == []
    assert len(_admit(gate, 0.3)) == 1
