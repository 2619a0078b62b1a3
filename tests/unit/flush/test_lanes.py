"""Prefix lanes: which lane a key is in, one lane's flow control, the set of lanes."""

from __future__ import annotations

import heapq

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


def test_lane_first_throttle_starts_measuring_and_re_times_queued_requests() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.on_send(100.0)
    lane.on_success(100.04, 100.0)
    waits = [lane.reserve(1, 0, 100.1) for _ in range(8)]
    assert waits == [0.0] * 8  # open: at the ceiling
    lane.on_send(100.1)
    lane.on_throttle(100.14, None, 100.1)
    assert lane.throttles == 1
    assert lane.cuts == 1  # queued requests reserve again
    assert lane.rate.phase == "measuring"
    assert lane.rate.rate_per_s == pytest.approx(6.0)  # the probe
    assert lane.requests.rate_per_s == pytest.approx(6.0)
    # They reserve again one probe interval apart, from a bucket empty since the refused
    # request was sent: the prefix had no token then either.
    again = [lane.reserve(1, 0, 100.14) for _ in range(3)]
    assert again == pytest.approx([100.1 + k / 6 - 100.14 for k in (1, 2, 3)])
    status = lane.status(100.14)
    assert (status.bucket, status.prefix, status.rate_limit_per_s) == ("bkt", "p/", 6.0)
    assert status.throttles == 1


def test_lane_probes_at_a_random_point_of_each_interval_only_while_measuring() -> None:
    draws = iter([0.5, 0.25])
    lane = Lane("bkt", "p/", LaneConfig(rate_per_s=10.0), 100.0, probe_jitter=lambda: next(draws))
    assert lane.reserve(1, 0, 100.0) == 0.0  # open: no jitter
    lane.on_send(100.0)
    lane.on_throttle(100.04, None, 100.0)  # measuring at the probe rate, 6/s
    assert lane.reserve(1, 0, 100.04) == pytest.approx(100.0 + 1 / 6 - 100.04 + 0.5 / 6)
    assert lane.reserve(1, 0, 100.04) == pytest.approx(100.0 + 2 / 6 - 100.04 + 0.25 / 6)


def test_lanes_give_their_lanes_probe_jitter() -> None:
    lane = Lanes(LaneConfig()).lane_for("b", "r0/x", 100.0)
    lane.on_send(100.0)
    lane.on_throttle(100.04, None, 100.0)
    waits = {round(lane.reserve(1, 0, 100.04) - k / 6, 9) for k in range(1, 9)}
    assert len(waits) > 1  # not on a fixed grid


def test_lane_throttles_while_measuring_count_but_cut_nothing() -> None:
    lane = _lane()
    lane.on_throttle(100.0, None, 100.0)
    for i in range(5):
        lane.on_throttle(100.1 + i * 0.1, None, 100.05 + i * 0.1)
    assert lane.throttles == 6
    assert lane.cuts == 1
    assert lane.rate.rate_per_s == pytest.approx(6.0)


def _measured_lane(limit_per_s: float, **config: float) -> Lane:
    """A lane that probed a prefix bucket of ``limit_per_s`` (burst 2) until it settled."""
    lane = _lane(**config)
    tokens, at_s, sent_s = 2.0, 100.0, 100.0
    while lane.rate.phase != "steady" and sent_s < 110.0:
        lane.poll(sent_s)
        tokens = min(2.0, tokens + (sent_s - at_s) * limit_per_s)
        at_s = sent_s
        lane.on_send(sent_s)
        if tokens >= 1:
            tokens -= 1
            lane.on_success(sent_s + 0.05, sent_s)
        else:
            lane.on_throttle(sent_s + 0.04, None, sent_s)
        sent_s += 1.0 / lane.rate.rate_per_s
    assert lane.rate.phase == "steady"
    return lane


def test_lane_settles_just_under_the_prefix_limit() -> None:
    lane = _measured_lane(1.0)
    assert lane.rate.estimate_per_s == pytest.approx(1.0, rel=0.1)
    assert lane.rate.estimate_per_s is not None
    assert lane.rate.rate_per_s == pytest.approx(0.95 * lane.rate.estimate_per_s)
    assert lane.requests.rate_per_s == lane.rate.rate_per_s


def test_lane_settling_keeps_what_the_prefix_earned_since_its_last_token() -> None:
    """After settling, the first request waits for the prefix's next token, counted from
    the last acceptance, not a whole interval from the moment of settling."""
    lane = _measured_lane(1.0)
    last_accepted_s = max(s for s, ok in lane.rate._outcomes if ok)
    settled_s = lane.requests._at_s
    wait_s = lane.reserve(1, 0, settled_s)
    assert settled_s + wait_s == pytest.approx(last_accepted_s + 1 / lane.rate.rate_per_s)
    assert wait_s < 1 / lane.rate.rate_per_s


