"""BucketService: buckets live upstream; the gateway remembers which ones exist so writes
keep being acknowledged while the upstream is unreachable."""

from __future__ import annotations

from gateway.clock import Clock
from gateway.errors import BucketNotEmpty, InvalidBucketName, SlowDown
from gateway.models import BucketInfo
from gateway.store.blobs import BlobStore
from gateway.store.buckets import BucketRecords
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

_DELETE_WAIT_S = 10.0


class BucketService:
    """Contract: ``require`` MUST raise NoSuchBucket for a bucket the upstream does not have
    (first use asks the upstream; later uses are answered from the journal). CreateBucket and
    DeleteBucket are passed upstream; DeleteBucket MUST refuse while objects are unflushed."""

    def __init__(
        self, journal: Journal, blobs: BlobStore, upstream: Upstream, clock: Clock
    ) -> None:
        self._journal = journal
        self._records = BucketRecords(journal)
        self._blobs = blobs
        self._upstream = upstream
        self._clock = clock
        self._known: set[str] = set()

    async def require(self, bucket: str) -> None:
        validate_bucket_name(bucket)
        if bucket in self._known:
            return
        if not await self._records.known_bucket(bucket):
            await self._upstream.head_bucket(bucket)
            await self._records.remember_bucket(BucketInfo(bucket, self._clock.wall()))
        self._known.add(bucket)

    async def head_bucket(self, bucket: str) -> None:
        validate_bucket_name(bucket)
        await self._upstream.head_bucket(bucket)

    async def list_buckets(self) -> list[BucketInfo]:
        return await self._upstream.list_buckets()

    async def create_bucket(self, bucket: str, location: str | None) -> None:
        validate_bucket_name(bucket)
        await self._upstream.create_bucket(bucket, location)
        await self._records.remember_bucket(BucketInfo(bucket, self._clock.wall()))
        self._known.add(bucket)

    async def delete_bucket(self, bucket: str) -> None:
        validate_bucket_name(bucket)
        if await self._journal.has_unflushed_objects(bucket):
            raise BucketNotEmpty(BucketName=bucket)
        # Deletes still pending would leave the upstream bucket non-empty: let them land.
        left, _ = await self._journal.wait_flushed(
            bucket, "", self._journal.last_seq, _DELETE_WAIT_S
        )
        if left:
            raise SlowDown("Deletes in this bucket are still being flushed; retry shortly.")
        await self._upstream.delete_bucket(bucket)
        self._known.discard(bucket)
        await self._blobs.discard(await self._records.forget_bucket(bucket))


def validate_bucket_name(bucket: str) -> None:
    """S3's naming rules (3-63 chars of a-z, 0-9, '.', '-', starting and ending alphanumeric).

    Besides being S3's rule, this keeps path tricks (``..``, ``/``, NUL) out of bucket names.
    """
    ok = 3 <= len(bucket) <= 63 and all(
        c.isascii() and (c.islower() or c.isdigit() or c in ".-") for c in bucket
    )
    if not ok or not bucket[0].isalnum() or not bucket[-1].isalnum() or ".." in bucket:
        raise InvalidBucketName(BucketName=bucket)
    parts = bucket.split(".")
    if len(parts) == 4 and all(p.isdigit() for p in parts):
        # S3: "must not be formatted as an IP address" (e.g. 192.168.5.4).
        raise InvalidBucketName(BucketName=bucket)
