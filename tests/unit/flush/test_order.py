"""FlushOrder with FlushPolicy against a real Journal: what a claim hands out, and when.

Times are explicit wall-clock seconds (acked_s and the claim's now_s; the lanes' monotonic
time is the same number here); nothing sleeps. ``Rig.claim`` does what the flusher's loop
does: take from the order, claim in the journal, settle; it never starts uploads, so lanes
have room again at the next claim unless a test sets ``in_flight``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.flush.lanes import LaneConfig, Lanes
from gateway.flush.order import FlushOrder
from gateway.flush.policy import FlushPolicy, PolicyConfig
from gateway.models import FlushState, LocalObject, ObjectMeta, parent_prefix
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.rows import prefix_end

BUCKET = "b"
T0 = 1_000.0


@dataclass
class Claimed:
    objects: list[LocalObject]
    wake_s: float | None  # the order's next timer after the claim


class Rig:
    """A FlushOrder subscribed to the journal, claimed from as the flusher does."""

    def __init__(self, policy: FlushPolicy) -> None:
        self.policy = policy
        self.lanes = policy.lanes
        self.order: FlushOrder | None = None
        self.queue: FlushQueue | None = None

    def is_temp(self, key: str) -> bool:
        return self.policy.is_temp(key)

    def is_marker(self, key: str) -> bool:
        return self.policy.is_marker(key)

    async def attach(self, journal: Journal) -> FlushOrder:
        if self.order is None:
            self.order = FlushOrder(self.policy, journal.figures)
            self.queue = FlushQueue(journal)
            await journal.subscribe(self.order)
        return self.order

    async def claim(self, journal: Journal, now_s: float, limit: int) -> Claimed:
        order = await self.attach(journal)
        assert self.queue is not None
        seqs = order.take(limit, now_s, now_s)
        try:
            objects = await self.queue.claim(seqs)
        finally:
            order.claimed(seqs)
        order.settle(now_s)
        return Claimed(objects, order.next_due_s())


def _policy(
    *,
    delay_s: float = 0.0,
    hold_s: float = 10.0,
    temp: Sequence[str] = ("*.tmp",),
    markers: Sequence[str] = (".metadata", "_SUCCESS"),
    depth: int = 3,
    concurrency: int = 8,
) -> Rig:
    config = PolicyConfig(
        write_back_delay_s=delay_s, temp_patterns=temp, temp_hold_s=hold_s, commit_markers=markers
    )
    return Rig(FlushPolicy(config, Lanes(LaneConfig(depth=depth, concurrency=concurrency))))


async def _put(
    journal: Journal, key: str, acked_s: float = T0, bucket: str = BUCKET
) -> LocalObject:
    meta = ObjectMeta(bucket=bucket, key=key, size_bytes=3, etag="e", last_modified_s=acked_s)
    row, _ = await journal.commit_put(meta, f"blob-{key}", acked_s)
    return row


async def _delete(journal: Journal, key: str, acked_s: float = T0) -> LocalObject:
    row, _ = await journal.commit_delete(BUCKET, key, acked_s)
    return row


async def _claim(journal: Journal, rig: Rig, now_s: float, limit: int = 100) -> Claimed:
    return await rig.claim(journal, now_s, limit)


def _keys(claimed: Claimed) -> list[str]:
    return [o.meta.key for o in claimed.objects]


def _queue(journal: Journal) -> FlushQueue:
    return FlushQueue(journal)


# -- write-back delay -----------------------------------------------------------------------


async def test_write_back_delay_holds_young_rows_and_reports_when(journal: Journal) -> None:
    rig = _policy(delay_s=0.5)
    await _put(journal, "k", T0)

    early = await _claim(journal, rig, T0 + 0.2)
    assert early.objects == []
    assert early.wake_s == pytest.approx(T0 + 0.5)

    ready = await _claim(journal, rig, T0 + 0.5)
    assert _keys(ready) == ["k"]
    assert ready.wake_s is None


async def test_write_back_delay_first_young_row_ends_the_round(journal: Journal) -> None:
    rig = _policy(delay_s=0.5)
    await _put(journal, "old", T0)
    await _put(journal, "young", T0 + 0.4)
    await _put(journal, "younger", T0 + 0.45)

    claimed = await _claim(journal, rig, T0 + 0.6)
    assert _keys(claimed) == ["old"]
    assert claimed.wake_s == pytest.approx(T0 + 0.9)


async def test_write_back_delay_coalesces_an_overwrite(journal: Journal) -> None:
    rig = _policy(delay_s=0.5)
    await _put(journal, "k", T0)
    assert (await _claim(journal, rig, T0 + 0.3)).objects == []
    second = await _put(journal, "k", T0 + 0.3)  # overwritten before it was eligible
    assert (await _claim(journal, rig, T0 + 0.6)).objects == []
    claimed = await _claim(journal, rig, T0 + 0.8)
    assert [o.seq for o in claimed.objects] == [second.seq]


async def test_write_back_delay_zero_claims_at_once(journal: Journal) -> None:
    rig = _policy(delay_s=0.0)
    await _put(journal, "k", T0 + 100.0)  # even a row acked "later" than now
    claimed = await _claim(journal, rig, T0)
    assert _keys(claimed) == ["k"]


# -- temp names -----------------------------------------------------------------------------


async def test_temp_key_is_held_and_the_hold_is_recorded(journal: Journal) -> None:
    rig = _policy(hold_s=10.0)
    await _put(journal, "p/x.tmp", T0)
    await _put(journal, "p/y", T0)

    first = await _claim(journal, rig, T0 + 1.0)
    assert _keys(first) == ["p/y"]  # a hold does not stop later rows
    assert first.wake_s == pytest.approx(T0 + 10.0)
    row = await journal.get(BUCKET, "p/x.tmp")
    assert row is not None and row.state is FlushState.PENDING

    # Held in memory: not offered before then, and the only wake-up is the hold's end.
    again = await _claim(journal, rig, T0 + 5.0)
    assert (again.objects, again.wake_s) == ([], pytest.approx(T0 + 10.0))

    late = await _claim(journal, rig, T0 + 10.0)
    assert _keys(late) == ["p/x.tmp"]


async def test_temp_hold_and_write_back_delay_wake_at_the_earlier(journal: Journal) -> None:
    rig = _policy(delay_s=0.5, hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    await _put(journal, "y", T0 + 0.4)
    claimed = await _claim(journal, rig, T0 + 0.6)
    assert claimed.objects == []
    assert claimed.wake_s == pytest.approx(T0 + 0.9)


async def test_temp_key_waits_for_the_later_of_hold_and_delay(journal: Journal) -> None:
    # One timer at the hold's end: no wake-up at the write-back delay in between.
    rig = _policy(delay_s=0.5, hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    claimed = await _claim(journal, rig, T0 + 0.1)
    assert claimed.wake_s == pytest.approx(T0 + 10.0)
    assert (await _claim(journal, rig, T0 + 9.9)).objects == []
    assert _keys(await _claim(journal, rig, T0 + 10.0)) == ["x.tmp"]
    short = _policy(delay_s=5.0, hold_s=1.0)  # a delay longer than the hold wins
    await _put(journal, "y.tmp", T0 + 20.0)
    assert (await _claim(journal, short, T0 + 21.0)).wake_s == pytest.approx(T0 + 25.0)


async def test_delete_of_a_temp_key_is_not_held(journal: Journal) -> None:
    rig = _policy(hold_s=10.0)
    await _delete(journal, "p/x.tmp", T0)
    claimed = await _claim(journal, rig, T0)
    assert _keys(claimed) == ["p/x.tmp"]
    assert claimed.objects[0].is_delete


async def test_delete_of_a_held_temp_key_replaces_the_hold(journal: Journal) -> None:
    rig = _policy(hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    assert (await _claim(journal, rig, T0 + 1.0)).objects == []
    tomb = await _delete(journal, "x.tmp", T0 + 2.0)  # the rename's delete
    claimed = await _claim(journal, rig, T0 + 2.0)
    assert [(o.seq, o.is_delete) for o in claimed.objects] == [(tomb.seq, True)]
    # The superseded version's hold ends with nothing to hand out.
    late = await _claim(journal, rig, T0 + 10.0)
    assert (late.objects, late.wake_s) == ([], None)


async def test_temp_patterns_match_the_name_only(journal: Journal) -> None:
    rig = _policy(temp=("*.tmp", ".~*"))
    for key in ("d.tmp/file", "a/.~lock", "a/b.tmp", "a/B.TMP"):
        await _put(journal, key, T0)
    claimed = await _claim(journal, rig, T0 + 1.0)
    assert _keys(claimed) == ["d.tmp/file", "a/B.TMP"]


# -- commit markers -------------------------------------------------------------------------


async def test_marker_waits_for_an_earlier_row_in_flight(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")

    first = await _claim(journal, rig, T0)
    assert _keys(first) == ["p/shard-0"]  # flushing now
    assert first.wake_s is None  # a SKIP: woken by the shard's outcome, not by time
    assert (await _claim(journal, rig, T0)).objects == []

    assert await _queue(journal).mark_durable(first.objects[0])
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata"]


async def test_marker_waits_for_an_earlier_pending_row(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")
    [shard] = (await _claim(journal, rig, T0, limit=1)).objects
    await _queue(journal).retry_later(shard, "503", T0 + 30.0)  # pending, backed off: not offered

    assert (await _claim(journal, rig, T0 + 1.0)).objects == []
    assert _keys(await _claim(journal, rig, T0 + 30.0)) == ["p/shard-0"]


async def test_marker_waits_for_an_earlier_failed_row(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")
    [shard] = (await _claim(journal, rig, T0)).objects
    order = await rig.attach(journal)
    assert order.held_markers() == []  # waiting for a shard in flight: not held
    await _queue(journal).mark_failed(shard, "AccessDenied")
    assert order.held_markers() == [(BUCKET, "p/.metadata")]  # only an operator frees it

    for _ in range(2):
        assert (await _claim(journal, rig, T0 + 5.0)).objects == []

    assert await _queue(journal).retry_failed() == 1
    assert order.held_markers() == []  # the shard moves again
    [retried] = (await _claim(journal, rig, T0 + 6.0)).objects
    assert retried.meta.key == "p/shard-0"
    await _queue(journal).mark_durable(retried)
    assert _keys(await _claim(journal, rig, T0 + 6.0)) == ["p/.metadata"]


async def test_marker_waits_for_an_earlier_tombstone(journal: Journal) -> None:
    rig = _policy()
    await _delete(journal, "p/stale-shard")
    await _put(journal, "p/_SUCCESS")
    first = await _claim(journal, rig, T0)
    assert _keys(first) == ["p/stale-shard"]
    await _queue(journal).mark_durable(first.objects[0])  # the tombstone row is dropped
    assert _keys(await _claim(journal, rig, T0)) == ["p/_SUCCESS"]


async def test_marker_waits_for_rows_in_sub_prefixes(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/rank_0/shard")
    await _put(journal, "p/.metadata")
    first = await _claim(journal, rig, T0)
    assert _keys(first) == ["p/rank_0/shard"]
    await _queue(journal).mark_durable(first.objects[0])
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata"]


async def test_marker_waits_for_a_held_temp_row(journal: Journal) -> None:
    rig = _policy(hold_s=10.0)
    await _put(journal, "p/shard.tmp", T0)
    await _put(journal, "p/.metadata", T0)
    claimed = await _claim(journal, rig, T0 + 1.0)
    assert claimed.objects == []
    assert claimed.wake_s == pytest.approx(T0 + 10.0)


async def test_marker_not_blocked_by_rows_acked_after_it(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/.metadata")
    await _put(journal, "p/shard-late")
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata", "p/shard-late"]


async def test_marker_not_blocked_by_an_earlier_key_overwritten_after_it(
    journal: Journal,
) -> None:
    # Rows are versions: the shard's pending version is acked after the marker.
    rig = _policy()
    first = await _put(journal, "p/shard")
    [claimed] = (await _claim(journal, rig, T0)).objects
    await _queue(journal).mark_durable(claimed)
    await _put(journal, "p/.metadata")
    rewritten = await _put(journal, "p/shard")
    assert rewritten.seq > first.seq
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata", "p/shard"]


async def test_marker_claimed_once_earlier_rows_are_durable(journal: Journal) -> None:
    rig = _policy()
    for i in range(3):
        await _put(journal, f"p/shard-{i}")
    await _put(journal, "p/.metadata")
    shards = (await _claim(journal, rig, T0)).objects
    assert sorted(o.meta.key for o in shards) == ["p/shard-0", "p/shard-1", "p/shard-2"]
    for shard in shards[:2]:
        await _queue(journal).mark_durable(shard)
        assert (await _claim(journal, rig, T0)).objects == []
    await _queue(journal).mark_durable(shards[2])
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata"]


async def test_markers_in_other_prefixes_are_independent(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "p/shard")
    await _put(journal, "q/.metadata")
    await _put(journal, "p0/.metadata")  # "p0/" sorts right after the range of "p/"
    await _put(journal, "p./.metadata")  # "p./" sorts right before it
    await _put(journal, "p/.metadata")
    await _put(journal, ".metadata", bucket="other")  # another bucket's root marker
    claimed = await _claim(journal, rig, T0)
    assert sorted(_keys(claimed)) == [
        ".metadata",
        "p./.metadata",
        "p/shard",
        "p0/.metadata",
        "q/.metadata",
    ]


async def test_top_level_marker_waits_for_the_whole_bucket(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "deep/down/x")
    await _put(journal, "_SUCCESS")
    await _put(journal, "later")
    first = await _claim(journal, rig, T0)
    assert _keys(first) == ["deep/down/x", "later"]
    await _queue(journal).mark_durable(first.objects[0])
    assert _keys(await _claim(journal, rig, T0)) == ["_SUCCESS"]


async def test_marker_with_a_unicode_parent_prefix(journal: Journal) -> None:
    rig = _policy()
    await _put(journal, "é/shard")
    await _put(journal, "ê/shard")  # the next code point: outside "é/"
    await _put(journal, "é0")  # outside too
    await _put(journal, "é/.metadata")
    await _put(journal, "ê/.metadata")
    first = await _claim(journal, rig, T0)
    assert _keys(first) == ["é/shard", "ê/shard", "é0"]
    assert (await _claim(journal, rig, T0)).objects == []  # both markers wait
    await _queue(journal).mark_durable(first.objects[0])
    assert _keys(await _claim(journal, rig, T0)) == ["é/.metadata"]


async def test_marker_patterns_are_configurable(journal: Journal) -> None:
    rig = _policy(markers=("COMMIT",))
    await _put(journal, "p/shard")
    await _put(journal, "p/.metadata")  # not a marker under this config
    await _put(journal, "p/COMMIT")
    assert _keys(await _claim(journal, rig, T0)) == ["p/shard", "p/.metadata"]


# -- lanes ----------------------------------------------------------------------------------


async def test_lane_concurrency_caps_each_round(journal: Journal) -> None:
    rig = _policy(depth=1, concurrency=2)
    for i in range(5):
        await _put(journal, f"a/{i}")
    for i in range(3):
        await _put(journal, f"b/{i}")
    claimed = await _claim(journal, rig, T0)
    assert _keys(claimed) == ["a/0", "a/1", "b/0", "b/1"]
    assert claimed.wake_s is None


async def test_lane_in_flight_counts_against_the_round(journal: Journal) -> None:
    rig = _policy(depth=1, concurrency=3)
    lane = rig.lanes.lane_for(BUCKET, "a/x", T0)
    lane.in_flight = 2
    for i in range(3):
        await _put(journal, f"a/{i}")
    await _put(journal, "b/0")
    assert _keys(await _claim(journal, rig, T0)) == ["a/0", "b/0"]
    lane.in_flight = 3
    assert (await _claim(journal, rig, T0)).objects == []
    # A full lane is parked until one of its uploads ends (the flusher says so) ...
    lane.in_flight = 1
    assert (await _claim(journal, rig, T0)).objects == []
    assert rig.order is not None
    rig.order.on_room(BUCKET, "a/x")
    # ... and its rows kept their place: oldest first once the lane has room.
    assert _keys(await _claim(journal, rig, T0)) == ["a/1", "a/2"]


async def test_lane_paused_by_retry_after_is_skipped(journal: Journal) -> None:
    rig = _policy(depth=1)
    rig.lanes.lane_for(BUCKET, "hot/x", T0).paused_until_s = T0 + 30.0  # Retry-After: 30
    await _put(journal, "hot/1")
    await _put(journal, "cold/1")
    claimed = await _claim(journal, rig, T0 + 1.0)
    assert _keys(claimed) == ["cold/1"]
    # The paused lane is looked at again a little later, more rarely each time.
    assert claimed.wake_s == pytest.approx(T0 + 1.25)
    again = await _claim(journal, rig, T0 + 1.25)
    assert (again.objects, again.wake_s) == ([], pytest.approx(T0 + 1.75))
    assert _keys(await _claim(journal, rig, T0 + 30.0)) == ["hot/1"]


async def test_lanes_are_per_bucket(journal: Journal) -> None:
    rig = _policy(depth=1, concurrency=1)
    await _put(journal, "a/1")
    await _put(journal, "a/2")
    await _put(journal, "a/1", bucket="other")
    claimed = await _claim(journal, rig, T0)
    assert [(o.meta.bucket, o.meta.key) for o in claimed.objects] == [
        (BUCKET, "a/1"),
        ("other", "a/1"),
    ]


async def test_claim_limit_is_honoured(journal: Journal) -> None:
    rig = _policy(depth=0, concurrency=100)
    for i in range(10):
        await _put(journal, f"k{i}")
    assert _keys(await _claim(journal, rig, T0, limit=3)) == ["k0", "k1", "k2"]
    assert _keys(await _claim(journal, rig, T0, limit=3)) == ["k3", "k4", "k5"]


# -- cost, supersede, restart ---------------------------------------------------------------


class _CountingRoom:
    """Counts the lane-room checks the order makes (its per-claim work)."""

    def __init__(self, rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        original = rig.policy.room

        def room(bucket: str, key: str, now_s: float, taken: int) -> Any:
            self.calls += 1
            return original(bucket, key, now_s, taken)

        monkeypatch.setattr(rig.policy, "room", room)


async def _bulk_put(journal: Journal, keys: Sequence[str], acked_s: float = T0) -> None:
    """Many rows in few transactions (commit_deletes-style), as a burst would leave them."""

    def op(conn: sqlite3.Connection, first_seq: int) -> None:
        for seq, key in enumerate(keys, first_seq):
            meta = ObjectMeta(bucket=BUCKET, key=key, size_bytes=1, etag="e", last_modified_s=0)
            journal.upsert(conn, seq, meta, f"blob-{key}", (), False, acked_s)

    await journal.run_write_versions(len(keys), op)


async def test_a_full_lane_costs_nothing_per_claim(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = _policy(depth=1, concurrency=2)
    await _bulk_put(journal, [f"full/{i:05d}" for i in range(10_000)])
    full = rig.lanes.lane_for(BUCKET, "full/x", T0)
    full.in_flight = 2
    room = _CountingRoom(rig, monkeypatch)
    assert (await _claim(journal, rig, T0)).objects == []
    assert room.calls <= 2  # looked at once, then parked (settle looks once more)
    for i in range(20):  # new work elsewhere, and more for the full lane
        await _put(journal, f"other/{i}")
        await _put(journal, f"full/new-{i}")
        assert _keys(await _claim(journal, rig, T0)) == [f"other/{i}"]
    # Each claim checked the lane it handed out from, never the full one.
    assert room.calls <= 2 + 20 * 2
    assert rig.order is not None
    rig.order.wakeup.clear()
    await _put(journal, "full/more")
    assert not rig.order.wakeup.is_set()  # a PUT into a parked lane wakes nobody


async def test_a_claim_costs_what_it_hands_out(
    journal: Journal, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig = _policy(depth=1, concurrency=100)
    await _bulk_put(journal, [f"lane{i % 50}/{i:05d}" for i in range(20_000)])
    await rig.attach(journal)
    room = _CountingRoom(rig, monkeypatch)
    claimed = await _claim(journal, rig, T0, limit=10)
    assert len(claimed.objects) == 10
    assert room.calls <= 20  # the ten handed out (not the 20,000 waiting)


async def test_superseded_rows_are_skipped_once(journal: Journal) -> None:
    rig = _policy(depth=0)
    await rig.attach(journal)
    await _put(journal, "a")
    await _put(journal, "b")
    newer = await _put(journal, "a")  # "a" is queued twice: its first place is dead
    await _delete(journal, "b")
    claimed = await _claim(journal, rig, T0)
    assert [(o.meta.key, o.seq, o.is_delete) for o in claimed.objects] == [
        ("a", newer.seq, False),
        ("b", newer.seq + 1, True),
    ]
    assert (await _claim(journal, rig, T0)).objects == []


async def test_a_version_superseded_during_its_claim_is_not_claimed(journal: Journal) -> None:
    rig = _policy(depth=0)
    order = await rig.attach(journal)
    await _put(journal, "k")
    seqs = order.take(10, T0, T0)
    newer = await _put(journal, "k")  # lands between take and the journal's claim
    assert rig.queue is not None
    assert await rig.queue.claim(seqs) == []
    order.claimed(seqs)
    assert [o.seq for o in (await _claim(journal, rig, T0)).objects] == [newer.seq]


async def test_a_failed_claim_puts_its_rows_back(journal: Journal) -> None:
    rig = _policy(depth=0)
    order = await rig.attach(journal)
    await _put(journal, "k")
    seqs = order.take(10, T0, T0)
    assert seqs and order.take(10, T0, T0) == []
    order.restore(seqs)  # e.g. the claim's transaction failed: nothing moved
    assert _keys(await _claim(journal, rig, T0)) == ["k"]


async def test_marker_superseded_while_it_waits_waits_as_the_new_version(
    journal: Journal,
) -> None:
    rig = _policy()
    await rig.attach(journal)
    await _put(journal, "p/shard")
    await _put(journal, "p/.metadata")
    [shard] = (await _claim(journal, rig, T0)).objects
    again = await _put(journal, "p/.metadata")  # a rewritten marker, the shard still out
    assert (await _claim(journal, rig, T0)).objects == []
    await _queue(journal).mark_durable(shard)
    assert [o.seq for o in (await _claim(journal, rig, T0)).objects] == [again.seq]


async def test_marker_waits_for_a_shard_rewritten_after_it(journal: Journal) -> None:
    # The shard's first version was pending at the marker's ack: its rewrite (acked after
    # the marker) must be durable first, or the marker would go up without that shard.
    rig = _policy()
    await rig.attach(journal)
    await _put(journal, "p/shard")
    await _put(journal, "p/.metadata")
    rewritten = await _put(journal, "p/shard")
    [first] = (await _claim(journal, rig, T0)).objects
    assert first.seq == rewritten.seq
    assert (await _claim(journal, rig, T0)).objects == []
    await _queue(journal).mark_durable(first)
    assert _keys(await _claim(journal, rig, T0)) == ["p/.metadata"]


async def test_order_rebuilt_from_the_journal(tmp_path: Path) -> None:
    """A restart: pending rows come back in ack order, backoffs as timers, a marker still
    waiting for an earlier failed row waits again, and a flushing row is pending again."""
    path = tmp_path / "j.db"
    first = Journal(path, fsync=False)
    first.open()
    rig = _policy(depth=0)
    await _put(first, "p/bad")
    await _put(first, "p/.metadata")
    await _put(first, "late")
    await _put(first, "inflight")
    claimed = await _claim(first, rig, T0, limit=1)
    await _queue(first).mark_failed(claimed.objects[0], "AccessDenied")
    [late, _in_flight] = (await _claim(first, rig, T0)).objects
    await _queue(first).retry_later(late, "503", T0 + 50.0)
    first.close()  # "inflight" is left flushing, as a crash would leave it

    journal = Journal(path, fsync=False)
    journal.open()
    try:
        again = _policy(depth=0)
        order = await again.attach(journal)
        assert order.backlog() == {(BUCKET, ""): (4, 12)}
        assert _keys(await _claim(journal, again, T0)) == ["inflight"]
        assert order.next_due_s() == pytest.approx(T0 + 50.0)
        assert _keys(await _claim(journal, again, T0 + 50.0)) == ["late"]
        assert await _queue(journal).retry_failed() == 1
        [bad] = (await _claim(journal, again, T0 + 51.0)).objects
        assert bad.meta.key == "p/bad"
        await _queue(journal).mark_durable(bad)
        assert _keys(await _claim(journal, again, T0 + 51.0)) == ["p/.metadata"]
    finally:
        journal.close()


async def test_lane_backlog_counts_unflushed_rows(journal: Journal) -> None:
    rig = _policy(depth=1)
    order = await rig.attach(journal)
    await _put(journal, "a/1")
    await _put(journal, "a/2")
    await _put(journal, "b/1")
    [a1, a2, b1] = (await _claim(journal, rig, T0)).objects
    assert order.backlog() == {(BUCKET, "a/"): (2, 6), (BUCKET, "b/"): (1, 3)}
    await _queue(journal).mark_failed(a2, "AccessDenied")  # failed is still unflushed
    await _queue(journal).mark_durable(a1)
    await _queue(journal).mark_durable(b1)
    assert order.backlog() == {(BUCKET, "a/"): (1, 3)}


# -- patterns -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "parent"),
    [
        ("ckpt/step_1/.metadata", "ckpt/step_1/"),
        ("_SUCCESS", ""),
        ("a/b/", "a/b/"),
        ("/x", "/"),
        ("é/ü/.metadata", "é/ü/"),
    ],
)
def test_parent_prefix(key: str, parent: str) -> None:
    assert parent_prefix(key) == parent


@pytest.mark.parametrize(
    ("key", "temp", "marker"),
    [
        ("x.tmp", True, False),
        ("dir/x.tmp", True, False),
        ("dir.tmp/x", False, False),
        ("x.TMP", False, False),  # case-sensitive
        (".tmp", True, False),
        ("x.tmp.bak", False, False),
        ("p/.metadata", False, True),
        ("p/.metadata.tmp", True, False),
        ("p/x.metadata", False, False),
        (".metadata", False, True),
        ("run/_SUCCESS", False, True),
        ("run/_success", False, False),
        ("_SUCCESS/x", False, False),
    ],
)
def test_temp_and_marker_patterns(key: str, temp: bool, marker: bool) -> None:
    rig = _policy()
    assert rig.is_temp(key) is temp
    assert rig.is_marker(key) is marker


def test_patterns_are_globs() -> None:
    rig = _policy(temp=("*.tmp*", "~$*"), markers=("*.commit",))
    assert rig.is_temp("a/x.tmp123")
    assert rig.is_temp("a/~$doc")
    assert not rig.is_temp("a/x.tm")
    assert rig.is_marker("a/step.commit")
    assert not rig.is_marker("a/step.commit/x")


# -- prefix_end -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "end"),
    [
        ("abc", "abd"),
        ("a/", "a0"),
        ("é/", "é0"),
        ("é", "ê"),
        ("a\U0010ffff", "b"),
        ("a\U0010ffff\U0010ffff", "b"),
        ("\U0010ffff", "\U0010ffff\U0010ffff"),
        ("", "\U0010ffff"),
        ("\ud7ff", "\ue000"),  # U+D800..U+DFFF are surrogates: skipped
        ("a\ud7ff", "a\ue000"),
        ("\ud7fe", "\ud7ff"),
        ("\ue000", "\ue001"),
        ("\uffff", "\U00010000"),
    ],
)
def test_prefix_end(prefix: str, end: str) -> None:
    assert prefix_end(prefix) == end


def test_prefix_end_is_always_encodable() -> None:
    for prefix in ("\ud7ff", "x\ud7ff", "\U0010ffff", "", "a\U0010ffff"):
        prefix_end(prefix).encode("utf-8")


_KEY_CHARS = st.characters(codec="utf-8", min_codepoint=0x2E, max_codepoint=0x10FFFF)
_EDGE_CHARS = st.sampled_from(["/", "0", "a", "\ud7ff", "\ue000", "\uffff", "\U0010ffff"])
_KEYS = st.text(st.one_of(_KEY_CHARS, _EDGE_CHARS), max_size=6)


@given(prefix=_KEYS, key=_KEYS)
def test_prefix_end_bounds_exactly_the_keys_with_the_prefix(prefix: str, key: str) -> None:
    assume(prefix.rstrip("\U0010ffff"))  # the documented absurd case is excluded
    assume(all(not 0xD800 <= ord(c) <= 0xDFFF for c in prefix + key))
    end = prefix_end(prefix)
    in_range = prefix.encode() <= key.encode() < end.encode()
    assert key.startswith(prefix) == in_range
    # SQLite compares TEXT with memcmp on UTF-8 (the BINARY collation): the same answer.
    conn = sqlite3.connect(":memory:")
    try:
        (sql_in_range,) = conn.execute(
            "SELECT ? >= ? AND ? < ?", (key, prefix, key, end)
        ).fetchone()
    finally:
        conn.close()
    assert bool(sql_in_range) == in_range
