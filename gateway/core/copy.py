"""CopyService: CopyObject and UploadPartCopy, server-side, with write-back.

A copy of a LOCAL source (pending or not) copies no bytes: each of the source's body files
is hard-linked under a fresh blob id, the links' directory is fsynced, and a new journal row
referencing the new ids commits. The new row owns its blobs: when either row is superseded
later its own files are unlinked and the other version is untouched. A multipart source keeps
its part list (same boundaries, same ``-N`` ETag), so the flusher uploads it with the same
parts and the upstream ETag equals the one acknowledged.

A copy of an UPSTREAM-ONLY source streams the body from the upstream into a new local blob
and commits it as pending, exactly like a PutObject of those bytes (ETag = MD5 of the body,
which is also what S3 reports for a CopyObject of a multipart source).

Durability order for both: blobs durable (link + directory fsync, or write + fsync) -> journal
COMMIT -> acknowledgement -> superseded blobs unlinked.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import BinaryIO

from gateway.checksums import b64
from gateway.clock import Clock
from gateway.core import peers
from gateway.core.bodies import bytes_only
from gateway.core.buckets import BucketService
from gateway.core.cache import admitted
from gateway.core.conditions import Preconditions, evaluate
from gateway.core.freshness import FreshRows
from gateway.core.ingest import validate_key
from gateway.core.multipart import MAX_PART_NUMBER, MultipartService
from gateway.core.writes import fleet_deciding, fleet_writing, replicate_local
from gateway.errors import (
    IncompleteBody,
    InternalError,
    InvalidArgument,
    InvalidRequest,
    NoSuchKey,
    NotModified,
    PreconditionFailed,
    S3NotImplemented,
)
from gateway.fleet.view import FleetView
from gateway.models import UPSTREAM_HEADERS, LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore, WrittenBlob
from gateway.store.journal import Journal, RowCheck
from gateway.store.space import CacheSpace
from gateway.store.uploads import Part, UploadJournal
from gateway.upstream.client import Upstream

# ObjectService.write_guard: a conditional write's check, now and inside its commit.
WriteGuard = Callable[[str, str, Preconditions], Awaitable[RowCheck | None]]
_TAGGING = "x-amz-tagging"
_READ_PIECE_BYTES = 1 << 20
# A source row can be superseded between lookup and link/open; look again this many times.
_ATTEMPTS = 3
SELF_COPY_MESSAGE = (
    "This copy request is illegal because it is trying to copy an object to itself without "
    "changing the object's metadata, storage class, website redirect location or encryption "
    "attributes."
)


@dataclass(frozen=True, slots=True)
class NewMetadata:
    """``x-amz-metadata-directive: REPLACE``: the copy takes these instead of the source's."""

    content_type: str
    user_metadata: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CopyObjectRequest:
    """A parsed CopyObject. ``replace`` None means the COPY directive (the default)."""

    source_bucket: str
    source_key: str
    bucket: str
    key: str
    conditions: Preconditions = field(default_factory=Preconditions)
    replace: NewMetadata | None = None
    # Storage class / encryption / redirect asked for: a self-copy is then legal in S3.
    is_changing_attributes: bool = False
    # The destination's (``If-None-Match: *``, ``If-Match``): a conditional copy.
    destination: Preconditions = field(default_factory=Preconditions)
    # The copy's encryption, storage class and tags as asked (``UPSTREAM_HEADERS``), and
    # whether its tags are the request's (``x-amz-tagging-directive: REPLACE``).
    target_headers: Mapping[str, str] = field(default_factory=dict)
    is_tagging_replaced: bool = False


@dataclass(frozen=True, slots=True)
class UploadPartCopyRequest:
    """A parsed UploadPartCopy. ``byte_range`` is (first, last), inclusive, or None for all."""

    source_bucket: str
    source_key: str
    bucket: str
    key: str
    upload_id: str
    part_number: int
    conditions: Preconditions = field(default_factory=Preconditions)
    byte_range: tuple[int, int] | None = None


