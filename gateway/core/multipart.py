"""MultipartService: CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
AbortMultipartUpload, ListParts, ListMultipartUploads.

Parts are durable on ack (same ingest as PutObject). Completing does not copy data: the new
object version is the ordered list of its part files, and its ETag is S3's
``md5(concatenated part MD5s)-N``. The flusher later uploads it with the same part
boundaries, so the upstream computes the same ETag.

An optional ``PartListener`` (the flusher's early multipart uploads, connected by the
composition root: core never imports flush) hears of each acknowledged part, completion
and abort, so the upstream upload can start while the client is still uploading.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gateway.checksums import CHECKSUM_ALGORITHMS, composite, full_object, is_crc
from gateway.clock import Clock
from gateway.core.buckets import BucketService
from gateway.core.cache import admitted
from gateway.core.ingest import ingest_file, validate_key
from gateway.core.writes import (
    TeeBody,
    commit_replicas,
    fleet_deciding,
    fleet_writing,
    replicas_aborted,
)
from gateway.errors import (
    BadDigest,
    EntityTooSmall,
    InvalidArgument,
    InvalidPart,
    InvalidPartOrder,
    InvalidRequest,
    NoSuchKey,
    NoSuchUpload,
)
from gateway.fleet.view import FleetView, ReplicaWriter
from gateway.models import LocalObject, ObjectMeta, PartRef, PutRequest, RequestBody
from gateway.store.blobs import BlobStore
from gateway.store.journal import RowCheck
from gateway.store.space import CacheSpace
from gateway.store.uploads import CompletedUpload, Part, Upload, UploadJournal
from gateway.upstream.client import Upstream

MAX_PART_NUMBER = 10_000


@dataclass(frozen=True, slots=True)
class CompletedPart:
    """A part named in the CompleteMultipartUpload body (checksums as ``Checksum<ALG>``)."""

    part_number: int
    etag: str
    checksums: Mapping[str, str] = field(default_factory=dict)


class PartListener(Protocol):
    """Hears of a local multipart upload's life, after each change is durable. Every call
    MUST return at once (work is scheduled, never awaited by the client's request) and
    MUST NOT raise."""

    def part_stored(self, upload: Upload, part: Part) -> None:
        """``part`` (maybe replacing one of the same number) was acknowledged."""

    def upload_completed(self, upload: Upload, row: LocalObject, chosen: Sequence[Part]) -> None:
        """The upload became the object version ``row``, made of ``chosen`` in order."""

    def upload_aborted(self, upload: Upload) -> None:
        """The client aborted the upload; its parts are gone."""


def multipart_etag(part_md5s: Sequence[str]) -> str:
    """S3's multipart ETag: MD5 of the concatenated binary part MD5s, then ``-N``."""
    digest = hashlib.md5(b"".join(bytes.fromhex(m) for m in part_md5s)).hexdigest()
    return f"{digest}-{len(part_md5s)}"


class MultipartService:
    """Contract: UploadPart MUST NOT ack before the part is durable; Complete MUST validate
    part numbers, ETags, order and sizes as S3 does and leave the upload intact on error."""

    def __init__(
        self,
        uploads: UploadJournal,
        blobs: BlobStore,
        buckets: BucketService,
        clock: Clock,
        *,
        max_part_bytes: int,
        min_part_bytes: int,
        space: CacheSpace | None = None,
        upstream: Upstream | None = None,
        listener: PartListener | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        self._fleet = fleet
        self._space = space
        self._listener = listener
        self._upstream = upstream
        self._uploads = uploads
        self._blobs = blobs
        self._buckets = buckets
        self._clock = clock
        self._max_part_bytes = max_part_bytes
        self._min_part_bytes = min_part_bytes

    async def create(
        self,
        bucket: str,
        key: str,
        content_type: str,
        user_metadata: Mapping[str, str],
        headers: Mapping[str, str],
        checksum_algorithm: str | None = None,
        checksum_type: str | None = None,
    ) -> str:
        validate_key(key)
        algorithm, kind = _checksum_config(checksum_algorithm, checksum_type)
        await self._buckets.require(bucket)
        upload_id = secrets.token_urlsafe(24)
        await self._uploads.create(
            Upload(
                upload_id,
                bucket,
                key,
                self._clock.wall(),
                content_type,
                dict(user_metadata),
                dict(headers),
                algorithm,
                kind,
            )
        )
        return upload_id

    async def upload(self, bucket: str, key: str, upload_id: str) -> Upload:
        """The upload, checked to belong to bucket/key (else NoSuchUpload, as S3)."""
        upload = await self._uploads.get(upload_id)
        if upload is None or upload.bucket != bucket or upload.key != key:
            raise NoSuchUpload(UploadId=upload_id)
        return upload

    async def upload_part(
        self, req: PutRequest, upload_id: str, part_number: int, body: RequestBody
    ) -> Part:
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise InvalidArgument(
                "Part number must be an integer between 1 and 10000, inclusive",
                ArgumentName="partNumber",
            )
        upload = await self.upload(req.bucket, req.key, upload_id)
        part = await admitted(
            self._space,
            req.content_length or 0,
            self._put_part(req, upload_id, part_number, body),
            max_bytes=self._max_part_bytes,
        )
        self.part_stored(upload, part)
        return part

    def part_stored(self, upload: Upload, part: Part) -> None:
        """Tell the listener of an acknowledged part (UploadPart, UploadPartCopy)."""
        if self._listener is not None:
            self._listener.part_stored(upload, part)

    async def _put_part(
        self, req: PutRequest, upload_id: str, part_number: int, body: RequestBody
    ) -> Part:
        # With replicas: the part is staged on the key's holders too before its ack; the
        # completion commits it there (docs/fleet.md, "Node loss").
        replica = self._replica(req.bucket, req.key, (upload_id, part_number))
        with replicas_aborted(replica):
            blob, checksums = await ingest_file(
                self._blobs,
                req,
                body if replica is None else TeeBody(body, replica),
                max_bytes=self._max_part_bytes,
            )
        if replica is not None:
            try:
                await replica.staged(blob.digests["md5"].hex(), blob.size_bytes, blob.crc32c)
            except BaseException:
                await self._blobs.discard([blob.blob_id])
                raise
        part = Part(
            part_number,
            blob.blob_id,
            blob.size_bytes,
            blob.digests["md5"].hex(),
            checksums,
            self._clock.wall(),
            blob.crc32c,
        )
        try:
            replaced = await self._uploads.put_part(upload_id, part)
        except BaseException:
            await self._blobs.discard([blob.blob_id])
            raise
        await self._blobs.discard(replaced)
        return part

    async def complete(
        self,
        bucket: str,
        key: str,
        upload_id: str,
        requested: Sequence[CompletedPart],
        expected: Mapping[str, str] | None = None,
        check: RowCheck | None = None,
    ) -> ObjectMeta:
        """Validate and commit. ``expected`` holds whole-object ``x-amz-checksum-*`` values
        the client sent with the request (verified against the computed one). ``check``
        (from ObjectService.write_guard) re-checks a conditional write inside the commit.

        A repeat of a Complete that succeeded (and lost its answer) returns what the first
        one did, as S3 does, while the key still holds that upload's object."""
        try:
            upload = await self.upload(bucket, key, upload_id)
        except NoSuchUpload:
            repeat = await self.completed(bucket, key, upload_id)
            if repeat is None:
                raise
            return repeat
        if not requested:
            raise InvalidRequest("You must specify at least one part")
        stored = {p.part_number: p for p in await self._uploads.parts(upload_id)}
        chosen: list[Part] = []
        for i, want in enumerate(requested):
            if i and want.part_number <= requested[i - 1].part_number:
                raise InvalidPartOrder()
            part = stored.get(want.part_number)
            if part is None or want.etag.strip().strip('"').lower() != part.etag:
                raise InvalidPart(PartNumber=str(want.part_number), ETag=want.etag)
            if any(part.checksums.get(a) != v for a, v in want.checksums.items()):
                raise InvalidPart(PartNumber=str(want.part_number), ETag=want.etag)
            chosen.append(part)
        for part in chosen[:-1]:
            if part.size_bytes < self._min_part_bytes:
                raise EntityTooSmall(
                    ProposedSize=str(part.size_bytes), MinSizeAllowed=str(self._min_part_bytes)
                )
        meta = ObjectMeta(
            bucket=bucket,
            key=key,
            size_bytes=sum(p.size_bytes for p in chosen),
            etag=multipart_etag([p.etag for p in chosen]),
            last_modified_s=self._clock.wall(),
            content_type=upload.content_type,
            user_metadata=upload.user_metadata,
            headers=upload.headers,
            checksums=_object_checksum(upload, chosen, expected or {}),
        )
        algorithm = upload.checksum_algorithm
        refs = tuple(
            PartRef(
                p.blob_id,
                p.size_bytes,
                p.etag,
                p.checksums.get(algorithm) if algorithm else None,
                p.crc32c,
            )
            for p in chosen
        )
        async with fleet_writing(self._fleet, bucket, key) as announced:
            replica = self._replica(bucket, key)
            await announced
            async with fleet_deciding(self._fleet, bucket, key, check):
                row, discard = await self._uploads.complete(
                    upload_id, meta, refs, self._clock.wall(), check
                )
        if replica is not None:  # the parts staged on the holders become the version there
            await commit_replicas(
                replica,
                replica.holders,
                row,
                stage_ids=[f"{upload_id}.{p.part_number}" for p in chosen],
                parts=[(p.size_bytes, p.etag) for p in chosen],
                resend=self._part_body(upload_id, chosen),
                crc32cs=[p.crc32c for p in chosen],
            )
        if self._listener is not None:
            self._listener.upload_completed(upload, row, chosen)
        await self._blobs.discard(discard)
        return meta

    def _replica(
        self, bucket: str, key: str, upload: tuple[str, int] | None = None
    ) -> ReplicaWriter | None:
        return None if self._fleet is None else self._fleet.replicate(bucket, key, upload)

    def _part_body(
        self, upload_id: str, parts: Sequence[Part]
    ) -> Callable[[str], AsyncIterator[bytes]]:
        """A part's body from this node's disk, for a holder that did not stage it (it
        joined after the part, or lost it): ``<upload id>.<part number>``."""
        by_id = {f"{upload_id}.{p.part_number}": p for p in parts}

        async def body(stage_id: str) -> AsyncIterator[bytes]:
            async for chunk in self._blobs.read_chunks(by_id[stage_id].blob_id):
                yield chunk

        return body

    async def completed(self, bucket: str, key: str, upload_id: str) -> ObjectMeta | None:
        """What a completed ``upload_id`` answered, if the key's object is still the one it
        made (a later write or delete of the key makes a repeat NoSuchUpload, as in S3).
        Without a local row (evicted after its flush) the upstream's ETag decides."""
        done = await self._uploads.completed(upload_id)
        if done is None or done.bucket != bucket or done.key != key:
            return None
        is_current = done.is_current
        if is_current is None and self._upstream is not None:
            is_current = await self._upstream_matches(done)
        if not is_current:
            return None
        return ObjectMeta(
            bucket=bucket,
            key=key,
            size_bytes=done.size_bytes,
            etag=done.etag,
            last_modified_s=done.completed_s,
            checksums=done.checksums,
        )

    async def _upstream_matches(self, done: CompletedUpload) -> bool:
        assert self._upstream is not None
        try:
            head = await self._upstream.head_object(done.bucket, done.key)
        except NoSuchKey:
            return False
        return head.etag == done.etag

    async def abort(self, bucket: str, key: str, upload_id: str) -> None:
        upload = await self.upload(bucket, key, upload_id)
        discard = await self._uploads.abort(upload_id)
        if self._listener is not None:
            self._listener.upload_aborted(upload)
        await self._blobs.discard(discard)

    async def list_parts(
        self, bucket: str, key: str, upload_id: str, after: int, limit: int
    ) -> tuple[Upload, list[Part], bool]:
        upload = await self.upload(bucket, key, upload_id)
        parts = await self._uploads.parts(upload_id, after, limit + 1)
        return upload, parts[:limit], len(parts) > limit

    async def list_uploads(
        self, bucket: str, prefix: str, key_marker: str, upload_id_marker: str, limit: int
    ) -> tuple[list[Upload], bool]:
        await self._buckets.require(bucket)
        found = await self._uploads.list(bucket, prefix, key_marker, upload_id_marker, limit + 1)
        return found[:limit], len(found) > limit


def _checksum_config(algorithm: str | None, kind: str | None) -> tuple[str | None, str | None]:
    """Validate CreateMultipartUpload's checksum algorithm and type (S3's defaults: COMPOSITE,
    except CRC64NVME which only exists as FULL_OBJECT)."""
    if algorithm is None:
        if kind is not None:
            raise InvalidRequest("x-amz-checksum-type requires x-amz-checksum-algorithm.")
        return None, None
    algorithm = algorithm.lower()
    if algorithm not in CHECKSUM_ALGORITHMS:
        raise InvalidRequest(f"Checksum algorithm {algorithm} is not supported.")
    kind = (kind or ("FULL_OBJECT" if algorithm == "crc64nvme" else "COMPOSITE")).upper()
    if kind not in ("COMPOSITE", "FULL_OBJECT"):
        raise InvalidRequest(f"Invalid x-amz-checksum-type {kind}.")
    if (kind == "FULL_OBJECT" and not is_crc(algorithm)) or (
        kind == "COMPOSITE" and algorithm == "crc64nvme"
    ):
        raise InvalidRequest(f"The {kind} checksum type cannot be used with {algorithm.upper()}.")
    return algorithm, kind


def _object_checksum(
    upload: Upload, parts: Sequence[Part], expected: Mapping[str, str]
) -> dict[str, str]:
    """The multipart object's checksum (composite ``b64-N`` or full-object), if every part
    carries one in the upload's algorithm; a whole-object value the client sent must match."""
    algorithm = upload.checksum_algorithm
    if algorithm is None or any(algorithm not in p.checksums for p in parts):
        return {}
    if upload.checksum_type == "FULL_OBJECT":
        value = full_object(algorithm, [(p.checksums[algorithm], p.size_bytes) for p in parts])
    else:
        value = composite(algorithm, [p.checksums[algorithm] for p in parts])
    sent = expected.get(algorithm)
    if sent is not None and sent != value and sent != value.split("-")[0]:
        raise BadDigest(
            f"The {algorithm.upper()} you specified did not match the calculated checksum."
        )
    return {algorithm: value}
