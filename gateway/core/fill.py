"""One read-through fill: an upstream object copied into new body files by parallel ranged
GETs, readable while it arrives (see fills.py for the contract and the registry).

``Fill.run`` is the whole life of a copy: the first ranged GET (its answer gives the ETag
and the size; part 1's size is asked for alongside, for a multipart layout), room reserved
under the high watermark, the remaining chunks ``If-Match`` that ETag, several at once
within the request limit and the bandwidth budget, a check of the bytes against the ETag,
then publication and the journal commit. ``FillReader`` serves one reader from it.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from gateway import metrics
from gateway.clock import Clock
from gateway.core.bodies import FileSpan, Piece
from gateway.core.fill_io import FillFiles
from gateway.core.fill_layout import Coverage, Layout, digest_matches, layout, parts_count
from gateway.core.integrity import BlobCheck, BlobVerifier
from gateway.core.ranges import parse_content_range
from gateway.errors import InternalError, InvalidRange, S3Error
from gateway.models import ObjectMeta, PartRef
from gateway.store.blobs import BlobStore
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace
from gateway.upstream.client import Upstream, UpstreamObject

log = logging.getLogger(__name__)

MiB = 1 << 20
_CHUNK_TRIES = 4
_RETRY_BASE_S = 0.2
_MAX_SPAN_BYTES = 8 * MiB  # one reader's piece (sendfile: no memory)
_HASH_PIECE_BYTES = 1 * MiB  # one pread of the in-order hash: memory per running fill
_WRITE_BATCH_BYTES = 1 * MiB  # network pieces gathered per write: memory per ranged GET


class BandwidthBudget(Protocol):
    """The upstream's bytes/s budget, shared with the flush engine (its global token
    bucket): ``reserve`` takes ``n_bytes`` now and returns how long to wait before using
    them (0 when they are there)."""

    def reserve(self, n: float, now_s: float) -> float: ...


@dataclass(frozen=True, slots=True)
class FillConfig:
    part_bytes: int = 8 * MiB  # one ranged GET
    fill_concurrency: int = 8  # ranged GETs in flight for one object
    request_concurrency: int = 32  # ranged GETs over all fills (a first answer: till its headers)
    max_object_bytes: int = 5 << 30  # larger objects are served, never cached


class FillDeps(Protocol):
    """What a fill uses, owned by the registry (fills.FillManager): the stores, the
    upstream, the shared limits, and ``forget`` to leave the registry when done."""

    journal: Journal
    blobs: BlobStore
    upstream: Upstream
    space: CacheSpace | None
    clock: Clock
    verifier: BlobVerifier
    config: FillConfig
    budget: BandwidthBudget | None
    requests: asyncio.Semaphore
    executor: ThreadPoolExecutor

    def forget(self, fill: Fill) -> None: ...


class Fill:
    """One object being copied. ``head()`` is its metadata once the first answer came (or
    the upstream's error); when ``is_serving`` is False (no room to cache it) readers
    fetch on their own. ``done()`` resolves once the fill ended; ``is_committed`` tells
    whether the copy was kept."""

    def __init__(self, deps: FillDeps, bucket: str, key: str) -> None:
        self._m = deps
        self.bucket = bucket
        self.key = key
        self.meta: ObjectMeta | None = None
        self.is_serving = True
        self.is_committed = False
        loop = asyncio.get_running_loop()
        self._head: asyncio.Future[ObjectMeta] = loop.create_future()
        self._done: asyncio.Future[None] = loop.create_future()
        self._head.add_done_callback(_consume)
        self._progress = asyncio.Event()
        self._error: S3Error | None = None
        self._files: FillFiles | None = None
        self._coverage: Coverage | None = None
        self._leases = 0

    # -- readers ---------------------------------------------------------------------------

    async def head(self) -> ObjectMeta:
        return await asyncio.shield(self._head)

    async def done(self) -> None:
        await asyncio.shield(self._done)

    @property
    def error(self) -> S3Error | None:
        """Why the fill failed (None while running, or when it did not fail)."""
        return self._error

    @property
    def arrived_bytes(self) -> int:
        return self._coverage.arrived_bytes if self._coverage else 0

    def reader(self, start: int, length: int) -> FillReader | None:
        """Bytes ``start`` .. ``start + length - 1`` as they arrive; None when the fill
        is over and its files are closed (the copy, if kept, is a local row now). Call
        only once ``head()`` returned and ``is_serving``."""
        assert self._files is not None and self._coverage is not None
        if self._files.is_closed:
            return None
        self._leases += 1
        return FillReader(self, start, start + length)

    def release(self) -> None:
        self._leases -= 1
        self._close_if_unused()

    def available_end(self, pos: int) -> int:
        assert self._coverage is not None
        return self._coverage.available_end(pos)

    def span(self, pos: int, stop: int) -> FileSpan:
        """Where bytes ``pos`` .. (at most) ``stop - 1`` are: one file's span."""
        assert self._files is not None
        return self._files.span(pos, stop)

    async def wait_progress(self) -> None:
        """Wait for more bytes (or the end); raises the fill's error if it failed."""
        if self._error is not None:
            raise self._error
        event = self._progress
        await event.wait()
        if self._error is not None:
            raise self._error

    def _notify(self) -> None:
        event, self._progress = self._progress, asyncio.Event()
        event.set()

    # -- the fill itself -------------------------------------------------------------------

    async def run(self) -> None:
        m = self._m
        m.journal.watch(self.bucket, self.key)
        reserved = 0
        # Part 1's size (the layout of a multipart object) is asked for alongside the
        # first GET: one round trip, not two, before the ranged GETs start.
        part_one = asyncio.create_task(self._part_one_bytes())
        try:
            first = await self._first_answer()
            meta = first.meta
            plan = await self._plan(meta, part_one)
            if (
                m.space is None
                or meta.size_bytes > m.config.max_object_bytes
                or not m.space.reserve_fill(meta.size_bytes)
            ):
                first.close()
                self.is_serving = False
                self._head.set_result(meta)
                return
            reserved = meta.size_bytes
            await self._begin(meta, plan, first)
            md5s = await self._fetch(first, plan.is_checkable)
            if plan.is_checkable and digest_matches(meta.etag, md5s):
                self.is_committed = await self._commit(meta, plan, md5s)
            elif plan.is_checkable:
                # Readers got the upstream's bytes as sent; only the copy is refused.
                # Encrypted objects (SSE-KMS, SSE-C) have ETags that are not MD5s.
                log.info(
                    "read-through copy of %s/%s not kept: its bytes do not hash to the "
                    "ETag %s (an encrypted object, or parts of unequal sizes)",
                    self.bucket,
                    self.key,
                    meta.etag,
                )
        except asyncio.CancelledError as exc:
            self._fail(exc)
            raise
        except S3Error as exc:
            self._fail(exc)
            log.warning("read-through of %s/%s failed: %s", self.bucket, self.key, exc)
        except Exception as exc:  # a worker: an unexpected failure is logged, never lost
            self._fail(exc)
            log.exception("read-through of %s/%s failed", self.bucket, self.key)
        finally:
            part_one.cancel()
            if reserved and m.space is not None:
                m.space.release_fill(reserved, is_kept=self.is_committed)
            m.journal.unwatch(self.bucket, self.key)
            m.forget(self)
            if self._files is not None and not self.is_committed:
                await asyncio.to_thread(self._files.discard)
            self._done.set_result(None)
            self._notify()
            self._close_if_unused()

    async def _first_answer(self) -> UpstreamObject:
        """The first chunk's GET: its answer carries the ETag and the object's size. Its
        bytes are charged to the bandwidth budget once their number is known (an object
        smaller than a chunk is charged its size), before its body is read."""
        m = self._m
        try:
            async with m.requests:
                answer = await m.upstream.get_object(
                    self.bucket, self.key, range_header=f"bytes=0-{m.config.part_bytes - 1}"
                )
        except InvalidRange:  # S3 refuses any range of an empty object
            answer = await m.upstream.get_object(self.bucket, self.key)
        rng = parse_content_range(answer.content_range)
        await self._pace(rng.length if rng is not None else answer.meta.size_bytes)
        return answer

    async def _part_one_bytes(self) -> int | None:
        """``HEAD ?partNumber=1``: part 1's size (the whole object's when single-part);
        None when the upstream would not say."""
        try:
            head = await self._m.upstream.head_part(self.bucket, self.key, 1)
        except S3Error:
            return None
        rng = parse_content_range(head.content_range)
        return rng.length if rng is not None else head.meta.size_bytes

    async def _plan(self, meta: ObjectMeta, part_one: asyncio.Task[int | None]) -> Layout:
        count = parts_count(meta.etag)
        if count is not None and count > 1 and meta.size_bytes > 0:
            return layout(meta.etag, meta.size_bytes, await part_one)
        part_one.cancel()
        return layout(meta.etag, meta.size_bytes, meta.size_bytes if count == 1 else None)

    async def _begin(self, meta: ObjectMeta, plan: Layout, first: UpstreamObject) -> None:
        m = self._m
        self._files = await asyncio.to_thread(FillFiles.create, m.blobs, plan.sizes)
        whole = parse_content_range(first.content_range) is None  # the range was ignored
        chunk = meta.size_bytes if whole else m.config.part_bytes
        self._coverage = Coverage(meta.size_bytes, chunk)
        self._files.is_hashed_inline = self._files.matches_grid(chunk)
        self.meta = meta
        self._head.set_result(meta)

    async def _fetch(self, first: UpstreamObject, is_checkable: bool) -> list[bytes]:
        """Every chunk (the first from ``first``), and the body files' MD5s in order."""
        coverage, files = self._coverage, self._files
        assert coverage is not None and files is not None
        indices = iter(range(1, coverage.chunks))
        is_ordered = is_checkable and not files.is_hashed_inline

        async def worker() -> None:
            for index in indices:
                await self._fetch_chunk(index)

        try:
            async with asyncio.TaskGroup() as group:
                hashing = group.create_task(self._hash()) if is_ordered else None
                group.create_task(self._write(first, 0, 0))
                for _ in range(min(self._m.config.fill_concurrency, coverage.chunks - 1)):
                    group.create_task(worker())
        except BaseExceptionGroup as group_error:
            raise group_error.exceptions[0] from None  # the first failure is the story
        if hashing is not None:
            return hashing.result()
        return files.digests() if is_checkable else []

    async def _fetch_chunk(self, index: int) -> None:
        """One chunk by ranged GET, resumed where it stopped after a transient error."""
        m, coverage, meta = self._m, self._coverage, self.meta
        assert coverage is not None and meta is not None
        start, end = coverage.chunk(index)
        for attempt in range(_CHUNK_TRIES):
            pos = start + coverage.filled(index)
            await self._pace(end - pos)
            try:
                async with m.requests:
                    answer = await m.upstream.get_object(
                        self.bucket,
                        self.key,
                        range_header=f"bytes={pos}-{end - 1}",
                        preconditions={"If-Match": f'"{meta.etag}"'},
                    )
                    got = parse_content_range(answer.content_range)
                    if got is None or (got.start, got.end) != (pos, end - 1):
                        answer.close()
                        raise InternalError(f"upstream answered {answer.content_range!r}")
                    await self._write(answer, index, pos)
                return
            except S3Error as exc:
                if exc.status < 500 or attempt + 1 == _CHUNK_TRIES:
                    raise
                log.info("ranged GET of %s/%s failed, retrying: %s", self.bucket, self.key, exc)
                await asyncio.sleep(_RETRY_BASE_S * 2**attempt)

    async def _write(self, answer: UpstreamObject, index: int, pos: int) -> None:
        """Stream one answer into the files at ``pos``. The network hands over pieces of
        tens of KiB: they are written in batches of ``_WRITE_BATCH_BYTES`` (one thread hop
        and one ``pwritev`` each), and readers are woken once per batch."""
        files, coverage = self._files, self._coverage
        assert files is not None and coverage is not None
        loop = asyncio.get_running_loop()
        batch: list[bytes] = []
        batch_bytes = 0
        async for piece in answer.chunks():
            batch.append(piece)
            batch_bytes += len(piece)
            if batch_bytes >= _WRITE_BATCH_BYTES:
                await loop.run_in_executor(self._m.executor, files.write, pos, batch)
                pos += batch_bytes
                coverage.add(index, batch_bytes)
                self._notify()
                batch, batch_bytes = [], 0
        if batch:
            await loop.run_in_executor(self._m.executor, files.write, pos, batch)
            coverage.add(index, batch_bytes)
            self._notify()
        start, end = coverage.chunk(index)
        if start + coverage.filled(index) < end:
            raise InternalError(f"upstream body of {self.key} ended early")
        metrics.READTHROUGH_BYTES.inc(end - start)

    async def _hash(self) -> list[bytes]:
        """MD5 of each body file, hashed in order as the bytes arrive (from the page
        cache: the bytes were just written)."""
        files, coverage = self._files, self._coverage
        assert files is not None and coverage is not None
        loop = asyncio.get_running_loop()
        pos = 0
        while pos < coverage.size_bytes:
            end = min(coverage.available_end(pos), pos + _HASH_PIECE_BYTES)
            if end <= pos:
                await self._progress.wait()
                continue
            await loop.run_in_executor(self._m.executor, files.hash, pos, end)
            pos = end
        return files.digests()

    async def _commit(self, meta: ObjectMeta, plan: Layout, md5s: list[bytes]) -> bool:
        m, files = self._m, self._files
        assert files is not None
        await m.blobs.publish_scratch(files.published())
        parts: tuple[PartRef, ...] = ()
        blob_id: str | None = files.blob_ids[0]
        if len(plan.sizes) > 1 or parts_count(meta.etag) is not None:
            parts = tuple(
                PartRef(b, size, md5.hex())
                for b, size, md5 in zip(files.blob_ids, plan.sizes, md5s, strict=True)
            )
            blob_id = None
        try:
            kept = await m.journal.commit_cached(meta, blob_id, m.clock.wall(), parts)
        except Exception as exc:  # e.g. disk full: the copy is optional
            log.info("read-through copy of %s/%s not kept: %s", self.bucket, self.key, exc)
            return False
        if kept:
            metrics.READTHROUGH_CACHED.inc()
            for fd, blob, md5 in zip(files.fds, files.blob_ids, md5s, strict=True):
                m.verifier.note_good(fd, BlobCheck(blob, "md5", md5))  # hashed just now
        return kept

    async def _pace(self, n_bytes: int) -> None:
        budget = self._m.budget
        if budget is not None and n_bytes > 0:
            wait_s = budget.reserve(n_bytes, self._m.clock.monotonic())
            if wait_s > 0:
                await asyncio.sleep(wait_s)

    def _fail(self, exc: BaseException) -> None:
        self._error = exc if isinstance(exc, S3Error) else InternalError("read-through failed")
        if not self._head.done():
            self._head.set_exception(self._error)

    def _close_if_unused(self) -> None:
        if self._done.done() and self._leases == 0 and self._files is not None:
            self._files.close()


def _consume(future: asyncio.Future[Any]) -> None:
    """Mark an exception as retrieved: a fill nobody waited on is not an error."""
    if not future.cancelled():
        future.exception()


class FillReader:
    """A ``BodySource`` over a fill: bytes ``[pos, end)`` in order as they arrive."""

    def __init__(self, fill: Fill, pos: int, end: int) -> None:
        self._fill = fill
        self._pos = pos
        self._end = end
        self._is_open = True

    async def next_piece(self) -> Piece | None:
        fill = self._fill
        if self._pos >= self._end:
            return None
        while (available := fill.available_end(self._pos)) <= self._pos:
            await fill.wait_progress()
        stop = min(available, self._end, self._pos + _MAX_SPAN_BYTES)
        span = fill.span(self._pos, stop)
        self._pos += span.count
        return span

    async def aclose(self) -> None:
        if self._is_open:
            self._is_open = False
            self._fill.release()
