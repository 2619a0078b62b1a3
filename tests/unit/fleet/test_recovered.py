"""A version acknowledged before its node's restart, against the bucket's (fleet/recovered.py):
dropped (and not served) only for another version written well after it, or one its
key's claims know of."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from gateway.errors import NoSuchKey, SlowDown
from gateway.fleet.recovered import NEWER_MARGIN_S, RecoveredVersions, newer_in_bucket
from gateway.models import FlushState, LocalObject, ObjectMeta

STARTED_S = 1000.0


class _Bucket:
    def __init__(self, there: ObjectMeta | None) -> None:
        self.there = there
        self.heads = 0

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        self.heads += 1
        if self.there is None:
            raise NoSuchKey(Key=key)
        return self.there


async def _send(call: Callable[[], Awaitable[ObjectMeta | None]]) -> ObjectMeta | None:
    return await call()


def _row(acked_s: float, etag: str = "mine", *, is_delete: bool = False) -> LocalObject:
    meta = ObjectMeta("b", "k", 1, etag, acked_s)
    return LocalObject(meta, 1, FlushState.PENDING, "blob", is_delete, acked_s=acked_s)


def _there(etag: str, written_s: float) -> ObjectMeta:
    return ObjectMeta("b", "k", 1, etag, written_s)


@pytest.mark.parametrize(
    ("row", "there", "newer"),
    [
        (_row(900.0), None, False),  # nothing there: it goes up
        (_row(900.0), _there("mine", 950.0), False),  # its own upload, before the crash
        (_row(900.0), _there("other", 900.0 + NEWER_MARGIN_S + 1), True),
        (_row(900.0), _there("other", 900.0 + NEWER_MARGIN_S - 1), False),  # within margin
        (_row(900.0), _there("other", 800.0), False),  # older than it
        (_row(900.0, "", is_delete=True), _there("other", 990.0), True),  # a newer PUT
        (_row(900.0, "", is_delete=True), _there("other", 800.0), False),
    ],
)
async def test_a_recovered_version_gives_way_only_to_a_later_one(
    row: LocalObject, there: ObjectMeta | None, newer: bool
) -> None:
    bucket = _Bucket(there)
    assert await newer_in_bucket(row, STARTED_S, bucket, _send) is newer  # type: ignore[arg-type]
    assert bucket.heads == 1


async def test_a_version_acknowledged_since_the_start_is_not_looked_at() -> None:
    bucket = _Bucket(_there("other", STARTED_S + 100))
    assert not await newer_in_bucket(_row(STARTED_S + 1), STARTED_S, bucket, _send)  # type: ignore[arg-type]
    assert bucket.heads == 0


async def test_reads_look_once_per_version_and_ask_the_claims_when_the_bucket_cannot_say() -> None:
    """A delete written meanwhile leaves nothing in the bucket to compare with: with
    replicas on, the key's claims decide. One look per version, shared by its readers."""
    bucket = _Bucket(None)
    asked: list[int] = []

    async def claimed_newer(obj: LocalObject) -> bool:
        asked.append(obj.seq)
        await asyncio.sleep(0)
        return True

    looks = RecoveredVersions(STARTED_S, bucket)  # type: ignore[arg-type]
    row = _row(900.0)
    assert not await looks.superseded(row)  # no claims to ask: it is served
    looks = RecoveredVersions(STARTED_S, bucket)  # type: ignore[arg-type]
    looks.elsewhere = claimed_newer
    answers = await asyncio.gather(*(looks.superseded(row) for _ in range(3)))
    assert answers == [True, True, True] and asked == [1] and bucket.heads == 2
    assert not await looks.superseded(_row(STARTED_S + 1))  # since the start: no look
    assert bucket.heads == 2


async def test_a_look_that_failed_is_not_remembered() -> None:
    class _Down(_Bucket):
        async def head_object(self, bucket: str, key: str) -> ObjectMeta:
            self.heads += 1
            if self.heads == 1:
                raise SlowDown()
            return await super().head_object(bucket, key)

    bucket = _Down(_there("other", 990.0))
    looks = RecoveredVersions(STARTED_S, bucket)  # type: ignore[arg-type]
    with pytest.raises(SlowDown):
        await looks.superseded(_row(900.0))
    assert await looks.superseded(_row(900.0))
    heads = bucket.heads
    assert await looks.superseded(_row(900.0)) and bucket.heads == heads  # remembered now


async def test_with_no_object_in_the_bucket_a_noted_delete_decides() -> None:
    """The bucket keeps nothing of a delete: with no object there, a PUT acknowledged
    before the restart gives way to a delete noted after it (DeleteNotes); a delete of
    its own asks nothing."""
    asked: list[float] = []

    async def deleted_after(obj: LocalObject) -> bool:
        asked.append(obj.acked_s)
        return obj.acked_s < 950.0

    empty = _Bucket(None)
    assert await newer_in_bucket(_row(900.0), STARTED_S, empty, _send, deleted_after)  # type: ignore[arg-type]
    assert not await newer_in_bucket(_row(960.0), STARTED_S, empty, _send, deleted_after)  # type: ignore[arg-type]
    gone = _row(900.0, "", is_delete=True)
    assert not await newer_in_bucket(gone, STARTED_S, empty, _send, deleted_after)  # type: ignore[arg-type]
    there = _Bucket(_there("mine", 950.0))
    assert not await newer_in_bucket(_row(900.0), STARTED_S, there, _send, deleted_after)  # type: ignore[arg-type]
    assert asked == [900.0, 960.0]
