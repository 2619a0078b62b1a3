"""ObjectService: PutObject / GetObject / HeadObject / DeleteObject with write-back.

Writes land locally (blob fsync, then journal COMMIT) and are acknowledged from there; the
flusher uploads them later. Reads prefer the local version (read-after-write, including
deletes) and fall through to the upstream for keys the gateway has never seen.

Reads evaluate preconditions first (412 / 304), then the range or part (416); a local body
is read from the right offset of the right part file, never from its start. Conditional
writes (``If-None-Match: *``, ``If-Match``) are checked once before the body is taken (to
fail fast) and again inside the commit transaction (so a concurrent write of the same key
through this gateway cannot slip in between).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import BinaryIO

from gateway import metrics
from gateway.clock import Clock
from gateway.core.buckets import BucketService
from gateway.core.cache import CacheFills, admitted, read_verified
from gateway.core.conditions import Preconditions, evaluate
from gateway.core.ingest import ingest, validate_key
from gateway.core.ranges import ByteRange, RangeSpec, parse_content_range, part_range, resolve_range
from gateway.errors import InternalError, InvalidRange, NoSuchKey, NotModified
from gateway.models import FlushState, LocalObject, ObjectMeta, PutRequest, RequestBody
from gateway.store.blobs import BlobStore
from gateway.store.integrity import body_digests, check_bytes
from gateway.store.journal import Journal, RowCheck
from gateway.store.space import CacheSpace
from gateway.upstream.client import Upstream

log = logging.getLogger(__name__)
_READ_PIECE_BYTES = 1 << 20
_NO_CONDITIONS = Preconditions()


@dataclass(frozen=True, slots=True)
class ReadOptions:
    """What a GET/HEAD asks for besides the key: one byte range or one part, and
    preconditions. ``range`` and ``part_number`` are never both set (S3 refuses that)."""

    range: RangeSpec | None = None
    part_number: int | None = None
    cond: Preconditions = field(default_factory=Preconditions)


_WHOLE = ReadOptions()


@dataclass(frozen=True, slots=True)
class ObjectHead:
    """What HEAD returns: the version's metadata and where it stands in the flush.

    ``byte_range`` is set for a 206 (range or part), ``parts_count`` for a part of a
    multipart object, ``is_not_modified`` for a 304.
    """

    meta: ObjectMeta
    state: FlushState
    byte_range: ByteRange | None = None
    parts_count: int | None = None
    is_not_modified: bool = False


@dataclass(slots=True)
class ObjectBody:
    """A GET in progress: ``chunks()`` streams the selected bytes once and releases its
    source (also when closed early)."""

    head: ObjectHead
    _chunks: AsyncIterator[bytes]

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks


class ObjectService:
    """Contract: ``put_object`` MUST NOT return before the body and its journal row are
    durable, and MUST leave nothing visible when it raises (a failed precondition
    included). Reads MUST see every acknowledged write and delete at once."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        buckets: BucketService,
        clock: Clock,
        *,
        max_object_bytes: int,
        space: CacheSpace | None = None,
        inline_max_bytes: int = 64 << 10,
    ) -> None:
        self._journal = journal
        self._blobs = blobs
        self._upstream = upstream
        self._buckets = buckets
        self._clock = clock
        self._max_object_bytes = max_object_bytes
        self._inline_max_bytes = inline_max_bytes
        self._space = space
        self.fills = CacheFills(journal, blobs, space, clock)

    async def put_object(
        self, req: PutRequest, body: RequestBody, cond: Preconditions = _NO_CONDITIONS
    ) -> ObjectMeta:
        validate_key(req.key)
        await self._buckets.require(req.bucket)
        check = await self.write_guard(req.bucket, req.key, cond)
        return await admitted(self._space, req.content_length or 0, self._put(req, body, check))

    async def _put(self, req: PutRequest, body: RequestBody, check: RowCheck | None) -> ObjectMeta:
        blob, checksums = await ingest(
            self._blobs,
            req,
            body,
            max_bytes=self._max_object_bytes,
            inline_max_bytes=self._inline_max_bytes,
        )
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
            _, superseded = await self._journal.commit_put(
                meta, blob.blob_id, self._clock.wall(), check, crc32c=blob.crc32c, body=blob.body
            )
        except BaseException:
            await asyncio.shield(self._blobs.discard(blob.blob_ids))
            raise
        await self._blobs.discard(superseded)
        return meta

    async def write_guard(self, bucket: str, key: str, cond: Preconditions) -> RowCheck | None:
        """Conditional write (PutObject, CompleteMultipartUpload): check ``cond`` against the
        key's current version now, and return the check to repeat inside the commit
        transaction (None without conditions).

        The current version is the local row (a tombstone is a missing key), else the
        upstream's object (one HEAD). Inside the transaction a local row, if any, decides;
        a row that has vanished since (a flushed tombstone) leaves what was seen here.
        """
        if cond.is_empty:
            return None
        local = await self._journal.get(bucket, key)
        if local is not None:
            seen = None if local.is_delete else local.meta.etag
        else:
            try:
                seen = (await self._upstream.head_object(bucket, key)).etag
            except NoSuchKey:
                seen = None
        check_write(cond, seen, key)

        def check(row: LocalObject | None) -> None:
            etag = seen if row is None else (None if row.is_delete else row.meta.etag)
            check_write(cond, etag, key)

        return check

    async def delete_object(self, bucket: str, key: str) -> None:
        validate_key(key)
        await self._buckets.require(bucket)
        _, superseded = await self._journal.commit_delete(bucket, key, self._clock.wall())
        await self._blobs.discard(superseded)

    async def head_object(self, bucket: str, key: str, read: ReadOptions = _WHOLE) -> ObjectHead:
        validate_key(key)
        await self._buckets.require(bucket)
        local = await self._journal.get(bucket, key)
        if local is not None:
            return select(local, read)
        if read.part_number is not None:
            part = await self._upstream.head_part(bucket, key, read.part_number)
            head = ObjectHead(
                part.meta,
                FlushState.DURABLE,
                parse_content_range(part.content_range),
                part.parts_count,
            )
        else:
            head = ObjectHead(await self._upstream.head_object(bucket, key), FlushState.DURABLE)
        return _apply(head, read)

    async def get_object(self, bucket: str, key: str, read: ReadOptions = _WHOLE) -> ObjectBody:
        validate_key(key)
        await self._buckets.require(bucket)
        for _ in range(3):
            local = await self._journal.get(bucket, key)
            if local is None:
                return await self._upstream_get(bucket, key, read)
            head = select(local, read)
            if head.is_not_modified:
                return ObjectBody(head, _no_chunks())
            span = head.byte_range or ByteRange(0, local.meta.size_bytes - 1, local.meta.size_bytes)
            if local.body is not None:
                return await self._inline_body(local, head, span)
            pieces = _pieces(local, span.start, span.length)
            try:
                files = await asyncio.to_thread(self._open_all, [p[0] for p in pieces])
            except FileNotFoundError:
                continue  # superseded between lookup and open: look again
            if self._space is not None:
                self._space.touch(bucket, key)
            digests = body_digests(local)
            if (
                head.byte_range is None
                and len(files) == len(digests)
                and all(d.is_checkable for d in digests)
            ):
                return ObjectBody(head, read_verified(files, digests, self._corrupt_hook(local)))
            return ObjectBody(head, _read_files(files, pieces))
        raise NoSuchKey(Key=key)  # pragma: no cover - three overwrites in a row while opening

    async def _inline_body(
        self, local: LocalObject, head: ObjectHead, span: ByteRange
    ) -> ObjectBody:
        """A body stored in the journal row: checked before anything is sent (a whole read;
        as with files, ranges are not checked), then served from memory."""
        assert local.body is not None
        if head.byte_range is None:
            problem = check_bytes(local.body, body_digests(local)[0])
            if problem is not None:
                message = f"local corruption: inline body: {problem}"
                await self.report_corrupt(local, message)
                raise InternalError(message)
        if self._space is not None:
            self._space.touch(local.meta.bucket, local.meta.key)
        return ObjectBody(head, _one_piece(local.body[span.start : span.start + span.length]))

    async def _upstream_get(self, bucket: str, key: str, read: ReadOptions) -> ObjectBody:
        """Read-through: the upstream evaluates range, part and preconditions in one GET.

        A full GET may be copied into the cache: the key is watched from before the
        upstream request, so a local write or delete that lands meanwhile (even one flushed
        and evicted before the copy finishes) keeps the stale copy out."""
        is_whole = read.range is None and read.part_number is None
        if not is_whole or not self.fills.is_enabled:
            return await self._upstream_fetch(bucket, key, read)
        self._journal.watch(bucket, key)
        try:
            body = await self._upstream_fetch(bucket, key, read)
        except BaseException:
            self._journal.unwatch(bucket, key)
            raise
        head = body.head
        if (
            head.byte_range is None
            and not head.is_not_modified
            and self.fills.wants(head.meta, self._max_object_bytes)
        ):
            return ObjectBody(body.head, self.fills.tee(body.head.meta, body.chunks()))
        self._journal.unwatch(bucket, key)
        return body

    async def _upstream_fetch(self, bucket: str, key: str, read: ReadOptions) -> ObjectBody:
        try:
            remote = await self._upstream.get_object(
                bucket,
                key,
                range_header=read.range.header() if read.range else None,
                part_number=read.part_number,
                preconditions=_condition_headers(read.cond),
            )
        except NotModified:
            # A 304 carries the validators; the upstream's came without a body to parse.
            meta = await self._upstream.head_object(bucket, key)
            return ObjectBody(
                ObjectHead(meta, FlushState.DURABLE, is_not_modified=True), _no_chunks()
            )
        except InvalidRange:
            meta = await self._upstream.head_object(bucket, key)
            assert read.range is not None
            raise InvalidRange(
                RangeRequested=read.range.header(), ActualObjectSize=str(meta.size_bytes)
            ) from None
        head = ObjectHead(
            remote.meta,
            FlushState.DURABLE,
            parse_content_range(remote.content_range),
            remote.parts_count,
        )
        return ObjectBody(head, remote.chunks())

    def _corrupt_hook(self, local: LocalObject) -> Callable[[str], Awaitable[None]]:
        async def on_corrupt(message: str) -> None:
            await self.report_corrupt(local, message)

        return on_corrupt

    async def report_corrupt(self, local: LocalObject, message: str) -> None:
        """A local body failed its digest check: log, count, and take it out of service
        (a durable copy is dropped so reads go upstream; an unflushed one becomes failed)."""
        log.error("%s/%s seq=%d: %s", local.meta.bucket, local.meta.key, local.seq, message)
        metrics.CORRUPT_BLOBS.inc()
        dropped = await asyncio.shield(self._journal.mark_corrupt(local, message))
        if dropped:
            await self._blobs.discard(dropped)

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


