"""The fleet's shares of a bucket (``flush/shares.py``): a member that stops sending to a
bucket hands what it got through to those still sending, in proportion to theirs."""

from __future__ import annotations

import pytest
from flowkit import ManualClock

from gateway.cli_fleet import format_fleet
from gateway.flush.control import RateConfig
from gateway.flush.gate import Gate, GateConfig
from gateway.flush.lanes import LaneConfig, Lanes
from gateway.flush.shares import STALE_S, FleetShares


class FakeGate:
    def __init__(self, shares: dict[str, float], wants: bool = True) -> None:
        self.mine = shares
        self.wants = wants
        self.taken: list[tuple[str, float]] = []
        self.fair: list[tuple[str, float, int]] = []
        self.senders: dict[str, int] = {}
        self.my_cuts: dict[str, tuple[int, float]] = {}
        self.followed: list[tuple[str, float]] = []

    def shares(self) -> dict[str, float]:
        return dict(self.mine)

    def take_share(self, bucket: str, extra_per_s: float) -> bool:
        if self.wants:
            self.taken.append((bucket, extra_per_s))
        return self.wants

    def note_fair_share(self, bucket: str, fair_per_s: float, senders: int) -> None:
        self.fair.append((bucket, round(fair_per_s, 3), senders))

    def note_senders(self, bucket: str, senders: int) -> None:
        self.senders[bucket] = senders

    def cuts(self) -> dict[str, tuple[int, float]]:
        return dict(self.my_cuts)

    def follow_cut(self, bucket: str, factor: float) -> bool:
        self.followed.append((bucket, factor))
        return self.wants


def test_a_bucket_a_peer_stops_sending_to_is_split_by_what_each_gets_through() -> None:
    gate, clock = FakeGate({"b": 20.0}), ManualClock(0.0)
    shares = FleetShares(gate, clock)
    shares.on_report("p", {"b": 30.0, "other": 5.0})
    shares.on_report("q", {"b": 10.0})
    clock.now_s = 1.0
    shares.on_report("p", {"b": 29.0, "other": 5.0})  # still sending: nothing handed over
    assert gate.taken == []
    shares.on_report("p", {"other": 5.0})  # stopped: its last figure is freed
    # Mine 20 of the 30 still sending (q 10): two thirds of p's 29.
    assert gate.taken == [("b", pytest.approx(29.0 * 20 / 30))]
    assert shares.handovers == 1
    assert shares.report() == (("b", 20.0),)


def test_nothing_is_taken_by_a_node_that_does_not_send_to_the_bucket() -> None:
    gate, clock = FakeGate({}), ManualClock(0.0)
    shares = FleetShares(gate, clock)
    shares.on_report("p", {"b": 30.0})
    shares.on_report("p", {})
    assert gate.taken == []


def test_a_first_report_a_silent_peer_and_a_peer_that_left_hand_nothing_over() -> None:
    gate, clock = FakeGate({"b": 10.0}), ManualClock(0.0)
    shares = FleetShares(gate, clock)
    shares.on_report("p", {})  # its first: nothing known before it
    shares.on_report("q", {"b": 40.0})
    shares.on_report("r", {"b": 40.0})
    shares.forget("r")  # said goodbye
    clock.now_s = STALE_S + 1
    shares.on_report("p", {})  # q is stale: forgotten, not handed over
    shares.on_report("q", {})  # back, as if new
    shares.on_report("r", {})
    assert gate.taken == []


def test_a_gate_takes_a_share_only_while_work_waits_for_its_rate() -> None:
    lanes = Lanes(LaneConfig(depth=1), RateConfig(initial_per_s=10.0))
    gate = Gate(lanes, GateConfig(), 0.0)
    assert gate.shares(0.0) == {}
    assert not gate.take_share("b", 5.0, 0.0)  # no budget yet
    lane = gate.lane_for("b", "ckpt/x", 0.0)
    for i in range(40):
        gate.submit(lane, i, 100, 0.0)
    granted, _ = gate.pump(0.0)
    assert 0 < len(granted) < 40  # the rate holds the rest back
    assert set(gate.shares(0.0)) == {"b"}
    before = lanes.budget("b", 0.0).rate.rate_per_s
    assert gate.take_share("b", 5.0, 0.1)
    assert lanes.budget("b", 0.0).rate.rate_per_s == pytest.approx(before + 5.0)


