"""Buckets the gateway knows to exist upstream, so writes keep being acknowledged while the
upstream is unreachable. A bucket is remembered after the upstream confirmed it once."""

from __future__ import annotations

import sqlite3

from gateway.models import BucketInfo
from gateway.store.journal import Journal
from gateway.store.rows import IMAGE_COLUMNS, RowChange, blob_ids_of, image_from


class BucketRecords:
    """The journal's ``buckets`` table. ``forget_bucket`` MUST only be called once the
    bucket is gone upstream; it returns the blobs of its (durable) rows, to unlink after."""

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def known_bucket(self, name: str) -> bool:
        return await self._journal.run_read(
            lambda c: (
                c.execute("SELECT 1 FROM buckets WHERE name = ?", (name,)).fetchone() is not None
            )
        )

    async def remember_bucket(self, bucket: BucketInfo) -> None:
        await self._journal.run_write(
            lambda c: c.execute(
                "INSERT OR IGNORE INTO buckets (name, created_s) VALUES (?, ?)",
                (bucket.name, bucket.created_s),
            )
        )

    async def forget_bucket(self, name: str) -> list[str]:
        """Drop a bucket and its (durable) rows; returns blob ids to unlink."""

        def op(conn: sqlite3.Connection) -> list[str]:
            blobs: list[str] = []
            for row in conn.execute(
                f"SELECT blob_id, parts, {IMAGE_COLUMNS} FROM objects WHERE bucket = ?", (name,)
            ).fetchall():
                blobs += blob_ids_of(row[0], row[1])
                self._journal.record(RowChange(image_from(row[2:]), None))
            conn.execute("DELETE FROM objects WHERE bucket = ?", (name,))
            conn.execute("DELETE FROM buckets WHERE name = ?", (name,))
            return blobs

        return await self._journal.run_write(op)
