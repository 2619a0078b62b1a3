"""Prefix lanes: which lane a key is in, one lane's flow control, the set of lanes."""

from __future__ import annotations

import heapq
from collections import deque

import pytest

from gateway.flush import lanes as lanes_module
from gateway.flush.lanes import Lane, LaneConfig, Lanes, lane_prefix

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


def test_lane_has_room_counts_in_flight_and_claimed_now() -> None:
    lane = _lane(concurrency=3)
    assert lane.has_room(100.0, 0)
    assert lane.has_room(100.0, 2)
    assert not lane.has_room(100.0, 3)
    lane.in_flight = 2
    assert lane.has_room(100.0, 0)
    assert not lane.has_room(100.0, 1)
    lane.in_flight = 3
    assert not lane.has_room(100.0, 0)


def test_lane_retry_after_pauses_it() -> None:
    lane = _lane()
    lane.on_throttle(100.0, 5.0)
    assert not lane.has_room(100.0, 0)
    assert not lane.has_room(104.99, 0)
    assert lane.has_room(105.0, 0)
    assert lane.status(101.0).paused_until_s == 105.0
    assert lane.status(105.0).paused_until_s is None


def test_lane_shorter_retry_after_does_not_shorten_a_pause() -> None:
    lane = _lane()
    lane.on_throttle(100.0, 10.0)
    lane.on_throttle(101.0, 1.0)
    assert lane.paused_until_s == 110.0


@pytest.mark.parametrize("retry_after_s", [None, 0.0])
def test_lane_throttle_without_retry_after_does_not_pause(retry_after_s: float | None) -> None:
    lane = _lane()
    lane.on_throttle(100.0, retry_after_s)
    assert lane.has_room(100.0, 0)
    assert lane.status(100.0).paused_until_s is None


def test_lane_reserve_unlimited_bandwidth_does_not_wait() -> None:
    lane = _lane()
    assert lane.reserve(1, 10 << 30, 100.0) == 0.0
    assert lane.last_used_s == 100.0


def test_lane_reserve_waits_for_bandwidth() -> None:
    lane = _lane(bandwidth_bytes_per_s=1000)
    assert lane.reserve(1, 1000, 100.0) == 0.0  # the burst: one second of bytes
    assert lane.reserve(1, 500, 100.0) == pytest.approx(0.5)
    assert lane.reserve(1, 2000, 100.0) == pytest.approx(2.5)  # larger than the burst
    assert lane.reserve(1, 0, 103.0) == 0.0


def test_lane_reserve_waits_for_request_tokens() -> None:
    lane = _lane(rate_per_s=10.0)
    waits = [lane.reserve(1, 0, 100.0) for _ in range(12)]
    assert waits[:10] == [0.0] * 10
    assert waits[10:] == pytest.approx([0.1, 0.2])


def test_lane_reserve_takes_the_longer_wait() -> None:
    lane = _lane(rate_per_s=10.0, bandwidth_bytes_per_s=100)
    assert lane.reserve(10, 100, 100.0) == 0.0
    assert lane.reserve(1, 0, 100.0) == pytest.approx(0.1)  # requests bound
    assert lane.reserve(1, 100, 100.0) == pytest.approx(1.0)  # bytes bound


def test_lane_reserve_counts_every_request_as_sent() -> None:
    lane = _lane()
    lane.reserve(5, 0, 100.0)  # a multipart upload: several requests at once
    lane.reserve(1, 0, 100.2)
    assert lane.rate.sent_rate_per_s(100.5) == 6.0


def test_lane_throttle_cuts_rate_and_its_bucket() -> None:
    lane = _lane(rate_per_s=3500.0)
    for i in range(40):
        lane.reserve(1, 0, 100.0 + i * 0.02)
    lane.on_throttle(100.8, None)
    assert lane.throttles == 1
    assert lane.rate.rate_per_s == pytest.approx(20.0)
    assert lane.requests.rate_per_s == pytest.approx(20.0)
    status = lane.status(100.8)
    assert (status.bucket, status.prefix, status.rate_limit_per_s) == ("bkt", "p/", 20.0)
    assert status.throttles == 1


def test_lane_cut_drops_the_debt_of_queued_requests_that_reserve_again() -> None:
    lane = _lane(rate_per_s=4.0)
    waits = [lane.reserve(1, 0, 100.0) for _ in range(8)]  # 4 now, 4 queued: 0.25..1 s
    assert waits[-1] == pytest.approx(1.0)
    lane.on_throttle(100.1, None)  # to 2/s (half of 8 sent in 1 s... capped by 4)
    assert lane.rate.rate_per_s == pytest.approx(2.0)
    # The four queued requests reserve again: 0.5 s apart at the new rate from the cut,
    # not behind the 1 s of debt they had already run up.
    again = [lane.reserve(1, 0, 100.1) for _ in range(4)]
    assert again == pytest.approx([0.5, 1.0, 1.5, 2.0])


def test_lane_throttles_within_a_window_count_but_cut_once() -> None:
    lane = _lane()
    lane.reserve(8, 0, 100.0)
    for _ in range(5):
        lane.on_throttle(100.1, None)
    assert lane.throttles == 5
    assert lane.rate.rate_per_s == pytest.approx(4.0)  # one cut: 0.5 * 8 sent


