"""Object rows: their columns, their decoding, and the change records every mutation emits.

A ``RowImage`` is what the figures and the flush order need of a row (no metadata, no
body); a ``RowChange`` pairs the image before a mutation with the image after it (None:
no row). Every statement that changes an ``objects`` row records one ``RowChange`` in the
same writer operation; the journal hands them to its consumers on the event loop, in commit
order, once the transaction is durable (``Journal._write``). That is how counts, bytes and
the in-memory flush order follow the table without ever scanning it.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from gateway.models import FlushState, LocalObject, ObjectMeta, PartRef

# Columns of a full row, in the order ``row_from`` decodes them (the inline body aside).
COLUMNS = (
    "bucket, key, seq, state, is_delete, blob_id, size_bytes, etag, last_modified_s, "
    "content_type, user_metadata, headers, checksums, attempts, last_error, parts, acked_s, "
    "flushed_before, crc32c"
)
# ... and with the inline body last, for reads that serve or upload it.
BODY_COLUMNS = COLUMNS + ", body"
# Columns of an image, in the order ``image_from`` decodes them.
IMAGE_COLUMNS = (
    "bucket, key, seq, COALESCE(fence_seq, seq), state, is_delete, size_bytes, acked_s, "
    "not_before_s"
)


@dataclass(frozen=True, slots=True)
class RowImage:
    """One row as figures and the flush order see it."""

    bucket: str
    key: str
    seq: int
    # Drain fence: the seq of the oldest acknowledged version of this key not yet durable
    # upstream (carried over while superseded versions were pending; = seq otherwise).
    fence_seq: int
    state: FlushState
    is_delete: bool
    size_bytes: int
    acked_s: float
    not_before_s: float

    @property
    def is_unflushed(self) -> bool:
        return self.state is not FlushState.DURABLE

    def with_state(self, state: FlushState, *, not_before_s: float | None = None) -> RowImage:
        return RowImage(
            self.bucket,
            self.key,
            self.seq,
            self.fence_seq,
            state,
            self.is_delete,
            self.size_bytes,
            self.acked_s,
            self.not_before_s if not_before_s is None else not_before_s,
        )


@dataclass(frozen=True, slots=True)
class RowChange:
    """A committed mutation of one row: ``old`` before it, ``new`` after it (None: absent).

    ``is_flush`` marks the outcome that made a version durable upstream (``mark_durable``),
    which is what the flushed counters count (an eviction also removes a row, but flushes
    nothing)."""

    old: RowImage | None
    new: RowImage | None
    is_flush: bool = False


@dataclass(frozen=True, slots=True)
class PartsChange:
    """Bytes of parts of open multipart uploads added (positive) or released (negative);
    ``is_replica``: bytes of replicas held for other gateways of the fleet instead."""

    delta_bytes: int
    is_replica: bool = False


Change = RowChange | PartsChange


def image_from(row: tuple[Any, ...]) -> RowImage:
    bucket, key, seq, fence_seq, state, is_delete, size, acked_s, not_before_s = row
    return RowImage(
        str(bucket),
        str(key),
        int(seq),
        int(fence_seq),
        FlushState(state),
        bool(is_delete),
        int(size),
        float(acked_s),
        float(not_before_s),
    )


def image_of(conn: sqlite3.Connection, bucket: str, key: str) -> RowImage | None:
    """Inside an op: the key's row as an image, or None."""
    row = conn.execute(
        f"SELECT {IMAGE_COLUMNS} FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
    ).fetchone()
    return image_from(row) if row else None


def row_from(r: tuple[Any, ...]) -> LocalObject:
    """A full row (``COLUMNS``, or ``BODY_COLUMNS``) as a LocalObject."""
    body = bytes(r[19]) if len(r) > 19 and r[19] is not None else None
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
        crc32c,
    ) = r[:19]
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
        crc32c=crc32c,
        body=body,
    )


