"""Journal: the durable record of every acknowledged write and delete (SQLite, WAL mode).

One row per (bucket, key) holds the newest acknowledged version, or a tombstone for a delete
that has not reached the upstream yet. The row's ``state`` is its place on the way
upstream: ``pending`` -> ``flushing`` -> ``durable`` (tombstones are then removed) or
``failed``. Because that state lives here, a restart resumes flushing. This module holds
the object rows; the plumbing (connections, writer, the change stream, fences) is in
``engine.py``, the flush queue's outcomes in ``queue.py``, bucket and upstream-upload
records in ``buckets.py`` and ``records.py``, multipart uploads in ``uploads.py``, the
figures in ``figures.py``.

Durability order: the caller writes and fsyncs the blob first, then ``commit_put`` commits the
row (``synchronous=FULL``: the WAL is fsynced before COMMIT returns), then the caller acks,
then it unlinks the superseded blob that ``commit_put`` returned.

Every mutation records its ``RowChange`` (``engine.py``), which keeps the figures and the
flush order in step without a scan.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef
from gateway.store.engine import ChangeConsumer, FenceCounter, JournalEngine
from gateway.store.rows import (
    BODY_COLUMNS,
    COLUMNS,
    IMAGE_COLUMNS,
    RowChange,
    RowImage,
    blob_ids_of,
    current,
    directory_prefixes,
    image_from,
    prefix_bytes,
    row_from,
    storable,
    write_version,
)

__all__ = ["ChangeConsumer", "FenceCounter", "Journal", "RowCheck"]
# A conditional-write check run inside a commit transaction: sees the key's current row
# (None when the key has no local row) and raises an S3Error to refuse the write.
RowCheck = Callable[[LocalObject | None], None]

log = logging.getLogger(__name__)


class Journal(JournalEngine):
    """The SQLite journal's object rows. Contract:

    - ``commit_*`` MUST only be called after the referenced blob is durable; they return
      once the row is durable. They return superseded blob ids, which the caller MUST unlink
      only after the call returns (never before COMMIT).
    - A flush outcome (``FlushQueue``) applies only if the row still carries the uploaded
      ``seq``; otherwise a newer write superseded it and the call is a no-op.
    """

    def __init__(
        self, path: Path, *, fsync: bool = True, readers: int = 2, admin_readers: int = 1
    ) -> None:
        super().__init__(path, fsync=fsync, readers=readers, admin_readers=admin_readers)
        # Keys with a read-through copy in progress -> [watchers, written since]. Set on the
        # loop, flagged in the writer thread (single dict/list item operations: GIL-atomic).
        self._watched: dict[tuple[str, str], list[Any]] = {}

    # -- acknowledged writes -----------------------------------------------------------------

    async def commit_put(
        self,
        meta: ObjectMeta,
        blob_id: str | None,
        acked_s: float,
        check: RowCheck | None = None,
        *,
        crc32c: int | None = None,
        body: bytes | None = None,
        on_seq: Callable[[int], None] | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """Make ``meta`` (body in ``blob_id``, or ``body`` itself, inline) the newest version
        of its key, state pending. ``crc32c`` is the body's, from ingest. ``on_seq`` gets
        the version's seq before the commit is queued (``run_write_versions``).

        ``check``, if given, sees the key's current row (None if there is none) inside the
        same transaction and may raise to refuse the write (conditional writes): no other
        write of the key can come between the check and the commit.
        Returns the new row and the superseded blob ids (to unlink after this returns).
        """

        return await self._commit_version(
            meta, blob_id, (), acked_s, check, crc32c=crc32c, body=body, on_seq=on_seq
        )

    def current(self, conn: sqlite3.Connection, bucket: str, key: str) -> LocalObject | None:
        """Inside an op: the key's row (version or tombstone), or None."""
        return current(conn, bucket, key)

    async def commit_delete(
        self, bucket: str, key: str, acked_s: float, check: RowCheck | None = None
    ) -> tuple[LocalObject, list[str]]:
        """Record a delete of ``key`` (a pending tombstone). Returns it and the superseded blob.
        ``check``: as for ``commit_put`` (a conditional delete)."""
        meta = ObjectMeta(bucket=bucket, key=key, size_bytes=0, etag="", last_modified_s=acked_s)
        return await self._commit_version(meta, None, (), acked_s, check, is_delete=True)

    async def commit_copy(
        self,
        meta: ObjectMeta,
        blob_id: str | None,
        parts: tuple[PartRef, ...],
        acked_s: float,
        *,
        crc32c: int | None = None,
        body: bytes | None = None,
        check: RowCheck | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """Make a copy the newest version of its key: a single body (``blob_id``, or ``body``
        inline) or the ordered ``parts`` of a multipart body. The referenced blobs MUST be
        durable and owned by this row alone (fresh hard links), since a superseded row's
        blobs are unlinked. Returns the new row and the superseded blob ids (to unlink after
        this returns). ``check``: as for ``commit_put`` (a conditional copy).
        """
        return await self._commit_version(
            meta, blob_id, parts, acked_s, check, crc32c=crc32c, body=body
        )

    async def _commit_version(
        self,
        meta: ObjectMeta,
        blob_id: str | None,
        parts: tuple[PartRef, ...],
        acked_s: float,
        check: RowCheck | None,
        *,
        is_delete: bool = False,
        crc32c: int | None = None,
        body: bytes | None = None,
        on_seq: Callable[[int], None] | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """One new version of ``meta``'s key (a tombstone with ``is_delete``), ``check``
        first seeing the key's current row in the same transaction."""

        def op(conn: sqlite3.Connection, seq: int) -> tuple[LocalObject, list[str]]:
            if check is not None:
                check(self.current(conn, meta.bucket, meta.key))
            return self.upsert(
                conn, seq, meta, blob_id, parts, is_delete, acked_s, crc32c=crc32c, body=body
            )

        return await self.run_write_versions(1, op, on_seq)

    async def commit_deletes(self, bucket: str, keys: Sequence[str], acked_s: float) -> list[str]:
        """Record deletes of every key in ``keys`` (pending tombstones) in ONE transaction:
        either all are durable or none is. Returns the superseded blob ids."""

        def op(conn: sqlite3.Connection, first_seq: int) -> list[str]:
            superseded: list[str] = []
            for seq, key in enumerate(keys, first_seq):
                meta = ObjectMeta(
                    bucket=bucket, key=key, size_bytes=0, etag="", last_modified_s=acked_s
                )
                _, old = self.upsert(conn, seq, meta, None, (), True, acked_s)
                superseded.extend(old)
            return superseded

        return await self.run_write_versions(len(keys), op)

    def upsert(
        self,
        conn: sqlite3.Connection,
        seq: int,
        meta: ObjectMeta,
        blob_id: str | None,
        parts: tuple[PartRef, ...],
        is_delete: bool,
        acked_s: float,
        *,
        is_cached: bool = False,
        crc32c: int | None = None,
        body: bytes | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """Inside a write op: replace the key's row with version ``seq`` (from
        ``run_write_versions``); return it and the blobs it superseded (see
        ``rows.write_version`` for the keywords)."""
        change, row, superseded = write_version(
            conn,
            seq,
            meta,
            blob_id,
            parts,
            is_delete,
            acked_s,
            is_cached=is_cached,
            crc32c=crc32c,
            body=body,
        )
        self.record(change)
        if log.isEnabledFor(logging.DEBUG):  # what a version is, to trace reads by (--log-level)
            what = "delete" if is_delete else f"etag {meta.etag}"
            log.debug("%s/%s seq=%d acked %.6f: %s", meta.bucket, meta.key, seq, acked_s, what)
        watch = self._watched.get((meta.bucket, meta.key))
        if watch is not None:
            watch[1] = True  # a read-through copy begun before this write is now stale
        return row, superseded

    def delete_row(self, conn: sqlite3.Connection, image: RowImage, *, is_flush: bool) -> bool:
        """Inside a write op: delete the row ``image`` describes if it still has that seq."""
        cur = conn.execute(
            "DELETE FROM objects WHERE bucket = ? AND key = ? AND seq = ?",
            (image.bucket, image.key, image.seq),
        )
        if cur.rowcount:
            self.record(RowChange(image, None, is_flush))
        return cur.rowcount > 0

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
        *,
        crc32c: int | None = None,
    ) -> bool:
        """Keep a read-through copy of an upstream object as a ``durable`` row, only if the
        key has no local row and was not written since ``watch`` (a local write or delete
        during the GET wins, even one already flushed and gone from the journal). The caller
        MUST hold a ``watch`` on the key from before its upstream GET. The body is one blob,
        or ``parts`` (with ``blob_id`` None) for a multipart object, part by part. It is a
        cache of upstream bytes (losing it loses nothing). Returns False if not kept; the
        caller then discards the blobs."""

        def op(conn: sqlite3.Connection, seq: int) -> bool:
            watch = self._watched.get((meta.bucket, meta.key))
            if watch is None or watch[1] or self.current(conn, meta.bucket, meta.key):
                return False
            self.upsert(
                conn, seq, meta, blob_id, parts, False, now_s, is_cached=True, crc32c=crc32c
            )
            return True

        return await self.run_write_versions(1, op)

    async def drop_copy(self, obj: LocalObject) -> list[str] | None:
        """Drop ``obj``'s row if it is still that durable version (a copy of the bucket's
        object found out of date: ``core/freshness.py``); its blob ids are returned for the
        caller to unlink after this returns. None if the row changed meanwhile."""

        def op(conn: sqlite3.Connection) -> list[str] | None:
            found = _version_row(conn, obj)
            if found is None or found[1].state is not FlushState.DURABLE:
                return None
            blob_ids, image = found
            self.delete_row(conn, image, is_flush=False)
            return blob_ids

        return await self._write(op)

    async def mark_corrupt(self, obj: LocalObject, error: str) -> list[str] | None:
        """A local body no longer matches its digest. A ``durable`` row is dropped (the
        upstream holds the good bytes; reads go there) and its blob ids are returned for
        the caller to unlink after this returns. An unflushed row becomes ``failed`` with
        ``error`` (never flushed as good; returns []). None if the row changed meanwhile."""

        def op(conn: sqlite3.Connection) -> list[str] | None:
            found = _version_row(conn, obj)
            if found is None:
                return None
            blob_ids, image = found
            if image.state is FlushState.DURABLE:
                self.delete_row(conn, image, is_flush=False)
                return blob_ids
            conn.execute(
                "UPDATE objects SET state = 'failed', last_error = ? "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (storable(error), obj.meta.bucket, obj.meta.key, obj.seq),
            )
            self.record(RowChange(image, image.with_state(FlushState.FAILED)))
            return []

        return await self._write(op)

    # -- reads ---------------------------------------------------------------------------

    async def get(self, bucket: str, key: str) -> LocalObject | None:
        """The local row for a key (a version or a tombstone), or None if the key is not local."""
        return await self._read(lambda conn: current(conn, bucket, key))

    async def scan(
        self, bucket: str, prefix: str, after: str, limit: int, *, inclusive: bool = False
    ) -> list[LocalObject]:
        """Rows of ``bucket`` whose key starts with ``prefix`` and sorts after ``after`` (or
        at it, if ``inclusive``), in S3 (UTF-8 binary) order, tombstones included."""
        bound = ">=" if inclusive else ">"

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM objects WHERE bucket = ? AND key {bound} ? AND key >= ? "
                "AND substr(CAST(key AS BLOB), 1, ?) = ? ORDER BY key LIMIT ?",
                (bucket, after, prefix, *prefix_bytes(prefix), limit),
            ).fetchall()
            return [row_from(r) for r in rows]

        return await self._read(op)

    async def scan_unflushed(
        self, bucket: str, prefix: str, after: str, limit: int
    ) -> list[LocalObject]:
        """Like ``scan``, but only rows not durable upstream (versions and tombstones): what
        another gateway of the fleet cannot find in the bucket."""

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM objects WHERE bucket = ? AND key > ? AND key >= ? "
                "AND substr(CAST(key AS BLOB), 1, ?) = ? AND state != 'durable' "
                "ORDER BY key LIMIT ?",
                (bucket, after, prefix, *prefix_bytes(prefix), limit),
            ).fetchall()
            return [row_from(r) for r in rows]

        return await self._read(op)

    async def unflushed_dirs(self) -> set[tuple[str, str]]:
        """The (bucket, parent directory) of every row not durable upstream: what a fleet
        node announces again when it starts with its disk (``LocalDirectory.restore``)."""

        def op(conn: sqlite3.Connection) -> set[tuple[str, str]]:
            return {
                (bucket, directory_prefixes(key)[-1])
                for state in ("pending", "flushing", "failed")
                for bucket, key in conn.execute(
                    "SELECT bucket, key FROM objects WHERE state = ?", (state,)
                )
            }

        return await self._read(op)

    async def unflushed_after(self, after_seq: int, limit: int) -> list[LocalObject]:
        """Rows not durable upstream with a seq above ``after_seq``, in seq order, at
        most ``limit``, with their inline bodies (re-replication's pass over what a lost
        holder held)."""

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            # One indexed range per state (objects_by_state), merged: no sort of them all.
            rows = [
                row_from(r)
                for state in ("pending", "flushing", "failed")
                for r in conn.execute(
                    f"SELECT {BODY_COLUMNS} FROM objects WHERE state = ? AND seq > ? "
                    "ORDER BY seq LIMIT ?",
                    (state, after_seq, limit),
                )
            ]
            return sorted(rows, key=lambda row: row.seq)[:limit]

        return await self._read(op)

    async def unflushed_seqs(self, seqs: Sequence[int]) -> set[int]:
        """Which of these versions a replica holder must still keep: rows not durable
        upstream, and versions superseded here by a row that is not durable yet (between
        its fence and its seq). The newer row may never have been acknowledged (its own
        replica failed): until it drains, the older acknowledged version's replica is the
        only other copy of the newest acknowledged data. And versions whose commit is on
        its way (a PutObject's holders commit it beside the local commit)."""
        wanted = list(seqs)
        unflushed = "state IN ('pending', 'flushing', 'failed')"

        def op(conn: sqlite3.Connection) -> set[int]:
            out: set[int] = set()
            for start in range(0, len(wanted), 500):
                batch = wanted[start : start + 500]
                marks = ",".join("?" * len(batch))
                out.update(
                    int(r[0])
                    for r in conn.execute(
                        f"SELECT seq FROM objects WHERE {unflushed} AND seq IN ({marks})",
                        batch,
                    )
                )
            spans = conn.execute(
                f"SELECT fence_seq, seq FROM objects WHERE {unflushed} AND fence_seq < seq"
            ).fetchall()
            out.update(s for s in wanted if any(low <= s < high for low, high in spans))
            return out

        # A version committed early on its holder may be in flight here: before the read
        # and after it, so that one committed while the read ran is never missed.
        before = self.in_flight(wanted)
        found = await self._read(op)
        return found | before | self.in_flight(wanted)

    async def has_unflushed_objects(self, bucket: str) -> bool:
        """Is any version (not a delete) in ``bucket`` still waiting for the upstream?"""
        if not self.figures.has_unflushed(bucket):
            return False  # nothing at all unflushed there: no query needed

        def op(conn: sqlite3.Connection) -> bool:
            row = conn.execute(
                "SELECT 1 FROM objects WHERE bucket = ? AND state != 'durable' AND is_delete = 0 "
                "LIMIT 1",
                (bucket,),
            ).fetchone()
            return row is not None

        return await self.run_admin_read(op)


def _version_row(conn: sqlite3.Connection, obj: LocalObject) -> tuple[list[str], RowImage] | None:
    """The blob ids and image of ``obj``'s version if its row is still there."""
    row = conn.execute(
        f"SELECT blob_id, parts, {IMAGE_COLUMNS} FROM objects "
        "WHERE bucket = ? AND key = ? AND seq = ?",
        (obj.meta.bucket, obj.meta.key, obj.seq),
    ).fetchone()
    return None if row is None else (blob_ids_of(row[0], row[1]), image_from(row[2:]))
