"""The local cache's read side: capacity admission for writes, read-through fills, and
integrity checks of local bodies while they are served.

- ``admitted``: runs a write that brings new bytes (PutObject, UploadPart, CopyObject)
  inside its capacity reservation; a refusal is ``503 SlowDown``.
- ``CacheFill``: a full-object read-through GET is copied into a new blob *while* it is
  served. The client never waits for the cache: pieces go through a bounded queue, and a
  full queue (slow disk) abandons the copy instead of blocking. The copy is committed as a
  ``durable`` row only if every byte arrived and its MD5 equals the (non-multipart) ETag.
- ``read_verified``: streams a whole local object while checking each body file against
  its stored digest (CRC32C from ingest, MD5 for older rows: ``store/integrity.py``),
  holding back the last piece until the check passed, so a client never receives a
  complete corrupt body: on a mismatch the stream raises instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import BinaryIO, Protocol, TypeVar

from gateway import metrics
from gateway.clock import Clock
from gateway.errors import InternalError
from gateway.models import ObjectMeta
from gateway.store.blobs import BlobStore
from gateway.store.integrity import BodyCheck, BodyDigest
from gateway.store.journal import Journal
from gateway.store.space import CacheSpace

log = logging.getLogger(__name__)

_FILL_QUEUE_PIECES = 16  # x 1 MiB upstream pieces: memory bound of one fill
_READ_PIECE_BYTES = 1 << 20


class _Written(Protocol):
    @property
    def size_bytes(self) -> int: ...


W = TypeVar("W", bound=_Written)


async def admitted(space: CacheSpace | None, size_bytes: int, write: Awaitable[W]) -> W:
    """Run ``write`` inside a reservation of ``size_bytes`` (SlowDown when it does not fit;
    the coroutine is then closed unstarted), then count the bytes it actually wrote (a
    length not known up front, a copy's source). No-op without a space (unit tests of
    other behaviour)."""
    if space is None:
        return await write
    try:
        async with space.admit(size_bytes) as grant:
            written = await write
            grant.commit(written.size_bytes)
            return written
    finally:
        if asyncio.iscoroutine(write):
            write.close()  # refused before it ran: no "never awaited" warning


class CacheFills:
    """Owner of the read-through fill tasks (each outlives its request by the commit).

    Contract: a fill MUST NOT slow its client down, MUST NOT commit a body that is not
    complete and MD5-equal to the upstream ETag, and MUST NOT replace a local row (a local
    write or delete during the GET wins). ``close`` cancels fills still running.
    """

    def __init__(
        self, journal: Journal, blobs: BlobStore, space: CacheSpace | None, clock: Clock
    ) -> None:
        self._journal = journal
        self._blobs = blobs
        self._space = space
        self._clock = clock
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def is_enabled(self) -> bool:
        return self._space is not None

    def wants(self, meta: ObjectMeta, max_object_bytes: int) -> bool:
        """Whether a full GET of ``meta`` should be copied into the cache."""
        if self._space is None or "-" in meta.etag or len(meta.etag) != 32:
            return False  # multipart ETag: no MD5 of the whole body to check against
        return meta.size_bytes <= max_object_bytes and self._space.fits_cache(meta.size_bytes)

    def tee(self, meta: ObjectMeta, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """Serve ``chunks`` and copy them into the cache on the side. The caller MUST hold a
        journal ``watch`` on the key (taken before the upstream GET); the fill releases it."""
        queue: asyncio.Queue[bytes | None] = asyncio.Queue(_FILL_QUEUE_PIECES)
        task = asyncio.create_task(self._fill(meta, queue), name=f"fill {meta.key}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        # Also when the task is cancelled before it ever ran.
        task.add_done_callback(lambda _: self._journal.unwatch(meta.bucket, meta.key))
        return _tee(chunks, queue, task)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _fill(self, meta: ObjectMeta, queue: asyncio.Queue[bytes | None]) -> None:
        try:
            blob = await self._blobs.write(_drain(queue), {"md5"})
        except Exception as exc:  # the copy is optional: the client got its bytes anyway
            log.debug("read-through copy of %s/%s not kept: %s", meta.bucket, meta.key, exc)
            return
        is_whole = blob.size_bytes == meta.size_bytes and blob.digests["md5"].hex() == meta.etag
        kept = False
        try:
            if is_whole:
                kept = await self._journal.commit_cached(
                    meta, blob.blob_id, self._clock.wall(), crc32c=blob.crc32c
                )
        except Exception as exc:  # e.g. disk full: the copy is optional
            log.debug("read-through copy of %s/%s not kept: %s", meta.bucket, meta.key, exc)
        finally:
            if not kept:
                await asyncio.shield(self._blobs.discard([blob.blob_id]))
        if not is_whole:
            log.warning("read-through copy of %s/%s did not match its ETag", meta.bucket, meta.key)
        if kept:
            metrics.READTHROUGH_CACHED.inc()
            if self._space is not None:
                self._space.note_cached(meta.size_bytes)  # may pass the high watermark


class _Abandoned(Exception):
    """The fill fell behind the client (or the client left): drop the copy."""


async def _drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
    while (piece := await queue.get()) is not None:
        yield piece


async def _tee(
    chunks: AsyncIterator[bytes], queue: asyncio.Queue[bytes | None], task: asyncio.Task[None]
) -> AsyncIterator[bytes]:
    is_complete = False
    try:
        async for piece in chunks:
            if not task.done():
                try:
                    queue.put_nowait(piece)
                except asyncio.QueueFull:
                    task.cancel()  # the cache is slower than the client: never make it wait
            yield piece
        is_complete = True
    finally:
        if not task.done():
            if is_complete:
                try:
                    queue.put_nowait(None)
                except asyncio.QueueFull:
                    task.cancel()
            else:
                task.cancel()  # a partial body is never committed
        with contextlib.suppress(Exception):
            await chunks.aclose()  # type: ignore[attr-defined]


# -- integrity of local bodies ---------------------------------------------------------------

OnCorrupt = Callable[[str], Awaitable[None]]


async def read_verified(
    files: list[BinaryIO], digests: list[BodyDigest], on_corrupt: OnCorrupt
) -> AsyncIterator[bytes]:
    """Stream each whole file in order, checking it against its digest in ``digests``.

    One piece is always held back, so the last bytes of the object leave only after every
    file matched; on a mismatch ``on_corrupt(message)`` runs and InternalError is raised
    (the response is cut short: the client sees a truncated body, never a complete bad one).
    """
    held: bytes | None = None
    try:
        for index, (fobj, digest) in enumerate(zip(files, digests, strict=True)):
            check = BodyCheck(digest)
            while piece := await asyncio.to_thread(_read_checking, fobj, check):
                if held is not None:
                    yield held
                held = piece
            problem = check.problem()
            if problem is not None:
                message = f"local corruption: body file {index + 1} of {len(files)}: {problem}"
                await on_corrupt(message)
                raise InternalError(message)
        if held is not None:
            yield held
    finally:
        for fobj in files:
            with contextlib.suppress(OSError):
                fobj.close()


def _read_checking(fobj: BinaryIO, check: BodyCheck) -> bytes:
    piece = fobj.read(_READ_PIECE_BYTES)
    check.update(piece)
    return piece
