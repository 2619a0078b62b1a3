"""The flush engine end to end: temp tombstones, commit ordering, the rename dance, lane
isolation, large single PUTs as multipart, abandoned uploads, global rate limits.

A real Journal and BlobStore on tmp_path and the in-memory FakeUpstream. Time is a
FakeClock the tests move by hand (acked_s comes from the same clock); the flusher is woken
(``Flusher.wake``) after a move. Nothing sleeps except short polls.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pytest
from fakes import FakeUpstream, until_changed
from flowkit import FAST_FLOW, fixed_gate

from gateway.clock import FakeClock
from gateway.flush import gate as gate_module
from gateway.flush.backoff import Backoff
from gateway.flush.flusher import Flusher
from gateway.flush.lanes import LaneConfig, LaneStatus
from gateway.flush.policy import PolicyConfig
from gateway.models import FlushState, LocalObject, ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.records import UpstreamUploadRecords
from gateway.upstream.classify import Retryable, Throttled
from gateway.upstream.client import PartSource

BUCKET = "ckpt"
WAIT_S = 5.0
MiB = 1 << 20


class SteppingClock(FakeClock):
    """Wall time moves one second per reading: every backoff has expired by the next claim."""

    def wall(self) -> float:
        self.advance(1.0)
        return super().wall()


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    j = Journal(tmp_path / "journal.db", fsync=False)
    j.open()
    yield j
    j.close()


@pytest.fixture
def blobs(tmp_path: Path) -> Iterator[BlobStore]:
    store = BlobStore(tmp_path / "blobs", fsync=False, piece_bytes=MiB)
    store.open_store()
    yield store
    store.close()


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream([BUCKET])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _flusher(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: FakeClock,
    *,
    policy: PolicyConfig | None = None,
    multipart_threshold_bytes: int = 64 * MiB,
    **gate: Any,
) -> Flusher:
    """A flusher whose gate has a fixed window (``concurrency``, 8) and the ``gate``
    options of ``flowkit.fixed_gate``."""
    backoff = Backoff(base_s=0.001, cap_s=0.01, rng=random.Random(1))
    return Flusher(
        journal,
        blobs,
        upstream,
        clock,
        gate=fixed_gate(clock, backoff=backoff, **gate),
        backoff=backoff,
        policy=policy,
        multipart_threshold_bytes=multipart_threshold_bytes,
    )


_RUNNING: set[Flusher] = set()  # woken by _advance


@contextlib.asynccontextmanager
async def _running(flusher: Flusher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(flusher.run(), name="test flusher")
    _RUNNING.add(flusher)
    try:
        yield task
    finally:
        _RUNNING.discard(flusher)
        await flusher.stop(1.0)
        await asyncio.wait_for(task, WAIT_S)


async def _chunks(body: bytes, piece: int = MiB) -> AsyncIterator[bytes]:
    for i in range(0, len(body), piece):
        yield body[i : i + piece]


async def _write(
    journal: Journal, blobs: BlobStore, clock: FakeClock, key: str, body: bytes, age_s: float = 0.0
) -> LocalObject:
    """A PUT as ObjectService does it (blob, row, unlink the superseded blob), acked
    ``age_s`` seconds ago by ``clock``."""
    blob = await blobs.write(_chunks(body), {"md5"})
    acked_s = clock.wall() - age_s
    meta = ObjectMeta(
        bucket=BUCKET,
        key=key,
        size_bytes=blob.size_bytes,
        etag=blob.digests["md5"].hex(),
        last_modified_s=acked_s,
    )
    row, superseded = await journal.commit_put(meta, blob.blob_id, acked_s=acked_s)
    await blobs.discard(superseded)
    return row


async def _write_inline(journal: Journal, clock: FakeClock, key: str, body: bytes) -> None:
    """A small PUT whose body lives in the journal: its flush reads no file in a thread, so
    nothing but the flow control moves a virtual clock between its requests."""
    meta = ObjectMeta(
        bucket=BUCKET,
        key=key,
        size_bytes=len(body),
        etag=hashlib.md5(body).hexdigest(),
        last_modified_s=clock.wall(),
    )
    await journal.commit_put(meta, None, clock.wall(), body=body)


async def _delete(journal: Journal, blobs: BlobStore, clock: FakeClock, key: str) -> LocalObject:
    row, superseded = await journal.commit_delete(BUCKET, key, clock.wall())
    await blobs.discard(superseded)
    return row


async def _copy(
    journal: Journal, blobs: BlobStore, clock: FakeClock, source: str, target: str
) -> LocalObject:
    """CopyObject of a local source, as CopyService does it: hard links, then the row."""
    src = await journal.get(BUCKET, source)
    assert src is not None and not src.is_delete
    [linked] = await blobs.link(src.blob_ids)
    now = clock.wall()
    meta = dataclasses.replace(src.meta, key=target, last_modified_s=now)
    row, superseded = await journal.commit_copy(meta, linked, (), now)
    await blobs.discard(superseded)
    return row


async def _until(
    journal: Journal, check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S
) -> None:
    """Wait until ``check()`` holds, re-checked after every committed journal change."""
    await until_changed(journal, check, timeout_s)


async def _eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S) -> None:
    """Poll ``check()`` (for what the journal does not notify)."""

    async def wait() -> None:
        while not await check():
            await asyncio.sleep(0.002)

    await asyncio.wait_for(wait(), timeout_s)


async def _drained(journal: Journal) -> None:
    async def check() -> bool:
        return await journal.unflushed(None, "", journal.last_seq) == (0, 0)

    await _until(journal, check)


async def _attempts_are(journal: Journal, keys: list[str], attempts: int) -> None:
    async def check() -> bool:
        rows = [await journal.get(BUCKET, k) for k in keys]
        return all(r is not None and r.attempts == attempts for r in rows)

    await _until(journal, check)


def _advance(journal: Journal, clock: FakeClock, seconds: float) -> None:
    clock.advance(seconds)
    for flusher in _RUNNING:
        flusher.wake()  # the flusher's idle wait ends; it claims again


def _lane(flusher: Flusher, prefix: str) -> LaneStatus:
    [status] = [s for s in flusher.lane_status() if s.prefix == prefix]
    return status


class _VirtualTime:
    """Stands in for ``asyncio`` inside the flusher module: ``sleep(d)`` waits until the
    FakeClock reaches the caller's now + ``d``; ``tick()`` moves the clock to the earliest
    sleeper's deadline and wakes every sleeper due then. With ``frozen`` the clock never
    moves: a sleeper waits until the test ends."""

    def __init__(self, clock: FakeClock, *, frozen: bool = False) -> None:
        self.clock = self._clock = clock
        self._frozen = frozen
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._count = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        if delay <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._count += 1
        self._sleepers.append((self._clock.monotonic() + delay, self._count, future))
        await future

    def tick(self) -> bool:
        """Advance to the next deadline (False if nobody sleeps)."""
        live = [s for s in self._sleepers if not s[2].done()]
        if self._frozen or not live:
            return False
        due_s = min(s[0] for s in live)
        self._clock.advance(max(0.0, due_s - self._clock.monotonic()))
        for deadline_s, _, future in live:
            if deadline_s <= due_s:
                future.set_result(None)
        self._sleepers = [s for s in live if not s[2].done()]
        return True


class _TimedUpstream(FakeUpstream):
    """Records the clock reading at which each PUT was sent (``sent``), and each write
    request of any kind (``requests``: time and operation)."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__([BUCKET])
        self._clock = clock
        self.sent: list[tuple[float, str]] = []
        self.requests: list[tuple[float, str]] = []

    async def put_object(self, meta: ObjectMeta, body: BinaryIO | Path) -> str:
        self.sent.append((self._clock.monotonic(), meta.key))
        self.requests.append((self._clock.monotonic(), "put"))
        return await super().put_object(meta, body)

    async def create_multipart(self, meta: ObjectMeta) -> str:
        self.requests.append((self._clock.monotonic(), "create"))
        return await super().create_multipart(meta)

    async def upload_part(
        self, bucket: str, key: str, upload_id: str, part_number: int, part: PartSource
    ) -> str:
        self.requests.append((self._clock.monotonic(), "part"))
        return await super().upload_part(bucket, key, upload_id, part_number, part)

    async def complete_multipart(
        self, bucket: str, key: str, upload_id: str, parts: Sequence[tuple[int, str]]
    ) -> str:
        self.requests.append((self._clock.monotonic(), "complete"))
        return await super().complete_multipart(bucket, key, upload_id, parts)


