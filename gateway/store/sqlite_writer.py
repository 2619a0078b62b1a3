"""Group commit: one thread owns the journal's write connection and commits queued
operations together, so N concurrent PUTs cost one WAL fsync instead of N.

Each operation runs inside its own SAVEPOINT: a failing operation is rolled back alone and
its caller gets the exception; the others commit. If COMMIT itself fails (disk full, I/O
error) every caller in the group gets that error and nothing of the group is visible.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
OnCommit = Callable[[Any], None]
_Item = tuple[
    Callable[[sqlite3.Connection], Any],
    "asyncio.Future[Any]",
    asyncio.AbstractEventLoop,
    OnCommit | None,
]
log = logging.getLogger(__name__)


class GroupWriter:
    """Runs write operations on one connection in one thread, batching commits.

    MUST be the only writer of its database. ``submit`` may be called from any event loop;
    results are delivered on the caller's loop. ``close`` drains the queue, then stops.

    ``on_commit(result)`` of an operation runs on the caller's loop once the group's COMMIT
    succeeded, before the caller's future resolves (also when the caller was cancelled
    meanwhile: the transaction is durable either way). Callbacks run in commit order, so a
    consumer of them sees the same sequence of states as the database did.
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        max_batch: int = 512,
        on_committed: Callable[[], None] | None = None,
    ) -> None:
        self._conn = conn
        self._max_batch = max_batch
        self._on_committed = on_committed  # after each successful COMMIT (writer thread)
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def submit(
        self, op: Callable[[sqlite3.Connection], T], on_commit: Callable[[T], None] | None = None
    ) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queue.put((op, fut, loop, on_commit))
        return fut

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._conn.close()

    def _run(self) -> None:
        stopping = False
        while not stopping:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            self._commit(batch)

    def _commit(self, batch: list[_Item]) -> None:
        results: list[tuple[bool, Any]] = []
        conn = self._conn
        try:
            conn.execute("BEGIN IMMEDIATE")
            for op, _, _, _ in batch:
                conn.execute("SAVEPOINT op")
                try:
                    results.append((True, op(conn)))
                    conn.execute("RELEASE op")
                except Exception as exc:  # the operation's own failure, reported to its caller
                    if not conn.in_transaction:
                        # SQLite itself rolled the whole transaction back (SQLITE_FULL,
                        # SQLITE_IOERR): the savepoint is gone and so is the group's work;
                        # every caller gets this cause (below), not "no such savepoint".
                        raise
                    conn.execute("ROLLBACK TO op")
                    conn.execute("RELEASE op")
                    results.append((False, exc))
            conn.execute("COMMIT")
            if self._on_committed is not None:
                self._on_committed()
        except Exception as exc:  # COMMIT failed: nothing of the group is durable
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            results = [(False, exc)] * len(batch)
        for (_, fut, loop, on_commit), (ok, value) in zip(batch, results, strict=True):
            if loop.is_closed():
                continue  # its caller is gone with its loop; the commit itself stands
            try:
                loop.call_soon_threadsafe(_resolve, fut, ok, value, on_commit)
            except RuntimeError:  # the loop closed just now: as above
                continue


def _resolve(fut: asyncio.Future[Any], ok: bool, value: Any, on_commit: OnCommit | None) -> None:
    if ok and on_commit is not None:
        try:
            on_commit(value)
        except Exception:  # a consumer's bug must not leave the caller hanging
            log.exception("journal commit callback failed")
    if fut.cancelled():
        return
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)
