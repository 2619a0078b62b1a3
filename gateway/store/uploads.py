"""Multipart uploads in the journal: uploads, their parts, and completion into an object.

Same durability order as single PUTs: a part's blob is durable before its row commits, and
the part is acknowledged after. Completion is one transaction: the object row takes the
ordered part list (no data is copied), the upload's rows go, the completion is remembered
(``completed_uploads``, so a repeated Complete can answer as the first did), and the blobs
of parts left out of the completion are returned for unlinking after COMMIT.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from gateway.errors import NoSuchUpload
from gateway.models import LocalObject, ObjectMeta, PartRef
from gateway.store.journal import Journal, RowCheck
from gateway.store.rows import PartsChange, prefix_bytes


@dataclass(frozen=True, slots=True)
class Upload:
    upload_id: str
    bucket: str
    key: str
    created_s: float
    content_type: str
    user_metadata: dict[str, str]
    headers: dict[str, str]
    checksum_algorithm: str | None = None
    checksum_type: str | None = None  # COMPOSITE | FULL_OBJECT


@dataclass(frozen=True, slots=True)
class CompletedUpload:
    """A multipart upload that completed: what its CompleteMultipartUpload answered, and
    whether the key still holds the version it made (``is_current``; None when the key has
    no local row any more, e.g. evicted after its flush: only the upstream can tell)."""

    upload_id: str
    bucket: str
    key: str
    etag: str
    size_bytes: int
    checksums: dict[str, str]
    completed_s: float
    is_current: bool | None


@dataclass(frozen=True, slots=True)
class Part:
    part_number: int
    blob_id: str
    size_bytes: int
    etag: str
    checksums: dict[str, str]
    last_modified_s: float
    crc32c: int | None = None  # of the part's file, from ingest (local integrity checks)


class UploadJournal:
    """Multipart state, stored in the Journal's database through its writer and readers.

    Contract: ``put_part`` and ``complete`` MUST raise NoSuchUpload if the upload is gone
    (aborted or completed concurrently); returned blob ids MUST be unlinked only after the
    call returns.
    """

    def __init__(self, journal: Journal) -> None:
        self._journal = journal

    async def create(self, upload: Upload) -> None:
        await self._journal.run_write(
            lambda c: c.execute(
                "INSERT INTO uploads (upload_id, bucket, key, created_s, content_type, "
                "user_metadata, headers, checksum_algorithm, checksum_type) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    upload.upload_id,
                    upload.bucket,
                    upload.key,
                    upload.created_s,
                    upload.content_type,
                    json.dumps(upload.user_metadata),
                    json.dumps(upload.headers),
                    upload.checksum_algorithm,
                    upload.checksum_type,
                ),
            )
        )

    async def get(self, upload_id: str) -> Upload | None:
        def op(conn: sqlite3.Connection) -> Upload | None:
            row = conn.execute(
                "SELECT " + _UPLOAD_COLUMNS + " FROM uploads WHERE upload_id = ?",
                (upload_id,),
            ).fetchone()
            return _upload(row) if row else None

        return await self._journal.run_read(op)

    async def put_part(self, upload_id: str, part: Part) -> list[str]:
        """Record (or replace) a part; returns the replaced part's blob id, if any."""

        def op(conn: sqlite3.Connection) -> list[str]:
            _require(conn, upload_id)
            old = conn.execute(
                "SELECT blob_id, size_bytes FROM parts WHERE upload_id = ? AND part_number = ?",
                (upload_id, part.part_number),
            ).fetchone()
            conn.execute(
                "INSERT OR REPLACE INTO parts (upload_id, part_number, blob_id, size_bytes, etag, "
                "checksums, last_modified_s, crc32c) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    upload_id,
                    part.part_number,
                    part.blob_id,
                    part.size_bytes,
                    part.etag,
                    json.dumps(part.checksums),
                    part.last_modified_s,
                    part.crc32c,
                ),
            )
            self._journal.record(PartsChange(part.size_bytes - (int(old[1]) if old else 0)))
            return [old[0]] if old else []

        return await self._journal.run_write(op)

    async def parts(self, upload_id: str, after: int = 0, limit: int = 10_000) -> list[Part]:
        def op(conn: sqlite3.Connection) -> list[Part]:
            rows = conn.execute(
                "SELECT part_number, blob_id, size_bytes, etag, checksums, last_modified_s, "
                "crc32c FROM parts WHERE upload_id = ? AND part_number > ? "
                "ORDER BY part_number LIMIT ?",
                (upload_id, after, limit),
            ).fetchall()
            return [Part(n, b, s, e, json.loads(c), m, crc) for n, b, s, e, c, m, crc in rows]

        return await self._journal.run_read(op)

    async def complete(
        self,
        upload_id: str,
        meta: ObjectMeta,
        parts: tuple[PartRef, ...],
        acked_s: float,
        check: RowCheck | None = None,
    ) -> tuple[LocalObject, list[str]]:
        """Make the upload the key's newest version; returns it and blobs to unlink.

        ``check`` (conditional writes) sees the key's current row inside the transaction,
        as in ``Journal.commit_put``; if it raises, the upload stays as it was."""
        used = {p.blob_id for p in parts}

        def op(conn: sqlite3.Connection, seq: int) -> tuple[LocalObject, list[str]]:
            _require(conn, upload_id)
            if check is not None:
                check(self._journal.current(conn, meta.bucket, meta.key))
            _drop_parts(self._journal, conn, upload_id)
            unused = [
                r[0]
                for r in conn.execute("SELECT blob_id FROM parts WHERE upload_id = ?", (upload_id,))
                if r[0] not in used
            ]
            conn.execute("DELETE FROM parts WHERE upload_id = ?", (upload_id,))
            conn.execute("DELETE FROM uploads WHERE upload_id = ?", (upload_id,))
            row, superseded = self._journal.upsert(conn, seq, meta, None, parts, False, acked_s)
            _remember_completed(conn, upload_id, row, acked_s)
            return row, unused + superseded

        return await self._journal.run_write_versions(1, op)

    async def completed(self, upload_id: str) -> CompletedUpload | None:
        """The completion of ``upload_id`` within the last ``COMPLETED_RETENTION_S``, if any."""

        def op(conn: sqlite3.Connection) -> CompletedUpload | None:
            row = conn.execute(
                "SELECT c.bucket, c.key, c.etag, c.size_bytes, c.checksums, c.completed_s, "
                "c.seq, o.seq, o.is_delete FROM completed_uploads AS c LEFT JOIN objects AS o "
                "ON o.bucket = c.bucket AND o.key = c.key WHERE c.upload_id = ?",
                (upload_id,),
            ).fetchone()
            if row is None:
                return None
            bucket, key, etag, size, checksums, done_s, seq, now_seq, is_delete = row
            current = None if now_seq is None else (now_seq == seq and not is_delete)
            return CompletedUpload(
                upload_id, bucket, key, etag, size, json.loads(checksums), done_s, current
            )

        return await self._journal.run_read(op)

    async def abort(self, upload_id: str) -> list[str]:
        """Drop an upload and its parts; returns their blobs. NoSuchUpload if unknown."""

        def op(conn: sqlite3.Connection) -> list[str]:
            _require(conn, upload_id)
            _drop_parts(self._journal, conn, upload_id)
            blobs = [
                r[0]
                for r in conn.execute("SELECT blob_id FROM parts WHERE upload_id = ?", (upload_id,))
            ]
            conn.execute("DELETE FROM parts WHERE upload_id = ?", (upload_id,))
            conn.execute("DELETE FROM uploads WHERE upload_id = ?", (upload_id,))
            return blobs

        return await self._journal.run_write(op)

    async def list(
        self, bucket: str, prefix: str, key_marker: str, upload_id_marker: str, limit: int
    ) -> list[Upload]:
        """Uploads in progress in key order, then upload id order, after the markers."""

        def op(conn: sqlite3.Connection) -> list[Upload]:
            rows = conn.execute(
                "SELECT " + _UPLOAD_COLUMNS + " "
                "FROM uploads WHERE bucket = ? AND substr(CAST(key AS BLOB), 1, ?) = ? "
                "AND (key > ? OR (key = ? AND upload_id > ?)) ORDER BY key, upload_id LIMIT ?",
                (bucket, *prefix_bytes(prefix), key_marker, key_marker, upload_id_marker, limit),
            ).fetchall()
            return [_upload(r) for r in rows]

        return await self._journal.run_read(op)


