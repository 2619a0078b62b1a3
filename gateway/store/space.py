"""CacheSpace: capacity admission (503 SlowDown backpressure) and LRU eviction of the cache.

Local bytes come in three kinds (sums of ``size_bytes`` in the journal):

- *unflushed*: rows ``pending``/``flushing``/``failed``. MUST NOT be evicted: they are the
  only copy of acknowledged bytes.
- *parts*: blobs of multipart uploads still open. MUST NOT be evicted either.
- *durable*: rows already in the upstream, kept as a read cache. Evictable, least recently
  used first (last access: ``accessed_s``, else the ack time ``acked_s``).

Admission: a new write of ``n`` bytes is refused with ``503 SlowDown`` when
``unflushed + parts + reserved + n > capacity``, where ``reserved`` counts writes admitted
and still streaming (reserved by Content-Length before the body is read, released when the
request ends). A write whose length is not known up front (HTTP chunked, no decoded length)
is admitted with 0 and grows its reservation piece by piece as it writes
(``Grant.grow``), refused the same way the moment a piece would not fit. Durable bytes
never refuse a write: they are evicted to make room.

The figures come from the journal's in-memory ``Figures`` (kept from its changes, exact as
soon as a write is acknowledged), so admission never queries the database.

Eviction: a background task (``run``) wakes when used bytes may have passed the high
watermark (after commits, on a disk-full error, on a timer), and evicts durable rows until
used bytes are at or below the low watermark. Evicting a row deletes it (only if it is still
the same durable version: a concurrent overwrite wins) and unlinks its blobs after COMMIT;
reads of the key then go to the upstream. Readers holding an open descriptor are unaffected.

Loop affinity: every method runs on the event loop; SQL runs in the journal's threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import sqlite3
from collections.abc import AsyncIterator

from gateway import metrics
from gateway.clock import Clock
from gateway.errors import SlowDown
from gateway.store.blobs import BlobStore
from gateway.store.figures import SpaceFigures
from gateway.store.journal import Journal
from gateway.store.rows import IMAGE_COLUMNS, blob_ids_of, image_from

log = logging.getLogger(__name__)

_EVICT_BATCH = 256
_TICK_S = 5.0  # eviction check and access-time write-back without any other trigger
_MIN_ROUND_GAP_S = 0.2


class Grant:
    """An admitted write's reservation. ``grow()`` as bytes of a length not known up front
    arrive; ``commit()`` once its row is committed."""

    def __init__(self, space: CacheSpace, size_bytes: int) -> None:
        self._space = space
        self.size_bytes = size_bytes
        self.committed_bytes = 0
        self.is_committed = False

    async def grow(self, size_bytes: int) -> None:
        """Reserve ``size_bytes`` more before writing them: raises SlowDown (and reserves
        nothing) when they do not fit. Released with the rest when the admission ends."""
        await self._space.require_room(size_bytes)
        self.size_bytes += size_bytes
        self._space.reserve(size_bytes)

    def commit(self, size_bytes: int) -> None:
        """The row is committed with ``size_bytes`` of new body (may differ from the
        reservation: a length not known up front, a copy's source)."""
        self.is_committed = True
        self.committed_bytes = size_bytes


class CacheSpace:
    """Capacity accounting and eviction. Contract: ``admit`` MUST raise SlowDown rather than
    let pinned bytes exceed ``capacity_bytes``; eviction MUST NOT remove a row that is not
    ``durable`` or a blob of an open upload; ``touch`` MUST NOT block or do I/O."""

    def __init__(
        self,
        journal: Journal,
        blobs: BlobStore,
        clock: Clock,
        *,
        capacity_bytes: int,
        high_fraction: float,
        low_fraction: float,
    ) -> None:
        self._journal = journal
        self._blobs = blobs
        self._clock = clock
        self.capacity_bytes = capacity_bytes
        self.high_bytes = int(capacity_bytes * high_fraction)
        self.low_bytes = int(capacity_bytes * low_fraction)
        self._low_fraction = low_fraction
        self._reserved_bytes = 0
        self._filling_bytes = 0  # read-through copies being written (reserve_fill)
        self._evict_lock = asyncio.Lock()
        self._wake = asyncio.Event()
        self._accessed: dict[tuple[str, str], float] = {}
        self._is_stopping = False
        self._is_disk_full = False
        self.evicted_objects = 0
        self.evicted_bytes = 0

    # -- admission --------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def admit(self, size_bytes: int) -> AsyncIterator[Grant]:
        """Reserve ``size_bytes`` for a write (raises SlowDown when they do not fit) for the
        block's duration. The caller calls ``grant.commit()`` once the journal row is
        committed; the figures count them from then on."""
        size_bytes = max(0, size_bytes)
        await self.require_room(size_bytes)
        grant = Grant(self, size_bytes)
        self._reserved_bytes += size_bytes
        token = _GRANT.set(grant)
        try:
            yield grant
        finally:
            _GRANT.reset(token)
            # Grown as the write went, if it did. The committed bytes are in the journal's
            # figures already (before the write returned).
            self._reserved_bytes -= grant.size_bytes
            if grant.is_committed and self.estimated_used_bytes() > self.high_bytes:
                self._wake.set()

    async def require_room(self, size_bytes: int) -> None:
        """Raise SlowDown unless ``size_bytes`` more fit (on fresh figures before refusing)."""
        if not self._fits(size_bytes):
            metrics.CAPACITY_REFUSALS.inc()
            raise SlowDown(
                "The gateway's local cache is full of data not yet flushed upstream; retry shortly."
            )

    def reserve(self, size_bytes: int) -> None:
        """Count ``size_bytes`` more as reserved (``Grant.grow``, after ``require_room``)."""
        self._reserved_bytes += size_bytes

    def _fits(self, size_bytes: int) -> bool:
        return self.pinned_estimate_bytes + size_bytes <= self.capacity_bytes

    def fits_cache(self, size_bytes: int) -> bool:
        """Whether a read-through copy of ``size_bytes`` may be kept without passing the
        high watermark once durable rows are evicted (pinned bytes and copies still being
        written stay under it)."""
        return self.pinned_estimate_bytes + self._filling_bytes + size_bytes <= self.high_bytes

    @property
    def pinned_estimate_bytes(self) -> int:
        """Bytes eviction cannot free: unflushed rows, open uploads (the journal's figures,
        kept as rows change) and writes in progress."""
        return self._journal.figures.space().pinned_bytes + self._reserved_bytes

    def reserve_fill(self, size_bytes: int) -> bool:
        """Reserve room for a read-through copy about to be written; False (nothing
        reserved) when it would not fit under the high watermark. Release it with
        ``release_fill`` whatever happens."""
        if not self.fits_cache(size_bytes):
            return False
        self._filling_bytes += size_bytes
        return True

    def release_fill(self, size_bytes: int, *, is_kept: bool) -> None:
        """The copy reserved with ``reserve_fill`` was committed (``is_kept``) or dropped."""
        self._filling_bytes -= size_bytes
        if is_kept:
            self.note_cached(size_bytes)

    @property
    def filling_bytes(self) -> int:
        return self._filling_bytes

    def estimated_used_bytes(self) -> int:
        """Used bytes, counting writes and copies still streaming as if they were done."""
        return self._journal.figures.space().used_bytes + self._reserved_bytes + self._filling_bytes

    async def refresh(self) -> SpaceFigures:
        """The figures now (from memory: no query)."""
        return self._journal.figures.space()

    # -- access tracking and eviction -------------------------------------------------------

    def touch(self, bucket: str, key: str) -> None:
        """Record a read of a local object (in memory; written back in batches)."""
        self._accessed[(bucket, key)] = self._clock.wall()

    def wake(self) -> None:
        """Ask the evictor to look now."""
        self._wake.set()

    def on_disk_full(self) -> None:
        """The filesystem said ENOSPC/EDQUOT: evict to the low watermark at once."""
        metrics.DISK_FULL_ERRORS.inc()
        self._is_disk_full = True
        self._wake.set()

    async def run(self) -> None:
        """The evictor loop, until ``stop``. A failed round is logged and retried later.

        Woken by commits past the high watermark, by flush outcomes while above it (a flush
        makes bytes evictable), by disk-full errors, and every few seconds; rounds are at
        least ``_MIN_ROUND_GAP_S`` apart so a stream of flushes costs few rounds."""
        self._journal.add_listener(self._on_changes)
        try:
            await self._loop()
        finally:
            self._journal.remove_listener(self._on_changes)

    def _on_changes(self) -> None:
        if self.estimated_used_bytes() > self.high_bytes:
            self._wake.set()

    async def _loop(self) -> None:
        while not self._is_stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), _TICK_S)
            if self._is_stopping:
                break
            await asyncio.sleep(_MIN_ROUND_GAP_S)  # let a burst of triggers coalesce
            self._wake.clear()
            try:
                await self.write_back_access()
                if self._is_disk_full:
                    self._is_disk_full = False
                    await self.evict_for_disk()
                else:
                    await self.evict_if_needed()
            except Exception:  # the worker loop must outlive one bad round
                log.exception("eviction round failed")
        with contextlib.suppress(Exception):
            await self.write_back_access()

    def stop(self) -> None:
        self._is_stopping = True
        self._wake.set()

    async def write_back_access(self) -> None:
        """Persist the batched last-access times (one transaction)."""
        if not self._accessed:
            return
        batch, self._accessed = self._accessed, {}
        rows = [(at_s, bucket, key) for (bucket, key), at_s in batch.items()]
        await self._journal.run_write(
            lambda c: c.executemany(
                "UPDATE objects SET accessed_s = ? WHERE bucket = ? AND key = ?", rows
            )
        )

    def note_cached(self, size_bytes: int) -> None:
        """A read-through copy of ``size_bytes`` was committed (outside ``admit``)."""
        if self.estimated_used_bytes() > self.high_bytes:
            self._wake.set()

    async def evict_if_needed(self) -> int:
        """Evict LRU durable rows if used bytes passed the high watermark, down to the low
        one. Returns the bytes evicted."""
        if self.estimated_used_bytes() <= self.high_bytes:
            return 0
        async with self._evict_lock:
            figures = await self.refresh()
            # Read-through copies being written take their room now, not once committed.
            used = figures.used_bytes + self._filling_bytes
            if used <= self.high_bytes:
                return 0
            return await self._evict_down_to(used, self.low_bytes)

    async def evict_for_disk(self) -> int:
        """The filesystem said ENOSPC: the disk is smaller than the capacity says (or other
        files share it). Evict durable rows down to the low watermark, or to the low
        fraction of what is used now if that is less, even below the high watermark."""
        async with self._evict_lock:
            figures = await self.refresh()
            target = min(self.low_bytes, int(figures.used_bytes * self._low_fraction))
            return await self._evict_down_to(figures.used_bytes, target)

    async def _evict_down_to(self, used_bytes: int, target_bytes: int) -> int:
        await self.write_back_access()
        freed = 0
        while used_bytes - freed > target_bytes:
            need = used_bytes - freed - target_bytes
            victims = await self._journal.run_admin_read(
                functools.partial(_lru_durable, need_bytes=need)
            )
            if not victims:
                break  # everything left is pinned: admission keeps new writes out
            removed = await self._journal.run_write(
                functools.partial(_delete_rows, self._journal, victims=victims)
            )
            blob_ids = [b for _, blobs in removed for b in blobs]
            await self._blobs.discard(blob_ids)  # after COMMIT: a crash leaves only orphans
            size = sum(s for s, _ in removed)
            freed += size
            self.evicted_objects += len(removed)
            self.evicted_bytes += size
            metrics.EVICTED_OBJECTS.inc(len(removed))
            metrics.EVICTED_BYTES.inc(size)
            if not removed:
                break  # every victim was overwritten meanwhile; look again next round
        if freed:
            log.info("evicted %d bytes of flushed objects from the local cache", freed)
        return freed


