"""Flusher: drains pending journal rows to the upstream bucket in the background.

Worker contract (after Garage's workers and rclone's write-back queue):
- a unit of work (one upload) is not interrupted by pause; waiting is;
- uploads of one key never overlap: a newer version waits for the older version's upload
  to finish, so a superseded upload can never become the final upstream state;
- a result is recorded only against the exact version (seq) uploaded;
- transient failures go back to pending with a full-jitter backoff; permanent ones become
  ``failed`` with the error kept; nothing is dropped;
- ``stop(deadline)`` stops claiming, lets uploads finish until the deadline, then cancels
  them; what is left is pending on disk and resumes at the next start.

Claims: pending rows are ordered in memory per lane (``FlushOrder``, loaded from the
journal at start and kept by its changes), so a claim costs what it hands out: a full or
paused lane is parked, not skipped row by row. The loop sleeps until something can happen:
a new row in a lane with room, an upload finishing, or the next timer (a backoff, a hold,
the write-back delay); a throttled or idle gateway does not spin.

Flow control: claims go through ``FlushPolicy`` (write-back delay, temp holds, lane room,
commit ordering); every request then goes through the request gate (``gate.py``, built by
the composition root and shared with early uploads and reads): admission by its bucket's
budget in fair rounds over the lanes, a slot of the adaptive window of requests in flight,
the global caps, and its answer reported exactly once. A claimed upload waiting for its
admission holds no slot, so a fast lane never queues behind slow lanes' backlog. A
multipart flush sends every request through the gate too (``multipart.py``).

Early multipart uploads (``early.py``) send a local multipart upload's parts while the
client is still uploading, through the same gate; the claimed row then only completes the
upload (``_upload``).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import BinaryIO, TypeVar

from gateway import metrics
from gateway.clock import Clock
from gateway.fleet.recovered import newer_in_bucket
from gateway.fleet.view import DeleteNotes, MarkerHolds, UploadClaims, UploadOrder
from gateway.flush.admission import BudgetStatus
from gateway.flush.backoff import Backoff
from gateway.flush.early import EarlyUploads
from gateway.flush.gate import GateStatus, RequestGate, build_gate
from gateway.flush.lanes import Lane, LaneStatus
from gateway.flush.multipart import put_parts
from gateway.flush.order import FlushOrder
from gateway.flush.orphans import UpstreamUploads
from gateway.flush.parts import split_parts
from gateway.flush.policy import FlushPolicy, PolicyConfig
from gateway.flush.progress import FlushProgress
from gateway.flush.ratelimit import TokenBucket
from gateway.models import LocalObject
from gateway.store.blobs import BlobStore, close_bodies, open_bodies
from gateway.store.integrity import BodyDigest, body_digests, check_bytes, check_fd
from gateway.store.journal import Journal
from gateway.store.queue import FlushQueue
from gateway.upstream.classify import (
    Corrupt,
    Fatal,
    FlushError,
    Retryable,
    Throttled,
    for_flush,
    printable,
    unsendable,
)
from gateway.upstream.client import PartSource, Upstream

log = logging.getLogger(__name__)
_SWEEP_INTERVAL_S = 60.0  # how often recorded, no longer open upstream uploads are aborted
_CLAIM_RETRY_S = 1.0  # pause after a claim the journal failed
# A request that waited longer than this for the gate looks again whether its version is
# still current (a journal read; none on the fast path).
_RECHECK_AFTER_WAIT_S = 0.05
T = TypeVar("T")


class _Superseded(Exception):
    """The version being flushed was replaced before its upload began."""


@dataclass(frozen=True, slots=True)
class FlusherStatus:
    state: str  # running | paused | stopped
    in_flight: int
    uploads_ok: int
    uploads_failed: int
    retries: int
    throttles: int
    last_error: str | None


class Flusher:
    """Background uploader. Construct, then ``await run()`` in an owned task.

    ``gate`` is the request gate every upload goes through (the composition root builds
    it and shares it with reads; by default one with the default settings)."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        clock: Clock,
        *,
        gate: RequestGate | None = None,
        backoff: Backoff | None = None,
        policy: PolicyConfig | None = None,
        multipart_threshold_bytes: int = 64 << 20,
        marker_holds: MarkerHolds | None = None,
        claims: UploadClaims | None = None,
        upload_order: UploadOrder | None = None,
    ) -> None:
        self._journal = journal
        self._queue = FlushQueue(journal)
        self._blobs = blobs
        self._upstream = upstream
        self._clock = clock
        self._backoff = backoff or Backoff()
        self.gate = gate or build_gate(clock, backoff=self._backoff)
        self.lanes = self.gate.lanes
        self.policy = FlushPolicy(policy or PolicyConfig(write_back_delay_s=0.0), self.lanes)
        # In a fleet, commit markers also wait for every other gateway (fleet/fence.py).
        self.order = FlushOrder(self.policy, journal.figures, marker_holds)
        self._claims = claims  # with replicas: one uploader per version (fleet/claims.py)
        # In a fleet: a key's versions on several nodes go up in ack order (fleet/ordering.py).
        self._upload_order = upload_order
        # Versions acknowledged before this start are compared with the bucket once
        # (recovered.py): peers that wrote their keys meanwhile could not ask this node.
        self.started_s = clock.wall()
        # In a fleet: deletes a node back from a restart must not upload over (the
        # composition root sets it: fleet/recovered.py ``DeleteNotes``).
        self.deletes: DeleteNotes | None = None
        self._withdrawn: set[tuple[str, str, int]] = set()  # versions never to upload
        self.progress = FlushProgress(clock.monotonic)  # bytes in flight, measured rates
        self.gate.on_accepted, self.gate.on_retry = self.progress.accepted, self.progress.failed
        self._is_attached = False
        self._multipart_threshold_bytes = multipart_threshold_bytes
        self._uploads = UpstreamUploads(journal, upstream, clock)
        # The PartListener of MultipartService, when the composition root connects it.
        self.early = EarlyUploads(
            journal,
            blobs,
            upstream,
            self._uploads,
            self.gate,
            clock,
            skip=lambda key: self.policy.is_temp(key) or self.policy.is_marker(key),
        )
        self._last_sweep_s = clock.monotonic()
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._by_key: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._uploads_ok = 0
        self._uploads_failed = 0
        self._retries = 0
        self._last_error: str | None = None
        self.claim_rounds = 0  # times the loop looked for work (wake-ups): see tests
        self.empty_rounds = 0  # ... and found none

    # -- control -------------------------------------------------------------------------

    def pause(self) -> None:
        self.gate.pause()

    def resume(self) -> None:
        self.gate.resume()

    @property
    def is_paused(self) -> bool:
        return self.gate.is_paused

    @property
    def bandwidth(self) -> TokenBucket:
        """The upstream's global bytes/s bucket; read-through fills draw from it too."""
        return self.gate.bandwidth

    def gate_status(self) -> GateStatus:
        """The window of requests in flight and the answers so far."""
        return self.gate.core.status()

    def lane_status(self) -> list[LaneStatus]:
        return self.lanes.status(self._clock.monotonic())

    def budget_status(self) -> list[BudgetStatus]:
        """Per bucket: the adaptive budget its lanes share."""
        return self.lanes.budgets()

    def lane_backlog(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Unflushed objects and bytes per (bucket, lane prefix) (from memory)."""
        return self.order.backlog()

    async def retry_failed(self) -> int:
        """Operator request: every failed row becomes pending again. Returns how many."""
        return await self._queue.retry_failed()

    def release_marker(self, bucket: str, key: str) -> bool:
        """An operator publishes a held commit marker now (see ``FlushOrder``)."""
        return self.order.release_marker(bucket, key)

    def wake(self) -> None:
        """Look for work now (e.g. after a test moved its clock)."""
        self.order.wakeup.set()

    async def attach(self) -> None:
        """Load the pending rows from the journal; ``run`` does it if it was not done.
        Call it before the gateway serves, so the load does not hold up the first writes."""
        if not self._is_attached:
            self._is_attached = True
            await self._journal.subscribe(self.order)

    def status(self) -> FlusherStatus:
        state = "stopped" if self._stopping else ("paused" if self.is_paused else "running")
        return FlusherStatus(
            state,
            len(self._tasks),
            self._uploads_ok,
            self._uploads_failed,
            self._retries + self.gate.retries,
            self.gate.core.throttled,
            self._last_error,
        )

    async def stop(self, deadline_s: float) -> None:
        """Stop claiming; wait for uploads until ``deadline_s`` seconds pass, then cancel."""
        self._stopping = True
        self.order.wakeup.set()
        self.gate.resume()
        self.gate.room.set()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=deadline_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
                log.warning("flusher: %d uploads cancelled at the shutdown deadline", len(late))
        await self.early.close()  # open early uploads: recorded, aborted at the next start

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        await self.attach()
        try:
            await self._abort_abandoned_uploads()
            self.early.ready.set()
            while not self._stopping:
                await self.gate.resumed()
                if self._stopping:
                    break
                room = self.gate.core.claim_room(len(self._tasks))
                if room <= 0:
                    self.gate.room.clear()
                    await self.gate.room.wait()
                    continue
                self.order.wakeup.clear()  # before looking: what comes after wakes us
                self.claim_rounds += 1
                seqs = self.order.take(room, self._clock.wall(), self._clock.monotonic())
                if seqs and not await self._claimed_ok(seqs):
                    continue
                if self._clock.monotonic() - self._last_sweep_s > _SWEEP_INTERVAL_S:
                    await self._abort_abandoned_uploads()
                if len(seqs) < room:  # the order had no more: wait until it may have
                    self.empty_rounds += not seqs
                    await self._idle()
        finally:
            self._journal.unsubscribe(self.order)

    async def _claimed_ok(self, seqs: list[int]) -> bool:
        """``_claim``, kept from ending the loop: a journal that fails a claim (disk error,
        locked database) is logged and the claim tried again after a pause; the rows stay
        queued. False after such a failure."""
        try:
            await self._claim(seqs)
        except Exception:
            log.exception("flush claim failed; trying again in %.0fs", _CLAIM_RETRY_S)
            await asyncio.sleep(_CLAIM_RETRY_S)
            return False
        return True

    async def _claim(self, seqs: list[int]) -> None:
        """Claim ``seqs`` in the journal and start their uploads."""
        try:
            claimed = await self._queue.claim(seqs)
        except BaseException:
            self.order.restore(seqs)  # nothing moved in the journal: they stay queued
            raise
        finally:
            self.order.claimed(seqs)
        if self._stopping or self.is_paused:
            await self._queue.release(claimed)
            return
        for obj in claimed:
            self._spawn(obj)
        self.order.settle(self._clock.monotonic())

    async def _idle(self) -> None:
        """Sleep until the order has something new (a row in a lane with room, an upload
        finished) or its next timer fires (a backoff, a hold, a paused lane); nothing else
        wakes the loop, so a throttled, paused or idle gateway costs no CPU."""
        due_s = self.order.next_due_s()
        wait_s = None if due_s is None else max(0.0, due_s - self._clock.wall())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.order.wakeup.wait(), wait_s)

    async def _abort_abandoned_uploads(self) -> None:
        """Abort recorded upstream multipart uploads that no upload task has open: left by
        a crash, or by an abort that failed (the upstream was throttling or away). They
        would otherwise accrue storage cost forever; kept for the next sweep on failure."""
        self._last_sweep_s = self._clock.monotonic()
        await self.early.reconcile()
        await self._uploads.sweep()

    def _spawn(self, obj: LocalObject) -> None:
        ident = (obj.meta.bucket, obj.meta.key)
        previous = self._by_key.get(ident)
        lane = self.lanes.lane_for(obj.meta.bucket, obj.meta.key, self._clock.monotonic())
        lane.in_flight += 1
        self.early.supersede(obj.meta.bucket, obj.meta.key, obj.seq)
        task = asyncio.create_task(
            self._flush_one(obj, lane, previous), name=f"flush {obj.meta.key}"
        )
        self._by_key[ident] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self.gate.room.set())
        task.add_done_callback(lambda t: self._forget(ident, t))

    def _forget(self, ident: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._by_key.get(ident) is task:
            del self._by_key[ident]

    async def _flush_one(
        self, obj: LocalObject, lane: Lane, previous: asyncio.Task[None] | None
    ) -> None:
        try:
            if previous is not None:
                # Never overlap two uploads of one key: the older one finishes first.
                await asyncio.wait([previous])
            await self._flush(obj, lane)
        finally:
            lane.in_flight -= 1
            self.order.on_room(obj.meta.bucket, obj.meta.key)  # the lane has room again

    async def _flush(self, obj: LocalObject, lane: Lane) -> None:
        """Upload one version and record the outcome. MUST NOT raise (but CancelledError):
        whatever the row holds, it ends durable, back to pending (transient failure),
        failed with its error, or dropped (a peer's newer version goes instead: ``_drop``,
        or ``withdraw`` that is dropping it now); never stranded in ``flushing``."""
        try:
            reason = None if obj.is_delete else unsendable(obj.meta)
            if reason is not None:
                raise Fatal(reason)
            if (obj.meta.bucket, obj.meta.key, obj.seq) in self._withdrawn:
                return  # a peer's newer version goes instead: being dropped (withdraw)
            if self._upload_order is not None and not await self._upload_order.before_upload(obj):
                return await self._drop(obj)  # a peer's newer version is in the bucket
            if self._upload_order is not None and await newer_in_bucket(
                obj,
                self.started_s,
                self._upstream,
                lambda call: self._send(lane, obj, 0, call),
                self.deletes.deleted_since if self.deletes is not None else None,
            ):
                return await self._drop(obj)  # written meanwhile while this node was down
            if not await self._claimed(obj):  # with replicas: uploaded by another gateway
                return await self._record_durable(obj)
            if self._claims is None and self.deletes is not None:  # (claimed: noted already)
                await self.deletes.before_delete(obj)
            with self.progress.upload(obj.meta.bucket, obj.meta.key, obj.meta.size_bytes):
                await self._upload(obj, lane)
            if self._claims is not None:
                await self._claims.after_upload(obj)
        except _Superseded:
            return
        except Exception as exc:  # the worker loop: every failure is recorded, none escapes
            if not isinstance(exc, FlushError):  # raised here, not by the upstream client
                log.exception("error flushing %s", _name(obj))
            await self._on_failure(obj, lane, for_flush(exc))
            return
        await self._record_durable(obj)

    async def _claimed(self, obj: LocalObject) -> bool:
        """With replicas on (docs/fleet.md, "Takeover"): claim the version before its
        upload. False: another gateway uploaded it (it is durable); a claim held by a live
        gateway is retried later (it is uploading it)."""
        if self._claims is None:
            return True
        decision = await self._claims.before_upload(obj)
        if decision == "wait":
            raise Retryable("another gateway holds the upload's claim: it uploads it")
        return decision == "upload"

    async def withdraw(self, obj: LocalObject, wait_s: float) -> bool:
        """A peer is about to upload a newer version of ``obj``'s key (docs/fleet.md, "One
        key through two nodes"): never upload ``obj``'s version; an upload of the key
        already on its way may finish first (up to ``wait_s``). True: it will not reach
        the bucket after now (dropped, or uploaded already); False: still uploading."""
        ident = (obj.meta.bucket, obj.meta.key)
        withdrawn = (*ident, obj.seq)
        self._withdrawn.add(withdrawn)
        try:
            task = self._by_key.get(ident)
            if task is not None:
                done, _ = await asyncio.wait([task], timeout=wait_s)
                if not done:
                    return False
            await self._drop(obj)
            return True
        finally:
            self._withdrawn.discard(withdrawn)

    async def _drop(self, obj: LocalObject) -> None:
        blob_ids = await self._queue.drop(obj)
        if blob_ids is None:
            return
        log.info(
            "%s seq=%d: a newer version from another gateway goes instead", _name(obj), obj.seq
        )
        await self._blobs.discard(blob_ids)

    async def _record_durable(self, obj: LocalObject) -> None:
        self._uploads_ok += 1
        try:
            is_recorded = await self._queue.mark_durable(obj)
        except Exception:  # the upload stands; the row is flushed again after a restart
            log.exception("could not record the flush of %s", _name(obj))
            return
        if is_recorded:
            metrics.FLUSH_OBJECTS.inc()
            metrics.FLUSH_BYTES.inc(obj.meta.size_bytes)
        log.debug("flushed %s/%s seq=%d", obj.meta.bucket, obj.meta.key, obj.seq)

    async def _upload(self, obj: LocalObject, lane: Lane) -> None:
        if obj.is_delete:
            if not obj.flushed_before and self.policy.is_temp(obj.meta.key):
                # A temp key that lived and died here: it never reached the upstream, and
                # temp names are not expected there from elsewhere. Nothing to send.
                return
            bucket, key = obj.meta.bucket, obj.meta.key
            await self._send(lane, obj, 0, lambda: self._upstream.delete_object(bucket, key))
            return
        if obj.body is not None:
            await self._upload_inline(obj, lane, obj.body)
            return
        if obj.parts and (etag := await self.early.complete(obj)) is not None:
            _check_etag(etag, obj.meta.etag)  # its parts were sent while the client uploaded
            return
        async with contextlib.AsyncExitStack() as files:
            try:
                # Opened and closed in a thread: an open can wait on the disk, and the last
                # close of a superseded (unlinked) blob frees its blocks.
                opened = await asyncio.to_thread(open_bodies, self._blobs, obj.blob_ids)
                files.push_async_callback(asyncio.to_thread, close_bodies, opened)
            except FileNotFoundError as exc:
                # Only a superseded version's blob is ever unlinked: nothing to upload, the
                # newer version has its own row. A blob missing for a live row is a fault.
                if await self._is_superseded(obj):
                    raise _Superseded() from exc
                raise Fatal(f"local body missing: {exc}") from exc
            digests = body_digests(obj)
            if obj.parts:
                for part_file, digest in zip(opened, digests, strict=True):
                    await _require_intact(part_file, digest)  # as for single bodies below
                sources = [
                    PartSource(f, p.size_bytes, p.etag)
                    for f, p in zip(opened, obj.parts, strict=True)
                ]
                expected = obj.meta.etag
            elif obj.meta.size_bytes > self._multipart_threshold_bytes:
                # Part MD5s are computed from the file here, so the upstream cannot catch a
                # corrupt body: the same pass checks it against the acked MD5.
                sources, expected = await split_parts(
                    opened[0], obj.meta.size_bytes, require=digests[0]
                )
            else:
                # Content-MD5 lets S3 refuse a corrupt body, but not every S3-compatible
                # upstream checks it (moto does not): a bad body MUST NOT become the
                # bucket's latest version, so check before sending (usually page cache).
                await _require_intact(opened[0], digests[0])
                body = self.progress.body(obj.meta.bucket, obj.meta.key, opened[0])
                size = obj.meta.size_bytes
                etag = await self._send(
                    lane, obj, size, lambda: self._upstream.put_object(obj.meta, body)
                )
                _check_etag(etag, obj.meta.etag)
                return
            sources = self.progress.parts(obj.meta.bucket, obj.meta.key, sources)
            etag = await put_parts(
                self.gate, self._upstream, self._uploads, lane, obj.seq, obj.meta, sources
            )
        _check_etag(etag, expected)

    async def _upload_inline(self, obj: LocalObject, lane: Lane, body: bytes) -> None:
        """A body stored in the journal: checked in memory (microseconds), sent from it."""
        problem = check_bytes(body, body_digests(obj)[0])
        if problem is not None:
            raise Corrupt(f"body {problem}")
        size = obj.meta.size_bytes
        etag = await self._send(
            lane, obj, size, lambda: self._upstream.put_object(obj.meta, io.BytesIO(body))
        )
        _check_etag(etag, obj.meta.etag)

    async def _send(
        self, lane: Lane, obj: LocalObject, size_bytes: int, call: Callable[[], Awaitable[T]]
    ) -> T:
        """One request of a claimed row through the gate (one try: a failure goes back to
        the row, which is retried after a backoff). A request that waited in the gate (a
        throttled or paced bucket: seconds) first looks whether its version is still the
        key's: one overwritten meanwhile is not sent (its newer version goes instead; it
        used to go up first, a PUT wasted where requests are scarcest, and seen in the
        bucket for a moment)."""
        asked_s = self._clock.monotonic()

        async def still_current() -> T:
            waited_s = self._clock.monotonic() - asked_s
            if waited_s > _RECHECK_AFTER_WAIT_S and await self._is_superseded(obj):
                log.info(
                    "%s seq=%d: overwritten while it waited to go: not sent", _name(obj), obj.seq
                )
                raise _Superseded()
            return await call()

        return await self.gate.send(lane, obj.seq, size_bytes, still_current, claimed=True)

    async def _is_superseded(self, obj: LocalObject) -> bool:
        current = await self._journal.get(obj.meta.bucket, obj.meta.key)
        return current is None or current.seq != obj.seq

    async def _on_failure(self, obj: LocalObject, lane: Lane, exc: FlushError) -> None:
        """Record a failed try: ``failed`` with its error when retrying cannot cure it, else
        back to pending after a backoff. Never raises (but CancelledError): a journal that
        cannot record it is logged, and the row is recovered at the next start."""
        error = printable(str(exc))
        self._last_error = f"{_name(obj)}: {error}"
        try:
            if isinstance(exc, Fatal):
                self._uploads_failed += 1
                metrics.FLUSH_FAILURES.inc()
                if isinstance(exc, Corrupt):
                    metrics.CORRUPT_BLOBS.inc()
                log.error("flush of %s failed permanently: %s", _name(obj), error)
                self.early.supersede(obj.meta.bucket, obj.meta.key, obj.seq + 1)
                await self._queue.mark_failed(obj, error)
                return
            self._retries += 1  # the gate counted the answer (a throttle) already
            self.progress.failed(error)
            metrics.FLUSH_RETRIES.inc()
            # A throttle is paced by the bucket's (cut) budget: the row's own backoff does
            # not grow with its attempts too, or a lane's last rows would idle for seconds.
            tries = 0 if isinstance(exc, Throttled) else obj.attempts
            delay = self._backoff.delay_s(tries, exc.retry_after_s)
            log.warning(
                "flush of %s failed (try %d), retrying in %.2fs: %s",
                _name(obj),
                obj.attempts + 1,
                delay,
                error,
            )
            await self._queue.retry_later(obj, error, self._clock.wall() + delay)
        except Exception:
            log.exception("could not record the failed flush of %s", _name(obj))


def _name(obj: LocalObject) -> str:
    """``bucket/key`` of a row, printable whatever the key holds."""
    return printable(f"{obj.meta.bucket}/{obj.meta.key}")


async def _require_intact(body: BinaryIO, digest: BodyDigest) -> None:
    """The body file still holds what was acked (stored CRC32C, or MD5 for older rows)."""
    problem = await asyncio.to_thread(check_fd, body.fileno(), digest)
    if problem is not None:
        raise Corrupt(f"body {problem}")


def _check_etag(got: str, expected: str) -> None:
    if got and got != expected:
        raise Fatal(f"upstream ETag {got} differs from the expected {expected}")
