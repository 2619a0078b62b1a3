"""The data dir's record of its upstream (store/origin.py): read without changing anything,
and renewed in one transaction that forgets the old upstream's copies and never an
unflushed row or an upload in progress."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from fakes import claim_pending

from gateway.models import BucketInfo, FlushState, ObjectMeta
from gateway.store import origin
from gateway.store.buckets import BucketRecords
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.records import UpstreamUploadRecords
from gateway.store.uploads import Part, Upload, UploadJournal


def meta(bucket: str, key: str, size: int) -> ObjectMeta:
    return ObjectMeta(bucket=bucket, key=key, size_bytes=size, etag="e", last_modified_s=1.0)


async def _fill(data_dir: Path) -> None:
    """One durable copy (b/cached), two unflushed rows (b/pending, c/failed), an upload in
    progress in bucket u with one part, a known bucket and an upstream upload record."""
    journal = Journal(data_dir / origin.JOURNAL_NAME, fsync=False)
    journal.open()
    try:
        await journal.commit_put(meta("b", "cached", 100), "blob-cached", 1.0)
        [claimed] = await claim_pending(journal, 10, 10.0)
        assert await FlushQueue(journal).mark_durable(claimed)
        await journal.commit_put(meta("b", "pending", 20), "blob-pending", 2.0)
        await journal.commit_put(meta("c", "failed", 3), "blob-failed", 3.0)
        [failing] = [r for r in await claim_pending(journal, 10, 10.0) if r.meta.key == "failed"]
        await FlushQueue(journal).mark_failed(failing, "AccessDenied")
        uploads = UploadJournal(journal)
        await uploads.create(Upload("up-1", "u", "big", 4.0, "binary/octet-stream", {}, {}))
        await uploads.put_part("up-1", Part(1, "blob-part", 7, "pe", {}, 4.0))
        await BucketRecords(journal).remember_bucket(BucketInfo("b", 1.0))
        await UpstreamUploadRecords(journal).record_upstream_upload("x", "b", "k", 1.0)
    finally:
        journal.close()


def test_no_journal_is_nothing(tmp_path: Path) -> None:
    assert origin.inspect(tmp_path) == origin.NOTHING
    assert origin.NOTHING.is_empty and not origin.NOTHING.has_unflushed


async def test_inspect_reads_without_changing_the_journal(tmp_path: Path) -> None:
    await _fill(tmp_path)
    # The database and its WAL (the -shm file is SQLite's scratch index: readers mark it).
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".db-shm"}
    found = origin.inspect(tmp_path, with_buckets=True)
    assert found == origin.Contents(
        upstream=None,  # none recorded yet
        unflushed_objects=2,
        unflushed_bytes=23,
        uploads=1,
        upload_bytes=7,
        has_cached=True,
        buckets=("b", "c", "u"),
    )
    assert origin.inspect(tmp_path).buckets == ()  # only when asked
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix != ".db-shm"}
    assert after == before


async def test_record_renew_forgets_only_what_the_old_upstream_held(tmp_path: Path) -> None:
    await _fill(tmp_path)
    origin.record(tmp_path, "http://old.example", renew=False, fsync=False)
    assert origin.inspect(tmp_path).upstream == "http://old.example"

    forgotten = origin.record(tmp_path, "https://new.example", renew=True, fsync=False)
    assert forgotten == origin.Forgotten(
        cached_objects=1, cached_bytes=100, buckets=1, upstream_uploads=1
    )
    found = origin.inspect(tmp_path)
    assert found.upstream == "https://new.example"
    assert (found.unflushed_objects, found.uploads, found.has_cached) == (2, 1, False)
    journal = Journal(tmp_path / origin.JOURNAL_NAME, fsync=False)
    referenced = journal.open()
    try:
        assert referenced == {"blob-pending", "blob-failed", "blob-part"}  # the rest: swept
        assert await journal.get("b", "cached") is None
        row = await journal.get("c", "failed")
        assert row is not None and row.state is FlushState.FAILED
        stats = (await journal.stats()).backlog
        assert (stats.pending_objects, stats.pending_bytes) == (2, 23)
        assert await UploadJournal(journal).get("up-1") is not None
        assert not await BucketRecords(journal).known_bucket("b")
        assert await UpstreamUploadRecords(journal).upstream_uploads() == []
    finally:
        journal.close()


def test_record_creates_a_journal(tmp_path: Path) -> None:
    assert origin.record(tmp_path, origin.DEMO, renew=True, fsync=False) == origin.Forgotten(
        0, 0, 0, 0
    )
    assert origin.inspect(tmp_path) == origin.Contents(origin.DEMO, 0, 0, 0, 0, False, ())


def test_inspect_refuses_a_file_that_is_not_a_journal(tmp_path: Path) -> None:
    (tmp_path / origin.JOURNAL_NAME).write_text("not a database\n")
    with pytest.raises(sqlite3.DatabaseError):
        origin.inspect(tmp_path)


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("HTTPS://S3.Example.com:443/", "https://s3.example.com"),
        ("http://127.0.0.1:80", "http://127.0.0.1"),
        ("http://localhost:9000//", "http://localhost:9000"),
        ("https://minio.local:9000/tenant/", "https://minio.local:9000/tenant"),
        ("http://[::1]:9000", "http://[::1]:9000"),
    ],
)
def test_normalise_endpoint(url: str, normal: str) -> None:
    assert origin.normalise_endpoint(url) == normal
