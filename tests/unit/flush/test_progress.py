"""gateway.flush.progress: rates that decay to 0, bytes in flight, and the ETA rules (fake
clock, no gateway)."""

from __future__ import annotations

import io
import threading

import pytest
from flowkit import ManualClock

from gateway.flush.progress import (
    WINDOW_S,
    CountingBody,
    Eta,
    FlushProgress,
    RateWindow,
    eta,
)
from gateway.upstream.client import PartSource

MB = 1_000_000


def test_rate_decays_to_exactly_zero_a_window_after_the_last_record() -> None:
    w = RateWindow(window_s=10.0)
    for t in range(20):  # 1 MB/s for 20 s
        w.add(100.0 + t, MB)
    assert w.rate(120.0) == pytest.approx(MB, rel=0.11)
    after_1s, after_5s = w.rate(121.0), w.rate(125.0)
    assert 0 < after_5s < after_1s  # decaying, not frozen at the last value
    assert w.rate(130.5) == 0.0  # the drain ended more than a window ago: idle is 0
    assert w.rate(10_000.0) == 0.0


def test_a_four_second_burst_is_measured_over_four_seconds() -> None:
    w = RateWindow(window_s=10.0)
    w.add(0.0, 1.0)  # something long ago
    for t in (60.0, 61.0, 62.0, 63.0):  # 25 MB/s from t=60 on
        w.add(t, 25 * MB)
    # Over the 4 s of the burst (plus the one whose start the last record ends), not 10 s.
    assert w.rate(64.0) == pytest.approx(100 * MB / 4.0)


def test_a_fresh_burst_is_divided_by_at_least_a_second() -> None:
    w = RateWindow(window_s=10.0)
    w.add(50.0, 64 * 1024)
    assert w.rate(50.001) == pytest.approx(64 * 1024)  # not 64 MiB/s after a millisecond


def test_a_single_burst_counts_until_the_window_has_passed() -> None:
    w = RateWindow(window_s=10.0)
    w.add(77.77, 4000)  # one small flush, then nothing
    assert w.rate(80.27) == pytest.approx(4000 / 2.5)
    assert w.rate(87.0) == pytest.approx(4000 / 9.23)
    assert w.rate(87.9) == 0.0


def test_work_taken_back_lowers_the_rate_but_never_below_zero() -> None:
    w = RateWindow(window_s=10.0)
    w.add(0.0, 4 * MB)
    w.add(2.0, -4 * MB)  # that upload failed: its bytes must be sent again
    assert w.rate(2.0) == 0.0
    w.add(3.0, -1.0)
    assert w.rate(3.0) == 0.0


def test_counting_body_counts_reads_and_uncounts_a_rewind() -> None:
    moved: list[int] = []
    body = CountingBody(io.BytesIO(b"x" * 1000), moved.append)
    assert body.read(300) == b"x" * 300
    assert body.tell() == 300
    assert sum(moved) == 300
    body.seek(0)  # a retried part: sent again from the start
    assert sum(moved) == 0
    assert len(body.read()) == 1000
    assert sum(moved) == 1000


def test_an_upload_counts_what_was_sent_while_in_flight_then_its_size() -> None:
    clock = ManualClock()
    progress = FlushProgress(clock)
    with progress.upload("b", "ckpt/step_1/shard", 2000):
        body = progress.body("b", "ckpt/step_1/shard", io.BytesIO(b"y" * 2000))  # type: ignore[arg-type]
        body.read(500)
        assert progress.sent_bytes() == 500
        assert progress.sent_bytes("b", "ckpt/step_1/") == 500
        assert progress.sent_bytes("b", "ckpt/step_2/") == 0
        assert progress.sent_bytes("other") == 0
        assert progress.total_bytes() == 500
        clock.now_s += 1.0
        assert progress.rate_bytes_per_s() == pytest.approx(500.0)
    assert progress.sent_bytes() == 0
    assert progress.total_bytes() == 2000  # its whole size once it succeeded
    assert progress.rate_bytes_per_s() == pytest.approx(2000.0)
    clock.now_s += WINDOW_S + 0.5
    assert progress.rate_bytes_per_s() == 0.0


