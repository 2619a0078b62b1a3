"""FlushPolicy / ClaimRound against a real Journal: what ``journal.claim`` hands out, and when.

Times are explicit wall-clock seconds (acked_s and the claim's now_s); nothing sleeps.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.flush.lanes import LaneConfig, Lanes
from gateway.flush.policy import FlushPolicy, PolicyConfig, parent_prefix
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.journal import Claimed, Journal, prefix_end

BUCKET = "b"
T0 = 1_000.0


@pytest.fixture
async def journal(tmp_path: Path) -> AsyncIterator[Journal]:
    j = Journal(tmp_path / "j.db", fsync=False)
    j.open()
    yield j
    j.close()


def _policy(
    *,
    delay_s: float = 0.0,
    hold_s: float = 10.0,
    temp: Sequence[str] = ("*.tmp",),
    markers: Sequence[str] = (".metadata", "_SUCCESS"),
    depth: int = 3,
    concurrency: int = 8,
) -> FlushPolicy:
    config = PolicyConfig(
        write_back_delay_s=delay_s, temp_patterns=temp, temp_hold_s=hold_s, commit_markers=markers
    )
    return FlushPolicy(config, Lanes(LaneConfig(depth=depth, concurrency=concurrency)))


async def _put(
    journal: Journal, key: str, acked_s: float = T0, bucket: str = BUCKET
) -> LocalObject:
    meta = ObjectMeta(bucket=bucket, key=key, size_bytes=3, etag="e", last_modified_s=acked_s)
    row, _ = await journal.commit_put(meta, f"blob-{key}", acked_s)
    return row


async def _delete(journal: Journal, key: str, acked_s: float = T0) -> LocalObject:
    row, _ = await journal.commit_delete(BUCKET, key, acked_s)
    return row


async def _claim(journal: Journal, policy: FlushPolicy, now_s: float, limit: int = 100) -> Claimed:
    return await journal.claim(limit, now_s, policy.round(now_s))


def _keys(claimed: Claimed) -> list[str]:
    return [o.meta.key for o in claimed.objects]


# -- write-back delay -----------------------------------------------------------------------


async def test_write_back_delay_holds_young_rows_and_reports_when(journal: Journal) -> None:
    policy = _policy(delay_s=0.5)
    await _put(journal, "k", T0)

    early = await _claim(journal, policy, T0 + 0.2)
    assert early.objects == []
    assert early.wake_s == pytest.approx(T0 + 0.5)
    # Not recorded as a hold: STOP re-evaluates at every claim.
    assert await journal.next_retry_s() is None

    ready = await _claim(journal, policy, T0 + 0.5)
    assert _keys(ready) == ["k"]
    assert ready.wake_s is None


async def test_write_back_delay_first_young_row_ends_the_round(journal: Journal) -> None:
    policy = _policy(delay_s=0.5)
    await _put(journal, "old", T0)
    await _put(journal, "young", T0 + 0.4)
    await _put(journal, "younger", T0 + 0.45)

    claimed = await _claim(journal, policy, T0 + 0.6)
    assert _keys(claimed) == ["old"]
    assert claimed.wake_s == pytest.approx(T0 + 0.9)


async def test_write_back_delay_coalesces_an_overwrite(journal: Journal) -> None:
    policy = _policy(delay_s=0.5)
    await _put(journal, "k", T0)
    assert (await _claim(journal, policy, T0 + 0.3)).objects == []
    second = await _put(journal, "k", T0 + 0.3)  # overwritten before it was eligible
    assert (await _claim(journal, policy, T0 + 0.6)).objects == []
    claimed = await _claim(journal, policy, T0 + 0.8)
    assert [o.seq for o in claimed.objects] == [second.seq]


async def test_write_back_delay_zero_claims_at_once(journal: Journal) -> None:
    policy = _policy(delay_s=0.0)
    await _put(journal, "k", T0 + 100.0)  # even a row acked "later" than now
    claimed = await _claim(journal, policy, T0)
    assert _keys(claimed) == ["k"]


# -- temp names -----------------------------------------------------------------------------


async def test_temp_key_is_held_and_the_hold_is_recorded(journal: Journal) -> None:
    policy = _policy(hold_s=10.0)
    await _put(journal, "p/x.tmp", T0)
    await _put(journal, "p/y", T0)

    first = await _claim(journal, policy, T0 + 1.0)
    assert _keys(first) == ["p/y"]  # a hold does not stop later rows
    assert first.wake_s == pytest.approx(T0 + 10.0)
    assert await journal.next_retry_s() == pytest.approx(T0 + 10.0)  # not_before recorded
    row = await journal.get(BUCKET, "p/x.tmp")
    assert row is not None and row.state is FlushState.PENDING

    # Recorded: not even offered before then (so no wake-up is reported either).
    again = await _claim(journal, policy, T0 + 5.0)
    assert (again.objects, again.wake_s) == ([], None)

    late = await _claim(journal, policy, T0 + 10.0)
    assert _keys(late) == ["p/x.tmp"]


async def test_temp_hold_and_write_back_delay_wake_at_the_earlier(journal: Journal) -> None:
    policy = _policy(delay_s=0.5, hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    await _put(journal, "y", T0 + 0.4)
    claimed = await _claim(journal, policy, T0 + 0.6)
    assert claimed.objects == []
    assert claimed.wake_s == pytest.approx(T0 + 0.9)


async def test_temp_key_younger_than_write_back_delay_is_not_held(journal: Journal) -> None:
    # The delay's STOP comes first: nothing is recorded for a row not yet eligible.
    policy = _policy(delay_s=0.5, hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    claimed = await _claim(journal, policy, T0 + 0.1)
    assert claimed.wake_s == pytest.approx(T0 + 0.5)
    assert await journal.next_retry_s() is None


async def test_delete_of_a_temp_key_is_not_held(journal: Journal) -> None:
    policy = _policy(hold_s=10.0)
    await _delete(journal, "p/x.tmp", T0)
    claimed = await _claim(journal, policy, T0)
    assert _keys(claimed) == ["p/x.tmp"]
    assert claimed.objects[0].is_delete


async def test_delete_of_a_held_temp_key_replaces_the_hold(journal: Journal) -> None:
    policy = _policy(hold_s=10.0)
    await _put(journal, "x.tmp", T0)
    assert (await _claim(journal, policy, T0 + 1.0)).objects == []
    tomb = await _delete(journal, "x.tmp", T0 + 2.0)  # the rename's delete
    claimed = await _claim(journal, policy, T0 + 2.0)
    assert [(o.seq, o.is_delete) for o in claimed.objects] == [(tomb.seq, True)]
    assert await journal.next_retry_s() is None


async def test_temp_patterns_match_the_name_only(journal: Journal) -> None:
    policy = _policy(temp=("*.tmp", ".~*"))
    for key in ("d.tmp/file", "a/.~lock", "a/b.tmp", "a/B.TMP"):
        await _put(journal, key, T0)
    claimed = await _claim(journal, policy, T0 + 1.0)
    assert _keys(claimed) == ["d.tmp/file", "a/B.TMP"]


# -- commit markers -------------------------------------------------------------------------


async def test_marker_waits_for_an_earlier_row_in_flight(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")

    first = await _claim(journal, policy, T0)
    assert _keys(first) == ["p/shard-0"]  # flushing now
    assert first.wake_s is None  # a SKIP: woken by the shard's outcome, not by time
    assert (await _claim(journal, policy, T0)).objects == []

    assert await journal.mark_durable(first.objects[0])
    assert _keys(await _claim(journal, policy, T0)) == ["p/.metadata"]


async def test_marker_waits_for_an_earlier_pending_row(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")
    [shard] = (await _claim(journal, policy, T0, limit=1)).objects
    await journal.retry_later(shard, "503", T0 + 30.0)  # pending, backed off: not offered

    assert (await _claim(journal, policy, T0 + 1.0)).objects == []
    assert _keys(await _claim(journal, policy, T0 + 30.0)) == ["p/shard-0"]


async def test_marker_waits_for_an_earlier_failed_row(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/shard-0")
    await _put(journal, "p/.metadata")
    [shard] = (await _claim(journal, policy, T0)).objects
    await journal.mark_failed(shard, "AccessDenied")

    for _ in range(2):
        assert (await _claim(journal, policy, T0 + 5.0)).objects == []

    assert await journal.retry_failed() == 1
    [retried] = (await _claim(journal, policy, T0 + 6.0)).objects
    assert retried.meta.key == "p/shard-0"
    await journal.mark_durable(retried)
    assert _keys(await _claim(journal, policy, T0 + 6.0)) == ["p/.metadata"]


async def test_marker_waits_for_an_earlier_tombstone(journal: Journal) -> None:
    policy = _policy()
    await _delete(journal, "p/stale-shard")
    await _put(journal, "p/_SUCCESS")
    first = await _claim(journal, policy, T0)
    assert _keys(first) == ["p/stale-shard"]
    await journal.mark_durable(first.objects[0])  # the tombstone row is dropped
    assert _keys(await _claim(journal, policy, T0)) == ["p/_SUCCESS"]


async def test_marker_waits_for_rows_in_sub_prefixes(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/rank_0/shard")
    await _put(journal, "p/.metadata")
    first = await _claim(journal, policy, T0)
    assert _keys(first) == ["p/rank_0/shard"]
    await journal.mark_durable(first.objects[0])
    assert _keys(await _claim(journal, policy, T0)) == ["p/.metadata"]


async def test_marker_waits_for_a_held_temp_row(journal: Journal) -> None:
    policy = _policy(hold_s=10.0)
    await _put(journal, "p/shard.tmp", T0)
    await _put(journal, "p/.metadata", T0)
    claimed = await _claim(journal, policy, T0 + 1.0)
    assert claimed.objects == []
    assert claimed.wake_s == pytest.approx(T0 + 10.0)


async def test_marker_not_blocked_by_rows_acked_after_it(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/.metadata")
    await _put(journal, "p/shard-late")
    assert _keys(await _claim(journal, policy, T0)) == ["p/.metadata", "p/shard-late"]


async def test_marker_not_blocked_by_an_earlier_key_overwritten_after_it(
    journal: Journal,
) -> None:
    # Rows are versions: the shard's pending version is acked after the marker.
    policy = _policy()
    first = await _put(journal, "p/shard")
    [claimed] = (await _claim(journal, policy, T0)).objects
    await journal.mark_durable(claimed)
    await _put(journal, "p/.metadata")
    rewritten = await _put(journal, "p/shard")
    assert rewritten.seq > first.seq
    assert _keys(await _claim(journal, policy, T0)) == ["p/.metadata", "p/shard"]


async def test_marker_claimed_once_earlier_rows_are_durable(journal: Journal) -> None:
    policy = _policy()
    for i in range(3):
        await _put(journal, f"p/shard-{i}")
    await _put(journal, "p/.metadata")
    shards = (await _claim(journal, policy, T0)).objects
    assert sorted(o.meta.key for o in shards) == ["p/shard-0", "p/shard-1", "p/shard-2"]
    for shard in shards[:2]:
        await journal.mark_durable(shard)
        assert (await _claim(journal, policy, T0)).objects == []
    await journal.mark_durable(shards[2])
    assert _keys(await _claim(journal, policy, T0)) == ["p/.metadata"]


async def test_markers_in_other_prefixes_are_independent(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "p/shard")
    await _put(journal, "q/.metadata")
    await _put(journal, "p0/.metadata")  # "p0/" sorts right after the range of "p/"
    await _put(journal, "p./.metadata")  # "p./" sorts right before it
    await _put(journal, "p/.metadata")
    await _put(journal, ".metadata", bucket="other")  # another bucket's root marker
    claimed = await _claim(journal, policy, T0)
    assert sorted(_keys(claimed)) == [
        ".metadata",
        "p./.metadata",
        "p/shard",
        "p0/.metadata",
        "q/.metadata",
    ]


async def test_top_level_marker_waits_for_the_whole_bucket(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "deep/down/x")
    await _put(journal, "_SUCCESS")
    await _put(journal, "later")
    first = await _claim(journal, policy, T0)
    assert _keys(first) == ["deep/down/x", "later"]
    await journal.mark_durable(first.objects[0])
    assert _keys(await _claim(journal, policy, T0)) == ["_SUCCESS"]


async def test_marker_with_a_unicode_parent_prefix(journal: Journal) -> None:
    policy = _policy()
    await _put(journal, "é/shard")
    await _put(journal, "ê/shard")  # the next code point: outside "é/"
    await _put(journal, "é0")  # outside too
    await _put(journal, "é/.metadata")
    await _put(journal, "ê/.metadata")
    first = await _claim(journal, policy, T0)
    assert _keys(first) == ["é/shard", "ê/shard", "é0"]
    assert (await _claim(journal, policy, T0)).objects == []  # both markers wait
    await journal.mark_durable(first.objects[0])
    assert _keys(await _claim(journal, policy, T0)) == ["é/.metadata"]


async def test_marker_patterns_are_configurable(journal: Journal) -> None:
    policy = _policy(markers=("COMMIT",))
    await _put(journal, "p/shard")
    await _put(journal, "p/.metadata")  # not a marker under this config
    await _put(journal, "p/COMMIT")
    assert _keys(await _claim(journal, policy, T0)) == ["p/shard", "p/.metadata"]


# -- lanes ----------------------------------------------------------------------------------


async def test_lane_concurrency_caps_each_round(journal: Journal) -> None:
    policy = _policy(depth=1, concurrency=2)
    for i in range(5):
        await _put(journal, f"a/{i}")
    for i in range(3):
        await _put(journal, f"b/{i}")
    claimed = await _claim(journal, policy, T0)
    assert _keys(claimed) == ["a/0", "a/1", "b/0", "b/1"]
    assert claimed.wake_s is None


async def test_lane_in_flight_counts_against_the_round(journal: Journal) -> None:
    policy = _policy(depth=1, concurrency=3)
    lane = policy.lanes.lane_for(BUCKET, "a/x", T0)
    lane.in_flight = 2
    for i in range(3):
        await _put(journal, f"a/{i}")
    await _put(journal, "b/0")
    assert _keys(await _claim(journal, policy, T0)) == ["a/0", "b/0"]
    lane.in_flight = 3
    assert (await _claim(journal, policy, T0)).objects == []
    # Skipped rows keep their place: oldest first once the lane has room.
    lane.in_flight = 1
    assert _keys(await _claim(journal, policy, T0)) == ["a/1", "a/2"]


async def test_lane_paused_by_retry_after_is_skipped(journal: Journal) -> None:
    policy = _policy(depth=1)
    policy.lanes.on_unsent_throttle(policy.lanes.lane_for(BUCKET, "hot/x", T0), T0, 30.0)
    await _put(journal, "hot/1")
    await _put(journal, "cold/1")
    claimed = await _claim(journal, policy, T0 + 1.0)
    assert _keys(claimed) == ["cold/1"]
    assert await journal.next_retry_s() is None  # a skip records nothing
    assert _keys(await _claim(journal, policy, T0 + 30.0)) == ["hot/1"]


async def test_lanes_are_per_bucket(journal: Journal) -> None:
    policy = _policy(depth=1, concurrency=1)
    await _put(journal, "a/1")
    await _put(journal, "a/2")
    await _put(journal, "a/1", bucket="other")
    claimed = await _claim(journal, policy, T0)
    assert [(o.meta.bucket, o.meta.key) for o in claimed.objects] == [
        (BUCKET, "a/1"),
        ("other", "a/1"),
    ]


async def test_claim_limit_is_honoured(journal: Journal) -> None:
    policy = _policy(depth=0, concurrency=100)
    for i in range(10):
        await _put(journal, f"k{i}")
    assert _keys(await _claim(journal, policy, T0, limit=3)) == ["k0", "k1", "k2"]
    assert _keys(await _claim(journal, policy, T0, limit=3)) == ["k3", "k4", "k5"]


async def test_round_tally_is_per_claim(journal: Journal) -> None:
    policy = _policy(depth=1, concurrency=1)
    await _put(journal, "a/1")
    await _put(journal, "a/2")
    round_ = policy.round(T0)
    assert _keys(await journal.claim(10, T0, round_)) == ["a/1"]
    # The same round counts what it admitted; a new round starts from zero.
    assert (await journal.claim(10, T0, round_)).objects == []
    assert _keys(await journal.claim(10, T0, policy.round(T0))) == ["a/2"]


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
    policy = _policy()
    assert policy.is_temp(key) is temp
    assert policy.is_marker(key) is marker


def test_patterns_are_globs() -> None:
    policy = _policy(temp=("*.tmp*", "~$*"), markers=("*.commit",))
    assert policy.is_temp("a/x.tmp123")
    assert policy.is_temp("a/~$doc")
    assert not policy.is_temp("a/x.tm")
    assert policy.is_marker("a/step.commit")
    assert not policy.is_marker("a/step.commit/x")


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
