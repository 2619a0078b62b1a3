"""Copies of flushed versions in a fleet (core/freshness.py): checked against the bucket
once another node may have written their key, dropped when stale, trusted in between."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fakes import FakeUpstream

from gateway.clock import FakeClock
from gateway.core.freshness import FreshRows
from gateway.errors import ServiceUnavailable
from gateway.models import ObjectMeta
from gateway.store.journal import Journal

BUCKET = "ckpt"
KEY = "step/shard"


class _Fleet:
    """What FreshRows asks of the fleet: when a copy may have gone stale, who may hold an
    unflushed version."""

    def __init__(self) -> None:
        self.stale_since_s = float("-inf")
        self.holders: list[str] = []

    def copies_stale_since(self, bucket: str, key: str) -> float:
        return self.stale_since_s

    def candidates(self, bucket: str, key: str) -> Sequence[str]:
        return self.holders


class _Blobs:
    def __init__(self) -> None:
        self.discarded: list[str] = []

    async def discard(self, blob_ids: Sequence[str]) -> None:
        self.discarded.extend(blob_ids)


class _CountingUpstream(FakeUpstream):
    def __init__(self) -> None:
        super().__init__([BUCKET])
        self.heads = 0
        self.down = False

    async def head_object(self, bucket: str, key: str) -> ObjectMeta:
        self.heads += 1
        if self.down:
            raise ServiceUnavailable()
        return await super().head_object(bucket, key)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db", fsync=False)
    j.open()
    yield j
    j.close()


async def _copy(journal: Journal, body: bytes) -> None:
    """A durable row of ``body`` (a read-through copy)."""
    meta = ObjectMeta(BUCKET, KEY, len(body), hashlib.md5(body).hexdigest(), 1.0)
    journal.watch(BUCKET, KEY)
    assert await journal.commit_cached(meta, "b" * 32, 1.0)
    journal.unwatch(BUCKET, KEY)


def _rows(journal: Journal, upstream: FakeUpstream, fleet: _Fleet | None) -> tuple:
    clock, blobs = FakeClock(), _Blobs()
    return FreshRows(journal, upstream, blobs, clock, fleet), clock, blobs  # type: ignore[arg-type]


async def test_a_copy_is_checked_once_then_trusted_until_its_key_may_have_changed(
    journal: Journal,
) -> None:
    upstream, fleet = _CountingUpstream(), _Fleet()
    upstream.add_object(BUCKET, KEY, b"one")
    await _copy(journal, b"one")
    rows, clock, _ = _rows(journal, upstream, fleet)
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 1
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 1
    fleet.stale_since_s = clock.monotonic() + 1  # a peer announced the directory since
    clock.advance(2)
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 2
    fleet.holders = ["b"]  # a peer may hold an unflushed version: checked every time
    await rows.get(BUCKET, KEY)
    await rows.get(BUCKET, KEY)
    assert upstream.heads == 4


async def test_a_stale_copy_is_dropped_and_its_blobs_discarded(journal: Journal) -> None:
    upstream, fleet = _CountingUpstream(), _Fleet()
    upstream.add_object(BUCKET, KEY, b"two")  # another node's version
    await _copy(journal, b"one")
    rows, _, blobs = _rows(journal, upstream, fleet)
    assert await rows.get(BUCKET, KEY) is None
    assert await journal.get(BUCKET, KEY) is None and blobs.discarded == ["b" * 32]


async def test_a_copy_of_a_key_deleted_since_is_dropped(journal: Journal) -> None:
    upstream, fleet = _CountingUpstream(), _Fleet()
    await _copy(journal, b"one")
    rows, _, _ = _rows(journal, upstream, fleet)
    assert await rows.get(BUCKET, KEY) is None and await journal.get(BUCKET, KEY) is None


async def test_in_an_outage_the_copy_is_served_unchecked_and_checked_later(
    journal: Journal,
) -> None:
    upstream, fleet = _CountingUpstream(), _Fleet()
    upstream.add_object(BUCKET, KEY, b"two")
    await _copy(journal, b"one")
    rows, _, _ = _rows(journal, upstream, fleet)
    upstream.down = True
    assert await rows.get(BUCKET, KEY) is not None
    upstream.down = False
    assert await rows.get(BUCKET, KEY) is None


async def test_alone_a_copy_is_never_checked(journal: Journal) -> None:
    upstream = _CountingUpstream()
    await _copy(journal, b"one")
    rows, _, _ = _rows(journal, upstream, None)
    assert await rows.get(BUCKET, KEY) is not None and upstream.heads == 0
