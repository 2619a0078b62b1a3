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

from gateway.core import peers
from gateway.core.buckets import BucketService
from gateway.core.freshness import FreshRows
from gateway.core.ingest import validate_key
from gateway.errors import NoSuchKey, ServiceUnavailable
from gateway.fleet.view import AttributesPage, FleetView
from gateway.models import LocalObject, ObjectAttributes, PartAttributes
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream


class ObjectAttributesService:
    """Contract: MUST answer from the local row when there is one (read-after-write), and
    MUST NOT answer for a key whose newest local version is a delete. In a fleet, a peer's
    newer unflushed version (or a lost writer's replica) answers, as for GET and HEAD."""

    def __init__(
        self,
        journal: Journal,
        upstream: Upstream,
        buckets: BucketService,
        fresh: FreshRows | None = None,
        fleet: FleetView | None = None,
    ) -> None:
        """``fresh``: in a fleet, the rows reads see (copies of flushed versions checked)."""
        self._journal = journal
        self._fresh = fresh
        self._upstream = upstream
        self._buckets = buckets
        self._fleet = fleet

    async def get_object_attributes(
        self, bucket: str, key: str, *, max_parts: int, part_number_marker: int
    ) -> ObjectAttributes:
        validate_key(key)
        await self._buckets.require(bucket)
        row = await self._journal.get(bucket, key)
        page = (max_parts, part_number_marker)
        peer = await self._from_peer(bucket, key, row, page)
        if peer is not None:
            return peer
        # A copy of a flushed version checked after the peers (FreshRows.after_peers).
        local = row if self._fresh is None else await self._fresh.after_peers(row)
        if local is None:
            return await self._upstream.get_object_attributes(
                bucket, key, max_parts=max_parts, part_number_marker=part_number_marker
            )
        if local.is_delete:
            raise NoSuchKey(Key=key)
        return local_attributes(local, max_parts=max_parts, part_number_marker=part_number_marker)

    async def _from_peer(
        self, bucket: str, key: str, row: LocalObject | None, page: AttributesPage
    ) -> ObjectAttributes | None:
        """The attributes of the newest unflushed version a peer (or a lost writer's
        replica holder) has, if it is newer than this node's row; None otherwise."""
        if self._fleet is None:
            return None
        nodes = self._fleet.candidates(bucket, key)
        found = await peers.newest_version(self._fleet, nodes, bucket, key, attributes=page)
        if found is None:
            return None
        head = found[0]
        if peers.is_unflushed(row) and row is not None and row.acked_s >= head.acked_s:
            return None
        if head.is_delete:
            raise NoSuchKey(Key=key)
        if head.attributes is None:  # a peer of an earlier release: it cannot say
            raise ServiceUnavailable()
        return head.attributes


def local_attributes(
    local: LocalObject, *, max_parts: int, part_number_marker: int
) -> ObjectAttributes:
    """The attributes of a local version, with one page of its parts."""
    meta = local.meta
    if not local.parts:
        return ObjectAttributes(
            meta.etag,
            meta.size_bytes,
            meta.last_modified_s,
            meta.checksums,
            storage_class=meta.storage_class,
        )
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
        storage_class=meta.storage_class,
    )
