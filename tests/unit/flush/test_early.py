"""Early multipart uploads: MultipartService (the client's side) connected to the Flusher's
EarlyUploads as app.py connects them, over a real Journal and BlobStore, FakeUpstream and a
FakeClock. Parts reach the upstream before the client's Complete; the Complete is sent at
the row's flush with the chosen parts; aborts, re-uploads, newer versions and restarts
leave no upstream upload behind and never a wrong object.

Nothing sleeps: tests await the fake upstream's changes (``FakeUpstream.until``) and the
journal's (``until_changed``), always with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeUpstream, RequestBody, until_changed
from flowkit import fixed_gate

from gateway.clock import FakeClock
from gateway.core.buckets import BucketService
from gateway.core.multipart import CompletedPart, MultipartService, multipart_etag
from gateway.flush.backoff import Backoff
from gateway.flush.flusher import Flusher
from gateway.flush.policy import PolicyConfig
from gateway.models import FlushState, ObjectMeta, PutRequest
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.records import UpstreamUploadRecords
from gateway.store.uploads import Part, UploadJournal
from gateway.upstream.classify import Throttled

BUCKET = "ckpt"
KEY = "ckpt/step_1/rank_0/shard.bin"
WAIT_S = 5.0
BODIES = [bytes([65 + i]) * (3000 + 1000 * i) for i in range(4)]  # four distinct parts


class _TickingClock(FakeClock):
    """Monotonic time moves a millisecond per reading: a budget cut by a throttle refills
    while the test waits (a frozen clock would hold the retried parts for ever)."""

    def monotonic(self) -> float:
        self.advance(0.001)
        return super().monotonic()


class World:
    """A journal, blobs, the fake upstream, a flusher and the client's MultipartService
    connected to it (what app.py does with --early-multipart on)."""

    def __init__(self, root: Path, clock: FakeClock | None = None, **flusher: Any) -> None:
        self.root = root
        self.clock = clock or _TickingClock()
        self.blobs = BlobStore(root / "data", fsync=False)
        self.blobs.open_store()
        self.journal = Journal(root / "journal.db", fsync=False)
        self.journal.open()
        self.upstream = FakeUpstream([BUCKET])
        self.flusher_args = flusher
        self.connect()

    def connect(self) -> None:
        """A new flusher and service over the same journal (what a restart makes)."""
        backoff = Backoff(base_s=0.001, cap_s=0.01, rng=random.Random(1))
        self.flusher = Flusher(
            self.journal,
            self.blobs,
            self.upstream,
            self.clock,
            gate=fixed_gate(self.clock, backoff=backoff),
            backoff=backoff,
            **self.flusher_args,
        )
        self.multipart = MultipartService(
            UploadJournal(self.journal),
            self.blobs,
            BucketService(self.journal, self.blobs, self.upstream, self.clock),
            self.clock,
            max_part_bytes=1 << 20,
            min_part_bytes=1,
            upstream=self.upstream,
            listener=self.flusher.early,
        )

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self.flusher.run(), name="test flusher")
        try:
            yield
        finally:
            await self.flusher.stop(1.0)
            await asyncio.wait_for(task, WAIT_S)

    async def create(self, key: str = KEY) -> str:
        return await self.multipart.create(BUCKET, key, "application/x", {"a": "1"}, {})

    async def part(self, upload_id: str, number: int, data: bytes, key: str = KEY) -> Part:
        req = PutRequest(BUCKET, key, "application/x", {}, {}, len(data))
        return await self.multipart.upload_part(req, upload_id, number, RequestBody(data))

    async def complete(self, upload_id: str, parts: list[Part], key: str = KEY) -> ObjectMeta:
        chosen = [CompletedPart(p.part_number, p.etag) for p in parts]
        return await self.multipart.complete(BUCKET, key, upload_id, chosen)

    def upstream_parts(self, upload_id: str) -> dict[int, bytes]:
        return {n: data for n, (data, _) in self.upstream.upload_parts.get(upload_id, {}).items()}

    async def drained(self) -> None:
        async def check() -> bool:
            unflushed = await self.journal.unflushed(None, "", self.journal.last_seq)
            return unflushed == (0, 0)

        await until_changed(self.journal, check, WAIT_S)

    async def records(self) -> list[tuple[str, str, str]]:
        return await UpstreamUploadRecords(self.journal).upstream_uploads()

    def close(self) -> None:
        self.journal.close()
        self.blobs.close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    w = World(tmp_path)
    yield w
    w.close()


async def _parts_landed(world: World, upstream_id: str, count: int) -> None:
    await world.upstream.until(lambda: len(world.upstream_parts(upstream_id)) == count)


async def test_parts_go_up_before_the_complete_and_only_the_complete_follows(
    world: World,
) -> None:
    async with world.running():
        upload_id = await world.create()
        parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:3], 1)]
        await _parts_landed(world, "early-1", 3)
        # Every part is upstream, nothing is visible in the bucket, and the sweep of
        # abandoned uploads leaves an early upload in use alone.
        assert world.upstream_parts("early-1") == dict(enumerate(BODIES[:3], 1))
        assert world.upstream.keys(BUCKET) == []
        await world.flusher._abort_abandoned_uploads()
        assert world.upstream.aborted == []
        assert await world.records() == [("early-1", BUCKET, KEY)]

        meta = await world.complete(upload_id, parts)
        await world.drained()

    assert [r for r in world.upstream.log if r[0] != "head_bucket"] == [
        ("create_multipart", BUCKET, KEY),
        *[("upload_part", BUCKET, KEY)] * 3,
        ("complete_multipart", BUCKET, KEY),
    ]
    assert world.upstream.body(BUCKET, KEY) == b"".join(BODIES[:3])
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert meta.etag == multipart_etag([p.etag for p in parts])
    row = await world.journal.get(BUCKET, KEY)
    assert row is not None and row.state == FlushState.DURABLE
    assert await world.records() == []
    assert world.upstream.open_uploads == {}


async def test_complete_with_a_subset_lists_only_the_chosen_parts(world: World) -> None:
    async with world.running():
        upload_id = await world.create()
        parts = [
            await world.part(upload_id, n, b) for n, b in zip((1, 3, 5, 9), BODIES, strict=True)
        ]
        await _parts_landed(world, "early-1", 4)
        chosen = [parts[0], parts[2], parts[3]]  # numbers 1, 5, 9: not contiguous
        meta = await world.complete(upload_id, chosen)
        await world.drained()

    assert world.upstream.body(BUCKET, KEY) == BODIES[0] + BODIES[2] + BODIES[3]
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert meta.etag == multipart_etag([p.etag for p in chosen])
    assert len(world.upstream.ops("upload_part")) == 4  # nothing sent twice
    assert world.upstream.open_uploads == {} and await world.records() == []


async def test_a_reuploaded_part_is_sent_after_the_older_send_and_wins(world: World) -> None:
    gate = asyncio.Event()
    world.upstream.part_gate = gate
    async with world.running():
        upload_id = await world.create()
        first = await world.part(upload_id, 1, BODIES[0])
        old = await world.part(upload_id, 2, b"old bytes of part two")
        await world.upstream.until(lambda: len(world.upstream.ops("upload_part")) == 2)
        # Both sends are in flight (held by the gate); the client sends part 2 again.
        new = await world.part(upload_id, 2, b"NEW bytes of part two, longer")
        assert len(world.upstream.ops("upload_part")) == 2  # the re-send waits its turn
        gate.set()
        await world.upstream.until(
            lambda: world.upstream_parts("early-1").get(2) == b"NEW bytes of part two, longer"
        )
        assert len(world.upstream.ops("upload_part")) == 3
        assert old.etag != new.etag
        meta = await world.complete(upload_id, [first, new])
        await world.drained()

    assert world.upstream.body(BUCKET, KEY) == BODIES[0] + b"NEW bytes of part two, longer"
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert world.upstream.part_overlaps == []  # the two sends of part 2 never overlapped
    assert world.upstream.open_uploads == {} and await world.records() == []


async def test_a_part_the_upstream_holds_differently_is_never_completed(world: World) -> None:
    """If the upstream's part is not the one recorded (an older send that landed late),
    S3's completion refuses the listed ETag: the early upload is aborted and the object
    goes up anew, never as a wrong object."""
    async with world.running():
        upload_id = await world.create()
        parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
        await _parts_landed(world, "early-1", 2)
        world.upstream.upload_parts["early-1"][2] = (b"stale", "0" * 32)
        meta = await world.complete(upload_id, parts)
        await world.drained()
    assert world.upstream.aborted == ["early-1"]
    assert len(world.upstream.ops("create_multipart")) == 2  # the early one, then anew
    assert world.upstream.body(BUCKET, KEY) == b"".join(BODIES[:2])
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert world.upstream.open_uploads == {} and await world.records() == []


async def test_a_client_abort_aborts_the_upstream_upload(world: World) -> None:
    async with world.running():
        upload_id = await world.create()
        for n, body in enumerate(BODIES[:2], 1):
            await world.part(upload_id, n, body)
        await _parts_landed(world, "early-1", 2)
        await world.multipart.abort(BUCKET, KEY, upload_id)
        await asyncio.wait_for(world.flusher.early.wait_idle(), WAIT_S)
        assert world.upstream.open_uploads == {} and await world.records() == []
    assert world.upstream.aborted == ["early-1"]
    assert world.upstream.keys(BUCKET) == []
    assert world.upstream.ops("complete_multipart") == []


async def test_an_object_superseded_before_its_flush_aborts_its_early_upload(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, policy=PolicyConfig(write_back_delay_s=100.0))
    try:
        async with world.running():
            upload_id = await world.create()
            parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
            await _parts_landed(world, "early-1", 2)
            await world.complete(upload_id, parts)
            # Overwritten within the write-back delay: the multipart version never flushes.
            newer = await world.create()
            last = await world.part(newer, 1, b"the newer version")
            await world.upstream.until(lambda: "early-2" in world.upstream.upload_parts)
            await _parts_landed(world, "early-2", 1)
            await world.complete(newer, [last])
            world.clock.advance(101.0)
            world.flusher.wake()
            await world.drained()
            await asyncio.wait_for(world.flusher.early.wait_idle(), WAIT_S)
        assert world.upstream.aborted == ["early-1"], world.upstream.log
        assert world.upstream.body(BUCKET, KEY) == b"the newer version"
        assert world.upstream.ops("complete_multipart") == [("complete_multipart", BUCKET, KEY)]
        assert world.upstream.open_uploads == {} and await world.records() == []
    finally:
        world.close()


async def test_a_restart_aborts_the_recorded_upload_and_the_object_still_lands(
    world: World,
) -> None:
    async with world.running():
        upload_id = await world.create()
        parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
        await _parts_landed(world, "early-1", 2)
    # Stopped with the upload open (as a kill leaves it): only the journal remembers it.
    assert await world.records() == [("early-1", BUCKET, KEY)]
    world.connect()  # a new process: nothing in memory
    async with world.running():
        await world.upstream.until(lambda: "early-1" not in world.upstream.open_uploads)
        parts.append(await world.part(upload_id, 3, BODIES[2]))  # a new early upload
        await _parts_landed(world, "early-2", 1)
        meta = await world.complete(upload_id, parts)
        await world.drained()

    assert world.upstream.aborted == ["early-1"]
    assert world.upstream.body(BUCKET, KEY) == b"".join(BODIES[:3])
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert world.upstream.open_uploads == {} and await world.records() == []


async def test_throttled_early_parts_are_retried_through_the_flow_control(
    tmp_path: Path,
) -> None:
    world = World(tmp_path, _TickingClock())
    world.upstream.fail_parts(Throttled("SlowDown (HTTP 503)"), Throttled("SlowDown (HTTP 503)"))
    async with world.running():
        upload_id = await world.create()
        parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
        await _parts_landed(world, "early-1", 2)  # before the Complete, despite the 503s
        status = world.flusher.status()
        assert (status.throttles, status.retries) == (2, 2)
        assert world.flusher.budget_status()[0].throttles == 2  # the bucket's budget heard
        await world.complete(upload_id, parts)
        await world.drained()
    assert world.upstream.body(BUCKET, KEY) == b"".join(BODIES[:2])
    assert len(world.upstream.ops("upload_part")) == 4
    world.close()


async def test_a_throttled_completion_keeps_the_early_upload_for_the_next_try(
    world: World,
) -> None:
    async with world.running():
        upload_id = await world.create()
        parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
        await _parts_landed(world, "early-1", 2)
        # More 503s than one request's tries: the row goes back to pending, and its next
        # try completes the same upstream upload (no part is sent again).
        world.upstream.fail_puts(*(Throttled("SlowDown (HTTP 503)") for _ in range(8)))
        meta = await world.complete(upload_id, parts)
        await world.drained()
    assert world.upstream.aborted == []
    assert len(world.upstream.ops("upload_part")) == 2
    assert len(world.upstream.ops("complete_multipart")) == 9
    assert world.upstream.buckets[BUCKET][KEY][1].etag == meta.etag
    assert world.upstream.body(BUCKET, KEY) == b"".join(BODIES[:2])


async def test_a_part_corrupted_on_disk_fails_the_object_visibly_and_aborts(
    world: World,
) -> None:
    upload_id = await world.create()  # the flusher is not running: nothing is sent yet
    parts = [await world.part(upload_id, n, b) for n, b in enumerate(BODIES[:2], 1)]
    path = world.blobs.path(parts[1].blob_id)
    with path.open("r+b") as f:  # one flipped byte, same size
        os.pwrite(f.fileno(), b"Z", 10)
    await world.complete(upload_id, parts)
    async with world.running():

        async def failed() -> bool:
            row = await world.journal.get(BUCKET, KEY)
            return row is not None and row.state == FlushState.FAILED

        await until_changed(world.journal, failed, WAIT_S)
        await world.upstream.until(lambda: world.upstream.open_uploads == {})
    row = await world.journal.get(BUCKET, KEY)
    assert row is not None and "local corruption" in (row.last_error or "")
    assert world.upstream.keys(BUCKET) == []
    assert world.upstream.aborted == ["early-1"]


@pytest.mark.parametrize("key", ["ckpt/step_1/.metadata.tmp", "ckpt/step_1/.metadata"])
async def test_temp_keys_and_commit_markers_are_not_started_early(world: World, key: str) -> None:
    """Held back on purpose (a temp key never reaches the bucket; no request for a marker
    leaves before its shards are durable): their parts wait for the object's own flush."""
    async with world.running():
        upload_id = await world.create(key)
        await world.part(upload_id, 1, BODIES[0], key)
        await asyncio.wait_for(world.flusher.early.wait_idle(), WAIT_S)
    assert [r for r in world.upstream.log if r[0] != "head_bucket"] == []
    assert world.flusher.early.open_count == 0