async def _ticking(
    virtual: _VirtualTime,
    journal: Journal,
    check: Callable[[], Awaitable[bool]],
    timeout_s: float = WAIT_S,
) -> None:
    """Wait until ``check()`` holds, moving the virtual clock to the next sleeper whenever
    nothing else can happen (the flusher waits for tokens or a pause), or by 10 ms when
    nothing sleeps (a row's backoff runs on the journal's wall clock)."""

    async def wait() -> None:
        while not await check():
            await asyncio.sleep(0.002)
            if not virtual.tick():
                _advance(journal, virtual.clock, 0.01)

    await asyncio.wait_for(wait(), timeout_s)


def _durable(journal: Journal, keys: list[str]) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        rows = [await journal.get(BUCKET, k) for k in keys]
        return all(r is not None and r.state is FlushState.DURABLE for r in rows)

    return check


# -- (a) temp keys that never need to reach the upstream -----------------------------------


async def test_temp_key_put_then_deleted_while_held_sends_nothing(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    async with _running(_flusher(journal, blobs, upstream, clock)):
        await _write(journal, blobs, clock, "x.tmp", b"partial")  # held temp_hold_s (10 s)
        _advance(journal, clock, 5.0)
        await _delete(journal, blobs, clock, "x.tmp")
        await _drained(journal)

    assert upstream.log == []
    assert await journal.get(BUCKET, "x.tmp") is None  # the tombstone is gone too


async def test_temp_key_put_then_deleted_before_flush_sends_nothing_without_hold(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    policy = PolicyConfig(write_back_delay_s=0.0, temp_hold_s=0.0)
    flusher = _flusher(journal, blobs, upstream, clock, policy=policy)
    flusher.pause()
    async with _running(flusher):
        await _write(journal, blobs, clock, "d/x.tmp", b"partial")
        await _delete(journal, blobs, clock, "d/x.tmp")
        flusher.resume()
        await _drained(journal)

    assert upstream.log == []
    assert flusher.status().uploads_ok == 1  # the tombstone counts as done


async def test_delete_of_a_temp_key_flushed_before_is_sent(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    async with _running(_flusher(journal, blobs, upstream, clock)):
        await _write(journal, blobs, clock, "x.tmp", b"lived long", age_s=60.0)  # past the hold
        await _drained(journal)
        assert upstream.body(BUCKET, "x.tmp") == b"lived long"

        tomb = await _delete(journal, blobs, clock, "x.tmp")
        assert tomb.flushed_before
        await _drained(journal)

    assert upstream.log == [("put", BUCKET, "x.tmp"), ("delete", BUCKET, "x.tmp")]
    assert upstream.body(BUCKET, "x.tmp") is None


async def test_delete_of_a_temp_key_in_flight_is_sent_after_the_put(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    gate = upstream.put_gate = asyncio.Event()
    async with _running(_flusher(journal, blobs, upstream, clock)):
        await _write(journal, blobs, clock, "x.tmp", b"body", age_s=60.0)
        await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)
        tomb = await _delete(journal, blobs, clock, "x.tmp")
        assert tomb.flushed_before  # the put is being sent
        gate.set()
        await _drained(journal)

    assert upstream.log == [("put", BUCKET, "x.tmp"), ("delete", BUCKET, "x.tmp")]
    assert upstream.body(BUCKET, "x.tmp") is None


async def test_delete_of_a_non_temp_key_never_flushed_is_sent(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    # The key may exist upstream from before the gateway: only temp names are assumed not to.
    upstream.add_object(BUCKET, "y", b"from elsewhere")
    flusher = _flusher(journal, blobs, upstream, clock)
    flusher.pause()
    async with _running(flusher):
        await _write(journal, blobs, clock, "y", b"short-lived")
        tomb = await _delete(journal, blobs, clock, "y")
        assert not tomb.flushed_before
        flusher.resume()
        await _drained(journal)

    assert upstream.log == [("delete", BUCKET, "y")]
    assert upstream.body(BUCKET, "y") is None


class _StoresThenFails(FakeUpstream):
    """The first PUT of ``key`` reaches the bucket but its answer is lost (a timeout)."""

    def __init__(self, key: str) -> None:
        super().__init__([BUCKET])
        self._key = key
        self._failed = False

    async def put_object(self, meta: ObjectMeta, body: BinaryIO | Path) -> str:
        etag = await super().put_object(meta, body)
        if meta.key == self._key and not self._failed:
            self._failed = True
            raise Retryable("ReadTimeoutError: the response did not arrive")
        return etag


async def test_delete_of_a_temp_key_whose_put_was_attempted_is_sent(
    journal: Journal, blobs: BlobStore, clock: FakeClock
) -> None:
    upstream = _StoresThenFails("x.tmp")
    policy = PolicyConfig(write_back_delay_s=0.0, temp_hold_s=0.0)
    async with _running(_flusher(journal, blobs, upstream, clock, policy=policy)):
        await _write(journal, blobs, clock, "x.tmp", b"body")
        await _attempts_are(journal, ["x.tmp"], 1)  # backed off; the clock stands still
        assert upstream.body(BUCKET, "x.tmp") == b"body"
        await _delete(journal, blobs, clock, "x.tmp")
        await _drained(journal)

    assert upstream.body(BUCKET, "x.tmp") is None


# -- (b) commit ordering -------------------------------------------------------------------

SHARDS = [f"step_1/__{i}_0.distcp" for i in range(4)]
MARKER = "step_1/.metadata"


async def test_marker_is_put_after_shards_that_were_retried(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    clock = SteppingClock()
    upstream.fail_puts(
        Retryable("InternalError (HTTP 500)"), Retryable("SlowDown (HTTP 503)"), key=SHARDS[2]
    )
    flusher = _flusher(journal, blobs, upstream, clock)
    flusher.pause()
    async with _running(flusher):
        for key in SHARDS:
            await _write(journal, blobs, clock, key, key.encode() * 100, age_s=10.0)
        await _write(journal, blobs, clock, MARKER, b"{metadata}", age_s=10.0)
        flusher.resume()
        await _drained(journal)

    puts = [key for op, _, key in upstream.log if op == "put"]
    assert puts.count(SHARDS[2]) == 3
    assert puts[-1] == MARKER and puts.count(MARKER) == 1
    assert [key for _, key, _ in upstream.stored][-1] == MARKER


async def test_marker_is_not_sent_while_a_shard_is_in_flight(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    gate = upstream.put_gate = asyncio.Event()
    flusher = _flusher(journal, blobs, upstream, clock)
    flusher.pause()
    async with _running(flusher):
        for key in SHARDS:
            await _write(journal, blobs, clock, key, b"shard")
        await _write(journal, blobs, clock, MARKER, b"{metadata}")
        flusher.resume()

        async def shards_arrived() -> bool:
            return len(upstream.log) >= len(SHARDS)

        await _eventually(shards_arrived)
        # Claimed in the same round as the shards, the marker would have arrived with them.
        assert sorted(key for _, _, key in upstream.log) == sorted(SHARDS)
        marker = await journal.get(BUCKET, MARKER)
        assert marker is not None and marker.state is FlushState.PENDING
        gate.set()
        await _drained(journal)

    assert [key for _, _, key in upstream.log][-1] == MARKER
    assert [key for _, key, _ in upstream.stored][-1] == MARKER


async def test_marker_waits_for_a_failed_shard(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    from gateway.upstream.classify import Fatal

    upstream.fail_puts(Fatal("AccessDenied (HTTP 403)"), key=SHARDS[0])
    async with _running(_flusher(journal, blobs, upstream, clock)):
        for key in SHARDS[:2]:
            await _write(journal, blobs, clock, key, b"shard")
        await _write(journal, blobs, clock, MARKER, b"{metadata}")

        async def failed_and_other_durable() -> bool:
            first = await journal.get(BUCKET, SHARDS[0])
            second = await journal.get(BUCKET, SHARDS[1])
            return (
                first is not None
                and first.state is FlushState.FAILED
                and second is not None
                and second.state is FlushState.DURABLE
            )

        await _until(journal, failed_and_other_durable)
        assert MARKER not in [key for _, _, key in upstream.log]

        assert await FlushQueue(journal).retry_failed() == 1
        await _drained(journal)

    assert [key for _, _, key in upstream.log][-1] == MARKER


# -- (c) the DCP rename dance ---------------------------------------------------------------


async def test_rename_dance_uploads_only_the_final_marker(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    # torch.distributed.checkpoint's FileSystemWriter (through an S3 filesystem) finishes a
    # checkpoint with: write .metadata.tmp, then rename it over .metadata, i.e. DELETE
    # .metadata, COPY .metadata.tmp -> .metadata, DELETE .metadata.tmp.
    policy = PolicyConfig(write_back_delay_s=0.5, temp_hold_s=10.0)
    flusher = _flusher(journal, blobs, upstream, clock, policy=policy)
    t0 = clock.wall()
    async with _running(flusher):
        await _write(journal, blobs, clock, "p/.metadata.tmp", b"{the metadata}")

        # Past the write-back delay: the temp key is still held, until its hold ends.
        _advance(journal, clock, 0.6)
        assert flusher.order.next_due_s() == pytest.approx(t0 + 10.0)
        assert upstream.log == []

        await _delete(journal, blobs, clock, "p/.metadata")
        await _copy(journal, blobs, clock, "p/.metadata.tmp", "p/.metadata")
        await _delete(journal, blobs, clock, "p/.metadata.tmp")

        _advance(journal, clock, 1.0)
        await _drained(journal)

    assert upstream.log == [("put", BUCKET, "p/.metadata")]
    assert upstream.body(BUCKET, "p/.metadata") == b"{the metadata}"
    assert await journal.get(BUCKET, "p/.metadata.tmp") is None


async def test_rename_dance_after_shards_keeps_the_marker_last(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    policy = PolicyConfig(write_back_delay_s=0.5, temp_hold_s=10.0)
    flusher = _flusher(journal, blobs, upstream, clock, policy=policy)
    flusher.pause()
    async with _running(flusher):
        for key in SHARDS:
            await _write(journal, blobs, clock, key, b"shard")
        await _write(journal, blobs, clock, "step_1/.metadata.tmp", b"{meta}")
        await _delete(journal, blobs, clock, MARKER)
        await _copy(journal, blobs, clock, "step_1/.metadata.tmp", MARKER)
        await _delete(journal, blobs, clock, "step_1/.metadata.tmp")
        flusher.resume()
        _advance(journal, clock, 1.0)
        await _drained(journal)

    keys = [key for _, _, key in upstream.log]
    assert sorted(keys) == sorted([*SHARDS, MARKER])
    assert keys[-1] == MARKER


# -- (d) lane isolation ---------------------------------------------------------------------


async def test_throttled_lane_does_not_hold_back_other_lanes(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five hot keys are throttled three times each, five cold keys never: the cold ones are
    durable after one try each while the hot ones are still retried (the bucket's budget
    is cut, the virtual clock moves only when everything waits)."""
    virtual = _VirtualTime(clock)
    monkeypatch.setattr(gate_module, "asyncio", virtual)
    hot = [f"hot/{i}" for i in range(5)]
    cold = [f"cold/{i}" for i in range(5)]
    for key in hot:
        upstream.fail_puts(*(Throttled("SlowDown (HTTP 503)") for _ in range(3)), key=key)
    flusher = _flusher(journal, blobs, upstream, clock, lanes=LaneConfig(depth=1), concurrency=16)
    flusher.pause()
    async with _running(flusher):
        for key in hot + cold:
            await _write(journal, blobs, clock, key, key.encode())
        flusher.resume()
        await _ticking(virtual, journal, _durable(journal, cold))
        hot_rows = [await journal.get(BUCKET, k) for k in hot]
        assert all(r is not None and r.state is not FlushState.DURABLE for r in hot_rows)
        assert _lane(flusher, "cold/").throttles == 0
        [budget] = flusher.budget_status()
        assert budget.events >= 1 and budget.rate_per_s < FAST_FLOW.initial_per_s

        await _ticking(virtual, journal, _durable(journal, hot))

    for key in hot + cold:
        assert upstream.body(BUCKET, key) == key.encode()
    assert [upstream.ops("put").count(("put", BUCKET, k)) for k in cold] == [1] * 5
    assert [upstream.ops("put").count(("put", BUCKET, k)) for k in hot] == [4] * 5
    assert _lane(flusher, "hot/").throttles == 15
    assert flusher.status().throttles == 15


async def test_retry_after_pauses_only_its_lane(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    virtual = _VirtualTime(clock)
    monkeypatch.setattr(gate_module, "asyncio", virtual)
    upstream.fail_puts(Throttled("SlowDown", retry_after_s=30.0), key="hot/0")
    flusher = _flusher(journal, blobs, upstream, clock, lanes=LaneConfig(depth=1))
    async with _running(flusher):
        await _write(journal, blobs, clock, "hot/0", b"0")
        await _attempts_are(journal, ["hot/0"], 1)
        paused_until_s = clock.monotonic() + 30.0
        assert _lane(flusher, "hot/").paused_until_s == pytest.approx(paused_until_s)

        await _write(journal, blobs, clock, "hot/1", b"1")
        await _write(journal, blobs, clock, "cold/0", b"c")
        await _ticking(virtual, journal, _durable(journal, ["cold/0"]))
        assert clock.monotonic() < paused_until_s
        row = await journal.get(BUCKET, "hot/1")
        assert row is not None and row.state is FlushState.PENDING  # its lane is paused

        _advance(journal, clock, 30.0)
        await _ticking(virtual, journal, _durable(journal, ["hot/0", "hot/1"]))

    assert upstream.ops("put").count(("put", BUCKET, "hot/0")) == 2


# -- (e) large single PUTs go up as multipart -----------------------------------------------


async def test_single_put_above_threshold_goes_up_as_multipart(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    body = random.Random(7).randbytes(16 * MiB + 5)  # parts of 16 MiB and 5 bytes
    pieces = [body[: 16 * MiB], body[16 * MiB :]]
    joined = b"".join(hashlib.md5(p).digest() for p in pieces)
    expected_etag = f"{hashlib.md5(joined).hexdigest()}-2"
    recorded: list[tuple[str, str, str]] = []
    record = UpstreamUploadRecords.record_upstream_upload

    async def record_spy(
        records: UpstreamUploadRecords, upload_id: str, bucket: str, key: str, created_s: float
    ) -> None:
        recorded.append((upload_id, bucket, key))
        await record(records, upload_id, bucket, key, created_s)

    monkeypatch.setattr(UpstreamUploadRecords, "record_upstream_upload", record_spy)
    flusher = _flusher(journal, blobs, upstream, clock, multipart_threshold_bytes=MiB)
    async with _running(flusher):
        row = await _write(journal, blobs, clock, "big.pt", body)
        await _drained(journal)

    ops = [op for op, _, _ in upstream.log]
    assert ops == ["create_multipart", "upload_part", "upload_part", "complete_multipart"]
    assert upstream.multipart_parts[(BUCKET, "big.pt")] == [16 * MiB, 5]
    assert upstream.body(BUCKET, "big.pt") == body
    assert upstream.buckets[BUCKET]["big.pt"][1].etag == expected_etag
    # An intent before CreateMultipartUpload, then the upload's own row.
    assert [(u.startswith("intent:"), b, k) for u, b, k in recorded] == [
        (True, BUCKET, "big.pt"),
        (False, BUCKET, "big.pt"),
    ]
    assert await UpstreamUploadRecords(journal).upstream_uploads() == []  # forgotten once complete
    done = await journal.get(BUCKET, "big.pt")
    assert done is not None and (done.seq, done.state) == (row.seq, FlushState.DURABLE)
    # The local row keeps the ETag the client was given (MD5 of the body), which is not the
    # upstream's: see the report.
    assert done.meta.etag == hashlib.md5(body).hexdigest() != expected_etag
    assert flusher.status().uploads_ok == 1


async def test_single_put_at_the_threshold_is_a_plain_put(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    body = b"x" * 1000
    flusher = _flusher(journal, blobs, upstream, clock, multipart_threshold_bytes=len(body))
    async with _running(flusher):
        await _write(journal, blobs, clock, "exact", body)
        await _drained(journal)
    assert upstream.log == [("put", BUCKET, "exact")]


# -- (f) abandoned upstream uploads ---------------------------------------------------------


async def test_abandoned_upload_is_aborted_at_start(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    await UpstreamUploadRecords(journal).record_upstream_upload(
        "up-crashed", BUCKET, "big.pt", clock.wall()
    )
    async with _running(_flusher(journal, blobs, upstream, clock)):

        async def forgotten() -> bool:
            return await UpstreamUploadRecords(journal).upstream_uploads() == []

        await _eventually(forgotten)
        await _write(journal, blobs, clock, "after", b"flushes as usual")
        await _drained(journal)

    assert upstream.aborted == ["up-crashed"]
    assert upstream.log == [("abort_multipart", BUCKET, "big.pt"), ("put", BUCKET, "after")]


async def test_upload_created_but_not_recorded_is_found_by_its_intent(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream, clock: FakeClock
) -> None:
    """A kill between CreateMultipartUpload and recording its id leaves only the intent:
    the sweep aborts the open uploads of exactly that key (whatever their Initiated time:
    moto, for one, reports a constant), and nothing else."""
    now_s = clock.wall()
    await UpstreamUploadRecords(journal).record_upstream_upload(
        "intent:abc", BUCKET, "big.pt", now_s
    )
    upstream.open_uploads = {
        "lost": (BUCKET, "big.pt", 1_289_422_113.0),  # what the crash left (moto's date)
        "other-key": (BUCKET, "big.pt.1", now_s + 0.5),
        "other-prefix": (BUCKET, "big", now_s + 0.5),
    }
    async with _running(_flusher(journal, blobs, upstream, clock)):

        async def forgotten() -> bool:
            return await UpstreamUploadRecords(journal).upstream_uploads() == []

        await _eventually(forgotten)
    assert upstream.aborted == ["lost"]
    assert set(upstream.open_uploads) == {"other-key", "other-prefix"}


class _AbortUnreachable(FakeUpstream):
    def __init__(self) -> None:
        super().__init__([BUCKET])
        self.abort_calls = 0

    async def abort_multipart(self, bucket: str, key: str, upload_id: str) -> bool:
        self.abort_calls += 1
        return False


async def test_abandoned_upload_is_kept_when_the_abort_fails(
    journal: Journal, blobs: BlobStore, clock: FakeClock
) -> None:
    upstream = _AbortUnreachable()
    await UpstreamUploadRecords(journal).record_upstream_upload(
        "up-crashed", BUCKET, "big.pt", clock.wall()
    )
    async with _running(_flusher(journal, blobs, upstream, clock)):
        await _write(journal, blobs, clock, "k", b"v")
        await _drained(journal)  # the failed abort does not stop flushing
    assert upstream.abort_calls == 1
    assert await UpstreamUploadRecords(journal).upstream_uploads() == [
        ("up-crashed", BUCKET, "big.pt")
    ]


# -- (g) global and lane rate limits --------------------------------------------------------


class _RecordingSleep:
    """Stands in for ``asyncio`` inside the flusher module: ``sleep`` records the delay and
    returns at once (the FakeClock stands still, so no bucket refills meanwhile)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


@pytest.fixture
def sleeps(monkeypatch: pytest.MonkeyPatch) -> _RecordingSleep:
    recorder = _RecordingSleep()
    monkeypatch.setattr(gate_module, "asyncio", recorder)
    return recorder


async def _flush_all(
    flusher: Flusher, journal: Journal, blobs: BlobStore, clock: FakeClock, bodies: dict[str, bytes]
) -> None:
    flusher.pause()
    async with _running(flusher):
        for key, body in bodies.items():
            await _write(journal, blobs, clock, key, body)
        flusher.resume()
        await _drained(journal)


async def _timed_flush(
    monkeypatch: pytest.MonkeyPatch,
    journal: Journal,
    blobs: BlobStore,
    clock: FakeClock,
    bodies: dict[str, bytes],
    **options: Any,
) -> list[tuple[float, str]]:
    """Flush ``bodies`` on virtual time; each request's time (from the resume) and kind."""
    virtual = _VirtualTime(clock)
    monkeypatch.setattr(gate_module, "asyncio", virtual)
    upstream = _TimedUpstream(clock)
    flusher = _flusher(journal, blobs, upstream, clock, **options)
    flusher.pause()
    async with _running(flusher):
        for key, body in bodies.items():
            if len(body) < MiB:
                await _write_inline(journal, clock, key, body)
            else:
                await _write(journal, blobs, clock, key, body)
        flusher.resume()
        await _ticking(virtual, journal, _durable(journal, list(bodies)))
    # From the first request: the ticker may move the clock while the first claim is
    # still in the journal's thread (a loaded machine), which says nothing of the pacing.
    first_s = min(t for t, _ in upstream.requests)
    return [(t - first_s, op) for t, op in sorted(upstream.requests)]


async def test_global_request_rate_spaces_uploads(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = {f"k{i}": b"v" for i in range(4)}
    sent = await _timed_flush(
        monkeypatch, journal, blobs, clock, bodies, rate_per_s=10.0, rate_burst=1.0
    )
    assert [t for t, _ in sent] == pytest.approx([0.0, 0.1, 0.2, 0.3], abs=1e-6)


async def test_global_bandwidth_spaces_uploads(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    bodies = {f"k{i}": b"b" * 50 for i in range(4)}
    sent = await _timed_flush(
        monkeypatch, journal, blobs, clock, bodies, bandwidth_bytes_per_s=100
    )  # 100 bytes of burst: two at once, then one per half second
    assert [t for t, _ in sent] == pytest.approx([0.0, 0.0, 0.5, 1.0], abs=1e-6)


async def test_lane_limits_apply_per_lane(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--lane-rate 2`` (a burst of one second, 2 requests) is a hard cap per lane: each
    lane sends two at once and its third half a second later, whatever the budget allows."""
    virtual = _VirtualTime(clock)
    monkeypatch.setattr(gate_module, "asyncio", virtual)
    upstream = _TimedUpstream(clock)
    lanes = LaneConfig(depth=1, rate_per_s=2.0)
    flusher = _flusher(journal, blobs, upstream, clock, lanes=lanes)
    keys = [f"{lane}/{i}" for lane in ("a", "b") for i in range(3)]
    flusher.pause()
    async with _running(flusher):
        for key in keys:  # in the journal: no file read in a thread moves the clock
            await _write_inline(journal, clock, key, b"v")
        flusher.resume()
        await _ticking(virtual, journal, _durable(journal, keys))
    start_s = min(t for t, _ in upstream.sent)  # as in _timed_flush
    for lane in ("a", "b"):
        times = sorted(t - start_s for t, k in upstream.sent if k.startswith(lane))
        assert times == pytest.approx([0.0, 0.0, 0.5], abs=1e-6), (lane, times)


async def test_temp_tombstone_takes_no_tokens(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: FakeClock,
    sleeps: _RecordingSleep,
) -> None:
    flusher = _flusher(journal, blobs, upstream, clock, rate_per_s=1.0, rate_burst=1.0)
    flusher.pause()
    async with _running(flusher):
        await _write(journal, blobs, clock, "x.tmp", b"v")
        await _delete(journal, blobs, clock, "x.tmp")
        await _delete(journal, blobs, clock, "gone")
        flusher.resume()
        await _drained(journal)
    assert sleeps.delays == []  # one real delete, within the burst
    assert upstream.log == [("delete", BUCKET, "gone")]


async def test_multipart_upload_takes_a_token_per_request(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every request of a multipart flush goes through the gate and takes its own token
    when it is admitted: create (the burst), each part, the completion."""
    sent = await _timed_flush(
        monkeypatch,
        journal,
        blobs,
        clock,
        {"big": bytes(16 * MiB + 1)},
        rate_per_s=1.0,
        rate_burst=1.0,
        multipart_threshold_bytes=MiB,
    )
    assert [t for t, _ in sent] == pytest.approx([0.0, 1.0, 2.0, 3.0], abs=1e-6)
    assert [op for _, op in sent] == ["create", "part", "part", "complete"]


# -- (h) lane waits take no global slot and no global token ----------------------------------


def _most_in_window(times: list[float], window_s: float) -> int:
    times = sorted(times)
    return max(
        sum(1 for t in times[i:] if t <= start + window_s + 1e-9) for i, start in enumerate(times)
    )


async def test_global_rate_holds_when_lanes_hold_requests_back(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Global 2/s (burst 1); lanes at 0.5/s: four slow lanes of three objects and eight
    one-object lanes. Whatever the lanes do, no window sees more than the global bucket
    allows (a request held by its lane must not spend a global token it cannot use)."""
    virtual = _VirtualTime(clock)
    monkeypatch.setattr(gate_module, "asyncio", virtual)
    upstream = _TimedUpstream(clock)
    lanes = LaneConfig(depth=1, rate_per_s=0.5)
    flusher = _flusher(
        journal, blobs, upstream, clock, concurrency=32, lanes=lanes, rate_per_s=2.0, rate_burst=1.0
    )
    keys = [f"slow{lane}/{i}" for lane in range(4) for i in range(3)]
    keys += [f"fast{lane}/0" for lane in range(8)]
    flusher.pause()
    async with _running(flusher):
        for key in keys:
            await _write(journal, blobs, clock, key, b"v")
        flusher.resume()
        while len(upstream.sent) < len(keys):
            await asyncio.sleep(0.005)  # let every task reach its sleep or its send
            virtual.tick()
        await _drained(journal)
    times = [t for t, _ in upstream.sent]
    assert sorted(k for _, k in upstream.sent) == sorted(keys)
    for window_s in (0.5, 1.0, 2.0, 4.0):
        assert _most_in_window(times, window_s) <= 1 + 2.0 * window_s, window_s


async def test_upload_waiting_for_its_lane_leaves_its_global_slot(
    journal: Journal, blobs: BlobStore, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two global slots; a lane at 0.1/s with eight objects queued ahead of another lane's
    one. The clock never moves, so the slow lane's later uploads wait for good: the fast
    lane's object must still be sent (it may not queue behind their lane waits)."""
    monkeypatch.setattr(gate_module, "asyncio", _VirtualTime(clock, frozen=True))
    upstream = _TimedUpstream(clock)
    lanes = LaneConfig(depth=1, rate_per_s=0.1, concurrency=8)
    flusher = _flusher(journal, blobs, upstream, clock, concurrency=2, lanes=lanes)
    flusher.pause()
    async with _running(flusher):
        for i in range(8):
            await _write(journal, blobs, clock, f"slow/{i}", b"v")
        await _write(journal, blobs, clock, "fast/0", b"f")
        flusher.resume()

        async def fast_sent() -> bool:
            return any(k == "fast/0" for _, k in upstream.sent)

        await _eventually(fast_sent)
        # One slow upload used the lane's only token (which one depends on the order the
        # claimed uploads finish their MD5 pre-check in threads), then the fast lane's.
        sent = [k for _, k in upstream.sent]
        assert len(sent) == 2 and sent[0].startswith("slow/") and sent[1] == "fast/0", sent
        assert _lane(flusher, "slow/").in_flight == 7  # all waiting for tokens, no slot
