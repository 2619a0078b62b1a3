"""CacheSpace: admission (503 SlowDown), LRU eviction of durable rows only, access times,
the accessed_s migration, the background-safe sweep, and the verify scrub."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes import claim_pending

from gateway.clock import Clock
from gateway.errors import SlowDown
from gateway.models import FlushState, ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.space import CacheSpace, current_grant
from gateway.store.uploads import Part, UploadJournal
from gateway.store.verify import verify_data_dir


class FakeClock(Clock):
    def __init__(self) -> None:
        self.now_s = 1000.0

    def monotonic(self) -> float:
        return self.now_s

    def wall(self) -> float:
        return self.now_s


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    yield data


class Env:
    def __init__(self, root: Path, capacity: int = 1000) -> None:
        self.root = root
        self.blobs = BlobStore(root, fsync=False)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        self.queue = FlushQueue(self.journal)
        self.clock = FakeClock()
        self.space = CacheSpace(
            self.journal,
            self.blobs,
            self.clock,
            capacity_bytes=capacity,
            high_fraction=0.9,
            low_fraction=0.5,
        )

    async def put(self, key: str, data: bytes, *, durable: bool = False) -> str:
        blob = await self.blobs.write(_chunks(data), {"md5"})
        meta = ObjectMeta(
            bucket="b",
            key=key,
            size_bytes=len(data),
            etag=hashlib.md5(data).hexdigest(),
            last_modified_s=self.clock.wall(),
        )
        self.clock.now_s += 1
        await self.journal.commit_put(meta, blob.blob_id, self.clock.wall())
        if durable:
            claimed = await claim_pending(self.journal, 100, 1e12)
            for obj in claimed:
                if obj.meta.key == key:
                    await self.queue.mark_durable(obj)
                else:
                    await self.queue.release([obj])
        return blob.blob_id

    def close(self) -> None:
        self.journal.close()
        self.blobs.close()


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Env]:
    e = Env(tmp_path)
    yield e
    e.close()


async def test_space_admits_until_unflushed_bytes_reach_capacity(env: Env) -> None:
    await env.put("pending", b"x" * 600)
    async with env.space.admit(400):
        pass
    with pytest.raises(SlowDown):
        async with env.space.admit(401):
            pass
    # A reservation in progress counts: two writes cannot both take the last bytes.
    async with env.space.admit(300):
        with pytest.raises(SlowDown):
            async with env.space.admit(200):
                pass


async def test_space_grows_a_reservation_as_an_unknown_length_is_written(env: Env) -> None:
    await env.space.refresh()
    async with env.space.admit(0) as grant:
        assert current_grant() is grant
        await grant.grow(600)
        await grant.grow(300)
        # What it wrote so far counts against other writes ...
        with pytest.raises(SlowDown):
            async with env.space.admit(101):
                pass
        # ... and a piece that does not fit is refused, reserving nothing.
        with pytest.raises(SlowDown):
            await grant.grow(101)
        assert grant.size_bytes == 900
    assert current_grant() is None
    async with env.space.admit(1000):  # released with the admission
        pass


async def test_space_durable_bytes_never_refuse_a_write(env: Env) -> None:
    await env.put("cached", b"c" * 900, durable=True)
    async with env.space.admit(1000) as grant:
        grant.commit(1000)


async def test_space_sees_a_flush_at_once(env: Env) -> None:
    await env.put("k", b"x" * 900)
    with pytest.raises(SlowDown):
        async with env.space.admit(900):
            pass
    [obj] = await claim_pending(env.journal, 10, 1e12)
    await env.queue.mark_durable(obj)  # the figures follow the change: no query, no lag
    async with env.space.admit(900):
        pass


async def test_space_figures_survive_a_restart(env: Env) -> None:
    await env.put("cached", b"c" * 300, durable=True)
    await env.put("pending", b"p" * 200)
    before = await env.space.refresh()
    env.journal.close()
    env.journal = Journal(env.root / "journal.db", fsync=False)
    env.journal.open()  # loaded by one pass over the rows
    assert env.journal.figures.space() == before
    stats = await env.journal.stats()
    assert (stats.flushed_objects, stats.flushed_bytes) == (1, 300)
    assert stats.backlog.pending_objects == 1 and stats.backlog.pending_bytes == 200


async def test_space_evicts_lru_durable_rows_down_to_low_watermark(env: Env) -> None:
    blobs = {k: await env.put(k, k.encode() * 200, durable=True) for k in ("a", "b", "c", "d")}
    pending = await env.put("p", b"p" * 150)
    env.space.touch("b", "a")  # read most recently: survives
    freed = await env.space.evict_if_needed()  # used 950 > 900: down to <= 500
    assert freed == 600
    assert await env.journal.get("b", "a") is not None
    for key in ("b", "c", "d"):
        assert await env.journal.get("b", key) is None
        assert not env.blobs.path(blobs[key]).exists()
    row = await env.journal.get("b", "p")
    assert row is not None and row.state is FlushState.PENDING
    assert env.blobs.path(pending).exists()
    assert env.space.evicted_objects == 3 and env.space.evicted_bytes == 600


async def test_space_never_evicts_unflushed_or_upload_parts(env: Env) -> None:
    await env.put("p1", b"1" * 500)
    await env.put("p2", b"2" * 300)
    uploads = UploadJournal(env.journal)
    part_blob = await env.blobs.write(_chunks(b"z" * 150), {"md5"})
    upload_id = "u1"
    await env.journal.run_write(
        lambda c: c.execute(
            "INSERT INTO uploads VALUES (?, 'b', 'mp', 1.0, '', '{}', '{}', NULL, NULL)",
            (upload_id,),
        )
    )
    await uploads.put_part(upload_id, Part(1, part_blob.blob_id, 150, "e", {}, 1.0))
    figures = await env.space.refresh()
    assert figures.used_bytes == 950 and figures.parts_bytes == 150
    assert env.space.estimated_used_bytes() == 950
    assert await env.space.evict_if_needed() == 0
    assert env.blobs.path(part_blob.blob_id).exists()
    assert (await env.journal.stats()).cached_bytes == 950


async def test_space_eviction_skips_row_overwritten_meanwhile(env: Env) -> None:
    await env.put("k", b"k" * 950, durable=True)
    from gateway.store.space import _delete_rows, _lru_durable

    victims = await env.journal.run_read(lambda c: _lru_durable(c, 950))
    await env.put("k", b"n" * 10)  # a newer pending version replaces the durable one
    removed = await env.journal.run_write(lambda c: _delete_rows(env.journal, c, victims))
    assert removed == []
    row = await env.journal.get("b", "k")
    assert row is not None and row.state is FlushState.PENDING


async def test_space_access_times_written_back_in_batch(env: Env) -> None:
    await env.put("k", b"k", durable=True)
    env.space.touch("b", "k")
    await env.space.write_back_access()
    got = await env.journal.run_read(
        lambda c: c.execute("SELECT accessed_s FROM objects WHERE key = 'k'").fetchone()[0]
    )
    assert got == env.clock.wall()


def test_journal_migration_adds_accessed_s_to_old_journal(tmp_path: Path) -> None:
    db = tmp_path / "journal.db"
    conn = sqlite3.connect(db)
    schema = (Path(__file__).parents[3] / "gateway/store/schema.sql").read_text()
    conn.executescript(schema)
    conn.execute(
        "INSERT INTO objects (bucket, key, seq, state, size_bytes, etag, last_modified_s, "
        "content_type, user_metadata, headers, checksums, acked_s) "
        "VALUES ('b', 'old', 1, 'durable', 1, 'e', 1, '', '{}', '{}', '{}', 1)"
    )
    conn.commit()
    conn.close()
    for _ in range(2):  # idempotent
        journal = Journal(db, fsync=False)
        journal.open()
        journal.close()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT key, accessed_s FROM objects").fetchall() == [("old", None)]
    conn.close()


async def test_sweep_spares_files_changed_after_the_mark(env: Env) -> None:
    old = await env.blobs.write(_chunks(b"old"), {"md5"})
    before_ns = env.blobs.path(old.blob_id).stat().st_ctime_ns + 1
    new = await env.blobs.write(_chunks(b"new"), {"md5"})
    new_path = env.blobs.path(new.blob_id)
    while new_path.stat().st_ctime_ns < before_ns:  # same clock tick: touch until later
        os.utime(new_path)
    assert env.blobs.sweep(set(), before_ns) == 1
    assert not env.blobs.path(old.blob_id).exists()
    assert new_path.exists()
    assert env.blobs.sweep(set()) == 1  # without a mark everything unreferenced goes
    assert not new_path.exists()


async def test_verify_reports_corrupt_and_missing_bodies(env: Env) -> None:
    good = await env.put("good", b"good body")
    bad = await env.put("bad", b"bad body!", durable=True)
    gone = await env.put("gone", b"gone body")
    report = verify_data_dir(env.root)
    assert report.problems == [] and report.checked_files == 3
    env.blobs.path(bad).write_bytes(b"bad bodY!")
    env.blobs.path(gone).unlink()
    report = verify_data_dir(env.root)
    assert sorted((p.where, p.state) for p in report.problems) == [
        ("b/bad", "durable"),
        ("b/gone", "pending"),
    ]
    assert env.blobs.path(good).exists()


async def test_journal_full_is_slowdown_and_recovers(env: Env) -> None:
    """SQLITE_FULL (here: a page cap) refuses the commit as 503 SlowDown; nothing of it is
    visible, earlier rows are intact, and commits work again once there is room."""
    await env.put("before", b"b" * 10)
    pages = await env.journal.run_read(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
    await env.journal.run_write(lambda c: c.execute(f"PRAGMA max_page_count = {pages}"))
    big_meta = ObjectMeta(
        bucket="b",
        key="big",
        size_bytes=1,
        etag="e",
        last_modified_s=1.0,
        user_metadata={"pad": "x" * 100_000},  # needs pages the cap refuses
    )
    with pytest.raises(SlowDown):
        await env.journal.commit_put(big_meta, "blob-big", 2.0)
    assert await env.journal.get("b", "big") is None
    row = await env.journal.get("b", "before")
    assert row is not None and row.state is FlushState.PENDING
    await env.journal.run_write(lambda c: c.execute("PRAGMA max_page_count = 1000000"))
    await env.journal.commit_put(big_meta, "blob-big", 3.0)
    row = await env.journal.get("b", "big")
    assert row is not None and row.meta.user_metadata["pad"] == "x" * 100_000


async def test_space_fill_reservations_count_against_the_high_watermark(env: Env) -> None:
    await env.put("pending", b"p" * 300)  # unflushed: pinned
    await env.space.refresh()
    assert env.space.reserve_fill(500)  # 300 + 500 <= 900 (high watermark)
    assert not env.space.reserve_fill(200)  # 300 + 500 + 200 > 900
    assert env.space.filling_bytes == 500
    assert env.space.estimated_used_bytes() == 800
    env.space.release_fill(500, is_kept=False)
    assert env.space.filling_bytes == 0 and env.space.reserve_fill(600)
    # Kept: the copy's row is in the journal's figures from its commit, not counted here.
    env.space.release_fill(600, is_kept=True)
    assert env.space.filling_bytes == 0 and env.space.estimated_used_bytes() == 300


async def test_space_evicts_durable_rows_for_copies_being_written(env: Env) -> None:
    await env.put("old", b"o" * 400, durable=True)
    await env.put("pending", b"p" * 300)
    await env.space.refresh()
    assert env.space.reserve_fill(250)  # pinned 300 + 250 fits; used would be 950
    assert await env.space.evict_if_needed() == 400  # the durable row goes, never "pending"
    assert await env.journal.get("b", "old") is None
    assert await env.journal.get("b", "pending") is not None