class CopyService:
    """Contract: a copy MUST NOT be acknowledged before its body files (links or a new blob)
    and its journal row are durable, and MUST leave nothing referenced when it raises. The
    source is read as the gateway sees it (read-after-write): a pending local version wins
    over the upstream, a pending delete makes it NoSuchKey. Copy-source conditions are
    evaluated against the exact version that is copied."""

    def __init__(
        self,
        journal: Journal,
        uploads: UploadJournal,
        blobs: BlobStore,
        upstream: Upstream,
        buckets: BucketService,
        multipart: MultipartService,
        clock: Clock,
        *,
        max_object_bytes: int,
        max_part_bytes: int,
        space: CacheSpace | None = None,
        fleet: FleetView | None = None,
        fresh: FreshRows | None = None,
        write_guard: WriteGuard | None = None,
    ) -> None:
        self._space = space
        self._write_guard = write_guard  # a conditional copy's check (ObjectService's)
        self._fleet = fleet
        # A copy's source as reads see it (in a fleet, a flushed copy checked: freshness.py).
        self._fresh = fresh or FreshRows(journal, upstream, blobs, clock, fleet)
        self._journal = journal
        self._uploads = uploads
        self._blobs = blobs
        self._upstream = upstream
        self._buckets = buckets
        self._multipart = multipart
        self._clock = clock
        self._max_object_bytes = max_object_bytes
        self._max_part_bytes = max_part_bytes

    # -- CopyObject ---------------------------------------------------------------------------

    async def copy_object(self, req: CopyObjectRequest) -> ObjectMeta:
        """Admission first: a local source reserves its size; an upstream source (size
        unknown before its GET) reserves nothing but is refused when the cache is full."""
        check = await self._destination_check(req)
        source = await self._journal.get(req.source_bucket, req.source_key)
        size_bytes = source.meta.size_bytes if source is not None else 0
        async with fleet_writing(self._fleet, req.bucket, req.key) as announced:
            replica = self._fleet.replicate(req.bucket, req.key) if self._fleet else None
            await announced  # before anything can commit
            meta = await admitted(self._space, size_bytes, self._copy_object(req, check))
        if replica is not None:  # the copy's bodies go to its holders from this node's disk
            row = await self._journal.get(req.bucket, req.key)
            if row is not None and row.meta.etag == meta.etag:
                await replicate_local(replica, row, self._blobs)
        return meta

    async def _destination_check(self, req: CopyObjectRequest) -> RowCheck | None:
        """A conditional copy (``If-None-Match: *`` / ``If-Match`` on the destination):
        checked now against the destination's current version, as a conditional
        PutObject, and again inside the commit."""
        if req.destination.is_empty:
            return None
        if self._write_guard is None:
            raise S3NotImplemented("Conditional copies are not implemented here.")
        validate_key(req.key)
        return await self._write_guard(req.bucket, req.key, req.destination)

    async def _copy_object(self, req: CopyObjectRequest, check: RowCheck | None) -> ObjectMeta:
        validate_key(req.key)
        validate_key(req.source_key)
        await self._buckets.require(req.source_bucket)
        await self._buckets.require(req.bucket)
        is_self = (req.source_bucket, req.source_key) == (req.bucket, req.key)
        if is_self and req.replace is None and not req.is_changing_attributes:
            raise InvalidRequest(SELF_COPY_MESSAGE)
        for _ in range(_ATTEMPTS):
            row = await self._journal.get(req.source_bucket, req.source_key)
            from_peer = await self._copy_from_peer(req, row, check)
            if from_peer is not None:
                return from_peer
            local = await self._fresh.after_peers(row)  # checked after the peers
            if local is None:
                return await self._copy_from_upstream(req, check)
            _require_version(local, req.source_key)
            check_source(req.conditions, local.meta)
            try:
                linked = await self._blobs.link(local.blob_ids)
            except FileNotFoundError:
                continue  # the source was superseded after the lookup: look again
            return await self._commit_linked(req, local, linked, check)
        raise InternalError("The copy source kept changing; retry the request.")

    async def _commit_linked(
        self,
        req: CopyObjectRequest,
        source: LocalObject,
        linked: list[str],
        check: RowCheck | None,
    ) -> ObjectMeta:
        now = self._clock.wall()
        meta = _copied_meta(req, source.meta, now)
        try:
            if source.parts:
                parts = tuple(
                    replace(p, blob_id=new_id)
                    for new_id, p in zip(linked, source.parts, strict=True)
                )
                blob_id = None
            else:  # single body (an empty object has a blob too; a missing one stays None)
                parts, blob_id = (), (linked[0] if linked else None)
            # An inline source (no files) is copied as bytes: it is small by definition.
            async with fleet_deciding(self._fleet, req.bucket, req.key, check):
                _, superseded = await self._journal.commit_copy(
                    meta, blob_id, parts, now, crc32c=source.crc32c, body=source.body, check=check
                )
        except BaseException:
            await asyncio.shield(self._blobs.discard(linked))
            raise
        await self._blobs.discard(superseded)
        return meta

    async def _copy_from_peer(
        self, req: CopyObjectRequest, local: LocalObject | None, check: RowCheck | None
    ) -> ObjectMeta | None:
        """In a fleet: a source another node holds unflushed (newer than this node's row)
        is copied from there, as the bucket's would be (docs/fleet.md); None otherwise."""
        if self._fleet is None:
            return None
        found = await peers.read_newest(
            self._fleet, req.source_bucket, req.source_key, local, "GET", {}
        )
        if found is None:
            return None
        try:
            check_source(req.conditions, found.head.meta)
            assert found.body is not None  # a GET's answer has one
            blob = await self._blobs.write(
                bytes_only(found.body), {"md5"}, max_bytes=self._max_object_bytes
            )
        finally:
            await found.aclose()
        return await self._commit_fetched(req, found.head.meta, blob, check)

    async def _copy_from_upstream(
        self, req: CopyObjectRequest, check: RowCheck | None
    ) -> ObjectMeta:
        remote = await self._upstream.get_object(req.source_bucket, req.source_key)
        try:
            check_source(req.conditions, remote.meta)
            blob = await self._blobs.write(
                remote.chunks(), {"md5"}, max_bytes=self._max_object_bytes
            )
        finally:
            remote.close()
        return await self._commit_fetched(req, remote.meta, blob, check)

    async def _commit_fetched(
        self,
        req: CopyObjectRequest,
        source: ObjectMeta,
        blob: WrittenBlob,
        check: RowCheck | None,
    ) -> ObjectMeta:
        """Commit a copy whose body was fetched from elsewhere (the bucket, a peer)."""
        now = self._clock.wall()
        try:
            if blob.size_bytes != source.size_bytes:
                raise IncompleteBody("The copy source was cut short.")
            meta = replace(
                _copied_meta(req, source, now),
                etag=blob.digests["md5"].hex(),
                checksums={},
            )
            async with fleet_deciding(self._fleet, req.bucket, req.key, check):
                _, superseded = await self._journal.commit_put(
                    meta, blob.blob_id, now, check, crc32c=blob.crc32c
                )
        except BaseException:
            await asyncio.shield(self._blobs.discard([blob.blob_id]))
            raise
        await self._blobs.discard(superseded)
        return meta

    # -- UploadPartCopy -----------------------------------------------------------------------

    async def upload_part_copy(self, req: UploadPartCopyRequest) -> Part:
        """Admission first (nothing reserved: the range's size is known only later)."""
        return await admitted(self._space, 0, self._upload_part_copy(req))

    async def _upload_part_copy(self, req: UploadPartCopyRequest) -> Part:
        if not 1 <= req.part_number <= MAX_PART_NUMBER:
            raise InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive",
                ArgumentName="partNumber",
            )
        validate_key(req.source_key)
        upload = await self._multipart.upload(req.bucket, req.key, req.upload_id)
        await self._buckets.require(req.source_bucket)
        # The part gets the upload's checksum too, so the object's checksum can be computed.
        extra = [upload.checksum_algorithm] if upload.checksum_algorithm else []
        algorithms = {"md5", *extra}
        blob: WrittenBlob | None = None
        for _ in range(_ATTEMPTS):
            row = await self._journal.get(req.source_bucket, req.source_key)
            found, blob = await self._part_from_peer(req, row, algorithms)
            if blob is not None:
                break
            if found:
                continue  # the peer's version changed between the two reads: look again
            local = await self._fresh.after_peers(row)  # checked after the peers
            if local is None:
                blob = await self._part_from_upstream(req, algorithms)
                break
            _require_version(local, req.source_key)
            check_source(req.conditions, local.meta)
            first, length = self._part_range(req.byte_range, local.meta.size_bytes)
            if local.body is not None:  # stored inline: the range is in the row
                piece = local.body[first : first + length]
                blob = await self._blobs.write(_pieces_of(piece), algorithms)
                break
            try:
                files = await asyncio.to_thread(self._open_all, local.blob_ids)
            except FileNotFoundError:
                continue  # superseded after the lookup: look again
            sizes = [p.size_bytes for p in local.parts] or [local.meta.size_bytes]
            try:
                blob = await self._blobs.write(
                    _read_range(files, sizes, first, length),
                    algorithms,
                    max_bytes=self._max_part_bytes,
                )
            finally:
                await asyncio.to_thread(_close_all, files)
            break
        if blob is None:
            raise InternalError("The copy source kept changing; retry the request.")
        part = Part(
            req.part_number,
            blob.blob_id,
            blob.size_bytes,
            blob.digests["md5"].hex(),
            {a: b64(blob.digests[a]) for a in extra},
            self._clock.wall(),
            blob.crc32c,
        )
        try:
            replaced = await self._uploads.put_part(req.upload_id, part)
        except BaseException:
            await asyncio.shield(self._blobs.discard([blob.blob_id]))
            raise
        await self._blobs.discard(replaced)
        self._multipart.part_stored(upload, part)  # the early upstream upload sends it too
        return part

    async def _part_from_peer(
        self, req: UploadPartCopyRequest, local: LocalObject | None, algorithms: set[str]
    ) -> tuple[bool, WrittenBlob | None]:
        """In a fleet: the part's bytes from a source another node holds unflushed (or a
        lost writer's replica), as from the bucket: a HEAD for the conditions and the
        range, then a ranged GET pinned to that version (If-Match). (False, None): this
        node's row or the bucket has the source; (True, None): the peer's version changed
        between the two (look again)."""
        if self._fleet is None:
            return False, None
        bucket, key = req.source_bucket, req.source_key
        head = await peers.read_newest(self._fleet, bucket, key, local, "HEAD", {})
        if head is None:
            return False, None
        await head.aclose()
        source = head.head.meta
        check_source(req.conditions, source)
        first, length = self._part_range(req.byte_range, source.size_bytes)
        if length == 0:
            return True, await self._blobs.write(_nothing(), algorithms)
        pinned = {"Range": f"bytes={first}-{first + length - 1}", "If-Match": f'"{source.etag}"'}
        try:
            found = await peers.read_newest(self._fleet, bucket, key, local, "GET", pinned)
        except (PreconditionFailed, NoSuchKey):
            return True, None
        if found is None:
            return True, None
        try:
            assert found.body is not None  # a GET's answer has one
            blob = await self._blobs.write(
                bytes_only(found.body), algorithms, max_bytes=self._max_part_bytes
            )
        finally:
            await found.aclose()
        if blob.size_bytes != length:
            await self._blobs.discard([blob.blob_id])
            raise IncompleteBody("The copy source was cut short by the node holding it.")
        return True, blob

    async def _part_from_upstream(
        self, req: UploadPartCopyRequest, algorithms: set[str]
    ) -> WrittenBlob:
        """A ranged GET of exactly the part's bytes, pinned to the version whose metadata
        the conditions and the range were checked against (If-Match on its ETag)."""
        head = await self._upstream.head_object(req.source_bucket, req.source_key)
        check_source(req.conditions, head)
        first, length = self._part_range(req.byte_range, head.size_bytes)
        if length == 0:
            return await self._blobs.write(_nothing(), algorithms)
        remote = await self._upstream.get_object(
            req.source_bucket,
            req.source_key,
            range_header=f"bytes={first}-{first + length - 1}",
            preconditions={"If-Match": f'"{head.etag}"'},
        )
        try:
            blob = await self._blobs.write(
                remote.chunks(), algorithms, max_bytes=self._max_part_bytes
            )
        finally:
            remote.close()
        if blob.size_bytes != length:
            await self._blobs.discard([blob.blob_id])
            raise IncompleteBody("The copy source was cut short by the upstream.")
        return blob

    def _part_range(self, byte_range: tuple[int, int] | None, size: int) -> tuple[int, int]:
        """(first byte, length) of the part, checked as S3 checks x-amz-copy-source-range."""
        if byte_range is None:
            first, length = 0, size
        else:
            first, last = byte_range
            if first > last or last >= size:
                raise InvalidArgument(
                    f"Range specified is not valid for source object of size: {size}",
                    ArgumentName="x-amz-copy-source-range",
                    ArgumentValue=f"bytes={first}-{last}",
                )
            length = last - first + 1
        if length > self._max_part_bytes:
            raise InvalidRequest(
                "The specified copy source is larger than the maximum allowable size for a "
                f"copy source: {self._max_part_bytes}"
            )
        return first, length

    def _open_all(self, blob_ids: Sequence[str]) -> list[BinaryIO]:
        """Open every body file up front, so a later unlink cannot cut the copy short."""
        files: list[BinaryIO] = []
        try:
            for blob_id in blob_ids:
                files.append(self._blobs.path(blob_id).open("rb"))
        except BaseException:
            _close_all(files)
            raise
        return files


