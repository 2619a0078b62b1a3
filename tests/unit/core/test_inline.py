"""Small bodies stored inside the journal: every path that reads a body handles them (GET,
ranges, HEAD, copy, part copy, flush, verify, eviction), they survive a reopen, a larger body
still goes to a file, and a corrupt inline body is never served or flushed as good.

Real journal and blob store on tmp_path, FakeUpstream upstream."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeUpstream, RequestBody, source_bytes, until_changed

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.core.copy import CopyObjectRequest, CopyService, UploadPartCopyRequest
from gateway.core.multipart import CompletedPart, MultipartService
from gateway.core.objects import ObjectService, ReadOptions
from gateway.core.ranges import RangeSpec
from gateway.errors import BadDigest, InternalError
from gateway.flush.backoff import Backoff
from gateway.flush.flusher import Flusher
from gateway.models import FlushState, PutRequest
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.space import CacheSpace
from gateway.store.uploads import UploadJournal
from gateway.store.verify import verify_data_dir

BUCKET = "ckpt"
KiB = 1 << 10
THRESHOLD = 64 * KiB


class World:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.clock = FakeClock()
        self.blobs = BlobStore(root, fsync=True)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=True)
        self.journal.open()
        self.upstream = FakeUpstream([BUCKET])
        self.buckets = BucketService(self.journal, self.blobs, self.upstream, self.clock)
        self.space = CacheSpace(
            self.journal,
            self.blobs,
            self.clock,
            capacity_bytes=1 << 30,
            high_fraction=0.9,
            low_fraction=0.5,
        )
        self.objects = ObjectService(
            self.journal,
            self.blobs,
            self.upstream,
            self.buckets,
            self.clock,
            max_object_bytes=1 << 30,
            space=self.space,
            inline_max_bytes=THRESHOLD,
        )
        self.uploads = UploadJournal(self.journal)
        self.multipart = MultipartService(
            self.uploads,
            self.blobs,
            self.buckets,
            self.clock,
            max_part_bytes=1 << 30,
            min_part_bytes=16,
        )
        self.copy = CopyService(
            self.journal,
            self.uploads,
            self.blobs,
            self.upstream,
            self.buckets,
            self.multipart,
            self.clock,
            max_object_bytes=1 << 30,
            max_part_bytes=1 << 30,
        )

    async def put(self, key: str, body: bytes, content_md5: str | None = None) -> None:
        req = PutRequest(BUCKET, key, "binary/octet-stream", {}, {}, len(body), content_md5)
        await self.objects.put_object(req, RequestBody(body, 5000))

    async def get(self, key: str, read: ReadOptions | None = None) -> bytes:
        got = await self.objects.get_object(BUCKET, key, read or ReadOptions())
        return await source_bytes(got.source)

    def blob_files(self) -> list[Path]:
        return [p for p in (self.root / "blobs").rglob("*") if p.is_file()]

    def close(self) -> None:
        self.journal.close()
        self.blobs.close()


def _bytes(n: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(n)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


async def test_small_body_lives_in_the_journal_and_reads_back(world: World) -> None:
    body = _bytes(4 * KiB)
    await world.put("small", body)
    assert world.blob_files() == []  # no file, no file fsync, no directory fsync
    row = await world.journal.get(BUCKET, "small")
    assert row is not None and row.body == body and row.blob_id is None
    assert row.meta.etag == hashlib.md5(body).hexdigest()
    assert await world.get("small") == body
    ranged = await world.get("small", ReadOptions(range=RangeSpec(first=10, last=19)))
    assert ranged == body[10:20]
    head = await world.objects.head_object(BUCKET, "small")
    assert head.meta.size_bytes == len(body) and head.state is FlushState.PENDING


async def test_threshold_decides_between_journal_and_file(world: World) -> None:
    await world.put("at", _bytes(THRESHOLD, 2))
    await world.put("above", _bytes(THRESHOLD + 1, 3))
    await world.put("empty", b"")
    at, above, empty = [await world.journal.get(BUCKET, k) for k in ("at", "above", "empty")]
    assert at is not None and at.body is not None and at.blob_id is None
    assert above is not None and above.body is None and above.blob_id is not None
    assert empty is not None and empty.body == b""
    assert len(world.blob_files()) == 1
    assert await world.get("above") == _bytes(THRESHOLD + 1, 3)
    assert await world.get("empty") == b""


async def test_inline_body_is_verified_like_a_file(world: World) -> None:
    body = _bytes(1000)
    bad = base64.b64encode(hashlib.md5(b"other").digest()).decode()
    with pytest.raises(BadDigest):
        await world.put("k", body, content_md5=bad)
    assert await world.journal.get(BUCKET, "k") is None


async def test_overwrites_between_file_and_inline_leave_nothing_behind(world: World) -> None:
    await world.put("k", _bytes(200 * KiB))
    assert len(world.blob_files()) == 1
    await world.put("k", b"now small")
    assert world.blob_files() == []  # the file version's blob went with its row
    await world.put("k", _bytes(100 * KiB))
    assert await world.get("k") == _bytes(100 * KiB)
    assert len(world.blob_files()) == 1


async def test_copy_of_an_inline_source_copies_its_bytes(world: World) -> None:
    body = b"a small shard"
    await world.put("src", body)
    await world.copy.copy_object(CopyObjectRequest(BUCKET, "src", BUCKET, "dst"))
    await world.put("src", b"changed")  # the copy owns its own bytes
    dst = await world.journal.get(BUCKET, "dst")
    assert dst is not None and dst.body == body and dst.crc32c is not None
    assert await world.get("dst") == body
    assert world.blob_files() == []


async def test_upload_part_copy_from_an_inline_source(world: World) -> None:
    body = _bytes(30 * KiB, 4)
    await world.put("src", body)
    upload_id = await world.multipart.create(BUCKET, "mp", "binary/octet-stream", {}, {})
    part = await world.copy.upload_part_copy(
        UploadPartCopyRequest(BUCKET, "src", BUCKET, "mp", upload_id, 1, byte_range=(100, 1099))
    )
    await world.multipart.complete(BUCKET, "mp", upload_id, [CompletedPart(1, part.etag)])
    assert await world.get("mp") == body[100:1100]


async def test_inline_bodies_survive_a_reopen(world: World) -> None:
    body = _bytes(10 * KiB, 5)
    await world.put("k", body)
    world.journal.close()
    world.journal = Journal(world.root / "journal.db", fsync=True)
    assert world.journal.open() == set()  # no blob file referenced
    row = await world.journal.get(BUCKET, "k")
    assert row is not None and row.body == body


async def test_corrupt_inline_body_is_not_served_and_marked_failed(world: World) -> None:
    await world.put("k", b"precious bytes")
    await world.journal.run_write(
        lambda c: c.execute("UPDATE objects SET body = ? WHERE key = 'k'", (b"precious bytez",))
    )
    with pytest.raises(InternalError):
        await world.get("k")
    row = await world.journal.get(BUCKET, "k")
    assert row is not None and row.state is FlushState.FAILED
    assert row.last_error is not None and row.last_error.startswith("local corruption")
    problems = verify_data_dir(world.root).problems
    assert [(p.where, p.blob_id) for p in problems] == [(f"{BUCKET}/k", "inline")]


async def test_flusher_uploads_inline_bodies_and_refuses_corrupt_ones(world: World) -> None:
    await world.put("good", b"good bytes")
    await world.put("bad", b"bad bytes")
    await world.journal.run_write(
        lambda c: c.execute("UPDATE objects SET body = ? WHERE key = 'bad'", (b"bad bytez",))
    )
    flusher = Flusher(
        world.journal,
        world.blobs,
        world.upstream,
        world.clock,
        backoff=Backoff(base_s=0.001, cap_s=0.01, rng=random.Random(1)),
    )
    task = asyncio.create_task(flusher.run())

    async def settled() -> bool:
        stats = await world.journal.stats()
        return stats.backlog.pending_objects == stats.backlog.failed_objects == 1

    try:
        await until_changed(world.journal, settled)
    finally:
        await flusher.stop(1.0)
        await task
    assert world.upstream.body(BUCKET, "good") == b"good bytes"
    assert world.upstream.body(BUCKET, "bad") is None
    [failed] = await FlushQueue(world.journal).failed()
    assert failed.meta.key == "bad" and (failed.last_error or "").startswith("local corruption")


async def test_durable_inline_rows_are_evicted_with_their_bytes(world: World) -> None:
    await world.put("k", _bytes(8 * KiB, 6))
    [obj] = await FlushQueue(world.journal).claim([world.journal.last_seq])
    await FlushQueue(world.journal).mark_durable(obj)
    space = world.journal.figures.space()
    assert (space.durable_bytes, space.unflushed_bytes) == (8 * KiB, 0)
    world.space.high_bytes = world.space.low_bytes = 0  # evict everything durable
    assert await world.space.evict_if_needed() == 8 * KiB
    assert await world.journal.get(BUCKET, "k") is None
    assert world.journal.figures.space().used_bytes == 0
