"""Journal: the durable record of every acknowledged write and delete (SQLite, WAL mode).

One row per (bucket, key) holds the newest acknowledged version, or a tombstone for a delete
that has not reached the upstream yet. The row's ``state`` is the flush queue: ``pending``
rows are claimed by the flusher (``flushing``), then become ``durable`` (tombstones are then
removed) or ``failed``. Because pending state lives here, a restart resumes flushing.

Durability order: the caller writes and fsyncs the blob first, then ``commit_put`` commits the
row (``synchronous=FULL``: the WAL is fsynced before COMMIT returns), then the caller acks,
then it unlinks the superseded blob that ``commit_put`` returned.

Threads: all writes go through one ``GroupWriter`` thread (group commit); reads use a small
pool of read-only connections, which in WAL mode see every committed write at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import json
import sqlite3
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, TypeVar

from gateway.errors import SlowDown
from gateway.models import BucketInfo, FlushState, LocalObject, ObjectMeta, PartRef
from gateway.store.sqlite_writer import GroupWriter

T = TypeVar("T")
# A conditional-write check run inside a commit transaction: sees the key's current row
# (None when the key has no local row) and raises an S3Error to refuse the write.
RowCheck = Callable[[LocalObject | None], None]

_COLUMNS = (
    "bucket, key, seq, state, is_delete, blob_id, size_bytes, etag, last_modified_s, "
    "content_type, user_metadata, headers, checksums, attempts, last_error, parts, acked_s, "
    "flushed_before"
)


class Action(enum.Enum):
    CLAIM = "claim"  # flush it now
    SKIP = "skip"  # not now (its lane is busy, it waits on others); look again next time
    HOLD = "hold"  # not before ``until_s``: recorded, so it is not offered again until then
    STOP = "stop"  # neither this row nor any later one is eligible before ``until_s``


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    until_s: float = 0.0


CLAIM = Verdict(Action.CLAIM)
SKIP = Verdict(Action.SKIP)


@dataclass(frozen=True, slots=True)
class QueueEntry:
    """What a claim policy sees of a pending row (cheap: no JSON decoded)."""

    bucket: str
    key: str
    seq: int
    is_delete: bool
    size_bytes: int
    acked_s: float
    flushed_before: bool


class QueueView(Protocol):
    """Queries a claim policy may make inside the claim transaction."""

    def unflushed_before(self, bucket: str, prefix: str, seq: int) -> bool:
        """Whether a row under ``bucket``/``prefix`` acked before ``seq`` is not durable."""
        ...


class ClaimPolicy(Protocol):
    """Decides, row by row in ack order, what the flusher takes next (flush/policy.py)."""

    def decide(self, entry: QueueEntry, now_s: float, view: QueueView) -> Verdict: ...


@dataclass(frozen=True, slots=True)
class Claimed:
    objects: list[LocalObject]
    wake_s: float | None  # when a held row becomes eligible (None: nothing held)


class _QueueView:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def unflushed_before(self, bucket: str, prefix: str, seq: int) -> bool:
        # Keys compare as UTF-8 bytes, which orders like code points: [prefix, end) is
        # exactly the keys starting with prefix, and the primary key index serves it.
        row = self._conn.execute(
            "SELECT 1 FROM objects WHERE bucket = ? AND key >= ? AND key < ? AND seq < ? "
            "AND state != 'durable' LIMIT 1",
            (bucket, prefix, prefix_end(prefix), seq),
        ).fetchone()
        return row is not None


def prefix_bytes(prefix: str) -> tuple[int, bytes]:
    """(length, bytes) of ``prefix`` in UTF-8, for ``substr(CAST(key AS BLOB), 1, n) = p``:
    SQLite's text ``substr`` stops at a NUL, which S3 keys may contain; blobs do not."""
    raw = prefix.encode("utf-8", "surrogatepass")
    return len(raw), raw


