"""Flusher: a real Journal and BlobStore on tmp_path, the in-memory FakeUpstream.

Nothing here sleeps: tests await the journal's changes (``until_changed``), the fake's
events, or a wrapped ``FlushQueue.claim``, always with a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeUpstream, claim_pending, until_changed
from flowkit import fixed_gate

from gateway.clock import Clock, FakeClock, SystemClock
from gateway.flush.backoff import Backoff
from gateway.flush.flusher import Flusher
from gateway.flush.lanes import LaneConfig
from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.store.uploads import Part, Upload, UploadJournal
from gateway.upstream.classify import Fatal, Retryable, Throttled

# Flow control out of the way (flowkit.FAST_FLOW): these tests are about the write-back,
# not the rate; tests/unit/flush/test_admission.py, test_gate.py and tests/sim are.

BUCKET = "ckpt"


WAIT_S = 5.0


class SteppingClock(FakeClock):
    """Wall time moves one second per reading, so a retry's tiny backoff has always expired
    by the next claim and retries do not wait for the flusher's idle poll."""

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
    store = BlobStore(tmp_path / "blobs", fsync=False, piece_bytes=4096)
    store.open_store()
    yield store
    store.close()


@pytest.fixture
def upstream() -> FakeUpstream:
    return FakeUpstream([BUCKET])


def _backoff() -> Backoff:
    return Backoff(base_s=0.001, cap_s=0.01, rng=random.Random(1))


def _flusher(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    clock: Clock | None = None,
    concurrency: int = 4,
) -> Flusher:
    clock = clock or SystemClock()
    gate = fixed_gate(clock, concurrency=concurrency, backoff=_backoff())
    return Flusher(journal, blobs, upstream, clock, gate=gate, backoff=_backoff())


@contextlib.asynccontextmanager
async def _running(flusher: Flusher) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(flusher.run(), name="test flusher")
    try:
        yield task
    finally:
        await flusher.stop(1.0)
        await asyncio.wait_for(task, WAIT_S)


async def _chunks(body: bytes, piece: int = 3000) -> AsyncIterator[bytes]:
    for i in range(0, len(body), piece):
        yield body[i : i + piece]


async def _write(journal: Journal, blobs: BlobStore, key: str, body: bytes) -> LocalObject:
    """What ObjectService does for a PUT: blob first, then the row, then unlink the old blob."""
    blob = await blobs.write(_chunks(body), {"md5"})
    meta = ObjectMeta(
        bucket=BUCKET,
        key=key,
        size_bytes=blob.size_bytes,
        etag=blob.digests["md5"].hex(),
        last_modified_s=time.time(),
    )
    row, superseded = await journal.commit_put(meta, blob.blob_id, acked_s=time.time())
    await blobs.discard(superseded)
    return row


async def _until(
    journal: Journal, check: Callable[[], Awaitable[bool]], timeout_s: float = WAIT_S
) -> None:
    """Wait until ``check()`` holds, re-checking after every committed journal change."""
    await until_changed(journal, check, timeout_s)


async def _drained(journal: Journal, timeout_s: float = WAIT_S) -> None:
    async def check() -> bool:
        return await journal.unflushed(None, "", journal.last_seq) == (0, 0)

    await _until(journal, check, timeout_s)


async def _state_is(journal: Journal, key: str, state: FlushState) -> None:
    async def check() -> bool:
        row = await journal.get(BUCKET, key)
        return row is not None and row.state == state

    await _until(journal, check)


