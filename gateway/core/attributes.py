"""GetObjectAttributes: an object's ETag, checksum, parts, size and storage class.

A key with a local row (pending, flushing, failed or durable) is answered from the journal:
the row holds the ETag, the verified checksums and, for a multipart object, its part list
with each part's size and checksum. A key with no local row is read through the upstream.
A local delete (tombstone) is NoSuchKey whatever the upstream still holds.

Part checksums are listed only when the object has a checksum, as S3 lists them for general
purpose buckets ("if an additional checksum isn't applied to the object, the response
doesn't return the Part element"); the parts count is always given for a multipart object.
"""

from __future__ import annotations

from gateway.core.buckets import BucketService
from gateway.core.freshness import FreshRows
from gateway.core.ingest import validate_key
from gateway.errors import NoSuchKey
from gateway.models import LocalObject, ObjectAttributes, PartAttributes
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream


class ObjectAttributesService:
    """Contract: MUST answer from the local row when there is one (read-after-write), and
    MUST NOT answer for a key whose newest local version is a delete."""

    def __init__(
        self,
        journal: Journal,
        upstream: Upstream,
        buckets: BucketService,
        fresh: FreshRows | None = None,
    ) -> None:
        """``fresh``: in a fleet, the rows reads see (copies of flushed versions checked)."""
        self._rows: Journal | FreshRows = fresh or journal
        self._upstream = upstream
        self._buckets = buckets

    async def get_object_attributes(
        self, bucket: str, key: str, *, max_parts: int, part_number_marker: int
    ) -> ObjectAttributes:
        validate_key(key)
        await self._buckets.require(bucket)
        local = await self._rows.get(bucket, key)
        if local is None:
            return await self._upstream.get_object_attributes(
                bucket, key, max_parts=max_parts, part_number_marker=part_number_marker
            )
        if local.is_delete:
            raise NoSuchKey(Key=key)
        return local_attributes(local, max_parts=max_parts, part_number_marker=part_number_marker)


def local_attributes(
    local: LocalObject, *, max_parts: int, part_number_marker: int
) -> ObjectAttributes:
    """The attributes of a local version, with one page of its parts."""
    meta = local.meta
    if not local.parts:
        return ObjectAttributes(meta.etag, meta.size_bytes, meta.last_modified_s, meta.checksums)
    has_checksum = bool(meta.checksums)
    numbered = [
        PartAttributes(n, p.size_bytes, p.checksum)
        for n, p in enumerate(local.parts, 1)
        if n > part_number_marker
    ]
    page = tuple(numbered[:max_parts]) if has_checksum else ()
    return ObjectAttributes(
        meta.etag,
        meta.size_bytes,
        meta.last_modified_s,
        meta.checksums,
        parts_count=len(local.parts),
        parts=page,
        part_number_marker=part_number_marker,
        max_parts=max_parts,
        is_truncated=has_checksum and len(numbered) > max_parts,
    )
