"""The flush queue's durable side: claims and outcomes of uploads, as journal rows.

What to claim next is decided in memory by the flush order (``flush/order.py``), which
follows the journal's changes; this module only moves the rows it names. Every transition
records its ``RowChange``, which keeps the figures and the flush order up to date.

- ``claim(seqs)``: ``pending`` -> ``flushing`` for each named version that is still
  pending (a version superseded meanwhile is skipped: the newer one has its own row).
- ``mark_durable``: the upstream has this version; a tombstone row is dropped.
- ``retry_later``: a transient failure; pending again, eligible at ``not_before_s``.
- ``mark_failed``: a permanent failure; kept until an operator asks for ``retry_failed``.
- ``release``: claimed rows given back unchanged (shutdown, pause).

Every outcome applies only if the row still carries the uploaded ``seq``: otherwise a newer
write superseded it and the call is a no-op (the newer version flushes next).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence

from gateway.models import FlushState, LocalObject
from gateway.store.journal import Journal
from gateway.store.rows import (
    BODY_COLUMNS,
    COLUMNS,
    IMAGE_COLUMNS,
    RowChange,
    RowImage,
    blob_ids_of,
    image_from,
    prefix_bytes,
    row_from,
    storable,
)


class FlushQueue:
    """Claims and outcomes of the flusher, through the journal's writer.

    Contract: ``claim`` MUST only move rows that are ``pending`` with the named seq; an
    outcome MUST be a no-op for a version that is no longer the key's row."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def claim(self, seqs: Sequence[int]) -> list[LocalObject]:
        """Move the named pending versions to ``flushing``; returns them as they were
        (``flushed_before`` from before this claim), in the order asked."""

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            claimed: list[LocalObject] = []
            for seq in seqs:
                row = conn.execute(
                    f"SELECT {IMAGE_COLUMNS}, {BODY_COLUMNS} FROM objects "
                    "INDEXED BY objects_by_state WHERE state = 'pending' AND seq = ?",
                    (seq,),
                ).fetchone()
                if row is None:
                    continue  # superseded (or deleted) since it was queued
                image = image_from(row[:9])
                # flushed_before: once a version is sent it may exist upstream, even if the
                # attempt later fails or is interrupted (a timeout can hide a success).
                conn.execute(
                    "UPDATE objects SET state = 'flushing', flushed_before = 1 "
                    "WHERE bucket = ? AND key = ? AND seq = ?",
                    (image.bucket, image.key, seq),
                )
                self._journal.record(RowChange(image, image.with_state(FlushState.FLUSHING)))
                claimed.append(_flushing(row_from(row[9:])))
            return claimed

        return await self._journal.run_write(op)

    async def mark_durable(self, obj: LocalObject) -> bool:
        """The upstream has ``obj``'s version. Tombstones are dropped. False if superseded."""

        def op(conn: sqlite3.Connection) -> bool:
            image = _image(conn, obj)
            if image is None:
                return False
            if obj.is_delete:
                return self._journal.delete_row(conn, image, is_flush=True)
            conn.execute(
                "UPDATE objects SET state = 'durable', last_error = NULL "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (obj.meta.bucket, obj.meta.key, obj.seq),
            )
            self._journal.record(RowChange(image, image.with_state(FlushState.DURABLE), True))
            _bump(conn, "flushed_objects", 1)
            _bump(conn, "flushed_bytes", obj.meta.size_bytes)
            return True

        return await self._journal.run_write(op)

    async def drop(self, obj: LocalObject) -> list[str] | None:
        """A newer version of the key, acknowledged on another gateway, goes upstream
        instead of ``obj``'s (docs/fleet.md, "One key through two nodes"): its row is
        deleted unless it is durable already or was superseded here. Returns its blob ids,
        for the caller to unlink after this returns; None when nothing was dropped."""

        def op(conn: sqlite3.Connection) -> list[str] | None:
            row = conn.execute(
                f"SELECT blob_id, parts, {IMAGE_COLUMNS} FROM objects "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (obj.meta.bucket, obj.meta.key, obj.seq),
            ).fetchone()
            if row is None:
                return None
            image = image_from(row[2:])
            if image.state is FlushState.DURABLE:
                return None
            self._journal.delete_row(conn, image, is_flush=False)  # nothing was uploaded
            return blob_ids_of(row[0], row[1])

        return await self._journal.run_write(op)

    async def retry_later(self, obj: LocalObject, error: str, not_before_s: float) -> None:
        """A transient failure: back to pending, eligible again at ``not_before_s`` (wall)."""
        await self._outcome(obj, FlushState.PENDING, error, not_before_s)

    async def mark_failed(self, obj: LocalObject, error: str) -> None:
        """A permanent failure: kept as ``failed`` until an operator asks for a retry."""
        await self._outcome(obj, FlushState.FAILED, error)

    async def _outcome(
        self, obj: LocalObject, state: FlushState, error: str, not_before_s: float | None = None
    ) -> None:
        """A failed attempt: count it, keep its error, move the row to ``state``."""

        def op(conn: sqlite3.Connection) -> None:
            image = _image(conn, obj)
            if image is None:
                return
            conn.execute(
                "UPDATE objects SET state = ?, attempts = attempts + 1, last_error = ?, "
                "not_before_s = COALESCE(?, not_before_s) "
                "WHERE bucket = ? AND key = ? AND seq = ?",
                (
                    state.value,
                    storable(error),
                    not_before_s,
                    obj.meta.bucket,
                    obj.meta.key,
                    obj.seq,
                ),
            )
            new = image.with_state(state, not_before_s=not_before_s)
            self._journal.record(RowChange(image, new))

        await self._journal.run_write(op)

    async def release(self, objs: Sequence[LocalObject]) -> None:
        """Give claimed rows back (shutdown): ``flushing`` -> ``pending``, no attempt counted."""

        def op(conn: sqlite3.Connection) -> None:
            for obj in objs:
                image = _image(conn, obj)
                if image is None or image.state is not FlushState.FLUSHING:
                    continue
                conn.execute(
                    "UPDATE objects SET state = 'pending' WHERE bucket = ? AND key = ? AND seq = ?",
                    (obj.meta.bucket, obj.meta.key, obj.seq),
                )
                self._journal.record(RowChange(image, image.with_state(FlushState.PENDING)))

        if objs:
            await self._journal.run_write(op)

    async def retry_failed(self) -> int:
        """Operator request: every failed row becomes pending again. Returns how many."""

        def op(conn: sqlite3.Connection) -> int:
            failed = [
                image_from(r)
                for r in conn.execute(
                    f"SELECT {IMAGE_COLUMNS} FROM objects WHERE state = 'failed' ORDER BY seq"
                )
            ]
            conn.execute(
                "UPDATE objects SET state = 'pending', not_before_s = 0 WHERE state = 'failed'"
            )
            for image in failed:
                new = image.with_state(FlushState.PENDING, not_before_s=0.0)
                self._journal.record(RowChange(image, new))
            return len(failed)

        return await self._journal.run_write(op)

    async def failed(self, limit: int = 100) -> list[LocalObject]:
        """The oldest ``limit`` failed rows (admin pool)."""

        def op(conn: sqlite3.Connection) -> list[LocalObject]:
            rows = conn.execute(
                f"SELECT {COLUMNS} FROM objects WHERE state = 'failed' ORDER BY seq LIMIT ?",
                (limit,),
            ).fetchall()
            return [row_from(r) for r in rows]

        return await self._journal.run_admin_read(op)

    async def unflushed_keys(
        self, bucket: str | None, prefix: str, max_seq: int, limit: int
    ) -> list[tuple[str, str]]:
        """Like ``pending_keys``, but every state that is not durable (flushing, failed)."""
        where = "state != 'durable' AND COALESCE(fence_seq, seq) <= ?"
        return await self._keys(where, bucket, prefix, max_seq, limit)

    async def pending_keys(
        self, bucket: str | None, prefix: str, max_seq: int, limit: int
    ) -> list[tuple[str, str]]:
        """(bucket, key) of up to ``limit`` pending rows under ``bucket`` (None: all) and
        ``prefix`` acknowledged at or before ``max_seq`` (admin pool)."""
        return await self._keys("state = 'pending' AND seq <= ?", bucket, prefix, max_seq, limit)

    async def _keys(
        self, where: str, bucket: str | None, prefix: str, max_seq: int, limit: int
    ) -> list[tuple[str, str]]:
        sql = (
            f"SELECT bucket, key FROM objects WHERE {where} AND substr(CAST(key AS BLOB), 1, ?) = ?"
        )
        args: list[object] = [max_seq, *prefix_bytes(prefix)]
        if bucket is not None:
            sql += " AND bucket = ?"
            args.append(bucket)
        sql += " LIMIT ?"
        args.append(limit)

        def op(conn: sqlite3.Connection) -> list[tuple[str, str]]:
            return [(str(b), str(k)) for b, k in conn.execute(sql, args)]

        return await self._journal.run_admin_read(op)


def _image(conn: sqlite3.Connection, obj: LocalObject) -> RowImage | None:
    """The row of ``obj``'s exact version, or None when it was superseded."""
    row = conn.execute(
        f"SELECT {IMAGE_COLUMNS} FROM objects WHERE bucket = ? AND key = ? AND seq = ?",
        (obj.meta.bucket, obj.meta.key, obj.seq),
    ).fetchone()
    return image_from(row) if row else None


def _flushing(obj: LocalObject) -> LocalObject:
    return dataclasses.replace(obj, state=FlushState.FLUSHING)


def _bump(conn: sqlite3.Connection, name: str, by: int) -> None:
    conn.execute(
        "INSERT INTO counters (name, value) VALUES (?, ?) "
        "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
        (name, by),
    )