def test_lane_steady_throttle_never_goes_below_the_minimum() -> None:
    lane = _measured_lane(1.0, min_rate_per_s=0.9)
    for t in range(10):
        lane.on_throttle(200.0 + 2 * t, None, 200.0 + 2 * t)
    assert lane.rate.rate_per_s == 0.9
    assert lane.requests.rate_per_s == 0.9


def test_lane_steady_success_grows_rate_and_its_bucket_up_to_the_ceiling() -> None:
    lane = _measured_lane(1.0, rate_per_s=2.0)
    level = lane.rate.rate_per_s
    lane.on_success(200.0, 199.0)
    assert lane.rate.rate_per_s == pytest.approx(level * 1.002)  # +0.2 % per success
    assert lane.requests.rate_per_s == lane.rate.rate_per_s
    for i in range(10_000):
        lane.on_success(201.0 + i, 200.0 + i)
    assert lane.rate.rate_per_s == 2.0
    assert lane.requests.rate_per_s == 2.0


def test_lanes_of_a_bucket_pool_their_measurements() -> None:
    lanes = Lanes(LaneConfig(depth=1))
    measured = [lanes.lane_for("b", f"r{i}/x", 100.0) for i in range(3)]
    assert len({id(lane.rate._pool) for lane in measured}) == 1
    other = lanes.lane_for("other", "r0/x", 100.0)
    assert other.rate._pool is not measured[0].rate._pool


def test_lane_status_of_a_fresh_lane() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.in_flight = 2
    status = lane.status(100.0)
    assert status.rate_limit_per_s == 3500.0
    assert (status.in_flight, status.throttles, status.paused_until_s) == (2, 0, None)


# -- the cut must bite ----------------------------------------------------------------------


def test_lane_after_a_cut_admits_nothing_at_once() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.reserve(10, 0, 100.0)
    lane.on_throttle(100.0, None, 100.0)
    assert lane.reserve(1, 0, 100.0) > 0.0  # the prefix is empty: wait one interval


def test_lane_idle_after_a_cut_does_not_bank_more_than_its_rate() -> None:
    lane = _lane(rate_per_s=3500.0)
    lane.reserve(200, 0, 100.0)
    lane.on_throttle(100.0, None, 100.0)  # measuring at the probe rate
    # Idle for 10 minutes (between two checkpoints), then a burst.
    free = 0
    while lane.reserve(1, 0, 700.0) == 0.0 and free < 10_000:
        free += 1
    assert free <= max(1.0, lane.rate.rate_per_s)


def _simulate_lane(limit_per_s: int, duration_s: float, concurrency: int) -> tuple[int, int]:
    """A lane with an endless backlog: ``concurrency`` workers each reserve a token, wait,
    send, and get the answer 20 ms later (so at most 50 x concurrency requests/s); the
    upstream is a token bucket of ``limit_per_s`` holding one second's worth (as S3's
    and the emulator's prefixes are). Returns (sent, throttled) after the first 5 s.

    A sliding-window limiter (``limit_per_s`` in any second) is not modelled: it answers
    in long runs of acceptances and refusals, which the lane's measurement reads as a
    much higher limit, and its steady state then draws about 8 % throttles."""
    latency_s = 0.02
    lane = Lane("bkt", "p/", LaneConfig(concurrency=concurrency), 0.0)
    # (time, tie-breaker, what): "ready" -> reserve; "send<cuts>" -> upstream (reserve again
    # if the lane was cut since); "ok"/"slow" -> answer
    events: list[tuple[float, int, str]] = [(0.0, i, "ready") for i in range(concurrency)]
    order = concurrency
    tokens, filled_s = float(limit_per_s), 0.0
    sent = throttled = 0
    while events:
        now_s, _, what = heapq.heappop(events)
        if now_s >= duration_s:
            break
        if what == "ready" or (what.startswith("send") and what != f"send{lane.cuts}"):
            # Reserve; a request timed before a cut reserves again (as the flusher does).
            at_s, what = now_s + lane.reserve(1, 0, now_s), f"send{lane.cuts}"
        elif what.startswith("send"):
            lane.on_send(now_s)
            sent += now_s >= 5.0
            tokens = min(limit_per_s, tokens + (now_s - filled_s) * limit_per_s)
            filled_s = now_s
            if tokens >= 1:
                tokens -= 1
                at_s, what = now_s + latency_s, f"ok{now_s!r}"
            else:
                throttled += now_s >= 5.0
                at_s, what = now_s + latency_s, f"slow{now_s!r}"
        else:
            if what.startswith("ok"):
                lane.on_success(now_s, float(what[2:]))
            else:
                lane.on_throttle(now_s, None, float(what[4:]))
            at_s, what = now_s, "ready"
        heapq.heappush(events, (at_s, order, what))
        order += 1
    return sent, throttled


def test_lane_converges_under_an_upstream_limit() -> None:
    sent, throttled = _simulate_lane(100, 120.0, concurrency=8)
    assert throttled / sent < 0.02
    assert 0.85 * 100 <= (sent - throttled) / 115.0 <= 101


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
    assert again.rate.phase == "measuring"
    assert again.rate.rate_per_s == pytest.approx(6.0)


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
