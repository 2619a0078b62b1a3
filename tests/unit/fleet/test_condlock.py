"""ConditionalLocks (gateway/fleet/condlock.py) over an in-memory bucket with S3's
conditional-write answers: one holder at a time, a released lock taken again, a dead
holder's lock taken once its lease (and the skew allowance) ran out, 409 after waiting, a
409 of the bucket retried."""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from gateway.clock import FakeClock
from gateway.errors import ConditionalRequestConflict
from gateway.fleet.condlock import LEASE_S, SKEW_S, ConditionalLocks
from gateway.upstream.classify import Retryable


class MemoryBucket:
    """put_if_absent / put_if_match / get_small as S3 answers them (an ETag is the MD5)."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.conflicts = 0  # the next PUTs answered 409 ConditionalRequestConflict

    async def put_if_absent(self, bucket: str, key: str, body: bytes) -> bool:
        await asyncio.sleep(0)  # a round trip: other writers run meanwhile
        if self.conflicts:
            self.conflicts -= 1
            raise Retryable("ConditionalRequestConflict (HTTP 409)")
        if key in self.objects:
            return False
        self.objects[key] = body
        return True

    async def put_if_match(self, bucket: str, key: str, body: bytes, etag: str) -> bool:
        await asyncio.sleep(0)
        found = self.objects.get(key)
        if found is None or hashlib.md5(found).hexdigest() != etag:
            return False
        self.objects[key] = body
        return True

    async def get_small(self, bucket: str, key: str) -> bytes | None:
        await asyncio.sleep(0)
        return self.objects.get(key)


class TickingClock(FakeClock):
    """Each look at the monotonic clock is a millisecond later (a waiter's loop ends)."""

    def monotonic(self) -> float:
        self.now_s += 0.001
        return self.now_s


def locks(
    bucket: MemoryBucket, node: str, clock: FakeClock, wait_s: float = 0.01
) -> ConditionalLocks:
    return ConditionalLocks(bucket, node, ".gateway/", clock, wait_s=wait_s)


async def test_one_holder_at_a_time_and_a_released_lock_is_taken_again() -> None:
    bucket, clock = MemoryBucket(), TickingClock()
    a, b = locks(bucket, "a", clock), locks(bucket, "b", clock)
    async with a.held("bkt", "k"):
        with pytest.raises(ConditionalRequestConflict):
            async with b.held("bkt", "k"):
                pytest.fail("b held the lock a holds")
        assert b.waits > 0
        async with b.held("bkt", "other key"):
            pass  # another key's lock is another object
    async with b.held("bkt", "k"):
        (name,) = [k for k in bucket.objects if k == b.lock_key("bkt", "k")]
        assert b'"holder": "b"' in bucket.objects[name]


async def test_concurrent_writers_hold_it_one_after_another() -> None:
    bucket, clock = MemoryBucket(), FakeClock()
    inside, most = 0, 0

    async def write(node: str) -> None:
        nonlocal inside, most
        async with locks(bucket, node, clock, wait_s=5.0).held("bkt", "k"):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.002)
            inside -= 1

    await asyncio.gather(*(write(n) for n in "abcdef"))
    assert most == 1


async def test_a_dead_holders_lock_is_taken_once_its_lease_and_the_skew_ran_out() -> None:
    bucket, clock = MemoryBucket(), TickingClock()
    dead = locks(bucket, "dead", clock)
    await dead._acquire("bkt", dead.lock_key("bkt", "k"))  # and never released
    clock.wall_s += LEASE_S
    with pytest.raises(ConditionalRequestConflict):
        async with locks(bucket, "b", clock).held("bkt", "k"):
            pass  # within the skew allowance: still the dead one's
    clock.wall_s += SKEW_S + 1
    async with locks(bucket, "b", clock).held("bkt", "k"):
        pass


async def test_a_409_of_the_bucket_is_tried_again() -> None:
    bucket, clock = MemoryBucket(), FakeClock()
    bucket.conflicts = 2
    async with locks(bucket, "a", clock, wait_s=5.0).held("bkt", "k"):
        assert bucket.conflicts == 0
