"""The journal's schema upkeep and its few whole-table reads: migrations at open, the one
pass that loads the figures and the flush order, and counts for prefixes the figures do
not keep. Nothing on a request's path calls these (see ``figures.py`` for what does).
"""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Iterator
from importlib import resources
from typing import Any

from gateway.store.figures import Figures, Tally
from gateway.store.rows import IMAGE_COLUMNS, RowImage, blob_ids_of, image_from, prefix_end

_LOAD_BATCH = 4096


def count_unflushed(
    conn: sqlite3.Connection,
    bucket: str | None,
    prefix: str,
    max_seq: int | None,
    exclude_key: str | None = None,
) -> Tally:
    """Unflushed rows under bucket/prefix (acknowledged at or before ``max_seq``, not
    counting ``exclude_key``): a range scan of the primary key, for what the figures do not
    keep."""
    sql = (
        "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0), "
        "COALESCE(SUM(state = 'failed'), 0), "
        "COALESCE(SUM(CASE WHEN state = 'failed' THEN size_bytes END), 0) FROM objects "
        "WHERE state != 'durable' AND key >= ? AND key < ?"
    )
    args: list[Any] = [prefix, prefix_end(prefix)]
    if bucket is not None:
        sql += " AND bucket = ?"
        args.append(bucket)
    if max_seq is not None:
        sql += " AND COALESCE(fence_seq, seq) <= ?"
        args.append(max_seq)
    if exclude_key is not None:
        sql += " AND key != ?"
        args.append(exclude_key)
    n, size, failed, failed_size = conn.execute(sql, args).fetchone()
    return Tally(int(n), int(size), int(failed), int(failed_size))


def unflushed_images(conn: sqlite3.Connection) -> Iterator[RowImage]:
    """Every unflushed row, in seq order (acknowledgement order): the three states' runs of
    the (state, seq) index merged, so SQLite never sorts the backlog."""
    runs = [_state_run(conn, state) for state in ("pending", "flushing", "failed")]
    for row in heapq.merge(*runs, key=lambda r: r[2]):
        yield image_from(row)


def _state_run(conn: sqlite3.Connection, state: str) -> Iterator[tuple[Any, ...]]:
    cursor = conn.execute(
        f"SELECT {IMAGE_COLUMNS} FROM objects INDEXED BY objects_by_state "
        "WHERE state = ? ORDER BY seq",
        (state,),
    )
    while batch := cursor.fetchmany(_LOAD_BATCH):
        yield from batch


def load_figures(conn: sqlite3.Connection, figures: Figures) -> None:
    """The figures of an opening journal: one pass over the rows."""
    for image in unflushed_images(conn):
        figures.load(image)
    figures.durable_bytes = int(
        conn.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM objects "
            "WHERE state = 'durable' AND is_delete = 0"
        ).fetchone()[0]
    )
    figures.parts_bytes = int(
        conn.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM parts").fetchone()[0]
    )
    figures.replica_bytes = int(
        conn.execute("SELECT COALESCE(SUM(size_bytes), 0) FROM replica_bodies").fetchone()[0]
    )
    counters = dict(conn.execute("SELECT name, value FROM counters"))
    figures.flushed_objects = int(counters.get("flushed_objects", 0))
    figures.flushed_bytes = int(counters.get("flushed_bytes", 0))


# Guarded migrations: each adds what an older data directory lacks, and is a no-op after.
_ADDED_COLUMNS = (
    ("objects", "accessed_s", "REAL"),  # last read (wall), for LRU eviction
    # Oldest unflushed acknowledged version of the key, for drain fences. NULL reads as
    # ``seq``: the old fence, which is right for rows written before the upgrade.
    ("objects", "fence_seq", "INTEGER"),
    # CRC32C of the single body, taken at ingest; NULL for rows written before (checked by
    # MD5 then). Parts keep theirs in the parts JSON (a fifth element) and in ``parts``.
    ("objects", "crc32c", "INTEGER"),
    ("parts", "crc32c", "INTEGER"),
    # A small body stored in the journal itself (no blob file); NULL otherwise.
    ("objects", "body", "BLOB"),
    # A replica committed before its writer's own commit (store/replicas.py).
    ("replicas", "is_early", "INTEGER NOT NULL DEFAULT 0"),
)


# Indexes on migrated columns (created after them).
_ADDED_INDEXES = (
    # Eviction's order (least recently used durable bodies first) without sorting the cache.
    "CREATE INDEX IF NOT EXISTS objects_lru ON objects (COALESCE(accessed_s, acked_s), seq) "
    "WHERE state = 'durable' AND is_delete = 0",
)


def ensure_schema(conn: sqlite3.Connection) -> None:
    """Create the journal's tables, or bring an older journal's up to date (idempotent)."""
    conn.executescript(resources.files("gateway.store").joinpath("schema.sql").read_text())
    migrate(conn)


def migrate(conn: sqlite3.Connection) -> None:
    """Bring an older journal's schema up to date (idempotent; runs at every open)."""
    for table, column, decl in _ADDED_COLUMNS:
        have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
    for statement in _ADDED_INDEXES:
        conn.execute(statement)


def read_seq_ceiling(conn: sqlite3.Connection) -> int:
    """The durable ceiling of sequence numbers (engine.py; 0 in a journal without one)."""
    row = conn.execute("SELECT value FROM counters WHERE name = 'seq_ceiling'").fetchone()
    return int(row[0]) if row else 0


def write_seq_ceiling(conn: sqlite3.Connection, ceiling: int) -> int:
    """Record ``ceiling`` (never lowered); returns it."""
    conn.execute(
        "INSERT INTO counters (name, value) VALUES ('seq_ceiling', ?) "
        "ON CONFLICT (name) DO UPDATE SET value = MAX(value, excluded.value)",
        (ceiling,),
    )
    return ceiling


def referenced_blobs(conn: sqlite3.Connection) -> set[str]:
    """Every blob id a row refers to: object bodies and parts of uploads in progress."""
    out = {
        b
        for blob_id, parts in conn.execute("SELECT blob_id, parts FROM objects")
        for b in blob_ids_of(blob_id, parts)
    }
    out.update(r[0] for r in conn.execute("SELECT blob_id FROM parts"))
    # Replicas held for other gateways of the fleet, staged or committed (store/replicas.py).
    out.update(
        r[0] for r in conn.execute("SELECT blob_id FROM replica_bodies WHERE blob_id IS NOT NULL")
    )
    return out