def check_write(cond: Preconditions, etag: str | None, key: str) -> None:
    """A conditional write against the current version (``etag`` None: no such key).

    S3: ``If-Match`` on a missing key is 404 NoSuchKey; a mismatch is 412; ``If-None-Match:
    *`` on an existing key is 412.
    """
    if cond.if_match is not None and etag is None:
        raise NoSuchKey(Key=key)
    evaluate(cond, etag, None, is_read=False)


def select(local: LocalObject, read: ReadOptions) -> ObjectHead:
    """What a GET/HEAD of this local row returns: 404, 412, 304, 416, 206 or 200."""
    if local.is_delete:
        raise NoSuchKey(Key=local.meta.key)
    # S3 sends x-amz-mp-parts-count only for a part of a multipart object.
    count = len(local.parts) if local.parts and read.part_number is not None else None
    sizes = [p.size_bytes for p in local.parts] or [local.meta.size_bytes]
    return _apply(ObjectHead(local.meta, local.state, parts_count=count), read, sizes)


def _apply(head: ObjectHead, read: ReadOptions, part_sizes: list[int] | None = None) -> ObjectHead:
    """Preconditions first (RFC 9110 order, as S3), then the range or the part (from
    ``part_sizes``; without them ``head`` already carries the part's range)."""
    meta = head.meta
    try:
        evaluate(read.cond, meta.etag, meta.last_modified_s, is_read=True)
    except NotModified:
        return ObjectHead(meta, head.state, is_not_modified=True)
    if part_sizes is not None and read.part_number is not None:
        rng = part_range(part_sizes, read.part_number)
        return ObjectHead(meta, head.state, rng, head.parts_count)
    if read.range is not None:
        return ObjectHead(meta, head.state, resolve_range(read.range, meta.size_bytes))
    return head


