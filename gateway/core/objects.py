"""ObjectService: PutObject / GetObject / HeadObject / DeleteObject with write-back.

Writes land locally (blob fsync, then journal COMMIT) and are acknowledged from there; the
flusher uploads them later. Reads prefer the local version (read-after-write, including
deletes) and fall through to the upstream for keys the gateway has never seen.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import BinaryIO

from gateway.checksums import b64
from gateway.clock import Clock
from gateway.core.buckets import BucketService
from gateway.errors import (
    BadDigest,
    IncompleteBody,
    InvalidDigest,
    InvalidRequest,
    KeyTooLongError,
    NoSuchKey,
    XAmzContentSHA256Mismatch,
)
from gateway.models import FlushState, LocalObject, ObjectMeta, PutRequest, RequestBody
from gateway.store.blobs import BlobStore, WrittenBlob
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

MAX_KEY_BYTES = 1024
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
        algorithms = {"md5", *req.checksums}
        if req.trailer_checksum:
            algorithms.add(req.trailer_checksum)
        if req.payload_sha256:
            algorithms.add("sha256")
        blob = await self._blobs.write(body.chunks(), algorithms, max_bytes=self._max_object_bytes)
        try:
            _verify(req, body, blob)
            meta = ObjectMeta(
                bucket=req.bucket,
                key=req.key,
                size_bytes=blob.size_bytes,
                etag=blob.digests["md5"].hex(),
                last_modified_s=self._clock.wall(),
                content_type=req.content_type,
                user_metadata=req.user_metadata,
                headers=req.headers,
                checksums=_checksums(req, blob),
            )
            _, superseded = await self._journal.commit_put(meta, blob.blob_id, self._clock.wall())
        except BaseException:
            await asyncio.shield(self._blobs.discard([blob.blob_id]))
            raise
        if superseded:
            await self._blobs.discard([superseded])
        return meta

    async def delete_object(self, bucket: str, key: str) -> None:
        validate_key(key)
        await self._buckets.require(bucket)
        _, superseded = await self._journal.commit_delete(bucket, key, self._clock.wall())
        if superseded:
            await self._blobs.discard([superseded])

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
            assert local.blob_id is not None
            try:
                fobj = await asyncio.to_thread(self._blobs.path(local.blob_id).open, "rb")
            except FileNotFoundError:
                continue  # superseded between lookup and open: look again
            return ObjectBody(head, _read_file(fobj))
        raise NoSuchKey(Key=key)  # pragma: no cover - three overwrites in a row while opening

    async def state_of(self, bucket: str, key: str) -> LocalObject | None:
        return await self._journal.get(bucket, key)


def validate_key(key: str) -> None:
    if not key:
        raise InvalidRequest("A key must be at least one character long.")
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        raise KeyTooLongError(Key=key[:64] + "...")


def _local_head(local: LocalObject) -> ObjectHead:
    if local.is_delete:
        raise NoSuchKey(Key=local.meta.key)
    return ObjectHead(local.meta, local.state)


async def _read_file(fobj: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while piece := await asyncio.to_thread(fobj.read, _READ_PIECE_BYTES):
            yield piece
    finally:
        with contextlib.suppress(OSError):
            fobj.close()


def _verify(req: PutRequest, body: RequestBody, blob: WrittenBlob) -> None:
    """Check what the client promised against what arrived; raise the S3 error S3 raises."""
    if req.content_length is not None and blob.size_bytes != req.content_length:
        raise IncompleteBody()
    if req.content_md5 is not None:
        try:
            expected = bytes.fromhex(_b64_to_hex(req.content_md5))
        except ValueError as exc:
            raise InvalidDigest() from exc
        if expected != blob.digests["md5"]:
            raise BadDigest()
    if (
        req.payload_sha256 is not None
        and req.payload_sha256.lower() != blob.digests["sha256"].hex()
    ):
        raise XAmzContentSHA256Mismatch()
    for algorithm, value in req.checksums.items():
        if value != b64(blob.digests[algorithm]):
            raise _mismatch(algorithm)
    if req.trailer_checksum:
        sent = body.trailers.get(f"x-amz-checksum-{req.trailer_checksum}")
        if sent is None:
            raise InvalidRequest(f"x-amz-checksum-{req.trailer_checksum} trailer is missing.")
        if sent != b64(blob.digests[req.trailer_checksum]):
            raise _mismatch(req.trailer_checksum)


def _mismatch(algorithm: str) -> BadDigest:
    return BadDigest(
        f"The {algorithm.upper()} you specified did not match the calculated checksum."
    )


def _checksums(req: PutRequest, blob: WrittenBlob) -> dict[str, str]:
    names = set(req.checksums) | ({req.trailer_checksum} if req.trailer_checksum else set())
    return {name: b64(blob.digests[name]) for name in sorted(names)}


def _b64_to_hex(value: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise ValueError("bad base64") from exc
    if len(raw) != 16:
        raise ValueError("not an MD5")
    return raw.hex()
