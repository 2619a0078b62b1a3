"""Journal: versions, tombstones, the flush queue's outcomes, recovery after a crash, drain
figures and fences kept from the changes."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest
from fakes import claim_pending

from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.engine import SEQ_BLOCK
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue


async def claim(journal: Journal, limit: int, now_s: float) -> list[LocalObject]:
    return await claim_pending(journal, limit, now_s)


def meta(key: str, size: int = 10, etag: str = "e") -> ObjectMeta:
    return ObjectMeta(
        bucket="b",
        key=key,
        size_bytes=size,
        etag=etag,
        last_modified_s=1.0,
        user_metadata={"m": "v"},
        checksums={"crc32": "AAAAAA=="},
    )


@pytest.fixture
def queue(journal: Journal) -> FlushQueue:
    return FlushQueue(journal)


async def test_journal_put_supersedes_and_returns_old_blob(journal: Journal) -> None:
    first, old = await journal.commit_put(meta("k"), "blob1", 1.0)
    assert old == []
    second, old = await journal.commit_put(meta("k", etag="f"), "blob2", 2.0)
    assert old == ["blob1"]
    assert second.seq > first.seq
    row = await journal.get("b", "k")
    assert row is not None and row.blob_id == "blob2" and row.meta.etag == "f"
    assert row.meta.user_metadata == {"m": "v"} and row.meta.checksums == {"crc32": "AAAAAA=="}


async def test_journal_outcome_ignored_for_superseded_version(
    journal: Journal, queue: FlushQueue
) -> None:
    await journal.commit_put(meta("k"), "blob1", 1.0)
    [claimed] = await claim(journal, 10, 10.0)
    await journal.commit_put(meta("k", etag="new"), "blob2", 2.0)
    assert await queue.mark_durable(claimed) is False
    row = await journal.get("b", "k")
    assert row is not None and row.state is FlushState.PENDING and row.meta.etag == "new"


async def test_journal_tombstone_removed_when_durable(journal: Journal, queue: FlushQueue) -> None:
    await journal.commit_put(meta("k"), "blob1", 1.0)
    _, old = await journal.commit_delete("b", "k", 2.0)
    assert old == ["blob1"]
    [claimed] = await claim(journal, 10, 10.0)
    assert claimed.is_delete
    assert await queue.mark_durable(claimed)
    assert await journal.get("b", "k") is None


async def test_journal_claim_order_and_backoff(journal: Journal, queue: FlushQueue) -> None:
    for name in ("z", "a", "m"):
        await journal.commit_put(meta(name), f"blob-{name}", 1.0)
    claimed = await claim(journal, 2, 10.0)
    assert [c.meta.key for c in claimed] == ["z", "a"]  # acknowledgement order, not key order
    await queue.retry_later(claimed[0], "SlowDown", not_before_s=100.0)
    later = await claim(journal, 10, 50.0)
    assert [c.meta.key for c in later] == ["m"]
    again = await claim(journal, 10, 150.0)
    assert [(c.meta.key, c.attempts) for c in again] == [("z", 1)]


async def test_journal_failed_kept_until_retry(journal: Journal, queue: FlushQueue) -> None:
    await journal.commit_put(meta("k"), "blob1", 1.0)
    [claimed] = await claim(journal, 10, 10.0)
    await queue.mark_failed(claimed, "AccessDenied")
    assert await claim(journal, 10, 10.0) == []
    [failed] = await queue.failed()
    assert failed.state is FlushState.FAILED and failed.last_error == "AccessDenied"
    assert await queue.retry_failed() == 1
    assert [c.meta.key for c in await claim(journal, 10, 10.0)] == ["k"]


async def test_journal_shutdown_wait_skips_failed_rows(journal: Journal, queue: FlushQueue) -> None:
    """A failed row waits for an operator: a drain fence counts it, but a waiter with a
    deadline that skips failed rows (shutdown) returns at once instead of at its timeout."""
    await journal.commit_put(meta("bad", size=7), "blob1", 1.0)
    [claimed] = await claim(journal, 10, 10.0)
    await queue.mark_failed(claimed, "AccessDenied")
    await journal.commit_put(meta("ok", size=5), "blob2", 2.0)
    fence = journal.last_seq
    assert await journal.unflushed(None, "", fence) == (2, 12)
    assert await journal.unflushed(None, "", fence, skip_failed=True) == (1, 5)
    [ok] = await claim(journal, 10, 10.0)
    await queue.mark_durable(ok)
    assert await journal.wait_flushed(None, "", fence, 60.0, skip_failed=True) == (0, 0)
    assert await journal.wait_flushed(None, "", fence, 0.0) == (1, 7)


async def test_journal_recover_moves_flushing_back_to_pending(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    j = Journal(path, fsync=True)
    j.open()
    await j.commit_put(meta("k"), "blob1", 1.0)
    await j.commit_put(meta("gone"), "blob2", 1.0)
    await j.commit_delete("b", "gone", 2.0)
    await claim(j, 10, 10.0)
    j.close()
    reopened = Journal(path, fsync=True)
    referenced = reopened.open()
    try:
        assert referenced == {"blob1"}
        row = await reopened.get("b", "k")
        assert row is not None and row.state is FlushState.PENDING
        tomb = await reopened.get("b", "gone")
        assert tomb is not None and tomb.is_delete and tomb.state is FlushState.PENDING
        # Sequence numbers keep increasing across restarts.
        new, _ = await reopened.commit_put(meta("k2"), "blob3", 3.0)
        assert new.seq > row.seq
    finally:
        reopened.close()


async def test_journal_drain_figures_respect_fence_and_prefix(journal: Journal) -> None:
    await journal.commit_put(meta("ckpt/1/a", size=5), "b1", 1.0)
    await journal.commit_put(meta("ckpt/1/b", size=7), "b2", 1.0)
    await journal.commit_put(meta("other/x", size=11), "b3", 1.0)
    fence = journal.last_seq
    await journal.commit_put(meta("ckpt/1/c", size=13), "b4", 1.0)
    assert await journal.unflushed("b", "ckpt/1/", fence) == (2, 12)
    assert await journal.unflushed(None, "", fence) == (3, 23)
    assert await journal.unflushed("other-bucket", "", fence) == (0, 0)
    stats = await journal.stats()
    assert stats.backlog.pending_objects == 4 and stats.backlog.pending_bytes == 36


async def test_journal_fence_covers_a_key_overwritten_after_it(
    journal: Journal, queue: FlushQueue
) -> None:
    await journal.commit_put(meta("ckpt/p/k", size=5), "b1", 1.0)
    fence = journal.last_seq
    await journal.commit_put(meta("ckpt/p/k", size=9), "b2", 2.0)  # pending v1 superseded
    await journal.commit_delete("b", "ckpt/p/k", 3.0)  # and again, by a tombstone
    assert await journal.unflushed("b", "ckpt/p/", fence) == (1, 0)
    [tomb] = await claim(journal, 10, 10.0)
    assert await queue.mark_durable(tomb)
    assert await journal.unflushed("b", "ckpt/p/", fence) == (0, 0)


async def test_journal_fence_restarts_after_the_key_was_durable(
    journal: Journal, queue: FlushQueue
) -> None:
    await journal.commit_put(meta("k", size=5), "b1", 1.0)
    [v1] = await claim(journal, 10, 10.0)
    assert await queue.mark_durable(v1)
    fence = journal.last_seq
    await journal.commit_put(meta("k", size=9), "b2", 2.0)  # v1 was durable: not fenced
    assert await journal.unflushed("b", "", fence) == (0, 0)
    assert await journal.unflushed("b", "", journal.last_seq) == (1, 9)


async def test_journal_fence_carried_over_a_flushing_version(
    journal: Journal, queue: FlushQueue
) -> None:
    await journal.commit_put(meta("k", size=5), "b1", 1.0)
    fence = journal.last_seq
    [v1] = await claim(journal, 10, 10.0)
    await journal.commit_put(meta("k", size=9), "b2", 2.0)  # supersedes an in-flight upload
    assert await queue.mark_durable(v1) is False
    assert await journal.unflushed("b", "", fence) == (1, 9)


async def test_journal_fence_column_added_to_an_old_journal(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = Journal(path, fsync=False)
    old.open()
    await old.commit_put(meta("k", size=5), "b1", 1.0)
    old.close()
    conn = sqlite3.connect(path)  # as a journal written before fence_seq existed
    conn.execute("ALTER TABLE objects DROP COLUMN fence_seq")
    conn.commit()
    conn.close()
    reopened = Journal(path, fsync=False)
    reopened.open()
    try:
        fence = reopened.last_seq
        assert await reopened.unflushed("b", "", fence) == (1, 5)
        await reopened.commit_put(meta("k", size=9), "b2", 2.0)
        assert await reopened.unflushed("b", "", fence) == (1, 9)
    finally:
        reopened.close()


async def test_journal_scan_is_sorted_by_utf8_bytes(journal: Journal) -> None:
    keys = ["b", "a/\u00e9", "a/z", "a/\U0001f600", "a/", "a"]
    for k in keys:
        await journal.commit_put(meta(k), "x", 1.0)
    rows = await journal.scan("b", "a/", "", 100)
    assert [r.meta.key for r in rows] == sorted(
        [k for k in keys if k.startswith("a/")], key=lambda s: s.encode()
    )
    rows = await journal.scan("b", "a/", "a/z", 100)
    assert [r.meta.key for r in rows] == ["a/\u00e9", "a/\U0001f600"]


async def test_a_replica_holder_keeps_versions_a_pending_row_superseded(
    journal: Journal, queue: FlushQueue
) -> None:
    """``unflushed_seqs`` (a holder's "which of these do you still need?"): a pending row,
    and the versions it superseded while they were pending too (the newer row may never
    have been acknowledged: its replica failed); not a version durable before the next
    was written, nor anything once the newest is durable."""
    v1, _ = await journal.commit_put(meta("k"), "b1", 1.0)
    v2, _ = await journal.commit_put(meta("k", etag="2"), "b2", 2.0)  # supersedes v1 pending
    other, _ = await journal.commit_put(meta("other"), "b3", 3.0)
    assert await journal.unflushed_seqs([v1.seq, v2.seq, other.seq]) == {
        v1.seq,
        v2.seq,
        other.seq,
    }
    assert await queue.mark_durable(v2)
    v3, _ = await journal.commit_put(meta("k", etag="3"), "b4", 4.0)  # after a durable one
    assert await journal.unflushed_seqs([v1.seq, v2.seq, v3.seq]) == {v3.seq}
    assert await queue.mark_durable(v3)
    assert await journal.unflushed_seqs([v1.seq, v2.seq, v3.seq, other.seq]) == {other.seq}


async def test_unflushed_after_lists_every_row_not_durable_in_seq_order(
    journal: Journal, queue: FlushQueue
) -> None:
    """Re-replication's pass: pending, flushing and failed rows above a seq, in seq order,
    a page at a time; durable rows left out."""
    rows = [(await journal.commit_put(meta(f"k{i}"), f"b{i}", 1.0))[0] for i in range(6)]
    await queue.claim([rows[1].seq])
    await queue.mark_failed((await queue.claim([rows[3].seq]))[0], "refused")
    assert await queue.mark_durable((await queue.claim([rows[4].seq]))[0])
    page = await journal.unflushed_after(0, 3)
    assert [r.seq for r in page] == [rows[0].seq, rows[1].seq, rows[2].seq]
    assert [r.state.value for r in page] == ["pending", "flushing", "pending"]
    rest = await journal.unflushed_after(page[-1].seq, 3)
    assert [r.seq for r in rest] == [rows[3].seq, rows[5].seq]
    assert await journal.unflushed_after(rows[5].seq, 3) == []
    await journal.commit_put(meta("small", size=5), None, 1.0, body=b"small")
    [got] = await journal.unflushed_after(rows[5].seq, 3)
    assert got.body == b"small"  # what a new holder lacking it gets


async def test_unflushed_dirs_are_the_parents_of_rows_not_durable(
    journal: Journal, queue: FlushQueue
) -> None:
    """What a fleet node announces again after a restart: the parent directory of each
    unflushed version or delete, not of durable rows."""
    await journal.commit_put(meta("top"), "b0", 1.0)
    await journal.commit_put(meta("ck/1/a"), "b1", 1.0)
    await journal.commit_put(meta("ck/1/b"), "b2", 1.0)
    done, _ = await journal.commit_put(meta("ck/2/a"), "b3", 1.0)
    await journal.commit_delete("b", "gone/x", 1.0)
    assert await queue.mark_durable((await queue.claim([done.seq]))[0])
    assert await journal.unflushed_dirs() == {("b", ""), ("b", "ck/1/"), ("b", "gone/")}


async def test_a_seq_is_handed_out_as_the_commit_is_queued_in_commit_order(
    journal: Journal,
) -> None:
    """``on_seq`` names the version's seq before the commit is queued; commits land in the
    order their seqs were handed out, also for one key written twice at once."""
    named: list[int] = []
    first = asyncio.ensure_future(
        journal.commit_put(meta("k", etag="1"), "b1", 1.0, on_seq=named.append)
    )
    second = asyncio.ensure_future(
        journal.commit_put(meta("k", etag="2"), "b2", 2.0, on_seq=named.append)
    )
    (row1, _), (row2, _) = await asyncio.gather(first, second)
    assert named == [row1.seq, row2.seq] and row2.seq == row1.seq + 1
    current = await journal.get("b", "k")
    assert current is not None and current.meta.etag == "2" and current.seq == row2.seq
    assert journal.is_reserved(row2.seq)


async def test_a_restart_never_hands_out_a_seq_that_was_named_before_its_commit(
    tmp_path: Path,
) -> None:
    """A seq named to replica holders may never commit (a crash); the durable ceiling makes
    every later start hand out numbers above it, evicted rows or not."""
    path = tmp_path / "ceiling.db"
    j = Journal(path, fsync=False)
    j.open()
    named: list[int] = []
    await j.commit_put(meta("k"), "b1", 1.0, on_seq=named.append)
    # Numbers handed out, then a crash before their commits: the last one was named
    j._next_seq += 10
    assert j.is_reserved(j._next_seq - 1)
    lost = j._next_seq - 1
    j.close()
    j = Journal(path, fsync=False)
    j.open()
    try:
        row, _ = await j.commit_put(meta("k2"), "b2", 2.0)
        assert row.seq > lost and j.is_reserved(row.seq)
        assert not j.is_reserved(row.seq + SEQ_BLOCK)
        # The earlier run's rows may have a newer version on a holder only; this run's not,
        # unless a failed commit's withdrawal may have missed a holder.
        assert j.may_be_superseded_elsewhere("b", "k", named[0])
        assert not j.may_be_superseded_elsewhere("b", "k2", row.seq)
        j.mark_doubtful("b", "k2")
        assert j.may_be_superseded_elsewhere("b", "k2", row.seq)
    finally:
        j.close()


async def test_the_ceiling_is_raised_before_the_numbers_reach_it(journal: Journal) -> None:
    ceiling = journal._durable_ceiling
    journal._next_seq = ceiling - 3  # a long run of writes since the start
    rows = [(await journal.commit_put(meta(f"k{i}"), f"b{i}", 1.0))[0] for i in range(6)]
    assert journal._durable_ceiling >= ceiling + SEQ_BLOCK // 2
    assert all(journal.is_reserved(r.seq) for r in rows[3:])  # past the old ceiling
    with sqlite3.connect(journal.path) as conn:
        [(stored,)] = conn.execute("SELECT value FROM counters WHERE name = 'seq_ceiling'")
    assert stored == journal._durable_ceiling


async def test_a_version_on_its_way_is_still_needed_by_its_replica_holders(
    journal: Journal,
) -> None:
    """A holder may ask about a version committed on it early, while the writer's own
    commit is still on its way: the writer answers that it needs it; once that commit
    failed, not any more."""
    release = threading.Event()
    named: list[int] = []

    def slow_then_refuse(current: LocalObject | None) -> None:
        release.wait(10)  # the writer thread is inside the commit
        raise RuntimeError("refused inside the commit")

    commit = asyncio.ensure_future(
        journal.commit_put(meta("k"), "b1", 1.0, slow_then_refuse, on_seq=named.append)
    )
    await asyncio.sleep(0)
    [seq] = named
    assert await journal.unflushed_seqs([seq, seq + 5]) == {seq}
    release.set()
    with pytest.raises(RuntimeError):
        await commit
    assert await journal.unflushed_seqs([seq]) == set()
