"""Prefix lanes: which lane a key is in, one lane's own gates, the set of lanes.

How the lanes of a bucket share its budget is in test_admission.py.
"""

from __future__ import annotations

import pytest

from gateway.flush import lanes as lanes_module
from gateway.flush.control import RateConfig
from gateway.flush.lanes import Lane, LaneConfig, Lanes, Ticket, lane_prefix

# -- lane_prefix ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "depth", "prefix"),
    [
        # depth 0: every key in the bucket's root lane
        ("ckpt/step_1/rank_0/shard", 0, ""),
        ("top", 0, ""),
        # depth 1
        ("ckpt/step_1/rank_0/shard", 1, "ckpt/"),
        ("ckpt/shard", 1, "ckpt/"),
        ("shard", 1, ""),
        # depth 3: the ranks of one step spread over lanes; the file name never counts
        ("ckpt/step_1/rank_0/shard", 3, "ckpt/step_1/rank_0/"),
        ("ckpt/step_1/rank_0/sub/shard", 3, "ckpt/step_1/rank_0/"),
        ("ckpt/step_1/.metadata", 3, "ckpt/step_1/"),
        ("ckpt/x", 3, "ckpt/"),
        ("x", 3, ""),
        ("", 3, ""),
        # negative depth behaves as 0
        ("a/b/c", -1, ""),
        # keys ending in a slash ("directory markers"): the whole key is directories
        ("a/", 1, "a/"),
        ("a/b/", 3, "a/b/"),
        ("a/b/c/d/", 3, "a/b/c/"),
        ("/", 3, "/"),
        # empty segments are kept as they are
        ("a//b", 3, "a//"),
        ("/lead/x", 1, "/"),
        # unicode
        ("données/été/poids.bin", 3, "données/été/"),
        ("模型/第1步/分片", 1, "模型/"),
        ("emoji/🚀/x", 2, "emoji/🚀/"),
    ],
)
def test_lane_prefix(key: str, depth: int, prefix: str) -> None:
    assert lane_prefix(key, depth) == prefix


def test_lane_prefix_is_a_prefix_of_the_key() -> None:
    for key in ("a/b/c/d", "a", "a/", "a/b/", "x//y/z", "ü/ß/ç"):
        for depth in range(5):
            assert key.startswith(lane_prefix(key, depth))


# -- one lane -------------------------------------------------------------------------------


def _lane(**config: float) -> Lane:
    return Lane("bkt", "p/", LaneConfig(**config), 100.0)  # type: ignore[arg-type]


def _ticket(lane: Lane, order: int = 0, requests: int = 1, size_bytes: int = 0) -> Ticket:
    ticket = Ticket(lane, order, requests, size_bytes)
    lane.add(ticket)
    return ticket


def test_lane_is_paused_until_its_retry_after_ends() -> None:
    lane = _lane()
    assert not lane.is_paused(100.0)
    lane.paused_until_s = 110.0
    assert lane.is_paused(109.9)
    assert not lane.is_paused(110.0)


def test_lane_waiting_requests_come_out_oldest_first() -> None:
    lane = _lane()
    late, early, same = _ticket(lane, 7), _ticket(lane, 3), _ticket(lane, 7)
    assert lane.head() is early
    lane.grant(early, 100.0)
    assert lane.head() is late  # same order: arrival order
    late.is_cancelled = True
    assert lane.head() is same
    assert lane.waiting == 1
    assert early.is_granted and not same.is_granted


def test_lane_unlimited_gates_never_wait() -> None:
    lane = _lane()
    ticket = _ticket(lane, size_bytes=10 << 30)
    assert lane.wait_s(ticket, 100.0) == 0.0


def test_lane_hard_rate_cap_waits_for_request_tokens() -> None:
    lane = _lane(rate_per_s=10.0)  # a burst of one second: 10 requests
    for _ in range(10):
        ticket = _ticket(lane)
        assert lane.wait_s(ticket, 100.0) == 0.0
        lane.grant(ticket, 100.0)
    assert lane.wait_s(_ticket(lane), 100.0) == pytest.approx(0.1)


def test_lane_bandwidth_cap_lets_a_large_body_overdraw_then_waits() -> None:
    lane = _lane(bandwidth_bytes_per_s=1000)
    big = _ticket(lane, size_bytes=2500)
    assert lane.wait_s(big, 100.0) == 0.0  # a full bucket lets a body larger than it go
    lane.grant(big, 100.0)
    assert lane.wait_s(_ticket(lane, 1, size_bytes=500), 100.0) == pytest.approx(2.0)


def test_lane_pause_holds_it_and_shows_in_status() -> None:
    lane = _lane()
    lane.paused_until_s = 105.0
    assert lane.wait_s(_ticket(lane), 101.0) == pytest.approx(4.0)
    assert lane.is_paused(104.99)
    assert not lane.is_paused(105.0)
    assert lane.status(101.0, 50.0).paused_until_s == 105.0
    assert lane.status(105.0, 50.0).paused_until_s is None


