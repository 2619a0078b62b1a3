"""A repeated CompleteMultipartUpload (MultipartService.completed) over a real journal and
blob store, FakeUpstream upstream: answered from the journal while the key's row is that
upload's version, from the upstream's ETag once the row is gone (evicted after its flush),
and forgotten after the retention."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeUpstream, RequestBody

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.core.multipart import CompletedPart, MultipartService
from gateway.models import ObjectMeta, PutRequest
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.uploads import COMPLETED_RETENTION_S, UploadJournal

BUCKET = "ckpt"


class World:
    def __init__(self, root: Path) -> None:
        self.clock = FakeClock()
        self.blobs = BlobStore(root / "data", fsync=False)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        self.upstream = FakeUpstream([BUCKET])
        buckets = BucketService(self.journal, self.blobs, self.upstream, self.clock)
        self.multipart = MultipartService(
            UploadJournal(self.journal),
            self.blobs,
            buckets,
            self.clock,
            max_part_bytes=1 << 20,
            min_part_bytes=1,
            upstream=self.upstream,
        )

    async def complete(self, key: str, data: bytes) -> tuple[str, ObjectMeta]:
        upload_id = await self.multipart.create(BUCKET, key, "binary/octet-stream", {}, {})
        req = PutRequest(BUCKET, key, "binary/octet-stream", {}, {}, len(data))
        part = await self.multipart.upload_part(req, upload_id, 1, RequestBody(data))
        done = [CompletedPart(1, part.etag)]
        return upload_id, await self.multipart.complete(BUCKET, key, upload_id, done)

    async def evict(self, key: str) -> None:
        await self.journal.run_write(
            lambda c: c.execute("DELETE FROM objects WHERE bucket = ? AND key = ?", (BUCKET, key))
        )


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.journal.close()
    w.blobs.close()


async def test_repeat_answers_from_the_journal(world: World) -> None:
    upload_id, meta = await world.complete("k", b"abc")
    repeat = await world.multipart.completed(BUCKET, "k", upload_id)
    assert repeat is not None and repeat.etag == meta.etag and repeat.size_bytes == 3
    again = await world.multipart.complete(BUCKET, "k", upload_id, [CompletedPart(1, "x")])
    assert again.etag == meta.etag
    assert await world.multipart.completed(BUCKET, "other", upload_id) is None


async def test_repeat_after_eviction_asks_the_upstream(world: World) -> None:
    upload_id, meta = await world.complete("k", b"abc")
    await world.evict("k")
    assert await world.multipart.completed(BUCKET, "k", upload_id) is None  # not upstream
    world.upstream.buckets[BUCKET]["k"] = (b"abc", meta)
    repeat = await world.multipart.completed(BUCKET, "k", upload_id)
    assert repeat is not None and repeat.etag == meta.etag
    other = ObjectMeta(BUCKET, "k", 1, "0" * 32, 0.0)
    world.upstream.buckets[BUCKET]["k"] = (b"z", other)
    assert await world.multipart.completed(BUCKET, "k", upload_id) is None


async def test_completed_uploads_are_forgotten_after_the_retention(world: World) -> None:
    old_id, _ = await world.complete("old", b"abc")
    world.clock.advance(COMPLETED_RETENTION_S + 1)
    await world.complete("new", b"def")  # prunes in its transaction
    assert await world.multipart.completed(BUCKET, "old", old_id) is None