def test_lane_throttle_never_goes_below_the_minimum() -> None:
    lane = _lane(min_rate_per_s=5.0)
    for t in range(10):
        lane.on_throttle(100.0 + 2 * t, None)
    assert lane.rate.rate_per_s == 5.0
    assert lane.requests.rate_per_s == 5.0


def test_lane_success_grows_rate_and_its_bucket_up_to_the_ceiling() -> None:
    lane = _lane(rate_per_s=100.0)
    lane.reserve(10, 0, 100.0)
    lane.on_throttle(100.0, None)
    assert lane.rate.rate_per_s == pytest.approx(5.0)
    lane.on_success(100.5)
    assert lane.rate.rate_per_s == pytest.approx(5.01)  # +0.2 % per success when slow
    assert lane.requests.rate_per_s == lane.rate.rate_per_s
    for _ in range(10_000):
        lane.on_success(101.0)
    assert lane.rate.rate_per_s == 100.0
    assert lane.requests.rate_per_s == 100.0


def test_lane_status_of_a_fresh_lane() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.in_flight = 2
    status = lane.status(100.0)
    assert status.rate_limit_per_s == 3500.0
    assert (status.in_flight, status.throttles, status.paused_until_s) == (2, 0, None)


# -- the cut must bite ----------------------------------------------------------------------


def test_lane_after_a_cut_admits_about_one_second_of_the_new_rate_at_once() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.reserve(10, 0, 100.0)
    lane.on_throttle(100.0, None)
    new_rate = lane.rate.rate_per_s
    assert new_rate == pytest.approx(5.0)
    free = 0
    while lane.reserve(1, 0, 100.0) == 0.0 and free < 10_000:
        free += 1
    assert free <= 2 * new_rate


def test_lane_idle_after_a_cut_does_not_bank_more_than_its_rate() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.reserve(200, 0, 100.0)
    lane.on_throttle(100.0, None)  # cut to 100/s
    # Idle for 10 minutes (between two checkpoints), then a burst.
    free = 0
    while lane.reserve(1, 0, 700.0) == 0.0 and free < 10_000:
        free += 1
    assert free <= 2 * lane.rate.rate_per_s


def _simulate_lane(limit_per_s: int, duration_s: float, concurrency: int) -> tuple[int, int]:
    """A lane with an endless backlog: ``concurrency`` workers each reserve a token, wait,
    send, and get the answer 20 ms later (so at most 50 x concurrency requests/s); the
    upstream throttles a request once it accepted ``limit_per_s`` in the last second.
    Returns (sent, throttled)."""
    latency_s = 0.02
    lane = Lane("bkt", "p/", LaneConfig(concurrency=concurrency), 0.0)
    # (time, tie-breaker, what): "ready" -> reserve; "send<cuts>" -> upstream (reserve again
    # if the lane was cut since); "ok"/"slow" -> answer
    events: list[tuple[float, int, str]] = [(0.0, i, "ready") for i in range(concurrency)]
    order = concurrency
    accepted: deque[float] = deque()
    sent = throttled = 0
    while events:
        now_s, _, what = heapq.heappop(events)
        if now_s >= duration_s:
            break
        if what == "ready" or (what.startswith("send") and what != f"send{lane.cuts}"):
            # Reserve; a request timed before a cut reserves again (as the flusher does).
            at_s, what = now_s + lane.reserve(1, 0, now_s), f"send{lane.cuts}"
        elif what.startswith("send"):
            sent += 1
            while accepted and accepted[0] <= now_s - 1.0:
                accepted.popleft()
            if len(accepted) < limit_per_s:
                accepted.append(now_s)
                at_s, what = now_s + latency_s, "ok"
            else:
                throttled += 1
                at_s, what = now_s + latency_s, "slow"
        else:
            if what == "ok":
                lane.on_success(now_s)
            else:
                lane.on_throttle(now_s, None)
            at_s, what = now_s, "ready"
        heapq.heappush(events, (at_s, order, what))
        order += 1
    return sent, throttled


def test_lane_converges_under_an_upstream_limit() -> None:
    sent, throttled = _simulate_lane(100, 120.0, concurrency=8)
    assert throttled / sent < 0.02
    assert 0.5 * 100 <= (sent - throttled) / 120.0 <= 100


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


def test_lanes_keep_their_state_between_uses() -> None:
    lanes = Lanes(LaneConfig(depth=1))
    lane = lanes.lane_for("b", "hot/1", 100.0)
    lane.reserve(4, 0, 100.0)
    lane.on_throttle(100.0, 30.0)
    again = lanes.lane_for("b", "hot/2", 110.0)
    assert again is lane
    assert not again.has_room(110.0, 0)
    assert again.rate.rate_per_s == pytest.approx(2.0)


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


def test_lanes_forgetting_keeps_a_lane_paused_by_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lanes_module, "_MAX_IDLE_LANES", 2)
    lanes = Lanes(LaneConfig(depth=1))
    hot = lanes.lane_for("b", "hot/x", 0.0)
    hot.on_throttle(0.0, 60.0)  # paused for a minute; its row waits in backoff (idle lane)
    lanes.lane_for("b", "other/x", 1.0)
    lanes.lane_for("b", "third/x", 2.0)  # over the limit: idle lanes are forgotten
    lane = lanes.peek("b", "hot/y")
    assert lane is not None and not lane.has_room(3.0, 0)