def check_source(cond: Preconditions, meta: ObjectMeta) -> None:
    """Evaluate the ``x-amz-copy-source-if-*`` conditions against the source version.

    Same precedence as GET (If-Match before If-Unmodified-Since, If-None-Match before
    If-Modified-Since), but every failure is 412 PreconditionFailed: a copy has no 304.
    """
    try:
        evaluate(cond, meta.etag, meta.last_modified_s, is_read=True)
    except PreconditionFailed as exc:
        failed = exc.fields.get("Condition", "")
        raise PreconditionFailed(Condition=f"x-amz-copy-source-{failed}") from exc
    except NotModified as exc:
        failed = "If-None-Match" if cond.if_none_match is not None else "If-Modified-Since"
        raise PreconditionFailed(Condition=f"x-amz-copy-source-{failed}") from exc


def _require_version(local: LocalObject, key: str) -> None:
    if local.is_delete:
        raise NoSuchKey(Key=key)


def _copied_meta(req: CopyObjectRequest, source: ObjectMeta, now_s: float) -> ObjectMeta:
    """The copy's metadata: the source's (COPY) or the request's (REPLACE); same body."""
    meta = replace(source, bucket=req.bucket, key=req.key, last_modified_s=now_s)
    if req.replace is not None:
        meta = replace(
            meta,
            content_type=req.replace.content_type,
            user_metadata=dict(req.replace.user_metadata),
            headers=dict(req.replace.headers),
        )
    # Encryption and storage class are the request's (else the bucket's defaults), tags
    # the source's unless replaced: S3's CopyObject.
    headers = {k: v for k, v in meta.headers.items() if k not in UPSTREAM_HEADERS}
    headers.update({k: v for k, v in req.target_headers.items() if k != _TAGGING})
    tags = req.target_headers if req.is_tagging_replaced else source.headers
    if _TAGGING in tags:
        headers[_TAGGING] = tags[_TAGGING]
    return replace(meta, headers=headers)


async def _read_range(
    files: list[BinaryIO], sizes: Sequence[int], first: int, length: int
) -> AsyncIterator[bytes]:
    """``length`` bytes from offset ``first`` of the concatenation of ``files`` (whose sizes
    are ``sizes``). The caller owns and closes the files."""
    offset = 0
    for fobj, size in zip(files, sizes, strict=True):
        if length <= 0:
            break
        if first >= offset + size:
            offset += size
            continue
        await asyncio.to_thread(fobj.seek, first - offset)
        left_in_file = min(size - (first - offset), length)
        while left_in_file > 0:
            piece = await asyncio.to_thread(fobj.read, min(_READ_PIECE_BYTES, left_in_file))
            if not piece:
                raise InternalError("A local body file is shorter than recorded.")
            left_in_file -= len(piece)
            length -= len(piece)
            yield piece
        first = offset = offset + size


def _close_all(files: list[BinaryIO]) -> None:
    for fobj in files:
        with contextlib.suppress(OSError):
            fobj.close()


async def _pieces_of(data: bytes) -> AsyncIterator[bytes]:
    if data:
        yield data


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # pragma: no cover - makes this an (empty) async generator