def test_the_status_says_who_sends_to_which_bucket_and_what_was_taken_over() -> None:
    gate, clock = FakeGate({"b": 20.0}), ManualClock(0.0)
    shares = FleetShares(gate, clock)
    shares.on_report("p", {"b": 30.0, "c": 4.0})
    shares.on_report("p", {"c": 4.0})  # p is done with b: all of it to this node
    status = shares.status()
    assert status == {
        "mine": {"b": 20.0},
        "peers": {"c": {"p": 4.0}},
        "handovers": 1,
        "taken_per_s": 30.0,
        "cuts_followed": 0,
    }
    shown = format_fleet({"node": "me", "datadir_id": "d", "members": [], "shares": status})
    assert "  b: 20 (me 20)" in shown
    assert "  c: 4 (p 4)" in shown
    assert "taken over from members that stopped: 30/s in 1 hand-overs" in shown


def test_each_report_gives_the_fleet_total_per_sender_of_the_buckets_shared() -> None:
    gate, clock = FakeGate({"b": 50.0, "alone": 9.0}), ManualClock(0.0)
    shares = FleetShares(gate, clock)
    shares.on_report("p", {"b": 80.0, "other": 5.0})
    assert gate.fair == [("b", 65.0, 2)]  # (50 + 80) / 2; nobody else sends to "alone"
    shares.on_report("q", {"b": 80.0})
    assert gate.fair[-1] == ("b", 70.0, 3)


def test_a_budget_keeps_the_fair_share_of_the_most_senders_and_starts_again_to_it() -> None:
    """The fleet's first congestion event left this node with 48 of 200/s and two peers
    with 76 each: its next start aims for a third of the fleet's total, not 48. The
    fair shares measured later with fewer senders (peers done) do not count."""
    lanes = Lanes(LaneConfig(depth=1), RateConfig(initial_per_s=10.0))
    budget = lanes.budget("b", 0.0)
    budget.rate.on_throttle(0.0, 0.05)  # a limit learnt: what got through (the floor here)
    own = budget.rate.own_per_s
    assert own is not None and own < 60.0
    budget.note_fair_share(66.7, 3)
    budget.note_fair_share(150.0, 2)  # a peer done: two senders measure more each
    assert budget.known_per_s == pytest.approx(66.7)
    assert lanes.known_rates() == {"b": pytest.approx(66.7)}
    budget.note_fair_share(1.0, 3)  # the latest with as many senders wins ...
    assert budget.known_per_s == pytest.approx(own)  # ... and never below its own share


def test_a_peers_own_cut_is_followed_once_and_a_restarted_count_is_a_new_base() -> None:
    """A peer's count of its own congestion events grows: its cut is followed with its
    factor. Its first report, an unchanged count, a bucket it had not reported before
    and a count that fell (its budget started again after idle) are not cuts."""
    gate, clock = FakeGate({"b": 10.0, "c": 5.0}), ManualClock(0.0)
    gate.my_cuts = {"b": (3, 0.8)}
    shares = FleetShares(gate, clock)
    assert shares.report_cuts() == (("b", 3, 0.8),)
    shares.on_report("p", {"b": 20.0}, {"b": (4, 0.9)})  # first report: a base
    shares.on_report("p", {"b": 20.0}, {"b": (4, 0.9)})
    shares.on_report("p", {"b": 20.0, "c": 1.0}, {"b": (4, 0.9), "c": (7, 0.8)})
    assert gate.followed == []
    shares.on_report("p", {"b": 20.0, "c": 1.0}, {"b": (5, 0.85), "c": (7, 0.8)})
    assert gate.followed == [("b", 0.85)]
    shares.on_report("p", {"b": 20.0}, {"b": (0, 0.8)})  # started again
    shares.on_report("p", {"b": 20.0}, {"b": (1, 0.8)})
    assert gate.followed == [("b", 0.85), ("b", 0.8)]
    assert shares.cuts_followed == 2 and shares.status()["cuts_followed"] == 2
    shares.on_report("q", {"b": 20.0})  # an older gateway: no cuts in its report
    shares.on_report("q", {"b": 20.0})
    assert len(gate.followed) == 2
    assert gate.senders == {"b": 3, "c": 1}  # p and q send to b; nobody else to c
