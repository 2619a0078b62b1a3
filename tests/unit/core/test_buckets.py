"""BucketService.require: the first burst into a bucket not seen yet costs one upstream
check (single flight), a transient failure of it is retried instead of answered to every
client, and a missing bucket is reported to every waiter (and asked again later)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import FakeUpstream

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.errors import NoSuchBucket, ServiceUnavailable
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal


class GatedUpstream(FakeUpstream):
    """HeadBucket held until ``gate`` is set; ``faults`` raised first, one per call."""

    def __init__(self, buckets: list[str]) -> None:
        super().__init__(buckets)
        self.gate = asyncio.Event()
        self.gate.set()
        self.faults: list[Exception] = []

    async def head_bucket(self, bucket: str) -> None:
        await self.gate.wait()
        if self.faults:
            self.log.append(("head_bucket", bucket, ""))
            raise self.faults.pop(0)
        await super().head_bucket(bucket)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Journal, BlobStore]]:
    journal = Journal(tmp_path / "journal.db", fsync=False)
    journal.open()
    blobs = BlobStore(tmp_path, fsync=False)
    blobs.open_store()
    yield journal, blobs
    blobs.close()
    journal.close()


def _heads(upstream: FakeUpstream) -> int:
    return len(upstream.ops("head_bucket"))


async def test_first_burst_sends_one_check(stores: tuple[Journal, BlobStore]) -> None:
    journal, blobs = stores
    upstream = GatedUpstream(["fresh"])
    service = BucketService(journal, blobs, upstream, FakeClock())
    upstream.gate.clear()  # the check is slow: the whole burst arrives while it runs
    burst = [asyncio.create_task(service.require("fresh")) for _ in range(128)]
    await asyncio.sleep(0)
    upstream.gate.set()
    await asyncio.gather(*burst)
    assert _heads(upstream) == 1
    await service.require("fresh")
    assert _heads(upstream) == 1  # known from then on
    again = BucketService(journal, blobs, upstream, FakeClock())
    await again.require("fresh")  # a new process: the journal remembers it
    assert _heads(upstream) == 1


async def test_transient_failures_of_the_check_are_retried(
    stores: tuple[Journal, BlobStore],
) -> None:
    journal, blobs = stores
    upstream = GatedUpstream(["flaky"])
    upstream.faults = [ServiceUnavailable("upstream unavailable"), ServiceUnavailable("again")]
    service = BucketService(journal, blobs, upstream, FakeClock())
    await asyncio.gather(*(service.require("flaky") for _ in range(32)))  # nobody sees a 503
    assert _heads(upstream) == 3


async def test_missing_bucket_is_reported_to_every_waiter_and_asked_again_later(
    stores: tuple[Journal, BlobStore],
) -> None:
    journal, blobs = stores
    upstream = GatedUpstream([])
    service = BucketService(journal, blobs, upstream, FakeClock())
    results = await asyncio.gather(
        *(service.require("nope") for _ in range(16)), return_exceptions=True
    )
    assert all(isinstance(r, NoSuchBucket) for r in results)
    assert _heads(upstream) == 1
    await upstream.create_bucket("nope", None)
    await service.require("nope")  # not remembered as missing
    assert _heads(upstream) == 2


async def test_a_waiter_that_leaves_does_not_cancel_the_check(
    stores: tuple[Journal, BlobStore],
) -> None:
    journal, blobs = stores
    upstream = GatedUpstream(["bkt1"])
    service = BucketService(journal, blobs, upstream, FakeClock())
    upstream.gate.clear()
    first = asyncio.create_task(service.require("bkt1"))
    second = asyncio.create_task(service.require("bkt1"))
    await asyncio.sleep(0)
    first.cancel()  # that client went away
    upstream.gate.set()
    await second
    assert _heads(upstream) == 1