# How long a completed upload is remembered: far beyond any SDK's retries of a Complete
# whose answer was lost, and across restarts (the journal keeps it).
COMPLETED_RETENTION_S = 24 * 3600.0


def _remember_completed(
    conn: sqlite3.Connection, upload_id: str, row: LocalObject, now_s: float
) -> None:
    """Inside the completion: record it, and forget completions past the retention."""
    conn.execute(
        "DELETE FROM completed_uploads WHERE completed_s < ?", (now_s - COMPLETED_RETENTION_S,)
    )
    meta = row.meta
    conn.execute(
        "INSERT OR REPLACE INTO completed_uploads (upload_id, bucket, key, seq, etag, "
        "size_bytes, checksums, completed_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            upload_id,
            meta.bucket,
            meta.key,
            row.seq,
            meta.etag,
            meta.size_bytes,
            json.dumps(dict(meta.checksums)),
            now_s,
        ),
    )


def _drop_parts(journal: Journal, conn: sqlite3.Connection, upload_id: str) -> None:
    """Inside an op that deletes an upload's parts: their bytes leave the parts figure (a
    completion's chosen parts come back as the object row's bytes)."""
    (size,) = conn.execute(
        "SELECT COALESCE(SUM(size_bytes), 0) FROM parts WHERE upload_id = ?", (upload_id,)
    ).fetchone()
    journal.record(PartsChange(-int(size)))


def _require(conn: sqlite3.Connection, upload_id: str) -> None:
    if conn.execute("SELECT 1 FROM uploads WHERE upload_id = ?", (upload_id,)).fetchone() is None:
        raise NoSuchUpload(UploadId=upload_id)


_UPLOAD_COLUMNS = (
    "upload_id, bucket, key, created_s, content_type, user_metadata, headers, "
    "checksum_algorithm, checksum_type"
)


def _upload(row: tuple[str, str, str, float, str, str, str, str | None, str | None]) -> Upload:
    upload_id, bucket, key, created_s, ctype, umeta, headers, algorithm, ctype_ = row
    return Upload(
        upload_id,
        bucket,
        key,
        created_s,
        ctype,
        json.loads(umeta),
        json.loads(headers),
        algorithm,
        ctype_,
    )
