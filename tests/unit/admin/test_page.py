"""The flush history behind the status page's chart (gateway/admin/page.py): samples are
taken when the journal changes, at most every SAMPLE_EVERY_S, and carry the flusher's
progress counter (bytes in flight count) beside the journal's totals."""

from __future__ import annotations

from gateway.admin.page import SAMPLE_EVERY_S, FlushHistory, HistorySource, Sample
from gateway.clock import FakeClock
from gateway.store.journal import Journal


def test_the_ring_keeps_the_newest_samples() -> None:
    history = FlushHistory(capacity=3)
    for t in range(5):
        history.add(Sample(float(t), t, t, 0, 0))
    assert [s.at_s for s in history.samples] == [2.0, 3.0, 4.0]


def test_changes_are_sampled_at_most_every_interval(journal: Journal) -> None:
    clock = FakeClock()
    progress = [0]
    src = HistorySource(journal, clock, lambda: True, lambda: progress[0])
    src.on_changes()
    progress[0] = 4096
    clock.advance(SAMPLE_EVERY_S / 2)
    src.on_changes()  # too soon: not sampled
    clock.advance(SAMPLE_EVERY_S / 2)
    src.on_changes()
    samples = [s.as_json() for s in src.history.samples]
    assert [s["progress_bytes"] for s in samples] == [0, 4096]
    assert samples[1] == {
        "t": clock.wall(),
        "flushed_bytes": 0,
        "flushed_objects": 0,
        "unflushed_bytes": 0,
        "unflushed_objects": 0,
        "progress_bytes": 4096,
        "paused": True,
    }