class _ClaimWatch:
    """Wraps ``FlushQueue.claim`` to report which seqs the flusher claimed (instrumentation
    only: the real claim runs unchanged). ``then`` runs after each non-empty claim."""

    def __init__(self, journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seqs: list[int] = []
        self.then: Callable[[list[LocalObject]], None] | None = None
        self._event = asyncio.Event()
        original = FlushQueue.claim

        async def claim(queue: FlushQueue, seqs: Sequence[int]) -> list[LocalObject]:
            rows = await original(queue, seqs)
            if rows:
                self.seqs += [r.seq for r in rows]
                self._event.set()
                if self.then is not None:
                    self.then(rows)
            return rows

        monkeypatch.setattr(FlushQueue, "claim", claim)

    async def wait_for_seq(self, seq: int) -> None:
        async def wait() -> None:
            while seq not in self.seqs:
                self._event.clear()
                await self._event.wait()

        await asyncio.wait_for(wait(), WAIT_S)


# -- the happy path -------------------------------------------------------------------------


async def test_flusher_uploads_exact_bytes_and_marks_durable(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    bodies = {
        "empty": b"",
        "small": b"hello",
        "run/1/shard-000": bytes(range(256)) * 40,  # several 4 KiB pieces
        "run/1/metadata.json": b'{"step": 1}',
    }
    flusher = _flusher(journal, blobs, upstream)
    async with _running(flusher):
        rows = {key: await _write(journal, blobs, key, body) for key, body in bodies.items()}
        await _drained(journal)

    for key, body in bodies.items():
        assert upstream.body(BUCKET, key) == body
        row = await journal.get(BUCKET, key)
        assert row is not None
        assert row.state == FlushState.DURABLE
        assert row.seq == rows[key].seq
        assert row.last_error is None
        assert blobs.path(row.blob_id or "").exists()  # the local copy stays as a cache
    assert sorted(upstream.ops("put")) == sorted(("put", BUCKET, k) for k in bodies)
    status = flusher.status()
    assert (status.uploads_ok, status.uploads_failed, status.retries) == (len(bodies), 0, 0)
    assert status.state == "stopped"
    stats = await journal.stats()
    assert stats.flushed_objects == len(bodies)
    assert stats.flushed_bytes == sum(len(b) for b in bodies.values())


async def test_flusher_uploads_rows_committed_before_it_started(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    await _write(journal, blobs, "early", b"before the flusher")

    async with _running(_flusher(journal, blobs, upstream)):
        await _drained(journal)

    assert upstream.body(BUCKET, "early") == b"before the flusher"


async def test_flusher_uploads_multipart_object_with_its_part_boundaries(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    bodies = [b"A" * 5000, b"B" * 7000, b"tail"]
    uploads = UploadJournal(journal)
    await uploads.create(Upload("up-1", BUCKET, "big.bin", time.time(), "application/x", {}, {}))
    refs = []
    for number, body in enumerate(bodies, 1):
        blob = await blobs.write(_chunks(body), {"md5"})
        md5 = blob.digests["md5"].hex()
        part = Part(number, blob.blob_id, blob.size_bytes, md5, {}, time.time())
        assert await uploads.put_part("up-1", part) == []
        refs.append(PartRef(blob.blob_id, blob.size_bytes, md5))
    joined = hashlib.md5(b"".join(hashlib.md5(b).digest() for b in bodies)).hexdigest()
    meta = ObjectMeta(
        bucket=BUCKET,
        key="big.bin",
        size_bytes=sum(len(b) for b in bodies),
        etag=f"{joined}-3",
        last_modified_s=time.time(),
        content_type="application/x",
    )

    async with _running(_flusher(journal, blobs, upstream)):
        row, unused = await uploads.complete("up-1", meta, tuple(refs), time.time())
        assert unused == []
        await _drained(journal)

    # One request per part, all in flight at once (the order they land in varies).
    ops = [op for op, _, _ in upstream.log]
    assert ops[0] == "create_multipart" and ops[-1] == "complete_multipart"
    assert sorted(ops[1:-1]) == ["upload_part"] * 3
    assert upstream.body(BUCKET, "big.bin") == b"".join(bodies)
    assert upstream.multipart_parts[(BUCKET, "big.bin")] == [len(b) for b in bodies]
    done = await journal.get(BUCKET, "big.bin")
    assert done is not None
    assert (done.seq, done.state, done.meta.etag) == (row.seq, FlushState.DURABLE, f"{joined}-3")


# -- deletes --------------------------------------------------------------------------------


async def test_flusher_applies_delete_upstream_and_drops_tombstone(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    upstream.add_object(BUCKET, "old.ckpt", b"stale")
    upstream.add_object(BUCKET, "kept", b"stays")

    async with _running(_flusher(journal, blobs, upstream)):
        await journal.commit_delete(BUCKET, "old.ckpt", time.time())
        await _drained(journal)

    assert upstream.body(BUCKET, "old.ckpt") is None
    assert upstream.body(BUCKET, "kept") == b"stays"
    assert upstream.log == [("delete", BUCKET, "old.ckpt")]
    assert await journal.get(BUCKET, "old.ckpt") is None


async def test_flusher_sends_only_the_delete_of_an_unflushed_put(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    flusher = _flusher(journal, blobs, upstream)
    flusher.pause()
    async with _running(flusher):
        await _write(journal, blobs, "tmp", b"short-lived")
        _, superseded = await journal.commit_delete(BUCKET, "tmp", time.time())
        assert len(superseded) == 1
        await blobs.discard(superseded)
        flusher.resume()
        await _drained(journal)

    assert upstream.log == [("delete", BUCKET, "tmp")]
    assert await journal.get(BUCKET, "tmp") is None


# -- transient failures ---------------------------------------------------------------------


async def test_flusher_retries_throttled_upload_then_succeeds(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    upstream.fail_puts(Throttled("SlowDown: Please reduce your request rate."), Throttled("503"))
    flusher = _flusher(journal, blobs, upstream, clock=SteppingClock())

    async with _running(flusher):
        await _write(journal, blobs, "hot/prefix", b"payload")
        await _drained(journal)

    assert upstream.body(BUCKET, "hot/prefix") == b"payload"
    assert upstream.ops("put") == [("put", BUCKET, "hot/prefix")] * 3
    status = flusher.status()
    assert (status.uploads_ok, status.uploads_failed) == (1, 0)
    assert (status.retries, status.throttles) == (2, 2)
    assert status.last_error is not None and "503" in status.last_error
    row = await journal.get(BUCKET, "hot/prefix")
    assert row is not None
    assert (row.state, row.attempts, row.last_error) == (FlushState.DURABLE, 2, None)


class _RecordingBackoff(Backoff):
    """Records the attempt count each retry delay was drawn for."""

    def __init__(self) -> None:
        super().__init__(base_s=0.001, cap_s=0.01, rng=random.Random(1))
        self.attempts: list[int] = []

    def delay_s(self, attempt: int, retry_after_s: float | None = None) -> float:
        self.attempts.append(attempt)
        return super().delay_s(attempt, retry_after_s)


async def test_flusher_throttle_retry_delay_does_not_grow_with_attempts(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    """A 503 is paced by the bucket's cut budget: the row's backoff stays at its first
    step. Other transient errors back off by the row's attempts as before."""
    upstream.fail_puts(
        Throttled("503"), Throttled("503"), Throttled("503"), Retryable("500"), Retryable("500")
    )
    backoff = _RecordingBackoff()
    clock = SteppingClock()  # budget cuts stay fast (FAST_FLOW's floor): only backoff matters
    gate = fixed_gate(clock, concurrency=4, backoff=backoff)
    flusher = Flusher(journal, blobs, upstream, clock, gate=gate, backoff=backoff)

    async with _running(flusher):
        await _write(journal, blobs, "hot/prefix", b"payload")
        await _drained(journal)

    assert upstream.body(BUCKET, "hot/prefix") == b"payload"
    assert backoff.attempts == [0, 0, 0, 3, 4]


async def test_flusher_retries_failed_delete(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    upstream.add_object(BUCKET, "x", b"1")
    upstream.fail_deletes(Retryable("InternalError: try again (HTTP 500)"))
    flusher = _flusher(journal, blobs, upstream, clock=SteppingClock())

    async with _running(flusher):
        await journal.commit_delete(BUCKET, "x", time.time())
        await _drained(journal)

    assert upstream.log == [("delete", BUCKET, "x")] * 2
    assert upstream.body(BUCKET, "x") is None
    assert (flusher.status().retries, flusher.status().throttles) == (1, 0)


async def test_flusher_waits_for_backoff_before_retrying(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    clock = FakeClock()
    upstream.fail_puts(Throttled("SlowDown", retry_after_s=0.005))
    flusher = _flusher(journal, blobs, upstream, clock=clock)

    async with _running(flusher):
        row = await _write(journal, blobs, "k", b"v")

        async def retried() -> bool:
            now = await journal.get(BUCKET, "k")
            return now is not None and now.attempts == 1

        await _until(journal, retried)
        # The wall clock stands still: the row is not eligible, nothing is sent again.
        for _ in range(3):
            flusher.wake()
            await asyncio.sleep(0)
        assert upstream.ops("put") == [("put", BUCKET, "k")]
        clock.advance(1.0)
        flusher.wake()
        await _drained(journal)

    assert upstream.ops("put") == [("put", BUCKET, "k")] * 2
    final = await journal.get(BUCKET, "k")
    assert final is not None and final.seq == row.seq and final.state == FlushState.DURABLE


# -- no busy loops (issue 13, item 4) ------------------------------------------------------


async def test_flusher_sleeps_while_its_lane_is_full(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    """One upload held in flight fills the lane: writes into it wake nobody, and the loop
    does not look again until the upload ends (counted rounds, no timing)."""
    upstream.put_gate = asyncio.Event()
    clock = SystemClock()
    gate = fixed_gate(clock, flow=None, lanes=LaneConfig(concurrency=1))
    flusher = Flusher(journal, blobs, upstream, clock, gate=gate, backoff=_backoff())
    async with _running(flusher):
        await _write(journal, blobs, "lane/first", b"held")
        await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)
        await _write(journal, blobs, "lane/second", b"x")  # the loop settles meanwhile
        rounds = flusher.claim_rounds
        for i in range(50):
            await _write(journal, blobs, f"lane/more-{i}", b"x")
            for _ in range(5):
                await asyncio.sleep(0)  # every chance to spin
        assert flusher.claim_rounds == rounds
        upstream.put_gate.set()
        await _drained(journal)
    # After the gate: one round per upload that ended, each handing out the next row.
    assert flusher.empty_rounds <= 3, flusher.empty_rounds


async def test_flusher_sleeps_through_a_retry_after_pause(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    """The lane is paused by Retry-After while rows' backoffs have expired: the loop looks
    a few times (0.25 s, then more rarely) instead of rescanning without pause. The old
    loop made thousands of empty rounds per second here."""
    upstream.fail_puts(Throttled("SlowDown", retry_after_s=0.6))
    flusher = Flusher(journal, blobs, upstream, SystemClock(), backoff=_backoff())
    async with _running(flusher):
        for i in range(20):
            await _write(journal, blobs, f"lane/{i}", b"x")
        await _drained(journal, timeout_s=10.0)
    assert len(upstream.ops("put")) == 21
    assert flusher.empty_rounds <= 8, flusher.empty_rounds


# -- permanent failures ---------------------------------------------------------------------


async def test_flusher_fatal_marks_failed_until_retry_failed(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    upstream.fail_puts(Fatal("AccessDenied: Access Denied (HTTP 403)"))
    flusher = _flusher(journal, blobs, upstream)

    async with _running(flusher):
        await _write(journal, blobs, "denied", b"precious")
        await _state_is(journal, "denied", FlushState.FAILED)

        row = await journal.get(BUCKET, "denied")
        assert row is not None
        assert row.last_error is not None and "AccessDenied" in row.last_error
        assert row.attempts == 1
        assert [r.meta.key for r in await FlushQueue(journal).failed()] == ["denied"]
        assert upstream.body(BUCKET, "denied") is None
        status = flusher.status()
        assert (status.uploads_ok, status.uploads_failed, status.retries) == (0, 1, 0)
        assert status.last_error is not None and "AccessDenied" in status.last_error
        assert await journal.unflushed(None, "", journal.last_seq) == (1, len(b"precious"))
        assert blobs.path(row.blob_id or "").read_bytes() == b"precious"  # data kept

        assert await flusher.retry_failed() == 1
        await _drained(journal)

    assert upstream.body(BUCKET, "denied") == b"precious"
    row = await journal.get(BUCKET, "denied")
    assert row is not None
    assert (row.state, row.last_error) == (FlushState.DURABLE, None)
    assert await FlushQueue(journal).failed() == []


async def test_flusher_missing_blob_is_fatal(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    flusher = _flusher(journal, blobs, upstream)
    flusher.pause()
    async with _running(flusher):
        row = await _write(journal, blobs, "lost", b"bytes")
        await blobs.discard([row.blob_id or ""])
        flusher.resume()
        await _state_is(journal, "lost", FlushState.FAILED)

    failed = await journal.get(BUCKET, "lost")
    assert failed is not None and failed.last_error is not None
    assert "No such file or directory" in failed.last_error
    assert upstream.log == []


async def test_flusher_records_any_exception_as_failed_and_keeps_going(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    # Not a FlushError, and its text cannot be encoded as UTF-8 (a lone surrogate): it was
    # retried for ever, or recording it raised inside the flush task (row stuck flushing).
    upstream.fail_puts(ValueError("refused caf\udce9"), key="bad")
    flusher = _flusher(journal, blobs, upstream)
    async with _running(flusher) as task:
        await _write(journal, blobs, "bad", b"one")
        await _state_is(journal, "bad", FlushState.FAILED)
        await _write(journal, blobs, "good", b"two")
        await _state_is(journal, "good", FlushState.DURABLE)
        assert not task.done()

    row = await journal.get(BUCKET, "bad")
    assert row is not None and row.attempts == 1
    assert row.last_error is not None and "caf\\udce9" in row.last_error
    assert flusher.status().uploads_failed == 1
    assert upstream.body(BUCKET, "good") == b"two"


async def test_flusher_fails_unsendable_headers_without_sending(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    flusher = _flusher(journal, blobs, upstream)
    flusher.pause()
    async with _running(flusher):
        row = await _write(journal, blobs, "latin1", b"body")
        meta = dataclasses.replace(row.meta, user_metadata={"a": "caf\udce9"})
        await journal.commit_put(meta, row.blob_id or "", acked_s=time.time())
        flusher.resume()
        await _state_is(journal, "latin1", FlushState.FAILED)

    failed = await journal.get(BUCKET, "latin1")
    assert failed is not None and failed.last_error is not None
    assert "x-amz-meta-a value 'caf\\udce9'" in failed.last_error
    assert upstream.ops("put") == []


# -- pause and resume -----------------------------------------------------------------------


async def test_flusher_pause_stops_claiming_and_resume_drains(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    flusher = _flusher(journal, blobs, upstream)
    async with _running(flusher):
        await _write(journal, blobs, "before", b"1")
        await _drained(journal)

        flusher.pause()
        assert flusher.status().state == "paused"
        await _write(journal, blobs, "during-a", b"2")
        await _write(journal, blobs, "during-b", b"3")
        with pytest.raises(TimeoutError):
            await _drained(journal, timeout_s=0.3)
        assert upstream.ops("put") == [("put", BUCKET, "before")]
        for key in ("during-a", "during-b"):
            row = await journal.get(BUCKET, key)
            assert row is not None and row.state == FlushState.PENDING

        flusher.resume()
        assert flusher.status().state == "running"
        await _drained(journal)

    assert upstream.body(BUCKET, "during-a") == b"2"
    assert upstream.body(BUCKET, "during-b") == b"3"


async def test_flusher_pause_during_claim_gives_rows_back(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = _ClaimWatch(journal, monkeypatch)
    flusher = _flusher(journal, blobs, upstream)
    watch.then = lambda rows: flusher.pause()  # the pause lands while claim() is running

    async with _running(flusher):
        row = await _write(journal, blobs, "k", b"v")
        await watch.wait_for_seq(row.seq)
        watch.then = None
        await _state_is(journal, "k", FlushState.PENDING)  # released, not left flushing
        assert upstream.log == []

        flusher.resume()
        await _drained(journal)

    assert upstream.body(BUCKET, "k") == b"v"


async def test_flusher_pause_does_not_interrupt_an_upload_in_flight(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    gate = upstream.put_gate = asyncio.Event()
    flusher = _flusher(journal, blobs, upstream, concurrency=1)
    async with _running(flusher):
        await _write(journal, blobs, "first", b"1")
        await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)
        flusher.pause()
        await _write(journal, blobs, "second", b"2")
        gate.set()
        await _state_is(journal, "first", FlushState.DURABLE)
        with pytest.raises(TimeoutError):
            await _drained(journal, timeout_s=0.3)
        assert upstream.ops("put") == [("put", BUCKET, "first")]

        flusher.resume()
        await _drained(journal)

    assert upstream.body(BUCKET, "second") == b"2"


# -- superseded versions --------------------------------------------------------------------


async def test_flusher_supersede_while_in_flight_uploads_newest_last(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = _ClaimWatch(journal, monkeypatch)
    gate = upstream.put_gate = asyncio.Event()
    flusher = _flusher(journal, blobs, upstream)

    async with _running(flusher):
        v1 = await _write(journal, blobs, "latest.ckpt", b"version one")
        await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)  # v1 is in flight

        v2 = await _write(journal, blobs, "latest.ckpt", b"version two")
        await watch.wait_for_seq(v2.seq)  # v2 is claimed while v1 is still held
        assert v1.seq in watch.seqs
        gate.set()
        await _drained(journal)

    assert upstream.body(BUCKET, "latest.ckpt") == b"version two"
    assert upstream.ops("put") == [("put", BUCKET, "latest.ckpt")] * 2
    assert upstream.stored == [
        (BUCKET, "latest.ckpt", b"version one"),
        (BUCKET, "latest.ckpt", b"version two"),
    ]
    assert upstream.overlaps == []
    row = await journal.get(BUCKET, "latest.ckpt")
    assert row is not None
    assert (row.seq, row.state) == (v2.seq, FlushState.DURABLE)
    assert row.meta.etag == hashlib.md5(b"version two").hexdigest()


async def test_flusher_never_sends_a_version_overwritten_while_it_waited_in_the_gate(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """v1's request waits for the gate (a throttled bucket) while v2 is committed: v1 is
    not sent at all, v2 is (v1 used to go up first, a wasted PUT)."""
    flusher = _flusher(journal, blobs, upstream)
    admitted = flusher.gate._admitted
    entered, release = asyncio.Event(), asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        entered.set()
        await release.wait()
        return await admitted(*args, **kwargs)

    monkeypatch.setattr(flusher.gate, "_admitted", held)
    async with _running(flusher):
        await _write(journal, blobs, "latest.ckpt", b"version one")
        await asyncio.wait_for(entered.wait(), WAIT_S)  # v1's request waits for the gate
        v2 = await _write(journal, blobs, "latest.ckpt", b"version two")
        await asyncio.sleep(0.1)
        release.set()
        await _drained(journal)

    assert upstream.stored == [(BUCKET, "latest.ckpt", b"version two")]
    row = await journal.get(BUCKET, "latest.ckpt")
    assert row is not None and (row.seq, row.state) == (v2.seq, FlushState.DURABLE)


async def test_flusher_delete_while_put_in_flight_leaves_key_deleted(
    journal: Journal,
    blobs: BlobStore,
    upstream: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watch = _ClaimWatch(journal, monkeypatch)
    gate = upstream.put_gate = asyncio.Event()
    flusher = _flusher(journal, blobs, upstream)

    async with _running(flusher):
        await _write(journal, blobs, "k", b"v1")
        await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)
        tomb, superseded = await journal.commit_delete(BUCKET, "k", time.time())
        await blobs.discard(superseded)
        await watch.wait_for_seq(tomb.seq)
        gate.set()
        await _drained(journal)

    assert upstream.log == [("put", BUCKET, "k"), ("delete", BUCKET, "k")]
    assert upstream.body(BUCKET, "k") is None
    assert await journal.get(BUCKET, "k") is None


# -- restart and shutdown -------------------------------------------------------------------


async def test_flusher_restart_resumes_rows_left_flushing(
    tmp_path: Path, journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    a = await _write(journal, blobs, "a", b"alpha")
    b = await _write(journal, blobs, "b", b"beta")
    claimed = await claim_pending(journal, 1, time.time())
    assert [o.seq for o in claimed] == [a.seq]
    row = await journal.get(BUCKET, "a")
    assert row is not None and row.state == FlushState.FLUSHING
    journal.close()  # the process "dies" with "a" in flight

    reopened = Journal(journal.path, fsync=False)
    referenced = reopened.open()
    try:
        assert referenced == {a.blob_id, b.blob_id}
        row = await reopened.get(BUCKET, "a")
        assert row is not None and row.state == FlushState.PENDING
        assert reopened.last_seq == b.seq

        async with _running(_flusher(reopened, blobs, upstream)):
            await _drained(reopened)

        assert upstream.body(BUCKET, "a") == b"alpha"
        assert upstream.body(BUCKET, "b") == b"beta"
        for key in ("a", "b"):
            done = await reopened.get(BUCKET, key)
            assert done is not None and done.state == FlushState.DURABLE
    finally:
        reopened.close()


async def test_flusher_stop_cancels_held_upload_and_restart_resumes_it(
    journal: Journal, blobs: BlobStore, upstream: FakeUpstream
) -> None:
    upstream.put_gate = asyncio.Event()  # never released: the upload hangs
    flusher = _flusher(journal, blobs, upstream)
    task = asyncio.create_task(flusher.run())
    await _write(journal, blobs, "stuck", b"data")
    await asyncio.wait_for(upstream.put_arrived.wait(), WAIT_S)

    await flusher.stop(0.01)
    await asyncio.wait_for(task, WAIT_S)
    assert flusher.status().in_flight == 0
    assert upstream.body(BUCKET, "stuck") is None
    assert await journal.unflushed(None, "", journal.last_seq) == (1, 4)
    journal.close()

    reopened = Journal(journal.path, fsync=False)
    reopened.open()
    try:
        upstream.put_gate = None
        async with _running(_flusher(reopened, blobs, upstream)):
            await _drained(reopened)
        assert upstream.body(BUCKET, "stuck") == b"data"
    finally:
        reopened.close()
