"""ObjectService: PutObject / GetObject / HeadObject / DeleteObject with write-back.

Writes land locally (blob fsync, then journal COMMIT) and are acknowledged from there; the
flusher uploads them later. Reads prefer the local version (read-after-write, including
deletes) and fall through to the upstream for keys the gateway has never seen.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO

from gateway.clock import Clock
from gateway.core.buckets import BucketService
from gateway.core.ingest import ingest, validate_key
from gateway.errors import NoSuchKey
from gateway.models import FlushState, LocalObject, ObjectMeta, PutRequest, RequestBody
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

_READ_PIECE_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What HEAD returns: the version's metadata and where it stands in the flush."""

    meta: ObjectMeta
    state: FlushState


@dataclass(slots=True)
class ObjectBody:
    """A GET in progress: ``chunks()`` streams the body once and releases its source."""

    head: ObjectHead
    _chunks: AsyncIterator[bytes]

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks


class ObjectService:
    """Contract: ``put_object`` MUST NOT return before the body and its journal row are
    durable, and MUST leave nothing visible when it raises. Reads MUST see every
    acknowledged write and delete at once."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        buckets: BucketService,
        clock: Clock,
        *,
        max_object_bytes: int,
    ) -> None:
        self._journal = journal
        self._blobs = blobs
        self._upstream = upstream
        self._buckets = buckets
        self._clock = clock
        self._max_object_bytes = max_object_bytes

    async def put_object(self, req: PutRequest, body: RequestBody) -> ObjectMeta:
        validate_key(req.key)
        await self._buckets.require(req.bucket)
        blob, checksums = await ingest(self._blobs, req, body, max_bytes=self._max_object_bytes)
        try:
            meta = ObjectMeta(
                bucket=req.bucket,
                key=req.key,
                size_bytes=blob.size_bytes,
                etag=blob.digests["md5"].hex(),
                last_modified_s=self._clock.wall(),
                content_type=req.content_type,
                user_metadata=req.user_metadata,
                headers=req.headers,
                checksums=checksums,
            )
            _, superseded = await self._journal.commit_put(meta, blob.blob_id, self._clock.wall())
        except BaseException:
            await asyncio.shield(self._blobs.discard([blob.blob_id]))
            raise
        await self._blobs.discard(superseded)
        return meta

    async def delete_object(self, bucket: str, key: str) -> None:
        validate_key(key)
        await self._buckets.require(bucket)
        _, superseded = await self._journal.commit_delete(bucket, key, self._clock.wall())
        await self._blobs.discard(superseded)

    async def head_object(self, bucket: str, key: str) -> ObjectHead:
        validate_key(key)
        await self._buckets.require(bucket)
        local = await self._journal.get(bucket, key)
        if local is not None:
            return _local_head(local)
        return ObjectHead(await self._upstream.head_object(bucket, key), FlushState.DURABLE)

    async def get_object(self, bucket: str, key: str) -> ObjectBody:
        validate_key(key)
        await self._buckets.require(bucket)
        for _ in range(3):
            local = await self._journal.get(bucket, key)
            if local is None:
                remote = await self._upstream.get_object(bucket, key)
                return ObjectBody(ObjectHead(remote.meta, FlushState.DURABLE), remote.chunks())
            head = _local_head(local)
            try:
                files = await asyncio.to_thread(self._open_all, local.blob_ids)
            except FileNotFoundError:
                continue  # superseded between lookup and open: look again
            return ObjectBody(head, _read_files(files))
        raise NoSuchKey(Key=key)  # pragma: no cover - three overwrites in a row while opening

    def _open_all(self, blob_ids: list[str]) -> list[BinaryIO]:
        """Open every body file up front, so a later unlink cannot cut a read short."""
        files: list[BinaryIO] = []
        try:
            for blob_id in blob_ids:
                files.append(self._blobs.path(blob_id).open("rb"))
        except BaseException:
            for f in files:
                f.close()
            raise
        return files

    async def state_of(self, bucket: str, key: str) -> LocalObject | None:
        return await self._journal.get(bucket, key)


def _local_head(local: LocalObject) -> ObjectHead:
    if local.is_delete:
        raise NoSuchKey(Key=local.meta.key)
    return ObjectHead(local.meta, local.state)


async def _read_files(files: list[BinaryIO]) -> AsyncIterator[bytes]:
    try:
        for fobj in files:
            while piece := await asyncio.to_thread(fobj.read, _READ_PIECE_BYTES):
                yield piece
    finally:
        for fobj in files:
            with contextlib.suppress(OSError):
                fobj.close()