def current(conn: sqlite3.Connection, bucket: str, key: str) -> LocalObject | None:
    """Inside an op: the key's full row (version or tombstone, inline body included), or
    None."""
    row = conn.execute(
        f"SELECT {BODY_COLUMNS} FROM objects WHERE bucket = ? AND key = ?", (bucket, key)
    ).fetchone()
    return row_from(row) if row else None


def parts_json(parts: tuple[PartRef, ...]) -> str | None:
    return (
        json.dumps([[p.blob_id, p.size_bytes, p.etag, p.checksum, p.crc32c] for p in parts])
        if parts
        else None
    )


def blob_ids_of(blob_id: str | None, parts: str | None) -> list[str]:
    """The blob ids of a row, from its ``blob_id`` and ``parts`` columns."""
    if parts:
        return [str(p[0]) for p in json.loads(parts)]
    return [blob_id] if blob_id else []


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


def directory_prefixes(key: str) -> list[str]:
    """Every directory prefix of ``key``, shortest first: ``a/b/c`` -> ``["", "a/", "a/b/"]``."""
    out = [""]
    start = 0
    while (slash := key.find("/", start)) >= 0:
        out.append(key[: slash + 1])
        start = slash + 1
    return out


def is_directory_prefix(prefix: str) -> bool:
    """Whether ``prefix`` names a directory (``""`` or ends with ``/``): the figures keep
    counts for exactly these."""
    return prefix == "" or prefix.endswith("/")


def write_version(
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
) -> tuple[RowChange, LocalObject, list[str]]:
    """Inside a write op: make this the key's row, as version ``seq``. Returns the change,
    the new row and the blob ids of the row it replaced (to unlink after COMMIT).

    ``is_cached``: a copy of what the upstream already has (read-through), durable at once
    and known to exist upstream. ``crc32c``: of the single body (file or ``body``, the body
    itself when it is stored inline)."""
    old = conn.execute(
        f"SELECT blob_id, parts, flushed_before, {IMAGE_COLUMNS} "
        "FROM objects WHERE bucket = ? AND key = ?",
        (meta.bucket, meta.key),
    ).fetchone()
    before = image_from(old[3:]) if old else None
    # Whether we ever sent (or are sending) an older version of this key upstream.
    flushed_before = is_cached or (
        before is not None and (bool(old[2]) or before.state is not FlushState.PENDING)
    )
    state = FlushState.DURABLE if is_cached else FlushState.PENDING
    # A superseded version that was not durable yet keeps the key inside the drain fences
    # taken after its ack: the fence waits for the version that replaces it.
    fence_seq = before.fence_seq if before and before.is_unflushed else seq
    conn.execute(
        f"INSERT OR REPLACE INTO objects ({BODY_COLUMNS}, not_before_s, fence_seq, accessed_s) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0, NULL, ?, ?, ?, ?, ?, 0, ?, ?)",
        (
            meta.bucket,
            meta.key,
            seq,
            state.value,
            int(is_delete),
            blob_id,
            meta.size_bytes,
            meta.etag,
            meta.last_modified_s,
            meta.content_type,
            json.dumps(dict(meta.user_metadata)),
            json.dumps(dict(meta.headers)),
            json.dumps(dict(meta.checksums)),
            parts_json(parts),
            acked_s,
            int(flushed_before),
            crc32c,
            body,
            fence_seq,
            acked_s if is_cached else None,
        ),
    )
    after = RowImage(
        meta.bucket, meta.key, seq, fence_seq, state, is_delete, meta.size_bytes, acked_s, 0.0
    )
    row = LocalObject(
        meta=meta,
        seq=seq,
        state=state,
        blob_id=blob_id,
        is_delete=is_delete,
        parts=parts,
        acked_s=acked_s,
        flushed_before=flushed_before,
        crc32c=crc32c,
        body=body,
    )
    return RowChange(before, after), row, (blob_ids_of(old[0], old[1]) if old else [])


def storable(error: str) -> str:
    """An error text SQLite can store whatever it holds: sqlite3 encodes text as UTF-8 and
    raises on a lone surrogate (undecodable request bytes), which would fail the recording
    of the error itself; such characters become backslash escapes."""
    return error.encode("utf-8", "backslashreplace").decode("utf-8")