def prefix_end(prefix: str) -> str:
    """The smallest string greater than every string that starts with ``prefix``."""
    stripped = prefix.rstrip("\U0010ffff")
    if not stripped:
        return "\U0010ffff" * (len(prefix) + 1)  # only reached for absurd keys
    nxt = ord(stripped[-1]) + 1
    if 0xD800 <= nxt <= 0xDFFF:  # surrogates cannot be encoded; skip the block
        nxt = 0xE000
    return stripped[:-1] + chr(nxt)


@dataclass(frozen=True, slots=True)
class Backlog:
    """Totals of what is not durable upstream yet."""

    pending_objects: int
    pending_bytes: int
    flushing_objects: int
    failed_objects: int
    oldest_acked_s: float | None


@dataclass(frozen=True, slots=True)
class Stats:
    backlog: Backlog
    flushed_objects: int
    flushed_bytes: int
    cached_bytes: int


class Journal:
    """The SQLite journal. Contract:

    - ``commit_*`` MUST only be called after the referenced blob is durable; they return
      once the row is durable. They return superseded blob ids, which the caller MUST unlink
      only after the call returns (never before COMMIT).
    - A flush outcome (``mark_durable``/``retry_later``/``mark_failed``) applies only if the
      row still carries the uploaded ``seq``; otherwise a newer write superseded it and the
      call is a no-op (the newer version flushes next).
    - ``pending_event`` is set whenever pending work may have appeared; ``changed`` is
      notified after every flush outcome (drain waiters re-check).
    """

    def __init__(self, path: Path, *, fsync: bool = True, readers: int = 2) -> None:
        self.path = path
        self.fsync = fsync
        self._readers = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="journal-read")
        self._local = threading.local()
        self._writer: GroupWriter | None = None
        self._next_seq = 1
        self.pending_event = asyncio.Event()
        self.changed = asyncio.Condition()
        # Keys with a read-through copy in progress -> [watchers, written since]. Set on the
        # loop, flagged in the writer thread (single dict/list item operations: GIL-atomic).
        self._watched: dict[tuple[str, str], list[Any]] = {}

    # -- lifecycle (blocking; called once at startup / shutdown) -------------------------

    def open(self) -> set[str]:
        """Create or migrate the schema, run recovery, return every referenced blob id."""
        conn = self._connect()
        conn.executescript(resources.files("gateway.store").joinpath("schema.sql").read_text())
        migrate(conn)
        # Recovery: uploads in flight when the process died never completed as far as we know.
        conn.execute("UPDATE objects SET state = 'pending' WHERE state = 'flushing'")
        row = conn.execute("SELECT COALESCE(MAX(seq), 0) FROM objects").fetchone()
        self._next_seq = int(row[0]) + 1
        blobs = referenced_blobs(conn)
        self._writer = GroupWriter(conn)
        self.pending_event.set()
        return blobs

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._readers.shutdown(wait=True)

    def _connect(self, *, readonly: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {'FULL' if self.fsync else 'OFF'}")
        conn.execute("PRAGMA busy_timeout = 10000")
        if readonly:
            conn.execute("PRAGMA query_only = ON")
        return conn

    # -- plumbing --------------------------------------------------------------------------

    async def _write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        assert self._writer is not None, "journal is not open"
        try:
            return await self._writer.submit(op)
        except sqlite3.OperationalError as exc:
            # SQLITE_FULL: the transaction was rolled back, the journal is intact; the
            # write is refused as retryable (space returns as the cache is evicted).
            if "full" in str(exc).lower():
                raise SlowDown("The gateway's local disk is full; retry shortly.") from exc
            raise

    async def _read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._with_reader, op)

    def _with_reader(self, op: Callable[[sqlite3.Connection], T]) -> T:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect(readonly=True)
            self._local.conn = conn
        return op(conn)

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    # -- acknowledged writes -----------------------------------------------------------------

    async def commit_put(
        self,
        meta: ObjectMeta,
        blob_id: str,
        acked_s: float,
        check: RowCheck | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """Make ``meta`` (body in ``blob_id``) the newest version of its key, state pending.

        ``check``, if given, sees the key's current row (None if there is none) inside the
        same transaction and may raise to refuse the write (conditional writes): no other
        write of the key can come between the check and the commit.
        Returns the new row and the superseded blob ids (to unlink after this returns).
        """

        def op(conn: sqlite3.Connection) -> tuple[LocalObject, list[str]]:
            if check is not None:
                check(self.current(conn, meta.bucket, meta.key))
            return self.upsert(conn, meta, blob_id, (), False, acked_s)

        result = await self._write(op)
        self.pending_event.set()
        return result

    def current(self, conn: sqlite3.Connection, bucket: str, key: str) -> LocalObject | None:
        """Inside an op: the key's row (version or tombstone), or None."""
        row = conn.execute(
            f"SELECT {_COLUMNS} FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
        ).fetchone()
        return _row(row) if row else None

    async def commit_delete(
        self, bucket: str, key: str, acked_s: float
    ) -> tuple[LocalObject, list[str]]:
        """Record a delete of ``key`` (a pending tombstone). Returns it and the superseded blob."""
        meta = ObjectMeta(bucket=bucket, key=key, size_bytes=0, etag="", last_modified_s=acked_s)
        result = await self._write(lambda c: self.upsert(c, meta, None, (), True, acked_s))
        self.pending_event.set()
        return result

    async def commit_copy(
        self, meta: ObjectMeta, blob_id: str | None, parts: tuple[PartRef, ...], acked_s: float
    ) -> tuple[LocalObject, list[str]]:
        """Make a copy the newest version of its key: a single body (``blob_id``) or the
        ordered ``parts`` of a multipart body. The referenced blobs MUST be durable and owned
        by this row alone (fresh hard links), since a superseded row's blobs are unlinked.
        Returns the new row and the superseded blob ids (to unlink after this returns)."""
        result = await self._write(lambda c: self.upsert(c, meta, blob_id, parts, False, acked_s))
        self.pending_event.set()
        return result

    async def commit_deletes(self, bucket: str, keys: Sequence[str], acked_s: float) -> list[str]:
        """Record deletes of every key in ``keys`` (pending tombstones) in ONE transaction:
        either all are durable or none is. Returns the superseded blob ids."""

        def op(conn: sqlite3.Connection) -> list[str]:
            superseded: list[str] = []
            for key in keys:
                meta = ObjectMeta(
                    bucket=bucket, key=key, size_bytes=0, etag="", last_modified_s=acked_s
                )
                _, old = self.upsert(conn, meta, None, (), True, acked_s)
                superseded.extend(old)
            return superseded

        result = await self._write(op)
        self.pending_event.set()
        return result

    def upsert(
        self,
        conn: sqlite3.Connection,
        meta: ObjectMeta,
        blob_id: str | None,
        parts: tuple[PartRef, ...],
        is_delete: bool,
        acked_s: float,
    ) -> tuple[LocalObject, list[str]]:
        """Inside a write op: replace the key's row; return it and the blobs it superseded."""
        old = conn.execute(
            "SELECT blob_id, parts, state, flushed_before, COALESCE(fence_seq, seq) "
            "FROM objects WHERE bucket = ? AND key = ?",
            (meta.bucket, meta.key),
        ).fetchone()
        # Whether we ever sent (or are sending) an older version of this key upstream.
        flushed_before = old is not None and (bool(old[3]) or old[2] != FlushState.PENDING.value)
        seq = self._next_seq
        # A superseded version that was not durable yet keeps the key inside the drain fences
        # taken after its ack: the fence waits for the version that replaces it.
        fence_seq = int(old[4]) if old and old[2] != FlushState.DURABLE.value else seq
        conn.execute(
            f"INSERT OR REPLACE INTO objects ({_COLUMNS}, not_before_s, fence_seq) "
            "VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, 0, ?)",
            (
                meta.bucket,
                meta.key,
                seq,
                int(is_delete),
                blob_id,
                meta.size_bytes,
                meta.etag,
                meta.last_modified_s,
                meta.content_type,
                json.dumps(dict(meta.user_metadata)),
                json.dumps(dict(meta.headers)),
                json.dumps(dict(meta.checksums)),
                _parts_json(parts),
                acked_s,
                int(flushed_before),
                fence_seq,
            ),
        )
        # Only advance once the statement succeeded (a failed op is rolled back alone).
        self._next_seq = seq + 1
        watch = self._watched.get((meta.bucket, meta.key))
        if watch is not None:
            watch[1] = True  # a read-through copy begun before this write is now stale
        row = LocalObject(
            meta=meta,
            seq=seq,
            state=FlushState.PENDING,
            blob_id=blob_id,
            is_delete=is_delete,
            parts=parts,
            acked_s=acked_s,
            flushed_before=flushed_before,
        )
        return row, (blob_ids_of(old[0], old[1]) if old else [])

    def watch(self, bucket: str, key: str) -> None:
        """Start noting writes of ``key`` (before a read-through GET is sent upstream)."""
        entry = self._watched.setdefault((bucket, key), [0, False])
        entry[0] += 1

    def unwatch(self, bucket: str, key: str) -> None:
        entry = self._watched.get((bucket, key))
        if entry is not None:
            entry[0] -= 1
            if entry[0] <= 0:
                del self._watched[(bucket, key)]

    async def commit_cached(
        self,
        meta: ObjectMeta,
        blob_id: str | None,
        now_s: float,
        parts: tuple[PartRef, ...] = (),
    ) -> bool:
        """Keep a read-through copy of an upstream object as a ``durable`` row, only if the
        key has no local row and was not written since ``watch`` (a local write or delete
        during the GET wins, even one already flushed and gone from the journal). The caller
        MUST hold a ``watch`` on the key from before its upstream GET. The body is one blob,
        or ``parts`` (with ``blob_id`` None) for a multipart object, part by part. It is a
        cache of upstream bytes (losing it loses nothing). Returns False if not kept; the
        caller then discards the blobs."""

        def op(conn: sqlite3.Connection) -> bool:
            watch = self._watched.get((meta.bucket, meta.key))
            if watch is None or watch[1] or self.current(conn, meta.bucket, meta.key):
                return False
            self.upsert(conn, meta, blob_id, parts, False, now_s)
            # Already upstream: durable at once, and an older version exists upstream.
            conn.execute(
                "UPDATE objects SET state = 'durable', flushed_before = 1, accessed_s = ? "
                "WHERE bucket = ? AND key = ?",
                (now_s, meta.bucket, meta.key),
            )
            return True

        return await self._write(op)

    async def mark_corrupt(self, obj: LocalObject, error: str) -> list[str] | None:
        """A local body no longer matches its digest. A ``durable`` row is dropped (the
        upstream holds the good bytes; reads go there) and its blob ids are returned for
        the caller to unlink after this returns. An unflushed row becomes ``failed`` with
        ``error`` (never flushed as good; returns []). None if the row changed meanwhile."""

        def op(conn: sqlite3.Connection) -> list[str] | None:
            ident = (obj.meta.bucket, obj.meta.key, obj.seq)
            row = conn.execute(
                "SELECT state, blob_id, parts FROM objects WHERE bucket = ? AND key = ? "
                "AND seq = ?",
                ident,
            ).fetchone()
            if row is None:
                return None
            if row[0] == FlushState.DURABLE.value:
                conn.execute("DELETE FROM objects WHERE bucket = ? AND key = ? AND seq = ?", ident)
                return blob_ids_of(row[1], row[2])
            conn.execute(
                "UPDATE objects SET state = 'failed', last_error = ? "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (storable(error), *ident),
            )
            return []

        result = await self._write(op)
        await self._notify()
        return result

    async def run_write(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` in the group-commit writer (for store-internal collaborators)."""
        return await self._write(op)

    async def run_read(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``op`` on a read connection (for store-internal collaborators)."""
        return await self._read(op)

    # -- reads ---------------------------------------------------------------------------

    async def get(self, bucket: str, key: str) -> LocalObject | None:
        """The local row for a key (a version or a tombstone), or None if the key is not local."""

        def op(conn: sqlite3.Connection) -> LocalObject | None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
            ).fetchone()
            return _row(row) if row else None

        return await self._read(op)

    async def scan(
        self, bucket: str, prefix: str, after: str, limit: int, *, inclusive: bool = False
    ) -> list[LocalObject]:
        """Rows of ``bucket`` whose key starts with ``prefix`` and sorts after ``after`` (or
        at it, if ``inclusive``), in S3 (UTF-8 binary) order, tombstones included."""
        bound = ">=" if inclusive else ">"

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM objects WHERE bucket = ? AND key {bound} ? AND key >= ? "
                "AND substr(CAST(key AS BLOB), 1, ?) = ? ORDER BY key LIMIT ?",
                (bucket, after, prefix, *prefix_bytes(prefix), limit),
            ).fetchall()
            return [_row(r) for r in rows]

        return await self._read(op)

    async def has_unflushed_objects(self, bucket: str) -> bool:
        """Is any version (not a delete) in ``bucket`` still waiting for the upstream?"""

        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM objects WHERE bucket = ? AND state != 'durable' AND is_delete = 0 "
                "LIMIT 1",
                (bucket,),
            ).fetchone()
            return row is not None

        return await self._read(op)

    # -- the flush queue ------------------------------------------------------------------

    async def claim(self, limit: int, now_s: float, policy: ClaimPolicy) -> Claimed:
        """Move up to ``limit`` pending rows (oldest ack first) that ``policy`` admits to
        ``flushing``. Rows backed off (``not_before_s``) are not offered. ``policy`` runs
        inside the write transaction, so what it sees cannot change under it."""

        def op(conn: sqlite3.Connection) -> Claimed:
            view = _QueueView(conn)
            chosen: list[tuple[str, str, int]] = []
            holds: list[tuple[float, str, str, int]] = []
            wake_s: float | None = None
            cursor = conn.execute(
                "SELECT bucket, key, seq, is_delete, size_bytes, acked_s, flushed_before "
                "FROM objects WHERE state = 'pending' AND not_before_s <= ? ORDER BY seq",
                (now_s,),
            )
            for bucket, key, seq, is_delete, size, acked_s, flushed in cursor:
                entry = QueueEntry(bucket, key, seq, bool(is_delete), size, acked_s, bool(flushed))
                verdict = policy.decide(entry, now_s, view)
                if verdict.action is Action.CLAIM:
                    chosen.append((bucket, key, seq))
                    if len(chosen) >= limit:
                        break
                    continue
                if verdict.action is Action.HOLD:
                    holds.append((verdict.until_s, bucket, key, seq))
                if verdict.action in (Action.HOLD, Action.STOP):
                    wake_s = verdict.until_s if wake_s is None else min(wake_s, verdict.until_s)
                if verdict.action is Action.STOP:
                    break
            conn.executemany(
                "UPDATE objects SET not_before_s = ? WHERE bucket = ? AND key = ? AND seq = ?",
                holds,
            )
            claimed: list[LocalObject] = []
            for bucket, key, seq in chosen:
                row = self.current(conn, bucket, key)  # as it was: flushed_before before this
                assert row is not None  # same transaction as the SELECT above
                claimed.append(row)
                # flushed_before: once a version is sent it may exist upstream, even if the
                # attempt later fails or is interrupted (a timeout can hide a success).
                conn.execute(
                    "UPDATE objects SET state = 'flushing', flushed_before = 1 "
                    "WHERE bucket = ? AND key = ? AND seq = ?",
                    (bucket, key, seq),
                )
            return Claimed([_with_state(o, FlushState.FLUSHING) for o in claimed], wake_s)

        return await self._write(op)

    async def next_retry_s(self) -> float | None:
        """When the earliest backed-off pending row becomes eligible (wall clock), if any."""

        def op(conn: sqlite3.Connection) -> float | None:
            row = conn.execute(
                "SELECT MIN(not_before_s) FROM objects WHERE state = 'pending' AND not_before_s > 0"
            ).fetchone()
            return None if row[0] is None else float(row[0])

        return await self._read(op)

    async def mark_durable(self, obj: LocalObject) -> bool:
        """The upstream has ``obj``'s version. Tombstones are dropped. False if superseded."""

        def op(conn: sqlite3.Connection) -> bool:
            key = (obj.meta.bucket, obj.meta.key, obj.seq)
            if obj.is_delete:
                cur = conn.execute(
                    "DELETE FROM objects WHERE bucket = ? AND key = ? AND seq = ?", key
                )
            else:
                cur = conn.execute(
                    "UPDATE objects SET state = 'durable', last_error = NULL "
                    "WHERE bucket = ? AND key = ? AND seq = ?",
                    key,
                )
            if cur.rowcount:
                _bump(conn, "flushed_objects", 1)
                _bump(conn, "flushed_bytes", obj.meta.size_bytes)
            return cur.rowcount > 0

        done = await self._write(op)
        self.pending_event.set()  # a commit marker may have been waiting for this one
        await self._notify()
        return done

    async def retry_later(self, obj: LocalObject, error: str, not_before_s: float) -> None:
        """A transient failure: back to pending, eligible again at ``not_before_s`` (wall)."""
        await self._write(
            lambda c: c.execute(
                "UPDATE objects SET state = 'pending', attempts = attempts + 1, last_error = ?, "
                "not_before_s = ? WHERE bucket = ? AND key = ? AND seq = ?",
                (storable(error), not_before_s, obj.meta.bucket, obj.meta.key, obj.seq),
            )
        )
        self.pending_event.set()
        await self._notify()

    async def mark_failed(self, obj: LocalObject, error: str) -> None:
        """A permanent failure: kept as ``failed`` until an operator asks for a retry."""
        await self._write(
            lambda c: c.execute(
                "UPDATE objects SET state = 'failed', attempts = attempts + 1, last_error = ? "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (storable(error), obj.meta.bucket, obj.meta.key, obj.seq),
            )
        )
        await self._notify()

    async def release(self, objs: list[LocalObject]) -> None:
        """Give claimed rows back (shutdown): ``flushing`` -> ``pending``, no attempt counted."""
        await self._write(
            lambda c: c.executemany(
                "UPDATE objects SET state = 'pending' WHERE bucket = ? AND key = ? AND seq = ? "
                "AND state = 'flushing'",
                [(o.meta.bucket, o.meta.key, o.seq) for o in objs],
            )
        )
        await self._notify()

    async def retry_failed(self) -> int:
        """Operator request: every failed row becomes pending again. Returns how many."""
        count = await self._write(
            lambda c: (
                c.execute(
                    "UPDATE objects SET state = 'pending', not_before_s = 0 WHERE state = 'failed'"
                ).rowcount
            )
        )
        self.pending_event.set()
        return int(count)

    # -- figures --------------------------------------------------------------------------

    @property
    def last_seq(self) -> int:
        """The seq of the newest acknowledged write: a drain fence."""
        return self._next_seq - 1

    async def unflushed(
        self, bucket: str | None, prefix: str, max_seq: int, *, skip_failed: bool = False
    ) -> tuple[int, int]:
        """Objects and bytes acknowledged at or before ``max_seq`` not yet durable upstream.

        A key counts if any version acknowledged at or before ``max_seq`` is not durable,
        even if a later write replaced it (``fence_seq``): the fence then waits for the
        newest version, since the one it covered will never be uploaded alone."""

        def op(conn: sqlite3.Connection) -> tuple[int, int]:
            sql = (
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM objects "
                "WHERE state != 'durable' AND COALESCE(fence_seq, seq) <= ? "
                "AND substr(CAST(key AS BLOB), 1, ?) = ?"
            )
            args: list[Any] = [max_seq, *prefix_bytes(prefix)]
            if bucket is not None:
                sql += " AND bucket = ?"
                args.append(bucket)
            if skip_failed:
                sql += " AND state != 'failed'"
            n, size = conn.execute(sql, args).fetchone()
            return int(n), int(size)

        return await self._read(op)

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
        ``timeout_s`` passes; return what is still unflushed. Woken by every flush outcome
        (``changed``). ``skip_failed``: failed rows wait for an operator, not for time, so a
        waiter with a deadline (shutdown) does not wait on them."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            objects, size = await self.unflushed(bucket, prefix, max_seq, skip_failed=skip_failed)
            left_s = deadline - loop.time()
            if objects == 0 or left_s <= 0:
                return objects, size
            async with self.changed:
                # The 1 s cap covers a notification that fired between query and wait.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.changed.wait(), min(left_s, 1.0))

    async def stats(self) -> Stats:
        return await self._read(_stats)

    async def lanes(self, lane_of: Callable[[str], str]) -> dict[tuple[str, str], tuple[int, int]]:
        """Unflushed objects and bytes by (bucket, lane prefix), ``lane_of`` mapping a key."""

        def op(conn: sqlite3.Connection) -> dict[tuple[str, str], tuple[int, int]]:
            out: dict[tuple[str, str], tuple[int, int]] = {}
            for bucket, key, size in conn.execute(
                "SELECT bucket, key, size_bytes FROM objects WHERE state != 'durable'"
            ):
                ident = (str(bucket), lane_of(str(key)))
                n, total = out.get(ident, (0, 0))
                out[ident] = (n + 1, total + int(size))
            return out

        return await self._read(op)

    # -- upstream multipart uploads in progress ----------------------------------------------

    async def record_upstream_upload(
        self, upload_id: str, bucket: str, key: str, created_s: float
    ) -> None:
        """Remember an upstream multipart upload before its parts are sent (crash safety)."""
        await self._write(
            lambda c: c.execute(
                "INSERT OR REPLACE INTO upstream_uploads VALUES (?, ?, ?, ?)",
                (upload_id, bucket, key, created_s),
            )
        )

    async def forget_upstream_upload(self, upload_id: str) -> None:
        await self._write(
            lambda c: c.execute("DELETE FROM upstream_uploads WHERE upload_id = ?", (upload_id,))
        )

    async def upstream_uploads(self) -> list[tuple[str, str, str]]:
        """(upload_id, bucket, key) of every upstream upload not known to be finished."""
        return [(u, b, k) for u, b, k, _ in await self.upstream_upload_records()]

    async def upstream_upload_records(self) -> list[tuple[str, str, str, float]]:
        """(upload_id, bucket, key, created_s) of every recorded upstream upload or intent."""
        rows = await self._read(
            lambda c: c.execute(
                "SELECT upload_id, bucket, key, created_s FROM upstream_uploads"
            ).fetchall()
        )
        return [(str(u), str(b), str(k), float(t)) for u, b, k, t in rows]

    async def failed(self, limit: int = 100) -> list[LocalObject]:
        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            rows = conn.execute(
                f"SELECT {_COLUMNS} FROM objects WHERE state = 'failed' ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
            return [_row(r) for r in rows]

        return await self._read(op)

    # -- buckets ---------------------------------------------------------------------------

    async def known_bucket(self, name: str) -> bool:
        return await self._read(
            lambda c: (
                c.execute("SELECT 1 FROM buckets WHERE name = ?", (name,)).fetchone() is not None
            )
        )

    async def remember_bucket(self, bucket: BucketInfo) -> None:
        await self._write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO buckets (name, created_s) VALUES (?, ?)",
                (bucket.name, bucket.created_s),
            )
        )

    async def forget_bucket(self, name: str) -> list[str]:
        """Drop a bucket and its (durable) rows; returns blob ids to unlink."""

        def op(conn: sqlite3.Connection) -> list[str]:
            blobs = [
                b
                for blob_id, parts in conn.execute(
                    "SELECT blob_id, parts FROM objects WHERE bucket = ?", (name,)
                )
                for b in blob_ids_of(blob_id, parts)
            ]
            conn.execute("DELETE FROM objects WHERE bucket = ?", (name,))
            conn.execute("DELETE FROM buckets WHERE name = ?", (name,))
            return blobs

        return await self._write(op)


def _stats(conn: sqlite3.Connection) -> Stats:
    by_state = {
        state: (int(n), int(size), oldest)
        for state, n, size, oldest in conn.execute(
            "SELECT state, COUNT(*), COALESCE(SUM(size_bytes), 0), MIN(acked_s) FROM objects "
            "WHERE state != 'durable' GROUP BY state"
        )
    }
    oldest = [v[2] for v in by_state.values() if v[2] is not None]
    backlog = Backlog(
        pending_objects=sum(v[0] for v in by_state.values()),
        pending_bytes=sum(v[1] for v in by_state.values()),
        flushing_objects=by_state.get("flushing", (0, 0, None))[0],
        failed_objects=by_state.get("failed", (0, 0, None))[0],
        oldest_acked_s=min(oldest) if oldest else None,
    )
    counters = dict(conn.execute("SELECT name, value FROM counters"))
    # Every local body byte: object versions and parts of uploads still open.
    cached = (
        conn.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM objects WHERE is_delete = 0"
        ).fetchone()[0]
        + conn.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM parts").fetchone()[0]
    )
    return Stats(
        backlog,
        int(counters.get("flushed_objects", 0)),
        int(counters.get("flushed_bytes", 0)),
        int(cached),
    )


def _bump(conn: sqlite3.Connection, name: str, by: int) -> None:
    conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
        (name, by),
    )


def _row(r: tuple[Any, ...]) -> LocalObject:
    (
        bucket,
        key,
        seq,
        state,
        is_delete,
        blob_id,
        size,
        etag,
        mtime,
        ctype,
        umeta,
        headers,
        checksums,
        attempts,
        last_error,
        parts,
        acked_s,
        flushed_before,
    ) = r
    meta = ObjectMeta(
        bucket=bucket,
        key=key,
        size_bytes=size,
        etag=etag,
        last_modified_s=mtime,
        content_type=ctype,
        user_metadata=json.loads(umeta),
        headers=json.loads(headers),
        checksums=json.loads(checksums),
    )
    return LocalObject(
        meta=meta,
        seq=seq,
        state=FlushState(state),
        blob_id=blob_id,
        is_delete=bool(is_delete),
        attempts=attempts,
        last_error=last_error,
        parts=tuple(PartRef(*p) for p in json.loads(parts)) if parts else (),
        acked_s=acked_s,
        flushed_before=bool(flushed_before),
    )


def storable(error: str) -> str:
    """An error text SQLite can store whatever it holds: sqlite3 encodes text as UTF-8 and
    raises on a lone surrogate (undecodable request bytes), which would fail the recording
    of the error itself; such characters become backslash escapes."""
    return error.encode("utf-8", "backslashreplace").decode("utf-8")


def _with_state(obj: LocalObject, state: FlushState) -> LocalObject:
    return dataclasses.replace(obj, state=state)


def _parts_json(parts: tuple[PartRef, ...]) -> str | None:
    return (
        json.dumps([[p.blob_id, p.size_bytes, p.etag, p.checksum] for p in parts])
        if parts
        else None
    )


def blob_ids_of(blob_id: str | None, parts: str | None) -> list[str]:
    """The blob ids of a row, from its ``blob_id`` and ``parts`` columns."""
    if parts:
        return [str(p[0]) for p in json.loads(parts)]
    return [blob_id] if blob_id else []


# Guarded migrations: each adds what an older data directory lacks, and is a no-op after.
_ADDED_COLUMNS = (
    ("objects", "accessed_s", "REAL"),  # last read (wall), for LRU eviction
    # Oldest unflushed acknowledged version of the key, for drain fences. NULL reads as
    # ``seq``: the old fence, which is right for rows written before the upgrade.
    ("objects", "fence_seq", "INTEGER"),
)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring an older journal's schema up to date (idempotent; runs at every open)."""
    for table, column, decl in _ADDED_COLUMNS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")


def referenced_blobs(conn: sqlite3.Connection) -> set[str]:
    """Every blob id a row refers to: object bodies and parts of uploads in progress."""
    out = {
        b
        for blob_id, parts in conn.execute("SELECT blob_id, parts FROM objects")
        for b in blob_ids_of(blob_id, parts)
    }
    out.update(r[0] for r in conn.execute("SELECT blob_id FROM parts"))
    return out
