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

Rate control and prefix lanes plug in at ``_admit`` (one place every upload passes).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from gateway.clock import Clock
from gateway.flush.backoff import Backoff
from gateway.models import LocalObject
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.upstream.classify import Fatal, FlushError, Retryable, Throttled
from gateway.upstream.client import PartSource, Upstream

log = logging.getLogger(__name__)
_IDLE_POLL_S = 1.0  # re-check for rows whose backoff has expired


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
    """Background uploader. Construct, then ``await run()`` in an owned task."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        upstream: Upstream,
        clock: Clock,
        *,
        concurrency: int = 8,
        backoff: Backoff | None = None,
    ) -> None:
        self._journal = journal
        self._blobs = blobs
        self._upstream = upstream
        self._clock = clock
        self._concurrency = concurrency
        self._backoff = backoff or Backoff()
        self._resumed = asyncio.Event()
        self._resumed.set()
        self._stopping = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._by_key: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._uploads_ok = 0
        self._uploads_failed = 0
        self._retries = 0
        self._throttles = 0
        self._last_error: str | None = None

    # -- control -------------------------------------------------------------------------

    def pause(self) -> None:
        self._resumed.clear()

    def resume(self) -> None:
        self._resumed.set()

    @property
    def is_paused(self) -> bool:
        return not self._resumed.is_set()

    def status(self) -> FlusherStatus:
        state = "stopped" if self._stopping else ("paused" if self.is_paused else "running")
        return FlusherStatus(
            state,
            len(self._tasks),
            self._uploads_ok,
            self._uploads_failed,
            self._retries,
            self._throttles,
            self._last_error,
        )

    async def stop(self, deadline_s: float) -> None:
        """Stop claiming; wait for uploads until ``deadline_s`` seconds pass, then cancel."""
        self._stopping = True
        self._journal.pending_event.set()
        self._resumed.set()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=deadline_s)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
                log.warning("flusher: %d uploads cancelled at the shutdown deadline", len(late))

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping:
            await self._resumed.wait()
            if self._stopping:
                break
            if len(self._tasks) >= self._concurrency:
                await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
                continue
            self._journal.pending_event.clear()
            claimed = await self._journal.claim(
                self._concurrency - len(self._tasks), self._clock.wall()
            )
            if self._stopping or self.is_paused:
                await self._journal.release(claimed)
                continue
            for obj in claimed:
                self._spawn(obj)
            if not claimed:
                wait_s = _IDLE_POLL_S
                next_s = await self._journal.next_retry_s()
                if next_s is not None:
                    wait_s = min(wait_s, max(0.0, next_s - self._clock.wall()))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._journal.pending_event.wait(), wait_s)

    def _spawn(self, obj: LocalObject) -> None:
        ident = (obj.meta.bucket, obj.meta.key)
        previous = self._by_key.get(ident)
        task = asyncio.create_task(self._flush_one(obj, previous), name=f"flush {obj.meta.key}")
        self._by_key[ident] = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda t: self._forget(ident, t))

    def _forget(self, ident: tuple[str, str], task: asyncio.Task[None]) -> None:
        if self._by_key.get(ident) is task:
            del self._by_key[ident]

    async def _flush_one(self, obj: LocalObject, previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            # Never overlap two uploads of one key: the older one finishes first.
            await asyncio.wait([previous])
        await self._admit(obj)
        try:
            await self._upload(obj)
        except _Superseded:
            return
        except FlushError as exc:
            await self._on_failure(obj, exc)
            return
        except Exception as exc:  # a bug below us must not strand the row in 'flushing'
            log.exception("unexpected error flushing %s/%s", obj.meta.bucket, obj.meta.key)
            await self._on_failure(obj, Retryable(f"unexpected {type(exc).__name__}: {exc}"))
            return
        self._uploads_ok += 1
        await self._journal.mark_durable(obj)
        log.debug("flushed %s/%s seq=%d", obj.meta.bucket, obj.meta.key, obj.seq)

    async def _admit(self, obj: LocalObject) -> None:
        """Rate control hook: token buckets and lanes wait here (a later issue)."""

    async def _upload(self, obj: LocalObject) -> None:
        if obj.is_delete:
            await self._upstream.delete_object(obj.meta.bucket, obj.meta.key)
            return
        with contextlib.ExitStack() as files:
            try:
                opened = [files.enter_context(self._blobs.path(b).open("rb")) for b in obj.blob_ids]
            except FileNotFoundError as exc:
                # Only a superseded version's blob is ever unlinked: nothing to upload, the
                # newer version has its own row. A blob missing for a live row is a fault.
                if await self._is_superseded(obj):
                    raise _Superseded() from exc
                raise Fatal(f"local body missing: {exc}") from exc
            if obj.parts:
                sources = [
                    PartSource(f, p.size_bytes, p.etag)
                    for f, p in zip(opened, obj.parts, strict=True)
                ]
                etag = await self._upstream.put_multipart(obj.meta, sources)
            else:
                etag = await self._upstream.put_object(obj.meta, opened[0])
        if etag and etag != obj.meta.etag:
            raise Fatal(f"upstream ETag {etag} differs from acknowledged {obj.meta.etag}")

    async def _is_superseded(self, obj: LocalObject) -> bool:
        current = await self._journal.get(obj.meta.bucket, obj.meta.key)
        return current is None or current.seq != obj.seq

    async def _on_failure(self, obj: LocalObject, exc: FlushError) -> None:
        self._last_error = f"{obj.meta.bucket}/{obj.meta.key}: {exc}"
        if isinstance(exc, Fatal):
            self._uploads_failed += 1
            log.error("flush of %s/%s failed permanently: %s", obj.meta.bucket, obj.meta.key, exc)
            await self._journal.mark_failed(obj, str(exc))
            return
        self._retries += 1
        if isinstance(exc, Throttled):
            self._throttles += 1
        delay = self._backoff.delay_s(obj.attempts, exc.retry_after_s)
        log.warning(
            "flush of %s/%s failed (try %d), retrying in %.2fs: %s",
            obj.meta.bucket,
            obj.meta.key,
            obj.attempts + 1,
            delay,
            exc,
        )
        await self._journal.retry_later(obj, str(exc), self._clock.wall() + delay)
