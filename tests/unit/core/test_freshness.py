"""Copies of flushed versions in a fleet (core/freshness.py): checked against the bucket
once another node may have written their key, dropped when stale, trusted in between;
and checked after the peers were asked (core/objects.py)."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import FakeUpstream

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.core.freshness import FreshRows
from gateway.core.objects import ObjectService
from gateway.errors import NoSuchKey, ServiceUnavailable
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore
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


async def _copy(journal: Journal, body: bytes) -> None:
    """A durable row of ``body`` (a read-through copy)."""
    meta = ObjectMeta(BUCKET, KEY, len(body), hashlib.md5(body).hexdigest(), 1.0)
    journal.watch(BUCKET, KEY)
    assert await journal.commit_cached(meta, "b" * 32, 1.0)
    journal.unwatch(BUCKET, KEY)


@dataclass
class _Case:
    rows: FreshRows
    upstream: _CountingUpstream
    fleet: _Fleet
    clock: FakeClock
    blobs: _Blobs


async def _case(
    journal: Journal, *, copy: bytes, bucket: bytes | None, alone: bool = False
) -> _Case:
    """A copy of ``copy`` here, ``bucket`` in the bucket (None: no object there)."""
    upstream, fleet, clock, blobs = _CountingUpstream(), _Fleet(), FakeClock(), _Blobs()
    if bucket is not None:
        upstream.add_object(BUCKET, KEY, bucket)
    await _copy(journal, copy)
    rows = FreshRows(journal, upstream, blobs, clock, None if alone else fleet)  # type: ignore[arg-type]
    return _Case(rows, upstream, fleet, clock, blobs)


async def test_a_copy_is_checked_once_then_trusted_until_its_key_may_have_changed(
    journal: Journal,
) -> None:
    c = await _case(journal, copy=b"one", bucket=b"one")
    rows, upstream, fleet = c.rows, c.upstream, c.fleet
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 1
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 1
    fleet.stale_since_s = c.clock.monotonic() + 1  # a peer announced the directory since
    c.clock.advance(2)
    assert (await rows.get(BUCKET, KEY)) is not None and upstream.heads == 2
    fleet.holders = ["b"]  # a peer may hold an unflushed version: checked every time
    await rows.get(BUCKET, KEY)
    await rows.get(BUCKET, KEY)
    assert upstream.heads == 4


async def test_a_stale_copy_is_dropped_and_its_blobs_discarded(journal: Journal) -> None:
    c = await _case(journal, copy=b"one", bucket=b"two")  # another node's version
    assert await c.rows.get(BUCKET, KEY) is None
    assert await journal.get(BUCKET, KEY) is None and c.blobs.discarded == ["b" * 32]


async def test_a_copy_of_a_key_deleted_since_is_dropped(journal: Journal) -> None:
    c = await _case(journal, copy=b"one", bucket=None)
    assert await c.rows.get(BUCKET, KEY) is None and await journal.get(BUCKET, KEY) is None


async def test_in_an_outage_the_copy_is_served_unchecked_and_checked_later(
    journal: Journal,
) -> None:
    c = await _case(journal, copy=b"one", bucket=b"two")
    c.upstream.down = True
    assert await c.rows.get(BUCKET, KEY) is not None
    c.upstream.down = False
    assert await c.rows.get(BUCKET, KEY) is None


async def test_alone_a_copy_is_never_checked(journal: Journal) -> None:
    c = await _case(journal, copy=b"one", bucket=None, alone=True)
    assert await c.rows.get(BUCKET, KEY) is not None and c.upstream.heads == 0


class _FlushingPeer(_Fleet):
    """One candidate holding a delete of KEY unflushed, which it flushes (the bucket loses
    KEY) while this node asks it: then it answers that it holds nothing."""

    def __init__(self, upstream: FakeUpstream) -> None:
        super().__init__()
        self.holders = ["c"]
        self.stale_since_s = float("inf")  # a copy is always checked
        self._upstream = upstream

    def replica_candidates(self, bucket: str, key: str) -> Sequence[str]:
        return []

    async def read(self, node: str, bucket: str, key: str, *args: object, **kw: object) -> None:
        await self._upstream.delete_object(bucket, key)
        self.holders = []


async def test_a_read_asks_the_peers_before_it_checks_its_copy(
    journal: Journal, tmp_path: Path
) -> None:
    """The copy here is checked against the bucket after the peers are asked: a version a
    peer flushes in between is found in the bucket. In the other order the copy was
    checked first (the bucket still held it), the peer then held nothing, and the copy
    was served over the delete (found by loadtest/fleet_soak.py)."""
    upstream = _CountingUpstream()
    upstream.add_object(BUCKET, KEY, b"one")
    await _copy(journal, b"one")
    clock, blobs = FakeClock(), BlobStore(tmp_path / "blobs", fsync=False)
    blobs.open_store()
    objects = ObjectService(
        journal,
        blobs,
        upstream,
        BucketService(journal, blobs, upstream, clock),
        clock,
        max_object_bytes=1 << 20,
        fleet=_FlushingPeer(upstream),  # type: ignore[arg-type]
    )
    with pytest.raises(NoSuchKey):
        await objects.head_object(BUCKET, KEY)
    assert await journal.get(BUCKET, KEY) is None  # the copy was dropped as stale


class _Overtaken:
    """``RecoveredVersions`` with a fixed answer (None: the bucket cannot say)."""

    def __init__(self, answer: bool | None) -> None:
        self.answer = answer
        self.asked = 0

    async def superseded(self, row: LocalObject) -> bool:
        self.asked += 1
        if self.answer is None:
            raise ServiceUnavailable()
        return self.answer


@pytest.mark.parametrize(("answer", "served"), [(True, False), (False, True), (None, True)])
async def test_an_unflushed_version_from_before_the_start_is_served_only_if_not_overtaken(
    journal: Journal, answer: bool | None, served: bool
) -> None:
    """Overtaken while this node was down (fleet/recovered.py): neither reads here nor
    peers' reads get it; when the bucket cannot say, it is served (the newest but for
    that)."""
    meta = ObjectMeta(BUCKET, KEY, 3, hashlib.md5(b"old").hexdigest(), 1.0)
    row = LocalObject(meta, 7, FlushState.PENDING, "b" * 32, acked_s=1.0)
    looks = _Overtaken(answer)
    fresh = FreshRows(journal, _CountingUpstream(), _Blobs(), FakeClock(), _Fleet(), looks)  # type: ignore[arg-type]
    assert (await fresh.after_peers(row) is row) is served
    assert (await fresh.unflushed(row) is row) is served and looks.asked == 2
    alone = FreshRows(journal, _CountingUpstream(), _Blobs(), FakeClock(), None, looks)  # type: ignore[arg-type]
    assert await alone.after_peers(row) is row and looks.asked == 2  # no fleet: nothing to ask
