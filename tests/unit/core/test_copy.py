"""CopyService and DeleteService over a real journal and blob store, FakeUpstream upstream."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from fakes import FakeUpstream, RequestBody

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.core.conditions import Preconditions
from gateway.core.copy import CopyObjectRequest, CopyService, UploadPartCopyRequest, check_source
from gateway.core.deletes import DeleteEntry, DeleteService
from gateway.core.multipart import CompletedPart, MultipartService
from gateway.errors import InvalidArgument, InvalidRequest, NoSuchKey, PreconditionFailed
from gateway.models import ObjectMeta, PutRequest
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.uploads import UploadJournal

BUCKET = "ckpt"
MIN_PART = 16


class World:
    def __init__(self, root: Path) -> None:
        self.clock = FakeClock()
        self.blobs = BlobStore(root / "data", fsync=True)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        self.upstream = FakeUpstream([BUCKET])
        self.buckets = BucketService(self.journal, self.blobs, self.upstream, self.clock)
        self.uploads = UploadJournal(self.journal)
        self.multipart = MultipartService(
            self.uploads,
            self.blobs,
            self.buckets,
            self.clock,
            max_part_bytes=1 << 20,
            min_part_bytes=MIN_PART,
        )
        self.copy = CopyService(
            self.journal,
            self.uploads,
            self.blobs,
            self.upstream,
            self.buckets,
            self.multipart,
            self.clock,
            max_object_bytes=1 << 20,
            max_part_bytes=1 << 20,
        )
        self.deletes = DeleteService(self.journal, self.blobs, self.buckets, self.clock)

    async def put(self, key: str, body: bytes) -> ObjectMeta:
        blob = await self.blobs.write(_chunks(body), {"md5"})
        meta = ObjectMeta(
            bucket=BUCKET,
            key=key,
            size_bytes=len(body),
            etag=blob.digests["md5"].hex(),
            last_modified_s=self.clock.wall(),
        )
        _, old = await self.journal.commit_put(meta, blob.blob_id, self.clock.wall())
        await self.blobs.discard(old)
        return meta

    async def put_multipart(self, key: str, parts: list[bytes]) -> ObjectMeta:
        upload_id = await self.multipart.create(BUCKET, key, "binary/octet-stream", {}, {})
        done = []
        for n, data in enumerate(parts, 1):
            req = _put_request(key, data)
            part = await self.multipart.upload_part(req, upload_id, n, RequestBody(data))
            done.append(CompletedPart(n, part.etag))
        return await self.multipart.complete(BUCKET, key, upload_id, done)

    async def read(self, key: str) -> bytes:
        local = await self.journal.get(BUCKET, key)
        assert local is not None and not local.is_delete
        return b"".join(self.blobs.path(b).read_bytes() for b in local.blob_ids)

    def close(self) -> None:
        self.journal.close()
        self.blobs.close()


async def _chunks(data: bytes) -> AsyncIterator[bytes]:
    for i in range(0, len(data), 7):
        yield data[i : i + 7]


def _put_request(key: str, data: bytes) -> PutRequest:
    return PutRequest(BUCKET, key, "binary/octet-stream", {}, {}, len(data))


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


def _copy(src: str, dst: str, **kwargs: object) -> CopyObjectRequest:
    return CopyObjectRequest(BUCKET, src, BUCKET, dst, **kwargs)  # type: ignore[arg-type]


async def test_copy_links_and_survives_source_removal(world: World) -> None:
    meta = await world.put("src", b"hello world")
    copied = await world.copy.copy_object(_copy("src", "dst"))
    assert copied.etag == meta.etag and copied.key == "dst"
    src_row = await world.journal.get(BUCKET, "src")
    dst_row = await world.journal.get(BUCKET, "dst")
    assert src_row is not None and dst_row is not None
    assert src_row.blob_ids != dst_row.blob_ids  # each row owns its own name
    assert (
        world.blobs.path(src_row.blob_ids[0]).stat().st_ino
        == world.blobs.path(dst_row.blob_ids[0]).stat().st_ino
    )
    await world.put("src", b"overwritten")  # unlinks the source's name
    assert not world.blobs.path(src_row.blob_ids[0]).exists()
    assert await world.read("dst") == b"hello world"


async def test_copy_multipart_keeps_parts(world: World) -> None:
    parts = [b"a" * MIN_PART, b"b" * MIN_PART, b"tail"]
    meta = await world.put_multipart("mp", parts)
    copied = await world.copy.copy_object(_copy("mp", "mp2"))
    assert copied.etag == meta.etag and copied.etag.endswith("-3")
    row = await world.journal.get(BUCKET, "mp2")
    assert row is not None and [p.size_bytes for p in row.parts] == [16, 16, 4]
    assert await world.read("mp2") == b"".join(parts)


async def test_copy_self_and_missing(world: World) -> None:
    await world.put("k", b"x")
    with pytest.raises(InvalidRequest):
        await world.copy.copy_object(_copy("k", "k"))
    with pytest.raises(NoSuchKey):
        await world.copy.copy_object(_copy("nope", "k2"))
    await world.deletes.delete_objects(BUCKET, [DeleteEntry("k")])
    with pytest.raises(NoSuchKey):
        await world.copy.copy_object(_copy("k", "k2"))


async def test_copy_from_upstream_is_pending_local(world: World) -> None:
    world.upstream.add_object(BUCKET, "remote", b"from upstream")
    copied = await world.copy.copy_object(_copy("remote", "here"))
    assert copied.etag == hashlib.md5(b"from upstream").hexdigest()
    assert await world.read("here") == b"from upstream"


@pytest.mark.parametrize(
    ("first", "last"), [(0, 0), (0, 35), (10, 20), (15, 16), (16, 31), (30, 35), (5, 33)]
)
async def test_upload_part_copy_ranges_across_part_files(
    world: World, first: int, last: int
) -> None:
    parts = [bytes(range(16)), bytes(range(100, 116)), b"wxyz"]
    await world.put_multipart("mp", parts)
    whole = b"".join(parts)
    upload_id = await world.multipart.create(BUCKET, "out", "binary/octet-stream", {}, {})
    part = await world.copy.upload_part_copy(
        UploadPartCopyRequest(BUCKET, "mp", BUCKET, "out", upload_id, 1, byte_range=(first, last))
    )
    assert world.blobs.path(part.blob_id).read_bytes() == whole[first : last + 1]
    assert part.etag == hashlib.md5(whole[first : last + 1]).hexdigest()


async def test_upload_part_copy_range_outside_object(world: World) -> None:
    await world.put("small", b"0123456789")
    upload_id = await world.multipart.create(BUCKET, "out", "binary/octet-stream", {}, {})
    for bad in ((0, 10), (5, 4)):
        with pytest.raises(InvalidArgument, match="size: 10"):
            await world.copy.upload_part_copy(
                UploadPartCopyRequest(BUCKET, "small", BUCKET, "out", upload_id, 1, byte_range=bad)
            )


def test_check_source_maps_every_failure_to_412() -> None:
    meta = ObjectMeta(BUCKET, "k", 1, "abc", last_modified_s=1_700_000_000.0)
    later = "Wed, 01 Jan 2031 00:00:00 GMT"
    earlier = "Wed, 01 Jan 2020 00:00:00 GMT"
    cases = [
        (Preconditions(if_match='"zzz"'), "x-amz-copy-source-If-Match"),
        (Preconditions(if_none_match='"abc"'), "x-amz-copy-source-If-None-Match"),
        (Preconditions(if_modified_since=later), "x-amz-copy-source-If-Modified-Since"),
        (Preconditions(if_unmodified_since=earlier), "x-amz-copy-source-If-Unmodified-Since"),
    ]
    for cond, name in cases:
        with pytest.raises(PreconditionFailed) as exc:
            check_source(cond, meta)
        assert exc.value.fields["Condition"] == name
    check_source(Preconditions(if_match='"abc"', if_unmodified_since=earlier), meta)


async def test_delete_objects_one_transaction(world: World) -> None:
    await world.put("a", b"1")
    await world.put("b", b"2")
    a_row = await world.journal.get(BUCKET, "a")
    assert a_row is not None
    outcomes = await world.deletes.delete_objects(
        BUCKET,
        [DeleteEntry("a"), DeleteEntry("k" * 1025), DeleteEntry("a"), DeleteEntry("missing")],
    )
    assert [o.error.code if o.error else None for o in outcomes] == [
        None,
        "KeyTooLongError",
        None,
        None,
    ]
    for key in ("a", "missing"):
        row = await world.journal.get(BUCKET, key)
        assert row is not None and row.is_delete
    assert not world.blobs.path(a_row.blob_ids[0]).exists()  # superseded body unlinked
    assert await world.read("b") == b"2"
