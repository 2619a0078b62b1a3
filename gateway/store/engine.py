"""The journal's engine: its SQLite connections, the group-commit writer, and the stream
of changes that keeps everything in memory in step with the tables.

Every write operation records a ``RowChange`` (``record``) per row it changes. Once its
group is committed, the changes go to ``figures`` and to every subscribed consumer (the
flush order), on the event loop, in commit order, before the writing coroutine resumes. So
when a write is acknowledged, every figure already counts it, and nothing ever has to scan
the table to know what is pending.

Threads: all writes go through one ``GroupWriter`` thread (group commit). Reads use two
small pools of read-only connections, which in WAL mode see every committed write at once:
one for request lookups (GET/HEAD/LIST), one for heavy admin and maintenance reads, so a
slow report never delays a lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gateway.errors import SlowDown
from gateway.store.checkpoint import Checkpointer
from gateway.store.figures import Fence, Figures, Stats, Tally
from gateway.store.rows import Change, RowChange, RowImage, is_directory_prefix
from gateway.store.sqlite_writer import GroupWriter
from gateway.store.tables import (
    count_unflushed,
    ensure_schema,
    load_figures,
    read_seq_ceiling,
    referenced_blobs,
    unflushed_images,
    write_seq_ceiling,
)

T = TypeVar("T")
_WRITER_CHECKPOINT_PAGES = 4096  # 16 MiB of WAL at 4 KiB pages
# Sequence numbers are reserved durably in blocks (``seq_ceiling``): a number at or below
# the durable ceiling may be named to a replica holder before its own row commits, since
# no later start hands it out again (a start begins above the ceiling).
SEQ_BLOCK = 1_000_000


class FenceCounter(Protocol):
    """Counts, inside the writer while a consumer loads, the rows a commit marker waits
    for: unflushed rows under bucket/prefix acknowledged at or before ``seq``, not counting
    ``exclude_key``."""

    def __call__(self, bucket: str, prefix: str, seq: int, exclude_key: str) -> Tally: ...


class ChangeConsumer(Protocol):
    """Follows the journal's rows from memory (the flush order).

    ``load`` is called for every unflushed row, in seq order, from the writer thread while
    nothing else touches the consumer (it MUST NOT touch loop objects or ``figures``);
    ``attach`` then runs on the loop at the load's place in the commit order, and
    ``apply`` for every committed change after it, on the loop, in commit order."""

    def load(self, image: RowImage, count_fence: FenceCounter) -> None: ...

    def attach(self) -> None: ...

    def apply(self, change: RowChange) -> None: ...


class JournalEngine:
    """Connections, writer, change stream and fences of one journal database. Contract:
    every statement changing an ``objects`` row MUST record its ``RowChange`` (``record``)
    in the same operation: figures and the flush order are kept from them alone."""

    def __init__(
        self, path: Path, *, fsync: bool = True, readers: int = 2, admin_readers: int = 1
    ) -> None:
        self.path = path
        self.fsync = fsync
        self.figures = Figures()
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="journal-read")
        self._admin_readers = ThreadPoolExecutor(
            max_workers=admin_readers, thread_name_prefix="journal-admin"
        )
        self._local = threading.local()
        self._writer: GroupWriter | None = None
        self._checkpointer: Checkpointer | None = None
        self._next_seq = 1  # the next version's seq: handed out on the loop, in submit order
        self._durable_ceiling = 0  # no seq above it was ever named outside this journal
        self._raising_ceiling = False
        self._in_flight: set[int] = set()  # handed out, their op not answered yet
        self.first_seq = 1  # this run's first: a lower one was handed out by an earlier run
        self._doubtful: set[tuple[str, str]] = set()
        self._consumers: list[ChangeConsumer] = []
        self._listeners: list[Callable[[], None]] = []  # called after each applied group
        self._log: list[Change] | None = None  # the running write op's changes (writer thread)
        self._applied = asyncio.Event()  # set after every applied group of changes

    # -- lifecycle (blocking; called once at startup / shutdown) -------------------------

    def open(self) -> set[str]:
        """Create or migrate the schema, run recovery, load the figures, return every
        referenced blob id."""
        conn = self._connect()
        ensure_schema(conn)
        # Recovery: uploads in flight when the process died never completed as far as we know.
        conn.execute("UPDATE objects SET state = 'pending' WHERE state = 'flushing'")
        newest = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM objects").fetchone()[0])
        self._next_seq = max(newest, read_seq_ceiling(conn)) + 1
        self._durable_ceiling = write_seq_ceiling(conn, self._next_seq - 1 + SEQ_BLOCK)
        self.first_seq = self._next_seq
        load_figures(conn, self.figures)
        self.figures.last_seq = newest
        blobs = referenced_blobs(conn)
        # Checkpoints happen in the background (checkpoint.py). The writer's own automatic
        # checkpoint stays only as a backstop, far later than SQLite's default (1000 pages):
        # it then finds nearly everything copied already, completes at once and lets the
        # WAL restart from its beginning, which bounds it under sustained writes.
        conn.execute(f"PRAGMA wal_autocheckpoint = {_WRITER_CHECKPOINT_PAGES}")
        self._checkpointer = Checkpointer(self._connect)
        self._writer = GroupWriter(conn, on_committed=self._checkpointer.note_commit)
        return blobs

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        self._readers.shutdown(wait=True)
        self._admin_readers.shutdown(wait=True)

    def _connect(self, *, readonly: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'OFF'}")
        conn.execute("PRAGMA busy_timeout = 10000")
        if readonly:
            conn.execute("PRAGMA query_only = ON")
        return conn

    # -- plumbing --------------------------------------------------------------------------

    def record(self, change: Change) -> None:
        """Inside a write op: note a change of a row (or of parts' bytes)."""
        assert self._log is not None, "record() outside a journal write op"
        self._log.append(change)

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        assert self._writer is not None, "journal is not open"

        def logged(conn: sqlite3.Connection) -> tuple[T, list[Change]]:
            self._log = []
            try:
                result = op(conn)
                return result, self._log
            finally:
                self._log = None

        try:
            result, _ = await self._writer.submit(logged, self._dispatch)
        except sqlite3.OperationalError as exc:
            # SQLITE_FULL: the transaction was rolled back, the journal is intact; the
            # write is refused as retryable (space returns as the cache is evicted).
            if "full" in str(exc).lower():
                raise SlowDown("The gateway's local disk is full; retry shortly.") from exc
            raise
        return result

    def _dispatch(self, logged: tuple[Any, list[Change]]) -> None:
        """On the loop, in commit order: hand a committed op's changes to their readers."""
        changes = logged[1]
        for change in changes:
            self.figures.apply(change)
            if isinstance(change, RowChange):
                for consumer in self._consumers:
                    consumer.apply(change)
        if changes:
            self._applied.set()
            for listener in self._listeners:
                listener()

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._with_reader, op)

    def _with_reader(self, op: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(readonly=True)
            self._local.conn = conn
        return op(conn)

    async def run_write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` in the group-commit writer (for store-internal collaborators)."""
        return await self._write(op)

    async def run_write_versions(
        self,
        count: int,
        op: Callable[[sqlite3.Connection, int], T],
        on_seq: Callable[[int], None] | None = None,
    ) -> T:
        """Run ``op(conn, first_seq)``, an op that writes up to ``count`` versions, as
        ``first_seq``, ``first_seq + 1``...: numbers handed out here, on the loop, in the
        order ops are submitted, which is the order they commit in. ``on_seq(first_seq)``
        runs before the op is queued (a replicated write names its seq to its holders)."""
        first = self._next_seq
        self._next_seq += count
        self._keep_ceiling_ahead()
        seqs = range(first, first + count)
        self._in_flight.update(seqs)
        try:
            if on_seq is not None:
                on_seq(first)
            return await self._write(lambda conn: op(conn, first))
        finally:  # committed and visible, failed, or its caller gone (never acknowledged)
            self._in_flight.difference_update(seqs)

    def in_flight(self, seqs: Iterable[int]) -> set[int]:
        """Which of ``seqs`` are handed out to a write not answered yet (a replica holder
        may hold one committed early, before it is in the table)."""
        return self._in_flight.intersection(seqs)

    def mark_doubtful(self, bucket: str, key: str) -> None:
        """A version of ``key`` named to replica holders failed to commit here and may not
        have been withdrawn from them everywhere (``may_be_superseded_elsewhere``)."""
        self._doubtful.add((bucket, key))

    def may_be_superseded_elsewhere(self, bucket: str, key: str, seq: int) -> bool:
        """Whether a newer version of ``key`` from this data dir may exist on a replica
        holder and not here: named before its commit (early), by an earlier run that died
        before the commit, or by this run when the commit failed and the withdrawal may
        not have reached every holder. Such a version may be taken over into the bucket;
        this one must then not follow it there."""
        return seq < self.first_seq or (bucket, key) in self._doubtful

    def is_reserved(self, seq: int) -> bool:
        """Whether ``seq`` is under the durable ceiling: safe to name before it commits."""
        return seq <= self._durable_ceiling

    def _keep_ceiling_ahead(self) -> None:
        """Raise the durable ceiling half a block before the numbers reach it (one small
        op in the next group commit)."""
        if self._raising_ceiling or self._durable_ceiling - self._next_seq > SEQ_BLOCK // 2:
            return
        assert self._writer is not None, "journal is not open"
        self._raising_ceiling = True
        target = self._next_seq + SEQ_BLOCK

        def raised(ceiling: int) -> None:
            self._durable_ceiling = max(self._durable_ceiling, ceiling)
            self._raising_ceiling = False

        fut = self._writer.submit(lambda conn: write_seq_ceiling(conn, target), raised)
        fut.add_done_callback(self._ceiling_attempted)

    def _ceiling_attempted(self, fut: asyncio.Future[int]) -> None:
        """A raise that did not commit (disk trouble) is tried again at the next write;
        meanwhile numbers above the ceiling are never named before they commit."""
        if fut.cancelled() or fut.exception() is not None:
            self._raising_ceiling = False

    async def run_read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on a lookup connection (quick point reads only)."""
        return await self._read(op)

    async def run_admin_read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on the admin pool: reports and maintenance scans, never beside GETs."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._admin_readers, self._with_reader, op)

    async def subscribe(self, consumer: ChangeConsumer) -> None:
        """Attach ``consumer``: it is loaded with every unflushed row (in the writer, so no
        commit falls between that picture and the changes that follow), then follows.
        Call it before the gateway serves: the load holds the writer for its duration."""

        def op(conn: sqlite3.Connection) -> None:
            def count_fence(bucket: str, prefix: str, seq: int, exclude_key: str) -> Tally:
                return count_unflushed(conn, bucket, prefix, seq, exclude_key)

            for image in unflushed_images(conn):
                consumer.load(image, count_fence)

        def attach(_: None) -> None:
            consumer.attach()
            self._consumers.append(consumer)

        assert self._writer is not None, "journal is not open"
        await self._writer.submit(op, attach)

    def unsubscribe(self, consumer: ChangeConsumer) -> None:
        with contextlib.suppress(ValueError):
            self._consumers.remove(consumer)

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` runs on the loop after each committed group of changes (it MUST be
        cheap: it runs for every write)."""
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    # -- figures and fences ------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The seq of the newest acknowledged write: a drain fence."""
        return self.figures.last_seq

    async def stats(self) -> Stats:
        """Totals (O(1), from memory)."""
        return self.figures.stats()

    async def open_fence(self, bucket: str | None, prefix: str) -> Fence:
        """A fence over everything acknowledged so far under ``bucket`` (None: all) and
        ``prefix``. Directory prefixes come from memory; another prefix is counted once,
        inside the writer, so that no change is missed or counted twice. MUST be closed."""
        if is_directory_prefix(prefix):
            return self.figures.fence(bucket, prefix)
        fences: list[Fence] = []

        def op(conn: sqlite3.Connection) -> Tally:
            return count_unflushed(conn, bucket, prefix, None)

        def adopt(tally: Tally) -> None:
            fences.append(self.figures.register(bucket, prefix, self.last_seq, tally))

        assert self._writer is not None, "journal is not open"
        await self._writer.submit(op, adopt)
        return fences[0]

    async def unflushed(
        self, bucket: str | None, prefix: str, max_seq: int, *, skip_failed: bool = False
    ) -> tuple[int, int]:
        """Objects and bytes acknowledged at or before ``max_seq`` not yet durable upstream.

        A key counts if any version acknowledged at or before ``max_seq`` is not durable,
        even if a later write replaced it (``fence_seq``): the fence then waits for the
        newest version, since the one it covered will never be uploaded alone. A fence at
        ``last_seq`` (the usual one) is answered from memory; an older one by a query."""
        if max_seq >= self.last_seq:
            fence = await self.open_fence(bucket, prefix)
            fence.close()
            return fence.figures(skip_failed=skip_failed)
        tally = await self.run_admin_read(
            lambda conn: count_unflushed(conn, bucket, prefix, max_seq)
        )
        return tally.figures(skip_failed=skip_failed)

    async def wait_flushed(
        self,
        bucket: str | None,
        prefix: str,
        max_seq: int,
        timeout_s: float,
        *,
        skip_failed: bool = False,
    ) -> tuple[int, int]:
        """Wait until ``unflushed(bucket, prefix, max_seq, skip_failed=...)`` is empty or
        ``timeout_s`` passes; return what is still unflushed. ``skip_failed``: failed rows
        wait for an operator, not for time, so a waiter with a deadline (shutdown) does not
        wait on them."""
        if max_seq >= self.last_seq:
            fence = await self.open_fence(bucket, prefix)
            try:
                return await fence.wait(timeout_s, skip_failed=skip_failed)
            finally:
                fence.close()
        loop = asyncio.get_running_loop()  # an older fence: re-counted after changes
        deadline = loop.time() + timeout_s
        while True:
            left = await self.unflushed(bucket, prefix, max_seq, skip_failed=skip_failed)
            wait_s = deadline - loop.time()
            if left[0] == 0 or wait_s <= 0:
                return left
            self._applied.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._applied.wait(), min(wait_s, 1.0))