# The reservation of the write running in this task: set by ``CacheSpace.admit`` for its
# block, so the ingest of a body with no declared length can grow it (``current_grant``).
_GRANT: contextvars.ContextVar[Grant | None] = contextvars.ContextVar("grant", default=None)


def current_grant() -> Grant | None:
    """The capacity reservation of the admitted write running in this task, if any."""
    return _GRANT.get()


_Victim = tuple[str, str, int, int, str | None, str | None]


def _lru_durable(conn: sqlite3.Connection, need_bytes: int) -> list[_Victim]:
    """Least recently used durable rows adding up to at least ``need_bytes``."""
    out: list[_Victim] = []
    total = 0
    cursor = conn.execute(  # the partial index objects_lru serves this order
        "SELECT bucket, key, seq, size_bytes, blob_id, parts FROM objects "
        "WHERE state = 'durable' AND is_delete = 0 "
        "ORDER BY COALESCE(accessed_s, acked_s), seq LIMIT ?",
        (_EVICT_BATCH,),
    )
    for bucket, key, seq, size, blob_id, parts in cursor:
        out.append((str(bucket), str(key), int(seq), int(size), blob_id, parts))
        total += int(size)
        if total >= need_bytes:
            break
    return out


def _delete_rows(
    journal: Journal, conn: sqlite3.Connection, victims: list[_Victim]
) -> list[tuple[int, list[str]]]:
    """Delete each victim if it is still that durable version; (size, blob ids) of each."""
    removed: list[tuple[int, list[str]]] = []
    for bucket, key, seq, size, blob_id, parts in victims:
        row = conn.execute(
            f"SELECT {IMAGE_COLUMNS} FROM objects "
            "WHERE bucket = ? AND key = ? AND seq = ? AND state = 'durable'",
            (bucket, key, seq),
        ).fetchone()
        if row is not None and journal.delete_row(conn, image_from(row), is_flush=False):
            removed.append((size, blob_ids_of(blob_id, parts)))
    return removed