def test_lane_status_reports_the_bucket_rate_unless_isolated() -> None:
    lane = _lane(rate_per_s=40.0)
    _ticket(lane)
    status = lane.status(100.0, 25.0)
    assert (status.rate_limit_per_s, status.is_isolated, status.waiting_requests) == (25, False, 1)
    assert lane.status(100.0, 500.0).rate_limit_per_s == 40.0  # --lane-rate is a hard cap
    for i in range(10):
        lane.answers.add(99.0 + i * 0.1, True)  # S3 took 10/s of it
    lane.isolate(RateConfig(), 100.0, 100.0)
    status = lane.status(100.0, 25.0)
    assert status.is_isolated
    assert status.rate_limit_per_s == pytest.approx(8.0, rel=0.1)  # 0.8 x what S3 took
    lane.end_isolation()
    assert not lane.status(100.0, 25.0).is_isolated


# -- the set of lanes -----------------------------------------------------------------------


def test_lanes_lane_for_reuses_one_lane_per_bucket_and_prefix() -> None:
    lanes = Lanes(LaneConfig(depth=2))
    assert lanes.peek("b", "run/1/x") is None
    lane = lanes.lane_for("b", "run/1/x", 100.0)
    assert lane.prefix == "run/1/"
    assert lanes.lane_for("b", "run/1/y", 101.0) is lane
    assert lanes.lane_for("b", "run/1/deep/z", 101.0) is lane
    assert lanes.peek("b", "run/1/z") is lane
    assert lanes.lane_for("b", "run/2/x", 101.0) is not lane
    assert lanes.lane_for("other", "run/1/x", 101.0) is not lane
    assert lanes.prefix_of("run/1/x") == "run/1/"
    assert sorted((s.bucket, s.prefix) for s in lanes.status(101.0)) == [
        ("b", "run/1/"),
        ("b", "run/2/"),
        ("other", "run/1/"),
    ]


def test_lanes_peek_has_no_side_effects() -> None:
    lanes = Lanes(LaneConfig())
    assert lanes.peek("b", "a/b/c/d") is None
    assert lanes.status(0.0) == []
    assert lanes.budgets() == []


def _in_flight(lanes: Lanes, keys: list[str], now_s: float) -> list[Ticket]:
    """One request per key admitted and sent at ``now_s``."""
    tickets = [
        lanes.submit(lanes.lane_for("b", k, now_s), i, 1, 0, now_s) for i, k in enumerate(keys)
    ]
    granted, _ = lanes.pump(now_s)
    assert granted == tickets
    for ticket in tickets:
        lanes.on_sent(ticket, now_s)
    return tickets


def test_lanes_retry_after_pauses_the_lane_and_never_shortens_a_pause() -> None:
    lanes = Lanes(LaneConfig(depth=1))
    first, second = _in_flight(lanes, ["hot/1", "hot/2"], 100.0)
    lanes.on_answer(first, 100.0, throttled=True, retry_after_s=10.0)
    lanes.on_answer(second, 101.0, throttled=True, retry_after_s=1.0)
    lane = first.lane
    assert lane.paused_until_s == 110.0
    assert lanes.lane_for("b", "hot/3", 105.0) is lane
    assert lane.is_paused(105.0)
    assert lane.throttles == 2


@pytest.mark.parametrize("retry_after_s", [None, 0.0])
def test_lanes_throttle_without_retry_after_does_not_pause(retry_after_s: float | None) -> None:
    lanes = Lanes(LaneConfig(depth=1))
    [ticket] = _in_flight(lanes, ["hot/1"], 100.0)
    lanes.on_answer(ticket, 100.0, throttled=True, retry_after_s=retry_after_s)
    assert not ticket.lane.is_paused(100.0)
    assert lanes.status(100.0)[0].paused_until_s is None


def test_lanes_forget_idle_lanes_beyond_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes_module, "_MAX_IDLE_LANES", 3)
    lanes = Lanes(LaneConfig(depth=1))
    busy = lanes.lane_for("b", "busy/x", 0.0)
    busy.in_flight = 1
    idle = [lanes.lane_for("b", f"idle{i}/x", 0.0) for i in range(2)]
    assert len(lanes.status(0.0)) == 3

    fresh = lanes.lane_for("b", "new/x", 1.0)  # the 4th lane: the idle ones go
    prefixes = sorted(s.prefix for s in lanes.status(1.0))
    assert prefixes == ["busy/", "new/"]
    assert lanes.lane_for("b", "busy/y", 1.0) is busy
    assert lanes.peek("b", "new/y") is fresh
    assert lanes.peek("b", "idle0/x") is None
    # An idle lane used again starts over.
    assert lanes.lane_for("b", "idle0/x", 2.0) is not idle[0]


def test_lanes_under_the_limit_forget_nothing() -> None:
    lanes = Lanes(LaneConfig(depth=1))
    made = [lanes.lane_for("b", f"p{i}/x", 0.0) for i in range(100)]
    assert all(lanes.peek("b", f"p{i}/y") is lane for i, lane in enumerate(made))


def test_lanes_forgetting_keeps_paused_waiting_and_recently_throttled_lanes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes_module, "_MAX_IDLE_LANES", 2)
    lanes = Lanes(LaneConfig(depth=1))
    [ticket] = _in_flight(lanes, ["hot/x"], 0.0)
    lanes.on_answer(ticket, 0.0, throttled=True, retry_after_s=60.0)  # paused a minute
    hot = ticket.lane
    waiting = lanes.lane_for("b", "waiting/x", 0.5)
    lanes.submit(waiting, 1, 1, 0, 0.5)
    lanes.lane_for("b", "third/x", 2.0)  # over the limit: idle lanes are forgotten
    assert lanes.peek("b", "hot/y") is hot and hot.is_paused(3.0)
    assert lanes.peek("b", "waiting/y") is waiting