def test_a_failed_upload_takes_its_bytes_back() -> None:
    clock = ManualClock()
    progress = FlushProgress(clock)
    with pytest.raises(OSError), progress.upload("b", "k", 1000):
        progress.body("b", "k", io.BytesIO(b"z" * 1000)).read(800)  # type: ignore[arg-type]
        raise OSError("connection reset")
    assert progress.total_bytes() == 0
    assert progress.rate_bytes_per_s() == 0.0


def test_parts_each_count_and_retry_alone() -> None:
    progress = FlushProgress(ManualClock())
    sources = [PartSource(io.BytesIO(b"p" * 100), 100, "m") for _ in range(3)]  # type: ignore[arg-type]
    with progress.upload("b", "big", 300):
        parts = progress.parts("b", "big", sources)
        assert [p.size_bytes for p in parts] == [100, 100, 100]
        parts[0].body.read()
        parts[1].body.read(40)
        assert progress.sent_bytes() == 140
        parts[1].body.seek(0)  # part 2 is retried
        assert progress.sent_bytes() == 100


def test_reads_from_executor_threads_are_all_counted() -> None:
    progress = FlushProgress(ManualClock())
    with progress.upload("b", "k", 8 * 4096):
        bodies = [progress.body("b", "k", io.BytesIO(b"t" * 4096)) for _ in range(8)]  # type: ignore[arg-type]
        threads = [
            threading.Thread(target=lambda f=f: [f.read(1) for _ in range(4096)]) for f in bodies
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert progress.sent_bytes() == 8 * 4096


def test_lane_rates_are_accepted_requests_per_second_and_decay() -> None:
    clock = ManualClock()
    progress = FlushProgress(clock)
    for _ in range(20):
        progress.accepted("b", "ckpt/step_1/")
        clock.now_s += 0.25  # 4 requests/s for 5 s
    assert progress.lane_rates() == {("b", "ckpt/step_1/"): pytest.approx(4.0, rel=0.1)}
    clock.now_s += WINDOW_S + 1
    assert progress.lane_rates() == {}  # idle: no rate, and the lane is forgotten


def test_waiting_for_the_upstream_until_something_is_accepted() -> None:
    clock = ManualClock()
    progress = FlushProgress(clock)
    assert progress.waiting_for() is None
    progress.failed("Could not connect to the endpoint URL")
    assert progress.waiting_for() == "Could not connect to the endpoint URL"
    clock.now_s += 1
    progress.accepted("b", "")
    assert progress.waiting_for() is None
    clock.now_s += 1
    progress.failed("SlowDown")
    assert progress.waiting_for() == "SlowDown"
    clock.now_s += 1
    with progress.upload("b", "k", 10):  # bytes moving count as accepted
        progress.body("b", "k", io.BytesIO(b"0123456789")).read(1)  # type: ignore[arg-type]
    assert progress.waiting_for() is None


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        ({}, Eta(30.0)),
        ({"movable_objects": 0, "remaining_bytes": 0}, Eta(0.0)),
        ({"movable_objects": 0, "stuck_objects": 2},
         Eta(None, "only failed objects are left: fix the cause, then `gateway retry`")),
        ({"is_paused": True}, Eta(None, "flusher paused: `gateway resume`")),
        ({"waiting_for": "connection refused"},
         Eta(None, "waiting for the upstream: connection refused")),
        ({"rate_bytes_per_s": 0.0}, Eta(None, "nothing flushed in the last 10s")),
        ({"remaining_bytes": -5}, Eta(0.0)),
    ],
)  # fmt: skip
def test_eta_rules(kw: dict[str, object], expected: Eta) -> None:
    args: dict[str, object] = {
        "movable_objects": 3,
        "remaining_bytes": 30 * MB,
        "stuck_objects": 0,
        "rate_bytes_per_s": float(MB),
        "is_paused": False,
        "waiting_for": None,
    }
    assert eta(**{**args, **kw}) == expected  # type: ignore[arg-type]


def test_idle_lane_windows_are_dropped_even_if_nobody_reads_them() -> None:
    clock = ManualClock()
    progress = FlushProgress(clock)
    for step in range(3000):  # a new lane per checkpoint step, hours apart
        progress.accepted("b", f"ckpt/step_{step}/")
        clock.now_s += WINDOW_S + 1
    assert len(progress._lanes) <= 1024