def _condition_headers(cond: Preconditions) -> dict[str, str]:
    pairs = {
        "If-Match": cond.if_match,
        "If-None-Match": cond.if_none_match,
        "If-Modified-Since": cond.if_modified_since,
        "If-Unmodified-Since": cond.if_unmodified_since,
    }
    return {name: value for name, value in pairs.items() if value is not None}


def _pieces(local: LocalObject, start: int, length: int) -> list[tuple[str, int, int]]:
    """(blob id, offset in it, bytes to read) for each body file the span touches."""
    files = (
        [(p.blob_id, p.size_bytes) for p in local.parts]
        if local.parts
        else ([(local.blob_id, local.meta.size_bytes)] if local.blob_id else [])
    )
    out: list[tuple[str, int, int]] = []
    file_start, end = 0, start + length
    for blob_id, size in files:
        file_end = file_start + size
        if file_end > start and file_start < end:
            offset = max(start, file_start) - file_start
            out.append((blob_id, offset, min(end, file_end) - file_start - offset))
        file_start = file_end
    return out


async def _one_piece(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover - makes this an async generator


async def _read_files(
    files: list[BinaryIO], pieces: list[tuple[str, int, int]]
) -> AsyncIterator[bytes]:
    try:
        for fobj, (_, offset, count) in zip(files, pieces, strict=True):
            if offset:
                await asyncio.to_thread(fobj.seek, offset)
            while count > 0:
                piece = await asyncio.to_thread(fobj.read, min(count, _READ_PIECE_BYTES))
                if not piece:
                    raise OSError(f"body file ended {count} bytes early")
                count -= len(piece)
                yield piece
    finally:
        for fobj in files:
            with contextlib.suppress(OSError):
                fobj.close()
