"""BucketService: buckets live upstream; the gateway remembers which ones exist so writes
keep being acknowledged while the upstream is unreachable.

The first use of a bucket asks the upstream once (single flight): a burst of writes into
a bucket not seen yet waits for that one HeadBucket instead of sending one per request,
and a transient upstream failure (5xx, unreachable) is retried inside that one check, with
a short backoff, rather than answered to every client as a 503.
"""

from __future__ import annotations

import asyncio
import contextlib

from gateway.clock import Clock
from gateway.errors import BucketNotEmpty, InvalidBucketName, S3Error, SlowDown
from gateway.fleet.view import FleetView
from gateway.models import BucketInfo
from gateway.store.blobs import BlobStore
from gateway.store.buckets import BucketRecords
from gateway.store.journal import Journal
from gateway.upstream.client import Upstream

_DELETE_WAIT_S = 10.0
_CHECK_TRIES = 6  # a transient failure of the first check: retried after 0.05 s, 0.1 s, ...
_CHECK_FIRST_DELAY_S = 0.05


class BucketService:
    """Contract: ``require`` MUST raise NoSuchBucket for a bucket the upstream does not have
    (first use asks the upstream; later uses are answered from the journal). CreateBucket and
    DeleteBucket are passed upstream; DeleteBucket MUST refuse while objects are unflushed,
    here or, in a fleet, on any other node (one that does not answer: SlowDown)."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        clock: Clock,
        fleet: FleetView | None = None,
    ) -> None:
        self._fleet = fleet
        self._journal = journal
        self._records = BucketRecords(journal)
        self._blobs = blobs
        self._upstream = upstream
        self._clock = clock
        self._known: set[str] = set()
        self._checks: dict[str, asyncio.Task[None]] = {}  # first checks in progress

    async def require(self, bucket: str) -> None:
        validate_bucket_name(bucket)
        if bucket in self._known:
            return
        check = self._checks.get(bucket)
        if check is None:
            check = asyncio.create_task(self._check(bucket), name=f"bucket check {bucket}")
            self._checks[bucket] = check
            check.add_done_callback(lambda done: self._check_done(bucket, done))
        # Shielded: a client that goes away does not cancel the check the others wait for.
        await asyncio.shield(check)

    def _check_done(self, bucket: str, check: asyncio.Task[None]) -> None:
        if self._checks.get(bucket) is check:
            del self._checks[bucket]
        if not check.cancelled():
            check.exception()  # retrieved here too, in case every waiter went away

    async def _check(self, bucket: str) -> None:
        """Known from the journal, else one HeadBucket (transient failures retried)."""
        if not await self._records.known_bucket(bucket):
            delay_s = _CHECK_FIRST_DELAY_S
            for attempt in range(1, _CHECK_TRIES + 1):
                try:
                    await self._upstream.head_bucket(bucket)
                    break
                except S3Error as exc:
                    if exc.status < 500 or attempt == _CHECK_TRIES:
                        raise  # NoSuchBucket, AccessDenied ...: every waiter gets it
                await asyncio.sleep(delay_s)
                delay_s *= 2
            await self._records.remember_bucket(BucketInfo(bucket, self._clock.wall()))
        self._known.add(bucket)

    async def close(self) -> None:
        """Cancel first checks still running (shutdown)."""
        for check in list(self._checks.values()):
            check.cancel()
            with contextlib.suppress(BaseException):
                await check

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
        if self._fleet is not None:  # nor on any other node of the fleet
            elsewhere = await self._fleet.unflushed_elsewhere(bucket)
            if elsewhere is None:
                raise SlowDown(
                    "A gateway of the fleet could not be asked whether it holds writes in "
                    "this bucket; retry shortly."
                )
            if elsewhere:
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
